"""A Python view of ``PyTreeDef._state()``: the post-order node list as a tree with key paths.

Shared by structure diffs (``_diff.py``) and fingerprints/serialization (``_serialize.py``).
The state is ``(1, ((type, data, arity, ref), ...))`` over the post-order nodes:

* a leaf ``(None, None, 0, -1)``;
* a node ``(cls, data, num_children, -1)``; ``data`` is what ``node_data()`` reports: the sorted
  key list of a dict, None for a namedtuple, the aux_data of a custom node, the tuple of meta
  values of a ``register_dataclass`` type, the key tuple of an OrderedDict,
  ``(default_factory, keys)`` of a defaultdict;
* a shared reference ``(None, None, 0, ref)``, ``ref >= 0`` the index of the node it repeats.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from jax._src import tree_util as _jax_internal

from . import _core

from .tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

STATE_VERSION = 1
_DICT_KINDS = (dict, collections.OrderedDict, collections.defaultdict)


@dataclasses.dataclass(slots=True)
class StateNode:
    """One entry of the state, with its children (indices) and its place in the tree.

    The key path is a property built on demand from the ``parent`` links: storing every node's
    full path would cost the sum of all depths (quadratic on a deep treedef), and the users
    (diffs, error messages) need only a few.
    """

    index: int
    type: type | None  # None for a leaf or a shared reference
    data: Any
    arity: int
    ref: int  # -1, or the index of the node this shared reference repeats
    children: list[int] = dataclasses.field(default_factory=list)
    parent: StateNode | None = dataclasses.field(default=None, repr=False, compare=False)
    key: Any = None  # the key entry from `parent` to this node (None at the root)

    @property
    def path(self) -> tuple[Any, ...]:
        """The key path from the root (JAX's key entries)."""
        keys = []
        node: StateNode | None = self
        while node is not None and node.parent is not None:
            keys.append(node.key)
            node = node.parent
        return tuple(reversed(keys))

    @property
    def is_leaf(self) -> bool:
        return self.type is None and self.ref < 0

    @property
    def is_ref(self) -> bool:
        return self.type is None and self.ref >= 0


def is_namedtuple(tp: type, data: Any, arity: int) -> bool:
    fields = getattr(tp, "_fields", None)
    return (
        issubclass(tp, tuple)
        and data is None
        and isinstance(fields, tuple)
        and len(fields) == arity
    )


def dataclass_data_fields(tp: type, arity: int) -> tuple[str, ...] | None:
    """The data (child) fields of a ``register_dataclass`` type, or None if it is not one.

    Types registered through fastree: the core's registration. Types registered only with
    JAX: JAX's Python registry entry closes over them (``data_fields`` in its flatten
    function), the only place JAX keeps them; read them from there, checking what is found.
    """
    from_core = _core.dataclass_fields(tp)
    if from_core is not None:
        return from_core[0] if len(from_core[0]) == arity else None
    entry = _jax_internal._registry.get(tp)
    fn = getattr(entry, "to_iter", None)
    code = getattr(fn, "__code__", None)
    if code is None or "data_fields" not in code.co_freevars or fn.__closure__ is None:
        return None
    fields = fn.__closure__[code.co_freevars.index("data_fields")].cell_contents
    if (
        isinstance(fields, tuple)
        and len(fields) == arity
        and all(isinstance(f, str) for f in fields)
    ):
        return fields
    return None


def child_keys(tp: type, data: Any, arity: int) -> list[Any]:
    """JAX's key-path entries for the children of a node (what flatten_with_path yields)."""
    if tp in (list, tuple):
        return [SequenceKey(i) for i in range(arity)]
    if tp is dict or tp is collections.OrderedDict:
        keys = list(data)
    elif tp is collections.defaultdict:
        keys = list(data[1])
    elif is_namedtuple(tp, data, arity):
        return [GetAttrKey(f) for f in tp._fields]
    else:
        fields = dataclass_data_fields(tp, arity)
        if fields is not None:
            return [GetAttrKey(f) for f in fields]
        return [FlattenedIndexKey(i) for i in range(arity)]
    if len(keys) != arity:
        return [FlattenedIndexKey(i) for i in range(arity)]
    return [DictKey(k) for k in keys]


def parse_state(state: Any) -> list[StateNode]:
    """Parses a state tuple into nodes (root last), with children and key paths (linear time).

    Raises:
        ValueError: the state is not a well-formed single tree.

    >>> import fastree.tree_util as tu
    >>> nodes = parse_state(tu.tree_structure({'a': [1, (2,)]})._state())
    >>> [(n.type.__name__ if n.type else '*', tu.keystr(n.path)) for n in nodes[1:]]
    [('*', "['a'][1][0]"), ('tuple', "['a'][1]"), ('list', "['a']"), ('dict', '')]
    """
    if not (isinstance(state, tuple) and len(state) == 2 and state[0] == STATE_VERSION):
        raise ValueError(f"Unsupported PyTreeDef state: {state!r:.80}")
    nodes: list[StateNode] = []
    open_roots: list[int] = []  # roots of subtrees not yet claimed by a parent
    for i, entry in enumerate(state[1]):
        tp, data, arity, ref = entry
        if arity < 0 or arity > len(open_roots) or (tp is None and arity != 0):
            raise ValueError(f"Malformed PyTreeDef state: bad arity at entry {i}.")
        if ref >= 0 and (tp is not None or ref >= i):
            raise ValueError(f"Malformed PyTreeDef state: bad reference at entry {i}.")
        node = StateNode(i, tp, data, arity, ref)
        if arity:
            node.children = open_roots[-arity:]
            del open_roots[-arity:]
        open_roots.append(i)
        nodes.append(node)
    if len(open_roots) != 1:
        raise ValueError("Malformed PyTreeDef state: not a single tree.")
    # Parent links and keys (each node's `path` follows them up to the root). Only dict kinds'
    # keys depend on the node data; the others' are looked up once per (type, arity).
    same_keys: dict[tuple[type, int, bool], list[Any]] = {}
    for node in nodes:
        if not node.children:
            continue
        assert node.type is not None
        if node.type in _DICT_KINDS:
            keys = child_keys(node.type, node.data, node.arity)
        else:
            shape = (node.type, node.arity, node.data is None)
            keys = same_keys.get(shape) or same_keys.setdefault(
                shape, child_keys(node.type, node.data, node.arity)
            )
        for key, child in zip(keys, node.children):
            nodes[child].parent = node
            nodes[child].key = key
    return nodes
