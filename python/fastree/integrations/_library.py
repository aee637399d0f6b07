"""What every integration asks about its library: its version, and the classes JAX already holds."""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any

from .. import _core
from ..jax_interop import compat as _jax_compat


@functools.cache
def version(distribution: str) -> tuple[int, ...] | None:
    """The installed distribution's (major, minor, micro), or None if absent or unreadable."""
    try:
        text = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return _jax_compat.version_tuple(text)[:3] or None


def version_within(distribution: str, known: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
    """Whether the installed version is in ``[known[0], known[1])``."""
    got = version(distribution)
    return got is not None and known[0] <= got < known[1]


def accelerate_with(native_node: Callable[[type, Any, Any, Any], Any]) -> list[type]:
    """Registers with fastree's core (only) the classes JAX holds that ``native_node`` takes.

    JAX keeps its registration (it refuses a second one); fastree's own functions read the
    classes natively from then on. Returns the classes changed. JAX from 0.10 keeps a class's
    with-keys function in jaxlib only: ``native_node`` is then given None for it.
    """
    changed = []
    for cls in _jax_compat.jax_registered_types():
        entry = _jax_compat.jax_registry_entry(cls)
        if entry is None or _core.attribute_node(cls) is not None:
            continue
        keyed = _jax_compat.jax_keypath_registry_entry(cls)
        flatten_with_keys = keyed.flatten_with_keys if keyed is not None else None
        node = native_node(cls, flatten_with_keys, entry.from_iter, entry.to_iter)
        if node is not None:
            _core.register_attribute_node(node)
            changed.append(cls)
    return changed
