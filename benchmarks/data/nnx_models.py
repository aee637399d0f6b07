"""Small flax.nnx models: one whose state is benchmarked as a pytree, one with shared submodules.

flax takes over a second to import, so it is imported (and the model classes defined) only when an
nnx tree is selected; ``_classes`` builds the classes once on first use.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from benchmarks.data.identity_nodes import SHARED_BLOCKS
from benchmarks.unsupported import Unsupported


def small_model_state() -> Any:
    """``nnx.split(model)[1]``: an nnx.State of 4 blocks + head (26 Variables, one array each)."""
    classes = _classes()
    _graphdef, state = classes.nnx.split(classes.Net(classes.nnx.Rngs(0)))
    return state


def shared_submodule_model() -> Any:
    """An embedding tied to the output layer around SHARED_BLOCKS blocks of two Linear layers.

    nnx.split/merge keeps the tie (merged.embed is merged.unembed); fastree's identity-preserving
    twin (identity_nodes.shared_model) has the same graph.
    """
    classes = _classes()
    return classes.SharedNet(classes.nnx.Rngs(0))


@functools.cache
def _classes() -> SimpleNamespace:
    try:
        from flax import nnx
    except ImportError as error:
        raise Unsupported(f"flax is not installed ({error})") from None
    # flax 0.12 wants a list of submodules wrapped in nnx.List; older flax (the newest for
    # Python 3.10) has no nnx.List and takes the plain list.
    module_list = getattr(nnx, "List", list)

    class Block(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.fc1 = nnx.Linear(2, 2, rngs=rngs)
            self.fc2 = nnx.Linear(2, 2, rngs=rngs)
            self.norm = nnx.LayerNorm(2, rngs=rngs)

    class Net(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.blocks = module_list([Block(rngs) for _ in range(4)])
            self.head = nnx.Linear(2, 2, rngs=rngs)

    class LinearPair(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.fc1 = nnx.Linear(2, 2, rngs=rngs)
            self.fc2 = nnx.Linear(2, 2, rngs=rngs)

    class SharedNet(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.embed = nnx.Embed(4, 2, rngs=rngs)
            self.blocks = module_list([LinearPair(rngs) for _ in range(SHARED_BLOCKS)])
            self.unembed = self.embed

    return SimpleNamespace(nnx=nnx, Net=Net, SharedNet=SharedNet)
