"""Identity-preserving custom nodes ("PyDAGs", issue #4).

A type registered with ``preserve_identity=True`` is flattened once per tree however many paths
reach it, recorded as a shared reference elsewhere in the treedef, and rebuilt as one object
placed at every position. These tests pin that contract: flatten/unflatten/map, treedef
equality, hashing, repr, pickle and the structural methods, sharing checks in flatten_up_to and
multi-tree maps, cycle errors, key paths, find_shared, the JAX bridge (jit/grad/vmap) and
fastree.jit, refcounts, and hypothesis properties over random DAGs.

The node types are registered once, at import (registration is global and permanent); the
classes live at module level so treedefs holding them pickle.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import pickle
import re
import sys

import jax
import jax.numpy as jnp
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastree
import fastree.tree_util as tu

SHARING_MISMATCH = "Sharing pattern mismatch"
CYCLE = "Reference cycle through an identity-preserving node: the "

# ------------------------------------------------------------------------------------------------
# node types, one per registration entry point


class Leaf:
    """A distinct, non-interned leaf object (so identity and refcount are ours alone)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Leaf({self.name!r})"


class Tag:
    """Aux data compared by value, with an identity of its own (for refcounts)."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Tag) and self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def __repr__(self):
        return f"Tag({self.value!r})"


@tu.register_dataclass(preserve_identity=True)
@dataclasses.dataclass(eq=False)
class Mod:
    """register_dataclass factory form; ``name`` is static aux data."""

    a: object
    b: object
    name: str = dataclasses.field(default="mod", metadata={"static": True})


@dataclasses.dataclass(eq=False)
class PlainMod:
    """The same shape as Mod, registered the ordinary way (JAX semantics)."""

    a: object
    b: object
    name: str = dataclasses.field(default="mod", metadata={"static": True})


tu.register_dataclass(PlainMod)


class Node:
    """register_pytree_node: any number of children and an aux tag."""

    def __init__(self, kids, tag=None):
        self.kids = list(kids)
        self.tag = tag

    def __repr__(self):
        return f"Node({self.kids!r}, {self.tag!r})"


def _flatten_node(node):
    return tuple(node.kids), node.tag


def _unflatten_node(tag, kids):
    return Node(kids, tag)


tu.register_pytree_node(Node, _flatten_node, _unflatten_node, preserve_identity=True)


class Box:
    """Plain (non-identity) node, used inside DAGs: duplicated like any JAX node."""

    def __init__(self, x):
        self.x = x


tu.register_pytree_node(Box, lambda b: ((b.x,), None), lambda _, c: Box(*c))


class KNode:
    """register_pytree_with_keys: named children."""

    def __init__(self, left, right):
        self.left, self.right = left, right


def _flatten_knode_with_keys(node):
    return ((tu.GetAttrKey("left"), node.left), (tu.GetAttrKey("right"), node.right)), None


def _unflatten_knode(_aux, kids):
    return KNode(*kids)


tu.register_pytree_with_keys(
    KNode, _flatten_knode_with_keys, _unflatten_knode, preserve_identity=True
)


class _ClassNodeBase:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def tree_flatten(self):
        return (self.x, self.y), None

    @classmethod
    def tree_unflatten(cls, _aux, kids):
        return cls(*kids)


@tu.register_pytree_node_class(preserve_identity=True)
class ClassNode(_ClassNodeBase):
    """register_pytree_node_class, factory form."""


class CallNode(_ClassNodeBase):
    """register_pytree_node_class, called with the class."""


tu.register_pytree_node_class(CallNode, preserve_identity=True)


@tu.register_pytree_node_class
class BareClassNode(_ClassNodeBase):
    """register_pytree_node_class, bare: JAX semantics."""


@tu.register_pytree_with_keys_class(preserve_identity=True)
class KeysClassNode(_ClassNodeBase):
    """register_pytree_with_keys_class, factory form."""

    def tree_flatten_with_keys(self):
        return ((tu.GetAttrKey("x"), self.x), (tu.GetAttrKey("y"), self.y)), None


@tu.register_dataclass(preserve_identity=True)
@dataclasses.dataclass(eq=False)
class Linear:
    w: object
    b: object


@tu.register_dataclass(preserve_identity=True)
@dataclasses.dataclass(eq=False)
class EncDec:
    enc: object
    dec: object


IDENTITY_TYPES = (Mod, Node, KNode, ClassNode, CallNode, KeysClassNode, Linear, EncDec)

# One factory per identity-preserving registration entry point: two children -> instance.
MAKERS = {
    "register_dataclass": lambda x, y: Mod(x, y),
    "register_pytree_node": lambda x, y: Node([x, y], Tag("t")),
    "register_pytree_with_keys": lambda x, y: KNode(x, y),
    "register_pytree_node_class(factory)": lambda x, y: ClassNode(x, y),
    "register_pytree_node_class(call)": lambda x, y: CallNode(x, y),
    "register_pytree_with_keys_class": lambda x, y: KeysClassNode(x, y),
}
maker_param = pytest.mark.parametrize("make", list(MAKERS.values()), ids=list(MAKERS))


def fresh(n=2, prefix="x"):
    return [Leaf(f"{prefix}{i}") for i in range(n)]


# ------------------------------------------------------------------------------------------------
# an independent walker: every position of every identity node, duplicates expanded


def _children(x):
    """Children of a container or node, in fastree's traversal order; None for a leaf."""
    if isinstance(x, (tuple, list)):
        return list(x)
    if isinstance(x, dict):
        return [x[k] for k in sorted(x)]
    if isinstance(x, Mod | PlainMod):
        return [x.a, x.b]
    if isinstance(x, Node):
        return list(x.kids)
    if isinstance(x, KNode):
        return [x.left, x.right]
    if isinstance(x, _ClassNodeBase):
        return [x.x, x.y]
    if isinstance(x, Box):
        return [x.x]
    if isinstance(x, Linear):
        return [x.w, x.b]
    if isinstance(x, EncDec):
        return [x.enc, x.dec]
    if x is None:
        return []
    return None


