"""Small flax.nnx models: one whose state is benchmarked as a pytree, one with shared submodules.

flax takes over a second to import, so it is imported (and the model classes defined) only when an
nnx tree is selected; ``_classes`` builds the classes once on first use.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from benchmarks.unsupported import Unsupported


def small_model_state() -> Any:
    """``nnx.split(model)[1]``: an nnx.State of 4 blocks + head (26 Variables, one array each)."""
    classes = _classes()
    _graphdef, state = classes.nnx.split(classes.Net(classes.nnx.Rngs(0)))
    return state


def shared_submodule_model() -> Any:
    """A model whose embedding is tied to its output layer and whose first block is used twice.

    nnx.split/merge keeps that sharing (merged.embed is merged.unembed), which is what fastree's
    identity-preserving flatten will be compared against.
    """
    classes = _classes()
    return classes.SharedNet(classes.nnx.Rngs(0))


@functools.cache
def _classes() -> SimpleNamespace:
    try:
        from flax import nnx
    except ImportError as error:
        raise Unsupported(f"flax is not installed ({error})") from None

    class Block(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.fc1 = nnx.Linear(2, 2, rngs=rngs)
            self.fc2 = nnx.Linear(2, 2, rngs=rngs)
            self.norm = nnx.LayerNorm(2, rngs=rngs)

    class Net(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.blocks = nnx.List([Block(rngs) for _ in range(4)])
            self.head = nnx.Linear(2, 2, rngs=rngs)

    class SharedNet(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.embed = nnx.Embed(4, 2, rngs=rngs)
            shared_block = Block(rngs)
            self.blocks = nnx.List([shared_block, shared_block, Block(rngs)])
            self.unembed = self.embed

    return SimpleNamespace(nnx=nnx, Net=Net, SharedNet=SharedNet)
