"""What every integration asks of JAX about its library: the classes JAX already holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _core
from ..jax_interop import compat as _jax_compat


def accelerate_with(native_node: Callable[[type, Any, Any, Any], Any]) -> list[type]:
    """The classes JAX holds with their library's own functions that fastree's core reads as
    the attribute nodes ``native_node`` offers, each registered with the core (only) if it was
    not yet.

    JAX keeps its registration (it refuses a second one). fastree's walks make such a class
    native when they first meet it (``fastree.integrations._adopt``); this does it for all of
    them at once, and also for a class the core adopted with JAX's functions before its
    integration could answer.
    """
    native = []
    for cls in _jax_compat.jax_registered_types():
        entry = _jax_compat.jax_registry_entry(cls)
        if entry is None:
            continue
        node = _core.attribute_node(cls)  # classifying it offers it to the integrations first
        if node is None:
            if not adopt_with(native_node, cls, entry.to_iter, entry.from_iter):
                continue
        elif entry.to_iter == node.flatten or node.use_library:
            continue  # registered through install (JAX reads it natively too), or given up
        native.append(cls)
    return native


def adopt_with(
    native_node: Callable[[type, Any, Any, Any], Any], cls: type, flatten: Any, unflatten: Any
) -> bool:
    """Registers with fastree's core (only) ``cls``, which JAX holds with these functions, as the
    attribute node ``native_node`` offers for it; False if it offers none.

    JAX from 0.10 keeps a class's with-keys function in jaxlib only: ``native_node`` is then
    given None for it.
    """
    keyed = _jax_compat.jax_keypath_registry_entry(cls)
    flatten_with_keys = keyed.flatten_with_keys if keyed is not None else None
    node = native_node(cls, flatten_with_keys, unflatten, flatten)
    if node is None:
        return False
    _core.register_attribute_node(node)
    return True