def positions(tree):
    """(identity nodes, leaves) at every traversal position, shared subtrees expanded."""
    nodes, leaves = [], []

    def walk(x):
        kids = _children(x)
        if kids is None:
            leaves.append(x)
            return
        if isinstance(x, IDENTITY_TYPES):
            nodes.append(x)
        for kid in kids:
            walk(kid)

    walk(tree)
    return nodes, leaves


def unique_leaves(tree):
    """The leaves fastree must return: each identity node's leaves once, at first occurrence."""
    seen, out = set(), []

    def walk(x):
        kids = _children(x)
        if kids is None:
            out.append(x)
            return
        if isinstance(x, IDENTITY_TYPES):
            if id(x) in seen:
                return
            seen.add(id(x))
        for kid in kids:
            walk(kid)

    walk(tree)
    return out


def aliasing(objects):
    """The id-partition of a position list: each position labelled by its object's first index."""
    first = {}
    return [first.setdefault(id(obj), i) for i, obj in enumerate(objects)]


def assert_same_aliasing(original, rebuilt, *, fresh_nodes=True):
    orig_nodes, orig_leaves = positions(original)
    new_nodes, new_leaves = positions(rebuilt)
    assert [type(n) for n in new_nodes] == [type(n) for n in orig_nodes]
    assert aliasing(new_nodes) == aliasing(orig_nodes)
    assert aliasing(new_leaves) == aliasing(orig_leaves)
    if fresh_nodes:
        originals = {id(n) for n in orig_nodes}
        assert not any(id(n) in originals for n in new_nodes)


def same_objects(xs, ys):
    return len(xs) == len(ys) and all(x is y for x, y in zip(xs, ys, strict=True))


# ------------------------------------------------------------------------------------------------
# flatten / unflatten


@maker_param
def test_pair_of_the_same_node(make):
    x0, x1 = fresh()
    m = make(x0, x1)
    leaves, treedef = tu.tree_flatten((m, m))
    assert same_objects(leaves, [x0, x1])
    assert treedef.num_leaves == 2
    text = repr(treedef)
    assert text.startswith("PyTreeDef((&1 CustomNode(") and text.endswith(", &1))")
    rebuilt = treedef.unflatten(leaves)
    assert type(rebuilt) is tuple and rebuilt[0] is rebuilt[1]
    assert type(rebuilt[0]) is type(m) and rebuilt[0] is not m
    assert same_objects(_children(rebuilt[0]), [x0, x1])


@maker_param
def test_distinct_equal_nodes_are_not_merged(make):
    x0, x1 = fresh()
    m1, m2 = make(x0, x1), make(x0, x1)
    leaves, treedef = tu.tree_flatten((m1, m2))
    assert same_objects(leaves, [x0, x1, x0, x1])
    assert "&" not in repr(treedef)
    rebuilt = treedef.unflatten(leaves)
    assert rebuilt[0] is not rebuilt[1]


def test_every_flattening_entry_point_sees_the_sharing():
    x0, x1 = fresh()
    m = Mod(x0, x1)
    tree = {"a": m, "b": [m, (m,)]}
    assert same_objects(tu.tree_leaves(tree), [x0, x1])
    assert same_objects(fastree.tree.leaves(tree), [x0, x1])
    assert tu.tree_structure(tree).num_leaves == 2
    assert tu.tree_structure(tree) == tu.tree_flatten(tree)[1]
    assert [leaf for _, leaf in tu.tree_flatten_with_path(tree)[0]] == [x0, x1]
    assert [leaf for _, leaf in tu.tree_leaves_with_path(tree)] == [x0, x1]
    assert repr(tu.tree_structure(tree)) == (
        "PyTreeDef({'a': &1 CustomNode(Mod[('mod',)], [*, *]), 'b': [&1, (&1,)]})"
    )


def test_sharing_across_builtin_containers():
    x0, x1 = fresh()
    m = Node([x0, x1], Tag("t"))
    tree = {"a": m, "b": [m]}
    leaves, treedef = tu.tree_flatten(tree)
    assert same_objects(leaves, [x0, x1])
    rebuilt = treedef.unflatten(leaves)
    assert rebuilt["a"] is rebuilt["b"][0]
    assert rebuilt["a"].tag == Tag("t")
    assert_same_aliasing(tree, rebuilt)


