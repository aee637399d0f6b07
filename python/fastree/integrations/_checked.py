"""Checking a native attribute node against the library functions it stands in for.

An integration hands a class to the core as an :class:`~fastree._core.AttrNode` only together with
a checker made here. The core calls the checker on the class's first instances (and on instances
whose ``__dict__`` holds other than the fields: partly initialised, wrapped) before any native
output leaves. It compares, for that instance:

- the children (the same objects, in the same order) and the aux data (the same objects in the
  same tuple shape) of the library's ``flatten`` and of the node's;
- the keys and children of both ``flatten_with_keys`` functions;
- the objects each ``unflatten`` rebuilds: same class, same instance state (names in the same
  order, the same value objects; of the same type only, for attributes the library's own rebuild
  makes anew). Skipped for a class whose rebuild runs its own code (chex calls
  ``__post_init__``): two extra rebuilds would run that code twice more, which the user would see.

On any difference, or if a library function raises, the node delegates to the library's functions
for that class from then on (the core also re-registers the class with them), and the reason is
kept for :func:`fastree.integrations.status`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Why a class went back to its library's functions: class -> reason.
fallbacks: dict[type, str] = {}


def _same(a: Any, b: Any) -> bool:
    # Identity, looking into tuples the flatten functions build afresh (the aux tuple, equinox's
    # tuple of wrapper attributes), with exact str compared by value (a name read from an
    # unpickled instance's __dict__ is not the interned field name). Never == on anything else:
    # an array in the aux data would raise.
    if a is b:
        return True
    if type(a) is str and type(b) is str:
        return a == b
    if type(a) is not tuple or type(b) is not tuple or len(a) != len(b):
        return False
    return all(_same(x, y) for x, y in zip(a, b))


def _state(obj: Any) -> list[tuple[str, Any]]:
    # What an instance holds: its __dict__ in order, then its filled slots.
    items = list(getattr(obj, "__dict__", {}).items())
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            sentinel = object()
            value = getattr(obj, name, sentinel)
            if value is not sentinel:
                items.append((name, value))
    return items


def _difference(node: Any, obj: Any, flatten: Callable[..., Any],
                flatten_with_keys: Callable[..., Any], unflatten: Callable[..., Any],
                rebuild: bool, fresh: frozenset[str]) -> str | None:
    lib_children, lib_aux = flatten(obj)
    lib_children = tuple(lib_children)
    nat_children, nat_aux = node.native_flatten(obj)
    if not _same(lib_children, nat_children):
        return "flatten: the children differ"
    if not _same(lib_aux, nat_aux):
        return "flatten: the aux data differ"
    lib_pairs, lib_keyed_aux = flatten_with_keys(obj)
    lib_pairs = tuple(lib_pairs)
    nat_pairs, nat_keyed_aux = node.native_flatten_with_keys(obj)
    if len(lib_pairs) != len(nat_pairs) or not _same(lib_keyed_aux, nat_keyed_aux):
        return "flatten_with_keys: the output differs"
    for (lib_key, lib_child), (nat_key, nat_child) in zip(lib_pairs, nat_pairs):
        if type(lib_key) is not type(nat_key) or lib_key != nat_key or lib_child is not nat_child:
            return f"flatten_with_keys: {lib_key!r} differs from {nat_key!r}"
    if not rebuild:
        return None
    lib_obj = unflatten(lib_aux, lib_children)
    nat_obj = node.native_unflatten(nat_aux, nat_children)
    if type(lib_obj) is not type(nat_obj):
        return "unflatten: the classes differ"
    lib_state, nat_state = _state(lib_obj), _state(nat_obj)
    if [k for k, _ in lib_state] != [k for k, _ in nat_state]:
        return "unflatten: the rebuilt attributes differ"
    for (name, a), (_, b) in zip(lib_state, nat_state):
        if a is not b and not (name in fresh and _same_fresh(a, b)):
            return f"unflatten: the rebuilt values of {name!r} differ"
    return None


def _same_fresh(a: Any, b: Any) -> bool:
    # Made anew by each rebuild: the same type, and for a dict the same keys in the same order
    # holding the very same values.
    if type(a) is not type(b):
        return False
    if type(a) is not dict:
        return True
    return list(a) == list(b) and all(a[k] is b[k] for k in a)


def attach(node: Any, flatten: Callable[..., Any], flatten_with_keys: Callable[..., Any],
           unflatten: Callable[..., Any], *, delegate_irregular: bool = False,
           check_rebuild: bool = True, fresh: tuple[str, ...] = ()) -> None:
    """Makes ``node`` check itself against the library's functions on its first instances.

    ``check_rebuild=False``: the rebuilt objects are not compared (see the module docstring).
    ``fresh``: attributes that the library's own rebuild makes anew each time (flax.nnx's
    Variable._new makes a new trace state, its unflatten a new metadata dict), compared by type
    (and a dict by its keys and value objects).
    ``delegate_irregular``: instances whose ``__dict__`` holds other than the fields are always
    the library's (see ``AttrNode.check_with``).
    """

    def check(obj: Any) -> bool:
        try:
            reason = _difference(node, obj, flatten, flatten_with_keys, unflatten, check_rebuild,
                                 frozenset(fresh))
        # Any failure means "do not trust the node". Nothing is lost: the library's function
        # then answers the same call, and raises its own error if it has one.
        except Exception as error:  # noqa: BLE001
            reason = f"{type(error).__name__} while checking: {error}"
        if reason is None:
            return True
        fallbacks[node.cls] = reason
        return False

    node.check_with(check, flatten, flatten_with_keys, unflatten,
                    delegate_irregular=delegate_irregular)
