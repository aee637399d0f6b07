"""The kinds of type flax's graph walks meet: the codes of ``enum Kind`` in csrc/nnx/nnx_graph.h,
which the Python side's table (``_flax_nnx_graph_tables.Graph``) hands the C walks. Each code is read
from the C module (``_core.NNX_GRAPH_KINDS``: the kinds' names, a code its position), never
written here; :func:`kinds_differ` is attach's check that the two sides name the same kinds.
Kept here once for the modules that classify and check (flax_nnx_graph,
_flax_nnx_graph_compare, _flax_nnx_graph_user_code); with the table type itself,
:class:`TypeTable`."""

from __future__ import annotations

import weakref
from typing import Any

from .. import _core

# The kinds this side classifies into and handles, by the C module's names.
KIND_NAMES = ("LEAF", "ARRAY_LEAF", "VARIABLE", "NNX_PYTREE", "GRAPH_NODE", "PYTREE_NODE", "LIST",
              "TUPLE", "NONE", "DICT", "UNSERVED", "PYTREE_STATE", "GENERIC_PYTREE")


def _code(name: str) -> int:
    # A kind the C walks do not name gets -1, which no entry of theirs holds; attach refuses to
    # serve anything then (kinds_differ).
    names = _core.NNX_GRAPH_KINDS
    return names.index(name) if name in names else -1


LEAF, ARRAY_LEAF, VARIABLE, NNX_PYTREE, GRAPH_NODE, PYTREE_NODE, LIST = map(_code, KIND_NAMES[:7])
TUPLE, NONE, DICT, UNSERVED, PYTREE_STATE, GENERIC_PYTREE = map(_code, KIND_NAMES[7:])


def kinds_differ() -> str | None:
    """What differs between the kinds this side handles and those the C walks define, or None.

    >>> kinds_differ() is None
    True
    """
    ours, theirs = set(KIND_NAMES), set(_core.NNX_GRAPH_KINDS)
    if ours == theirs and len(_core.NNX_GRAPH_KINDS) == len(theirs):
        return None
    return (f"the C walks' node kinds differ from those the Python side handles: "
            f"{sorted(ours ^ theirs) or list(_core.NNX_GRAPH_KINDS)}")

# Kinds with nothing native to check: the walk calls the type's own (Python) functions, and a
# check would call them a second time (a flatten with side effects would see its own effects).
# Unserved types never reach the walk.
CALLS_ITS_OWN = (GRAPH_NODE, PYTREE_NODE, UNSERVED)


class TypeTable(dict):
    """A kind table, type -> entry, that keeps no type alive and is the one owner of what is
    cached of a type.

    flax lets a class go once nothing uses it (a leaf class made per model, say); a table keyed
    by the class itself would hold every class a walk ever met. Each type is held here by its
    canonical weak reference (``weakref.ref(cls)``, no callback), which is what the C walks look
    up: ``PyWeakref_NewRef(type, NULL)`` hands back that same object while this table holds it
    (``KindEntry``, csrc/nnx/nnx_graph_walk.h). Each value is ``(entry, version)``: the entry and
    the type's version tag (``_core.type_version``) read before the entry was computed; the C
    walks use an entry only while the type's tag is still that one, so a class changed since
    (a method set, a base changed) is classified again. Clearing, popping or pruning the table
    forgets both: no other cache of a type's kind exists.

    The Python side reads and writes entries by the type, as with a dict. The entry of a type
    that died stays until :meth:`prune` (no weak-reference callback edits the table while a
    walk reads it); nothing finds it meanwhile, since a type born at the same address has a weak
    reference of its own. A key that cannot be weakly referenced (not a type) is not kept: it is
    classified again at each meeting.

    >>> table = TypeTable()
    >>> Leaf = type("Leaf", (), {})
    >>> table[Leaf] = (LEAF, None, None)
    >>> table.get(Leaf), Leaf in table, table.current(Leaf)
    ((0, None, None), True, True)
    >>> Leaf.changed = True  # a class attribute set: a new version tag
    >>> table.current(Leaf)
    False
    >>> probe = weakref.ref(Leaf)
    >>> del Leaf
    >>> import gc; _ = gc.collect()
    >>> probe() is None, len(table), table.prune(), len(table)
    (True, 1, None, 0)
    """

    def get(self, cls: Any, default: Any = None) -> Any:
        key = _weak_key(cls)
        value = None if key is None else dict.get(self, key)
        return default if value is None else value[0]

    def __getitem__(self, cls: Any) -> Any:
        key = _weak_key(cls)
        if key is None:
            raise KeyError(cls)
        return dict.__getitem__(self, key)[0]

    def __contains__(self, cls: Any) -> bool:
        key = _weak_key(cls)
        return key is not None and dict.__contains__(self, key)

    def __setitem__(self, cls: Any, entry: Any) -> None:
        self.store(cls, entry, _core.type_version(cls))

    def store(self, cls: Any, entry: Any, version: int) -> None:
        """Keeps ``entry`` for ``cls``, computed from the class as it was at ``version`` (its tag
        read before the entry was made: a change while it was made shows at the next look)."""
        key = _weak_key(cls)
        if key is not None:
            dict.__setitem__(self, key, (entry, version))

    def current(self, cls: Any) -> bool:
        """Whether ``cls`` has an entry made from the class as it is now (what the C walks ask
        before they use one). A type with no version tag never has."""
        key = _weak_key(cls)
        value = None if key is None else dict.get(self, key)
        version = _core.type_version(cls)
        return value is not None and version != 0 and value[1] == version

    def pop(self, cls: Any, *default: Any) -> Any:
        key = _weak_key(cls)
        if key is None:
            if default:
                return default[0]
            raise KeyError(cls)
        value = dict.pop(self, key, None)
        if value is not None:
            return value[0]
        if default:
            return default[0]
        raise KeyError(cls)

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