def test_parent_whose_children_share_a_grandchild():
    x0, x1, x2, x3 = fresh(4)
    grandchild = Linear(x0, x1)
    parent = EncDec(Node([grandchild, x2]), Node([grandchild, x3]))
    leaves, treedef = tu.tree_flatten(parent)
    assert same_objects(leaves, [x0, x1, x2, x3])
    rebuilt = treedef.unflatten(leaves)
    assert rebuilt.enc is not rebuilt.dec
    assert rebuilt.enc.kids[0] is rebuilt.dec.kids[0]
    assert rebuilt.enc.kids[0] is not grandchild
    assert_same_aliasing(parent, rebuilt)


def test_shared_node_containing_shared_nodes():
    x0, x1, x2 = fresh(3)
    inner = Linear(x0, x1)
    middle = Node([inner, inner, x2])
    tree = [middle, {"k": middle, "j": inner}]
    leaves, treedef = tu.tree_flatten(tree)
    assert same_objects(leaves, [x0, x1, x2])
    rebuilt = treedef.unflatten(leaves)
    assert rebuilt[0] is rebuilt[1]["k"]
    assert rebuilt[0].kids[0] is rebuilt[0].kids[1] is rebuilt[1]["j"]
    assert_same_aliasing(tree, rebuilt)


def test_first_occurrence_is_in_traversal_order():
    # Dict children are visited in sorted-key order: 'a' comes first although inserted last.
    x0, x1 = fresh()
    m = Mod(x0, x1)
    text = repr(tu.tree_structure({"z": [m], "a": m}))
    assert text == "PyTreeDef({'a': &1 CustomNode(Mod[('mod',)], [*, *]), 'z': [&1]})"


def test_two_unflattens_never_share():
    x0, x1 = fresh()
    m = Node([Linear(x0, x1)] * 2)
    tree = (m, [m])
    leaves, treedef = tu.tree_flatten(tree)
    first, second = treedef.unflatten(leaves), treedef.unflatten(leaves)
    ids_first = {id(n) for n in positions(first)[0]}
    ids_second = {id(n) for n in positions(second)[0]}
    ids_original = {id(n) for n in positions(tree)[0]}
    assert ids_first.isdisjoint(ids_second)
    assert ids_first.isdisjoint(ids_original) and ids_second.isdisjoint(ids_original)
    assert_same_aliasing(tree, first)
    assert_same_aliasing(tree, second)
    assert_same_aliasing(tree, tu.tree_unflatten(treedef, leaves))


def test_plain_registration_keeps_jax_semantics():
    x0, x1 = fresh()
    for p in (PlainMod(x0, x1), BareClassNode(x0, x1), Box(x0)):
        tree = {"a": p, "b": [p]}
        leaves, treedef = tu.tree_flatten(tree)
        assert same_objects(leaves, jtu.tree_leaves(tree))
        assert repr(treedef) == repr(jtu.tree_structure(tree))
        assert "&" not in repr(treedef)
        rebuilt = treedef.unflatten(leaves)
        assert rebuilt["a"] is not rebuilt["b"][0]
        assert fastree.from_jax(jtu.tree_structure(tree)) == treedef


def test_unflatten_checks_the_unique_leaf_count():
    m = Mod(1.0, 2.0)
    treedef = tu.tree_structure((m, m))
    with pytest.raises(ValueError, match=re.escape("Too many leaves for PyTreeDef; expected 2.")):
        treedef.unflatten([1, 2, 3, 4])
    with pytest.raises(
        ValueError, match=re.escape("Too few leaves for PyTreeDef; expected 2, got 1")
    ):
        treedef.unflatten([1])


# ------------------------------------------------------------------------------------------------
# tree_map


def test_tree_map_calls_once_per_unique_leaf_and_keeps_sharing():
    x0, x1, x2 = fresh(3)
    m = Mod(x0, Node([x1]))
    tree = {"a": m, "b": [m, m], "c": x2}
    calls = []

    def f(x):
        calls.append(x)
        return Leaf(x.name + "'")

    out = tu.tree_map(f, tree)
    assert same_objects(calls, [x0, x1, x2])
    assert out["a"] is out["b"][0] is out["b"][1]
    assert out["a"].b is not m.b
    assert [leaf.name for leaf in tu.tree_leaves(out)] == ["x0'", "x1'", "x2'"]
    assert_same_aliasing(tree, tu.tree_map(lambda x: x, tree))


def test_tree_map_with_path_sees_first_occurrence_paths():
    x0, x1 = fresh()
    m = KNode(x0, x1)
    seen = []
    out = tu.tree_map_with_path(lambda p, x: seen.append(tu.keystr(p)) or x, {"b": [m], "a": m})
    assert seen == ["['a'].left", "['a'].right"]
    assert out["a"] is out["b"][0]


