"""Key-path entries made by jaxlib functions, for the core's key cache (csrc/keys.cpp).

jaxlib's key classes (``SequenceKey``, ``DictKey``, ...) are nanobind types whose constructor
aborts the process when memory runs out (a ``std::bad_alloc`` escapes a ``noexcept`` frame while
nanobind grows its table of live instances). jaxlib's bound functions turn the same failure into
``MemoryError``. So the core never calls the classes: it asks these makers, which let jaxlib's
registry flatten a stand-in container one level and take the keys it made.

>>> from fastree import _key_makers
>>> _key_makers.sequence_block(3)
[SequenceKey(idx=0), SequenceKey(idx=1), SequenceKey(idx=2)]
>>> _key_makers.dict_key('w'), _key_makers.getattr_key('bias')
(DictKey(key='w'), GetAttrKey(name='bias'))
"""

from __future__ import annotations

import operator
from typing import Any

from ._jax_compat import tree_util as _jtu

_flatten_with_keys = _jtu.default_registry.flatten_one_level_with_keys
_first = operator.itemgetter(0)


class _Indexed:
    """A node of ``n`` children, registered only in a private jaxlib registry below, so that
    jaxlib numbers its children with ``FlattenedIndexKey``."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class _Named(tuple):  # instances carry `_fields`: jaxlib reads it per object
    """A one-item tuple with its own ``_fields``: jaxlib keys its item ``GetAttrKey(_fields[0])``."""


_private_registry = type(_jtu.default_registry)()
_private_registry.register_node(_Indexed, lambda node: ([None] * node.n, None), lambda *_: None)


def sequence_block(n: int) -> list[Any]:
    """``[SequenceKey(0), ..., SequenceKey(n - 1)]``."""
    return list(map(_first, _flatten_with_keys([None] * n)[0]))


def flattened_index_block(n: int) -> list[Any]:
    """``[FlattenedIndexKey(0), ..., FlattenedIndexKey(n - 1)]``."""
    return list(map(_first, _private_registry.flatten_one_level_with_keys(_Indexed(n))[0]))


def dict_key(key: Any) -> Any:
    """``DictKey(key)``."""
    return _flatten_with_keys({key: None})[0][0][0]


def dict_key_block(keys: list[Any]) -> list[Any]:
    """``[DictKey(k) for k in keys]``, for distinct keys of one orderable type (str, or int)."""
    made = {entry.key: entry for entry, _ in _flatten_with_keys(dict.fromkeys(keys))[0]}
    return [made[key] for key in keys]


def getattr_key(name: Any) -> Any:
    """``GetAttrKey(name)``."""
    holder = _Named((None,))
    holder._fields = (name,)  # type: ignore[attr-defined]
    return _flatten_with_keys(holder)[0][0][0]


def _works() -> bool:
    # Older jaxlib releases may lack one of these routes: then the core keeps calling the classes.
    try:
        return (
            sequence_block(2)[1] == _jtu.SequenceKey(1)
            and flattened_index_block(2)[1] == _jtu.FlattenedIndexKey(1)
            and dict_key("a") == _jtu.DictKey("a")
            and dict_key_block(["b", "a"]) == [_jtu.DictKey("b"), _jtu.DictKey("a")]
            and getattr_key("a") == _jtu.GetAttrKey("a")
        )
    except Exception:  # noqa: BLE001 - any failure means: not this jaxlib's routes
        return False


def install() -> None:
    from . import _core

    if _works():
        _core.set_key_makers(
            sequence_block, flattened_index_block, dict_key, getattr_key, dict_key_block
        )
