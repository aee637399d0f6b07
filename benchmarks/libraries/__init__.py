"""Library adapters, one module each; ``load_libraries`` imports those asked for.

Order matters for display only: fastree first, then the competitors.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.libraries import (
    dmtree_lib,
    fastree_lib,
    jax_lib,
    nnx_lib,
    optree_lib,
    torch_lib,
)
from benchmarks.libraries.base import Library
from benchmarks.unsupported import Unsupported

LOADERS: dict[str, Callable[[], Library]] = {
    "fastree": fastree_lib.load,
    "jax": jax_lib.load,
    "optree": optree_lib.load,
    "dm-tree": dmtree_lib.load,
    "torch": torch_lib.load,
    "nnx": nnx_lib.load,
    "fastree-plain": fastree_lib.load_plain,
    "fastree-noaux": fastree_lib.load_noaux,
}


def load_libraries(names: list[str] | None = None) -> tuple[list[Library], dict[str, str]]:
    """(libraries that loaded, {name: why not} for the others)."""
    loaded: list[Library] = []
    missing: dict[str, str] = {}
    for name, loader in LOADERS.items():
        if names is not None and name not in names:
            continue
        try:
            loaded.append(loader())
        except Unsupported as reason:
            missing[name] = str(reason)
    return loaded, missing