def test_multi_tree_map_with_matching_sharing():
    m, n = Mod(1, 2), Mod(10, 20)
    calls = []
    out = tu.tree_map(lambda x, y: calls.append((x, y)) or x + y, (m, [m]), (n, [n]))
    assert calls == [(1, 10), (2, 20)]
    assert out[0] is out[1][0] and (out[0].a, out[0].b) == (11, 22)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("shared", "distinct", id="first-shares"),
        pytest.param("distinct", "shared", id="second-shares"),
    ],
)
def test_multi_tree_map_sharing_mismatch(first, second):
    def build(kind):
        m1, m2 = Mod(1, 2), Mod(1, 2)
        return {"x": [m1, {"y": m1 if kind == "shared" else m2}]}

    with pytest.raises(ValueError, match=f"^{SHARING_MISMATCH}") as info:
        tu.tree_map(lambda x, y: x, build(first), build(second))
    assert "['x'][1]['y']" in str(info.value)


# ------------------------------------------------------------------------------------------------
# flatten_up_to


def test_flatten_up_to_then_unflatten():
    x0, x1 = fresh()
    m = Node([x0, x1])
    treedef = tu.tree_structure({"a": m, "b": [m]})
    other = Node([Leaf("y0"), Leaf("y1")])
    leaves = treedef.flatten_up_to({"a": other, "b": [other]})
    assert same_objects(leaves, other.kids)
    rebuilt = treedef.unflatten(leaves)
    assert rebuilt["a"] is rebuilt["b"][0] and rebuilt["a"] is not other


def test_flatten_up_to_a_prefix_with_sharing():
    m = Mod(0, 0)
    prefix = tu.tree_structure((m, m))
    sub_a, sub_b = [Leaf("p"), Leaf("q")], {"k": Leaf("r")}
    target = Mod(sub_a, sub_b)
    leaves = prefix.flatten_up_to((target, target))
    assert leaves[0] is sub_a and leaves[1] is sub_b
    assert len(leaves) == 2


def test_flatten_up_to_treedef_shares_tree_does_not():
    m = Mod(1, 2)
    treedef = tu.tree_structure({"p": m, "q": [m]})
    with pytest.raises(ValueError, match=f"^{SHARING_MISMATCH}") as info:
        treedef.flatten_up_to({"p": Mod(1, 2), "q": [Mod(1, 2)]})
    assert "['q'][0]" in str(info.value)


def test_flatten_up_to_tree_shares_treedef_does_not():
    m = Mod(1, 2)
    treedef = tu.tree_structure({"p": Mod(1, 2), "q": [Mod(1, 2)]})
    with pytest.raises(ValueError, match=f"^{SHARING_MISMATCH}") as info:
        treedef.flatten_up_to({"p": m, "q": [m]})
    message = str(info.value)
    assert "['p']" in message and "['q'][0]" in message


# ------------------------------------------------------------------------------------------------
# treedef: equality, hash, repr, pickle, structure methods


def test_equality_and_hash_include_the_sharing_pattern():
    m, m1, m2 = Mod(1, 2), Mod(1, 2), Mod(1, 2)
    shared, distinct = tu.tree_structure((m, m)), tu.tree_structure((m1, m2))
    assert shared != distinct
    assert (shared == distinct) is False
    assert shared == tu.tree_structure((m2, m2))
    assert hash(shared) == hash(tu.tree_structure((m1, m1)))
    assert distinct == tu.tree_structure((Mod(3, 4), Mod(5, 6)))
    # Which positions share matters, not only how many references there are.
    a, b = Mod(1, 2), Mod(1, 2)
    assert tu.tree_structure((a, a, b)) != tu.tree_structure((a, b, b))
    assert tu.tree_structure((a, b, a)) != tu.tree_structure((a, b, b))


def test_equality_with_different_aux_data():
    m, n = Mod(1, 2, name="x"), Mod(1, 2, name="y")
    assert tu.tree_structure((m, m)) != tu.tree_structure((n, n))


def test_repr_numbers_each_shared_node():
    a, b = Mod(1, 2), Node([3])
    text = repr(tu.tree_structure([a, b, a, b]))
    assert text == (
        "PyTreeDef([&1 CustomNode(Mod[('mod',)], [*, *]), &2 CustomNode(Node[None], [*]), &1, &2])"
    )


def _pair():
    m = Mod(1, 2)
    return (m, m)


def _dict():
    m = Node([1, 2], Tag("t"))
    return {"a": m, "b": [m]}


def _grandchild():
    g = Linear(1, 2)
    return EncDec(Node([g, 3]), Node([g, 4]))


@pytest.mark.parametrize(
    "tree",
    [_pair, _dict, _grandchild, lambda: Mod(1, 2)],
    ids=["pair", "dict", "grandchild", "unshared"],
)
def test_pickle_round_trip(tree):
    original = tree()
    leaves, treedef = tu.tree_flatten(original)
    restored = pickle.loads(pickle.dumps(treedef))
    assert restored == treedef and hash(restored) == hash(treedef)
    assert repr(restored) == repr(treedef)
    assert_same_aliasing(original, restored.unflatten(leaves))


