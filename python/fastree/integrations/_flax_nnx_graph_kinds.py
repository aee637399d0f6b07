"""The kinds of type flax's graph walks meet: the codes of ``enum Kind`` in csrc/nnx/nnx_graph.h,
which the Python side's table (``flax_nnx_graph._Graph``) hands the C walks. Kept here once for
the modules that classify and check (flax_nnx_graph, _flax_nnx_graph_compare,
_flax_nnx_graph_user_code); with the table type itself, :class:`TypeTable`."""

from __future__ import annotations

import weakref
from typing import Any

LEAF, ARRAY_LEAF, VARIABLE, NNX_PYTREE, GRAPH_NODE, PYTREE_NODE = range(6)
LIST, TUPLE, NONE, DICT, UNSERVED, PYTREE_STATE, GENERIC_PYTREE = range(6, 13)

# Kinds with nothing native to check: the walk calls the type's own (Python) functions, and a
# check would call them a second time (a flatten with side effects would see its own effects).
# Unserved types never reach the walk.
CALLS_ITS_OWN = (GRAPH_NODE, PYTREE_NODE, UNSERVED)


class TypeTable(dict):
    """A kind table, type -> entry, that keeps no type alive.

    flax lets a class go once nothing uses it (a leaf class made per model, say); a table keyed
    by the class itself would hold every class a walk ever met. Each type is held here by its
    canonical weak reference (``weakref.ref(cls)``, no callback), which is what the C walks look
    up: ``PyWeakref_NewRef(type, NULL)`` hands back that same object while this table holds it
    (``KindEntry``, csrc/nnx/nnx_graph_walk.h). The Python side reads and writes by the type, as
    with a dict. The entry of a type that died stays until :meth:`prune` (no weak-reference
    callback edits the table while a walk reads it); nothing finds it meanwhile, since a type
    born at the same address has a weak reference of its own. A key that cannot be weakly
    referenced (not a type) is not kept: it is classified again at each meeting.

    >>> table = TypeTable()
    >>> Leaf = type("Leaf", (), {})
    >>> table[Leaf] = (LEAF, None, None)
    >>> table.get(Leaf), Leaf in table
    ((0, None, None), True)
    >>> probe = weakref.ref(Leaf)
    >>> del Leaf
    >>> import gc; _ = gc.collect()
    >>> probe() is None, len(table), table.prune(), len(table)
    (True, 1, None, 0)
    """

    def get(self, cls: Any, default: Any = None) -> Any:
        key = _weak_key(cls)
        return default if key is None else dict.get(self, key, default)

    def __getitem__(self, cls: Any) -> Any:
        key = _weak_key(cls)
        if key is None:
            raise KeyError(cls)
        return dict.__getitem__(self, key)

    def __contains__(self, cls: Any) -> bool:
        key = _weak_key(cls)
        return key is not None and dict.__contains__(self, key)

    def __setitem__(self, cls: Any, entry: Any) -> None:
        key = _weak_key(cls)
        if key is not None:
            dict.__setitem__(self, key, entry)

    def pop(self, cls: Any, *default: Any) -> Any:
        key = _weak_key(cls)
        if key is None:
            if default:
                return default[0]
            raise KeyError(cls)
        return dict.pop(self, key, *default)

    def prune(self) -> None:
        """Drops the entries of types that died (called between walks, never during one: the C
        walks count a table's entries to see whether a walk met new types)."""
        for key in [key for key in dict.keys(self) if key() is None]:
            dict.__delitem__(self, key)


def _weak_key(cls: Any) -> Any:
    try:
        return weakref.ref(cls)
    except TypeError:  # not weakly referenceable (a record naming no type): not kept
        return None
