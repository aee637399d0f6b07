"""What every integration asks of JAX about its library: the classes JAX already holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _core
from ..jax_interop import compat as _jax_compat


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