def test_children_are_self_contained():
    x0, x1 = fresh()
    m = Mod(x0, x1)
    children = tu.tree_structure(({"a": m}, m)).children()
    assert children == [tu.tree_structure({"a": m}), tu.tree_structure(m)]
    # the second child was a reference to the node inside the first: it gets a copy of it
    assert "&" not in repr(children[1])
    rebuilt = children[1].unflatten([1, 2])
    assert isinstance(rebuilt, Mod) and (rebuilt.a, rebuilt.b) == (1, 2)
    pair_children = tu.tree_structure((m, m)).children()
    assert pair_children == [tu.tree_structure(m)] * 2
    inner_children = tu.tree_structure([Node([m, m])]).children()
    assert inner_children == [tu.tree_structure(Node([m, m]))]
    assert "&1" in repr(inner_children[0])


def test_compose_keeps_sharing_in_each_copy():
    m, m2 = Mod(1, 2), Mod(1, 2)
    composed = tu.tree_structure((0, 0)).compose(tu.tree_structure((m, m)))
    assert composed == tu.tree_structure(((m, m), (m2, m2)))
    out = composed.unflatten([1, 2, 3, 4])
    assert out[0][0] is out[0][1] and out[1][0] is out[1][1]
    assert out[0][0] is not out[1][0]
    # an outer treedef whose shared node has its leaves replaced by inner structures
    outer = tu.tree_structure((m, m)).compose(tu.tree_structure((0, 0)))
    n = Mod((1, 2), (3, 4))
    assert outer == tu.tree_structure((n, n))


def test_walk_folds_a_shared_node_once():
    calls = []

    def node_fn(children, _data):
        value = tuple(children)
        calls.append(value)
        return ["folded", value]

    m = Mod(1, 2)
    out = tu.tree_structure((m, {"k": m})).walk(node_fn, lambda x: x * 10, [1, 2])
    tuple_children = out[1]
    assert tuple_children[0] is tuple_children[1][1][0]
    assert tuple_children[0] == ["folded", (10, 20)]
    assert len(calls) == 3  # Mod once, the dict, the tuple


def test_from_iterable_tree_keeps_sharing():
    m = Linear(1, 2)
    out = tu.tree_structure([m, {"a": m}]).from_iterable_tree([(5, 6), {"a": (5, 6)}])
    assert out[0] is out[1]["a"]
    assert isinstance(out[0], Linear) and (out[0].w, out[0].b) == (5, 6)


def test_to_jax_and_back_within_one_object():
    inner = Linear(1.0, 2.0)
    treedef = tu.tree_structure({"model": EncDec(inner, inner), "x": 3.0})
    jax_treedef = treedef.to_jax()
    assert fastree.from_jax(jax_treedef) == treedef
    rebuilt = jax_treedef.unflatten([1.0, 2.0, 3.0])
    assert rebuilt["model"].enc is rebuilt["model"].dec


def test_to_jax_refuses_sharing_across_containers():
    # A JAX treedef can hold sharing only inside one identity-preserving node; dropping it
    # silently would hand back a different structure.
    inner = Linear(1.0, 2.0)
    treedef = tu.tree_structure({"a": [inner, inner]})
    with pytest.raises(ValueError, match="cannot express"):
        treedef.to_jax()


# ------------------------------------------------------------------------------------------------
# key paths


def test_flatten_with_path_lists_shared_leaves_once():
    x0, x1 = fresh()
    m = Mod(x0, x1)
    pairs, treedef = tu.tree_flatten_with_path({"b": [m], "a": m})
    assert pairs == [
        ((tu.DictKey("a"), tu.GetAttrKey("a")), x0),
        ((tu.DictKey("a"), tu.GetAttrKey("b")), x1),
    ]
    assert treedef == tu.tree_structure({"b": [m], "a": m})


def test_paths_of_nested_sharing():
    x0, x1, x2 = fresh(3)
    inner = KNode(x0, x1)
    tree = [Node([x2, inner]), inner]
    paths = [tu.keystr(p) for p, _ in tu.tree_leaves_with_path(tree)]
    assert paths == ["[0][<flat index 0>]", "[0][<flat index 1>].left", "[0][<flat index 1>].right"]


# ------------------------------------------------------------------------------------------------
# cycles


def _self_cycle():
    node = Node([Leaf("x")])
    node.kids.append(node)
    return {"a": [node]}


def _cycle_through_builtins():
    a = Node([Leaf("x")])
    b = KNode(Leaf("y"), a)
    a.kids.append({"z": [b]})
    return (0, a)


@pytest.mark.parametrize(
    "flatten",
    [tu.tree_flatten, tu.tree_leaves, tu.tree_flatten_with_path, tu.tree_structure],
    ids=["tree_flatten", "tree_leaves", "tree_flatten_with_path", "tree_structure"],
)
@pytest.mark.parametrize(
    ("build", "path"),
    [(_self_cycle, "['a'][0]"), (_cycle_through_builtins, "[1]")],
    ids=["self", "through-builtins"],
)
def test_reference_cycle_raises(flatten, build, path):
    with pytest.raises(ValueError, match=re.escape(CYCLE)) as info:
        flatten(build())
    message = str(info.value)
    assert f"{Node!r} at key path {path} contains itself (again at key path {path}" in message


def test_reference_cycle_in_tree_map():
    with pytest.raises(ValueError, match=re.escape(CYCLE)):
        tu.tree_map(lambda x: x, _self_cycle())


