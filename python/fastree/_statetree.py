"""A Python view of a treedef's nodes: ``PyTreeDef._nodes()`` as a tree with key paths.

Shared by structure diffs (``diagnostics/diff.py``), fingerprints/serialization (``_serialize.py``) and the
JAX conversion (``jax_interop/bridge.py``). The core describes each post-order node as ``(kind, type,
data, arity, num_leaves, ref, child_keys)``: its kind (``"leaf"``, ``"none"``, ``"tuple"``,
``"list"``, ``"dict"``, ``"namedtuple"``, ``"ordered_dict"``, ``"default_dict"``, ``"custom"``,
``"dataclass"``, ``"attribute"``, ``"shared_ref"``), its type and node data as ``node_data()`` reports them (None
for a leaf or a shared reference), its number of children, the index of the node a shared
reference repeats (-1 otherwise) and the key entries of its children. So nothing here decides a
kind or a key from a type: the one thing added is the keys of types registered with JAX's own
``register_dataclass`` only, which the core adopts as custom nodes while JAX names their
children by field (see :func:`parse_nodes`).

The pickle state (``PyTreeDef._state()``, ``(1, ((type, data, arity, ref), ...))``) stays the
core's format; :func:`parse_state` reads one through the core, which validates it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _core
from .jax_interop import compat as _jax_compat
from .jax_interop.compat import tree_util as _jtu

STATE_VERSION = 1

DICT_KINDS = ("dict", "ordered_dict", "default_dict")
"""The kinds whose children are keyed by ``DictKey`` (their node data holds the keys)."""


@dataclasses.dataclass(slots=True)
class StateNode:
    """One node, with its children (indices) and its place in the tree.

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
    kind: str = "leaf"  # the core's kind (see the module docstring)
    keys: tuple[Any, ...] = ()  # the key entries of the children, in order
    num_nodes: int = 1  # nodes in this subtree (itself included), as in the post-order list
    num_leaves: int = 0  # leaves in this subtree (a shared reference's count 0, as in the core)

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
        return self.kind == "leaf"

    @property
    def is_ref(self) -> bool:
        return self.kind == "shared_ref"

    @property
    def first(self) -> int:
        """The index of the first node of this subtree (post-order: it ends at ``index``)."""
        return self.index - self.num_nodes + 1


def _jax_dataclass_keys(tp: type, arity: int) -> tuple[Any, ...] | None:
    # A type registered with jax.tree_util.register_dataclass and not with fastree: the core
    # adopts JAX's flatten function (a custom node, FlattenedIndexKey children) while JAX keys
    # its children by field name. JAX keeps the names only inside that function.
    fields = _jax_compat.jax_dataclass_fields(tp)
    if fields is None or len(fields) != arity:
        return None
    return tuple(_jtu.GetAttrKey(f) for f in fields)


def parse_nodes(treedef: _core.PyTreeDef) -> list[StateNode]:
    """The nodes of ``treedef`` (post-order, root last) with children and key paths; linear.

    >>> import fastree.tree_util as tu
    >>> nodes = parse_nodes(tu.tree_structure({'a': [1, (2,)]}))
    >>> [(n.kind, tu.keystr(n.path)) for n in nodes[1:]]
    [('leaf', "['a'][1][0]"), ('tuple', "['a'][1]"), ('list', "['a']"), ('dict', '')]
    """
    nodes: list[StateNode] = []
    roots: list[int] = []  # subtrees not yet claimed by a parent (the core's list is well formed)
    jax_keys: dict[tuple[type, int], tuple[Any, ...] | None] = {}
    for i, (kind, tp, data, arity, leaves, ref, keys) in enumerate(treedef._nodes()):
        node = StateNode(i, tp, data, arity, ref, kind=kind, keys=keys, num_leaves=leaves)
        if arity:
            node.children = roots[-arity:]
            del roots[-arity:]
            node.num_nodes += sum(nodes[c].num_nodes for c in node.children)
            if kind == "custom":
                shape = (tp, arity)
                if shape not in jax_keys:
                    jax_keys[shape] = _jax_dataclass_keys(tp, arity)
                node.keys = jax_keys[shape] or keys
            for key, child in zip(node.keys, node.children):
                nodes[child].parent = node
                nodes[child].key = key
        roots.append(i)
        nodes.append(node)
    return nodes


def parse_state(state: Any) -> list[StateNode]:
    """:func:`parse_nodes` of the treedef a ``PyTreeDef._state()`` tuple describes.

    Raises:
        ValueError: the state is not a well-formed single tree (the core's check).

    >>> import fastree.tree_util as tu
    >>> nodes = parse_state(tu.tree_structure({'a': [1, (2,)]})._state())
    >>> [(n.type.__name__ if n.type else '*', tu.keystr(n.path)) for n in nodes[1:]]
    [('*', "['a'][1][0]"), ('tuple', "['a'][1]"), ('list', "['a']"), ('dict', '')]
    """
    return parse_nodes(_core._treedef_from_state(state))


def subtree_state(nodes: list[StateNode], node: StateNode) -> tuple[int, tuple[Any, ...]]:
    """The ``_state()`` of the subtree rooted at ``node``, for ``_core._treedef_from_state``.

    Its entries are the subtree's slice of the post-order list, with shared references
    renumbered from the subtree's first node. Every reference in the subtree must point into
    it (the caller checks).
    """
    first = node.first
    entries = tuple(
        (n.type, n.data, n.arity, n.ref - first if n.ref >= 0 else -1)
        for n in nodes[first : node.index + 1]
    )
    return (STATE_VERSION, entries)