# ------------------------------------------------------------------------------------------------
# find_shared


def test_find_shared_array_in_plain_containers():
    w = np.zeros(3)
    shared = fastree.find_shared({"a": w, "b": [w], "c": np.zeros(3)})
    assert len(shared) == 1
    assert isinstance(shared[0], fastree.SharedObject)
    assert shared[0].obj is w
    assert shared[0].paths == [(tu.DictKey("a"),), (tu.DictKey("b"), tu.SequenceKey(0))]


def test_find_shared_skips_immutable_scalars():
    s = "a string long enough not to be interned by accident"
    assert fastree.find_shared({"a": 1, "b": 1, "c": None, "d": s, "e": s, "f": 2.5}) == []
    assert fastree.find_shared([b"xy", b"xy", True, True, 1j, 1j]) == []


def test_find_shared_does_not_rewalk_a_shared_node():
    inner = Linear(Leaf("w"), Leaf("b"))
    model = EncDec(inner, inner)
    found = fastree.find_shared({"m": model, "n": model})
    assert [s.obj for s in found] == [model, inner]
    assert found[0].paths == [(tu.DictKey("m"),), (tu.DictKey("n"),)]
    assert found[1].paths == [
        (tu.DictKey("m"), tu.GetAttrKey("enc")),
        (tu.DictKey("m"), tu.GetAttrKey("dec")),
    ]


def test_find_shared_order_and_plain_nodes():
    leaf, box = Leaf("l"), Box(Leaf("inner"))
    found = fastree.find_shared([box, leaf, box, leaf])
    assert [s.obj for s in found] == [box, leaf]
    assert found[0].paths == [(tu.SequenceKey(0),), (tu.SequenceKey(2),)]


def test_find_shared_is_leaf_and_nothing_shared():
    x = Leaf("x")
    pair = [x, x]
    found = fastree.find_shared({"a": pair, "b": pair}, is_leaf=lambda n: isinstance(n, list))
    assert [s.obj for s in found] == [pair]
    assert fastree.find_shared({"a": [Leaf(1)], "b": (Leaf(2),)}) == []


# ------------------------------------------------------------------------------------------------
# through JAX: jit, grad, vmap


def _tied_model():
    shared = Linear(jnp.arange(4.0).reshape(2, 2), jnp.ones(2))
    return EncDec(shared, shared)


def test_jax_jit_keeps_sharing_inside_the_object():
    seen = []

    @jax.jit
    def step(model, x):
        seen.append(model.enc is model.dec)
        return model, model.enc.w @ x + model.dec.b

    model = _tied_model()
    out_model, y = step(model, jnp.ones(2))
    assert seen == [True]
    assert out_model.enc is out_model.dec and out_model is not model
    np.testing.assert_allclose(y, [2.0, 6.0])


def test_grad_of_a_tied_weight_sums_both_uses():
    model = _tied_model()
    x = jnp.array([1.0, 2.0])

    def loss(m):
        return jnp.sum(m.enc.w @ x) + 3.0 * jnp.sum(m.dec.w @ x)

    grads = jax.grad(loss)(model)
    assert isinstance(grads, EncDec) and grads.enc is grads.dec
    one_use = jax.grad(lambda w: jnp.sum(w @ x))(model.enc.w)
    np.testing.assert_allclose(grads.enc.w, 4.0 * one_use)
    np.testing.assert_allclose(grads.enc.b, 0.0)


def test_vmap_keeps_sharing():
    shared = Linear(jnp.ones((3, 2, 2)), jnp.zeros((3, 2)))
    seen = []

    def f(model):
        seen.append(model.enc is model.dec)
        assert model.enc.w.shape == (2, 2)
        return model

    out = jax.vmap(f)(EncDec(shared, shared))
    assert seen == [True]
    assert out.enc is out.dec and out.enc.w.shape == (3, 2, 2)


# ------------------------------------------------------------------------------------------------
# fastree.jit


def test_fastree_jit_shares_across_arguments_and_containers():
    traces = []

    @fastree.jit
    def f(a, b, c):
        traces.append((a is b, a is c["k"][0]))
        return {"x": a, "y": [b, c["k"][0]]}, a.w @ jnp.ones(2)

    lin = Linear(jnp.eye(2), jnp.zeros(2))
    out, y = f(lin, lin, {"k": [lin]})
    assert traces == [(True, True)]
    assert out["x"] is out["y"][0] is out["y"][1] and out["x"] is not lin
    np.testing.assert_allclose(y, [1.0, 1.0])


def test_fastree_jit_retraces_only_on_structure_aux_or_sharing():
    traces = []

    @fastree.jit
    def f(a, b):
        traces.append(1)
        return a.w + b.w

    def lin(value):
        return Linear(jnp.full((2,), value), jnp.zeros(2))

    shared = lin(1.0)
    f(shared, shared)
    other = lin(5.0)
    np.testing.assert_allclose(f(other, other), [10.0, 10.0])
    assert len(traces) == 1  # only leaf values changed
    f(lin(1.0), lin(2.0))
    assert len(traces) == 2  # sharing pattern changed
    f(lin(3.0), lin(4.0))
    assert len(traces) == 2
    f(shared, Linear(jnp.ones(2), None))
    assert len(traces) == 3  # structure changed
    f(Linear(jnp.ones(3), jnp.zeros(2)), Linear(jnp.ones(3), jnp.zeros(2)))
    assert len(traces) == 4  # leaf shape changed
    g = fastree.jit(lambda a, b: (traces.append("g"), a.a + b.a)[1])
    m = Mod(jnp.ones(2), jnp.ones(2), name="first")
    g(m, m)
    g(Mod(jnp.ones(2), jnp.ones(2), name="first"), Mod(jnp.ones(2), jnp.ones(2), name="first"))
    renamed = Mod(jnp.ones(2), jnp.ones(2), name="renamed")
    g(renamed, renamed)
    assert traces.count("g") == 3  # sharing, then aux data changed
    g(Mod(jnp.zeros(2), jnp.zeros(2), name="renamed"), renamed)
    assert traces.count("g") == 4


def test_fastree_jit_static_arguments():
    traces = []

    def scale(x, n):
        traces.append(n)
        return x * n

    by_num = fastree.jit(scale, static_argnums=1)
    np.testing.assert_allclose(by_num(jnp.ones(2), 3), [3.0, 3.0])
    by_num(jnp.ones(2), 3)
    by_num(jnp.ones(2), 4)
    assert traces == [3, 4]
    by_name = fastree.jit(scale, static_argnames="n")
    np.testing.assert_allclose(by_name(jnp.ones(2), n=5), [5.0, 5.0])


def test_fastree_jit_rejects_donation():
    with pytest.raises(TypeError, match="donate_argnums"):
        fastree.jit(lambda x: x, donate_argnums=0)


def test_fastree_jit_explain_logs_the_retrace(caplog):
    f = fastree.jit(lambda a, b: a.w, explain=True)
    shared = Linear(jnp.ones(2), jnp.zeros(2))
    with caplog.at_level(logging.WARNING, logger="fastree.jit"):
        f(shared, shared)
        f(shared, Linear(jnp.ones(2), jnp.zeros(2)))
    assert any("retrace" in record.getMessage() for record in caplog.records)


# ------------------------------------------------------------------------------------------------
# the table of entered objects: each thread's walks reuse one, sized by the walk before


def _chain_with_a_repeat(n):
    """n distinct Mods in a list, then the first one again: one repeat, found last."""
    mods = [Mod(Leaf(f"a{i}"), Leaf(f"b{i}")) for i in range(n)]
    return [*mods, mods[0]], mods


@pytest.mark.parametrize("sizes", [(3000, 2, 3000), (2, 3000, 2), (1, 1, 40_000, 1)])
def test_sharing_is_found_whatever_the_walk_before(sizes):
    # A walk starts with a table sized for the previous one: a big table after a big walk, a
    # small one that must grow after a small walk.
    for n in sizes:
        tree, mods = _chain_with_a_repeat(n)
        leaves, treedef = tu.tree_flatten(tree)
        assert len(leaves) == 2 * n
        rebuilt = treedef.unflatten(leaves)
        assert rebuilt[0] is rebuilt[-1] and rebuilt[0] is not mods[0]
        assert len({id(m) for m in rebuilt}) == n
        mapped = tu.tree_map(lambda x: x, tree)
        assert mapped[0] is mapped[-1] and len({id(m) for m in mapped}) == n


def test_a_walk_inside_a_flatten_function_keeps_its_own_table():
    inner_tree, inner_mods = _chain_with_a_repeat(500)
    inner_counts = []

    class Outer:
        def __init__(self, kids):
            self.kids = kids

    def flatten_outer(node):
        # A whole identity-preserving walk, bigger than the outer one, mid-walk.
        leaves, treedef = tu.tree_flatten(inner_tree)
        rebuilt = treedef.unflatten(leaves)
        inner_counts.append((len(leaves), len({id(m) for m in rebuilt}), rebuilt[0] is rebuilt[-1]))
        return tuple(node.kids), None

    tu.register_pytree_node(
        Outer, flatten_outer, lambda _, kids: Outer(list(kids)), preserve_identity=True
    )
    shared = Mod(Leaf("s"), Leaf("t"))
    tree = [Outer([shared, Mod(Leaf("u"), Leaf("v"))]), shared, Outer([shared])]
    leaves, treedef = tu.tree_flatten(tree)
    assert inner_counts == [(1000, 500, True)] * 2
    assert len(leaves) == 4  # s, t, u, v: the shared Mod once
    rebuilt = treedef.unflatten(leaves)
    assert rebuilt[1] is rebuilt[0].kids[0] is rebuilt[2].kids[0]
    mapped = tu.tree_map(lambda x: x, tree)
    assert mapped[1] is mapped[0].kids[0] is mapped[2].kids[0]


def test_a_cycle_after_the_table_grew_names_both_paths():
    tree, _ = _chain_with_a_repeat(300)
    tu.tree_flatten([Mod(1, 2)])  # the next walk starts with a small table, and grows it
    loop = Node([Leaf("x")])
    loop.kids.append(loop)
    with pytest.raises(ValueError, match=re.escape(CYCLE)) as info:
        tu.tree_flatten([tree, loop])
    assert "at key path [1] contains itself (again at key path [1][<flat index 1>])" in str(
        info.value
    )
    with pytest.raises(ValueError, match=re.escape("Reference cycle")):
        tu.tree_map(lambda x: x, [tree, loop])


def test_entered_objects_are_released_when_a_walk_fails():
    class Boom:
        pass

    def refuse(_):
        raise RuntimeError("boom")

    tu.register_pytree_node(Boom, refuse, lambda *_: Boom(), preserve_identity=True)
    tree, mods = _chain_with_a_repeat(200)
    before = [sys.getrefcount(m) for m in mods]
    for walk in (tu.tree_flatten, tu.tree_leaves, tu.tree_structure, tu.tree_flatten_with_path):
        with pytest.raises(RuntimeError, match="boom"):
            walk([tree, Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        tu.tree_map(lambda x: x, [tree, Boom()])
    gc.collect()
    assert [sys.getrefcount(m) for m in mods] == before


# ------------------------------------------------------------------------------------------------
# refcounts


def test_refcounts_unchanged_after_many_calls():
    leaves = fresh(3)
    tag = Tag("aux")
    name = "static name not interned " * 2
    m = Node([leaves[0], Mod(leaves[1], leaves[2], name=name)], tag)
    tree = {"a": m, "b": [m, (m,)]}
    watched = [*leaves, tag, name, m, m.kids[1]]

    def cycle():
        flat, treedef = tu.tree_flatten(tree)
        rebuilt = treedef.unflatten(flat)
        mapped = tu.tree_map(lambda x: x, tree)
        paths = tu.tree_flatten_with_path(tree)
        return rebuilt, mapped, paths, treedef.flatten_up_to(tree)

    cycle()
    gc.collect()
    before = [sys.getrefcount(obj) for obj in watched]
    for _ in range(10_000):
        cycle()
    gc.collect()
    assert [sys.getrefcount(obj) for obj in watched] == before


# ------------------------------------------------------------------------------------------------
# properties over random DAGs


@st.composite
def dags(draw):
    """Identity nodes built bottom-up (each may hold earlier ones), mixed with builtins."""
    pool = []
    counter = iter(range(10**6))

    def child(depth):
        options = ["leaf", "int"] + (["node", "node"] if pool else [])
        options += ["tuple", "list", "dict", "box"] if depth < 2 else []
        kind = draw(st.sampled_from(options))
        if kind == "leaf":
            return Leaf(next(counter))
        if kind == "int":
            return draw(st.integers(0, 3))
        if kind == "node":
            return draw(st.sampled_from(pool))
        if kind == "box":
            return Box(child(depth + 1))
        kids = [child(depth + 1) for _ in range(draw(st.integers(0, 3)))]
        if kind == "tuple":
            return tuple(kids)
        if kind == "list":
            return kids
        return {f"k{i}": kid for i, kid in enumerate(kids)}

    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["mod", "node", "knode", "class"]))
        if kind == "mod":
            pool.append(Mod(child(0), child(0), name=draw(st.sampled_from("xy"))))
        elif kind == "node":
            kids = [child(0) for _ in range(draw(st.integers(0, 3)))]
            pool.append(Node(kids, Tag(draw(st.integers(0, 1)))))
        elif kind == "knode":
            pool.append(KNode(child(0), child(0)))
        else:
            pool.append(ClassNode(child(0), child(0)))
    roots = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
    extra = [child(0) for _ in range(draw(st.integers(0, 2)))]
    layout = draw(st.sampled_from(["list", "tuple", "dict"]))
    items = roots + extra
    if layout == "list":
        return items
    if layout == "tuple":
        return tuple(items)
    return {f"r{i}": item for i, item in enumerate(items)}


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(tree=dags())
def test_unflatten_reproduces_the_aliasing_graph(tree):
    leaves, treedef = tu.tree_flatten(tree)
    assert same_objects(leaves, unique_leaves(tree))
    assert treedef.num_leaves == len(leaves)
    rebuilt = treedef.unflatten(leaves)
    assert_same_aliasing(tree, rebuilt)
    assert tu.tree_structure(rebuilt) == treedef
    assert hash(tu.tree_structure(rebuilt)) == hash(treedef)
    again = treedef.unflatten(leaves)
    assert {id(n) for n in positions(again)[0]}.isdisjoint(id(n) for n in positions(rebuilt)[0])
    assert same_objects(treedef.flatten_up_to(tree), leaves)
    nodes = positions(tree)[0]
    assert ("&" in repr(treedef)) == (len({id(n) for n in nodes}) < len(nodes))


@SETTINGS
@given(tree=dags())
def test_identity_map_reproduces_the_aliasing_graph(tree):
    calls = []
    mapped = tu.tree_map(lambda x: calls.append(x) or x, tree)
    assert same_objects(calls, unique_leaves(tree))
    assert_same_aliasing(tree, mapped)
    paths = [tu.keystr(p) for p, _ in tu.tree_leaves_with_path(tree)]
    assert len(paths) == len(calls) == len(set(paths))
