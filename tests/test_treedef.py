"""fastree.PyTreeDef methods, compared with the equivalent JAX treedef."""

import copy
import pickle

import fastree
import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from helpers import (
    TREE_DICT,
    TREES,
    NodeClass,
    Pair,
    Point,
    assert_leaves_identical,
    assert_same_treedef,
    assert_trees_equal,
    parametrize,
    requires_jax,
)

JAX_REGISTRY = jtu.default_registry


def _both(tree):
    return tu.tree_structure(tree), jtu.tree_structure(tree)


@parametrize(tree=TREE_DICT)
def test_repr_and_str_match_jax(tree):
    ftd, jtd = _both(tree)
    assert repr(ftd) == repr(jtd)
    assert str(ftd) == str(jtd)


@parametrize(tree=TREE_DICT)
def test_counts(tree):
    ftd, jtd = _both(tree)
    assert ftd.num_leaves == jtd.num_leaves
    assert ftd.num_nodes == jtd.num_nodes
    assert isinstance(ftd.num_leaves, int) and isinstance(ftd.num_nodes, int)


@parametrize(tree=TREE_DICT)
def test_to_jax_from_jax(tree):
    ftd, jtd = _both(tree)
    converted = ftd.to_jax()
    assert isinstance(converted, jtu.PyTreeDef)
    assert converted == jtd
    back = fastree.from_jax(jtd)
    assert isinstance(back, fastree.PyTreeDef)
    assert back == ftd
    assert fastree.from_jax(ftd.to_jax()) == ftd
    # the converted treedef is usable by JAX itself
    leaves = jtu.tree_leaves(tree)
    assert_trees_equal(converted.unflatten(leaves), jtd.unflatten(leaves), identical_leaves=True)
    assert_trees_equal(back.unflatten(leaves), jtd.unflatten(leaves), identical_leaves=True)


def test_equality_matrix_matches_jax():
    # trees built twice so equality cannot be identity
    trees_a = list(TREE_DICT.values())
    trees_b = [copy.deepcopy(t) for t in trees_a]
    f = [tu.tree_structure(t) for t in trees_a]
    fb = [tu.tree_structure(t) for t in trees_b]
    j = [jtu.tree_structure(t) for t in trees_a]
    for i in range(len(f)):
        assert f[i] == fb[i] and not (f[i] != fb[i])
        assert hash(f[i]) == hash(fb[i])
        for k in range(len(f)):
            assert (f[i] == f[k]) == (j[i] == j[k]), (i, k)
            assert (f[i] != f[k]) == (j[i] != j[k]), (i, k)


@parametrize(tree=TREE_DICT)
def test_equal_treedefs_hash_equal(tree):
    a = tu.tree_structure(tree)
    b = tu.tree_structure(copy.deepcopy(tree))
    assert a == b
    assert hash(a) == hash(b)
    assert isinstance(hash(a), int)
    assert len({a, b}) == 1


def test_aux_data_compared_with_eq():
    class Aux:
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            return isinstance(other, Aux) and self.v == other.v

        __hash__ = None  # unhashable aux data must still allow hashing the treedef

    a = tu.tree_structure(Pair(1, 2, tag=Aux(1)))
    b = tu.tree_structure(Pair(1, 2, tag=Aux(1)))
    c = tu.tree_structure(Pair(1, 2, tag=Aux(2)))
    assert a == b and a != c and not (a == c)
    assert hash(a) == hash(b)
    ja, jc = jtu.tree_structure(Pair(1, 2, tag=Aux(1))), jtu.tree_structure(Pair(1, 2, tag=Aux(2)))
    assert (a == c) == (ja == jc)


def test_dict_keys_in_equality():
    assert tu.tree_structure({"a": 1}) != tu.tree_structure({"b": 1})
    assert tu.tree_structure({"a": 1, "b": 2}) == tu.tree_structure({"b": 3, "a": 4})
    assert tu.tree_structure(NodeClass(1, meta=(1,))) != tu.tree_structure(NodeClass(1, meta=(2,)))
    assert tu.tree_structure(Point(1, 2, label="a")) != tu.tree_structure(Point(1, 2, label="b"))


def test_dict_keys_equal_but_distinct_objects():
    # equality takes a shortcut for identical key objects; equal distinct ones must still match
    k1, k2 = "".join(["ke", "y"]), "".join(["k", "ey"])
    assert k1 == k2 and k1 is not k2
    a, b = tu.tree_structure({k1: 1, "z": 2}), tu.tree_structure({k2: 1, "z": 2})
    assert a == b and not (a != b) and hash(a) == hash(b)
    for x, y in [({1: 0}, {1.0: 0}), ({1: 0}, {True: 0}), ({(1, "a"): 0}, {(1, "a"): 0})]:
        assert (tu.tree_structure(x) == tu.tree_structure(y)) == (
            jtu.tree_structure(x) == jtu.tree_structure(y)
        )


@parametrize(tree=TREE_DICT)
def test_pickle_round_trip(tree):
    ftd = tu.tree_structure(tree)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        restored = pickle.loads(pickle.dumps(ftd, protocol=protocol))
        assert isinstance(restored, fastree.PyTreeDef)
        assert restored == ftd
        assert hash(restored) == hash(ftd)
        assert repr(restored) == repr(ftd)
        assert restored.to_jax() == jtu.tree_structure(tree)


@parametrize(tree=TREE_DICT)
def test_children(tree):
    ftd, jtd = _both(tree)
    fch, jch = ftd.children(), jtd.children()
    assert isinstance(fch, list)
    assert len(fch) == len(jch)
    for fc, jc in zip(fch, jch):
        assert_same_treedef(fc, jc)
    tch = tu.treedef_children(ftd)
    assert len(tch) == len(jch)
    for fc, jc in zip(tch, jch):
        assert_same_treedef(fc, jc)


@parametrize(tree=TREE_DICT)
def test_treedef_is_leaf(tree):
    ftd, jtd = _both(tree)
    assert tu.treedef_is_leaf(ftd) == jtu.treedef_is_leaf(jtd)


@parametrize(tree=TREE_DICT)
def test_node_data(tree):
    ftd, jtd = _both(tree)
    assert ftd.node_data() == jtd.node_data()
    fnd = ftd.node_data()
    if fnd is not None:
        assert type(fnd) is tuple and fnd[0] is jtd.node_data()[0]


@requires_jax("PyTreeDef.from_node_data_and_children")
@parametrize(tree=TREE_DICT)
def test_from_node_data_and_children_rebuilds(tree):
    def rebuild_fast(td):
        kids = [rebuild_fast(c) for c in td.children()]
        return fastree.PyTreeDef.from_node_data_and_children(td.node_data(), kids)

    def rebuild_jax(td):
        kids = [rebuild_jax(c) for c in td.children()]
        return jtu.PyTreeDef.from_node_data_and_children(JAX_REGISTRY, td.node_data(), kids)

    ftd, jtd = _both(tree)
    rebuilt = rebuild_fast(ftd)
    assert isinstance(rebuilt, fastree.PyTreeDef)
    assert rebuilt == ftd
    assert_same_treedef(rebuilt, rebuild_jax(jtd))


@requires_jax("PyTreeDef.from_node_data_and_children")
def test_from_node_data_and_children_builds_new_structure():
    leaf = tu.tree_structure(1)
    inner = tu.tree_structure((1, 2))
    built = fastree.PyTreeDef.from_node_data_and_children((dict, ["x", "y"]), [leaf, inner])
    assert built == tu.tree_structure({"x": 0, "y": (0, 0)})
    jbuilt = jtu.PyTreeDef.from_node_data_and_children(
        JAX_REGISTRY, (dict, ["x", "y"]), [leaf.to_jax(), inner.to_jax()]
    )
    assert_same_treedef(built, jbuilt)
    custom = fastree.PyTreeDef.from_node_data_and_children((Pair, "t"), [leaf, leaf])
    assert_trees_equal(custom.unflatten([1, 2]), Pair(1, 2, tag="t"))


@parametrize(tree=TREE_DICT)
def test_walk(tree):
    def f_node(children, node_data):
        return ("node", tuple(children), node_data)

    def f_leaf(x):
        return ("leaf", x)

    ftd, jtd = _both(tree)
    leaves = list(range(ftd.num_leaves))
    assert ftd.walk(f_node, f_leaf, leaves) == jtd.walk(f_node, f_leaf, leaves)


def test_walk_call_order_matches_jax():
    tree = {"a": [1, (2, None)], "b": Pair(3, NodeClass(4, 5))}
    ftd, jtd = _both(tree)

    def run(td):
        log = []
        td.walk(
            lambda ch, nd: log.append(("n", tuple(ch), nd)) or len(log),
            lambda x: log.append(("l", x)) or len(log),
            "wxyz!",
        )
        return log

    assert run(ftd) == run(jtd)


COMPOSE_CASES = {
    "tuple_dict": ((1, [2]), {"a": 1, "b": None}),
    "leaf_outer": (1, (1, 2)),
    "leaf_inner": ([1, 2], 0),
    "none_inner": ([1, 2], None),
    "custom": (Pair(1, 2), NodeClass(1, (2,))),
    "empty_outer": ((), [1]),
    "nested": ({"x": Pair(1, [2])}, Point(1, [2, 3])),
}


@parametrize(case=COMPOSE_CASES)
def test_compose(case):
    outer, inner = case
    fo, jo = _both(outer)
    fi, ji = _both(inner)
    composed = fo.compose(fi)
    assert_same_treedef(composed, jo.compose(ji))
    assert composed.num_leaves == fo.num_leaves * fi.num_leaves


TREEDEF_TUPLE_CASES = {
    "empty": [],
    "one": [(1, 2)],
    "many": [{"a": 1}, None, 5, Pair(1, 2)],
}


@parametrize(trees=TREEDEF_TUPLE_CASES)
def test_treedef_tuple(trees):
    ftds = [tu.tree_structure(t) for t in trees]
    jtds = [jtu.tree_structure(t) for t in trees]
    got = tu.treedef_tuple(ftds)
    assert_same_treedef(got, jtu.treedef_tuple(jtds))
    assert got == tu.tree_structure(tuple(trees))
    # any iterable of treedefs is accepted
    assert tu.treedef_tuple(iter(ftds)) == got
    assert tu.treedef_tuple(tuple(ftds)) == got


FROM_ITERABLE_CASES = {
    "dict": ({"a": (1, 2), "b": [3]}, [[4, 5], [6]]),
    "subtree_leaves": ({"a": (1, 2), "b": [3]}, ([4, 5], [[6, 7]])),
    "leaf": (1, "whole"),
    "none": ([None, 1], [None, 2]),
    "nested": ([(1, (2, 3))], [[9, [8, 7]]]),
    "custom": (Pair(1, [2]), [10, [20]]),
}


@parametrize(case=FROM_ITERABLE_CASES)
def test_from_iterable_tree(case):
    tree, iterable = case
    ftd, jtd = _both(tree)
    try:
        expected = jtd.from_iterable_tree(iterable)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)) as info:
            ftd.from_iterable_tree(iterable)
        assert str(info.value) == str(e)
    else:
        assert_trees_equal(ftd.from_iterable_tree(iterable), expected, identical_leaves=True)


FLATTEN_UP_TO_CASES = {
    "same": ({"a": 1, "b": (2, 3)}, {"a": 1, "b": (2, 3)}),
    "subtrees": ({"a": 1, "b": (2, 3)}, {"a": [1, {"z": 2}], "b": ((3,), None)}),
    "leaf_prefix": (0, {"whole": [1, 2]}),
    "none_matches_none": ([None, 1], [None, (5, 6)]),
    "namedtuple": (TREE_DICT["namedtuple"], TREE_DICT["namedtuple"]._replace(a=(1, 2))),
    "custom": (Pair(1, 2), Pair([1], {"q": 2})),
    "dataclass": (Point(1, 2), Point((1, 1), [2])),
    "ordered_dict": (TREE_DICT["ordered_dict"], TREE_DICT["ordered_dict"]),
    "defaultdict": (TREE_DICT["defaultdict"], TREE_DICT["defaultdict"]),
    "static": (TREE_DICT["static_in_tree"], TREE_DICT["static_in_tree"]),
    "partial": (TREE_DICT["partial"], TREE_DICT["partial"]),
}


@parametrize(case=FLATTEN_UP_TO_CASES)
def test_flatten_up_to(case):
    prefix, full = case
    ftd, jtd = _both(prefix)
    got = ftd.flatten_up_to(full)
    assert isinstance(got, list)
    assert_leaves_identical(got, jtd.flatten_up_to(full))


@pytest.mark.parametrize("tree", TREES[:5])
def test_treedef_not_equal_to_other_objects(tree):
    td = tu.tree_structure(tree)
    assert not (td == repr(td))
    assert not (td == None)  # noqa: E711
    assert td != tu.tree_structure([tree, tree])


def test_methods_take_their_arguments_by_keyword_as_in_jax():
    tree = {"a": (1, 2), "b": [3]}
    td, jtd = tu.tree_structure(tree), jtu.tree_structure(tree)
    assert td.flatten_up_to(tree=tree) == jtd.flatten_up_to(tree=tree)

    def f_node(children, node_data):
        return sum(children)

    def f_leaf(x):
        return x * 10

    assert td.walk(f_node, f_leaf, leaves=[1, 2, 3]) == jtd.walk(f_node, f_leaf, leaves=[1, 2, 3])
    assert td.walk(f_node=f_node, f_leaf=f_leaf, leaves=[1, 2, 3]) == 60
    assert jtd.walk(f_node=f_node, f_leaf=f_leaf, leaves=[1, 2, 3]) == 60
    rebuilt = fastree.PyTreeDef.from_node_data_and_children(
        registry=tu.default_registry, node_data=td.node_data(), children=td.children()
    )
    assert rebuilt == td
    assert fastree.PyTreeDef.from_node_data_and_children(
        node_data=td.node_data(), children=td.children()
    ) == td


@pytest.mark.parametrize(
    "call",
    [
        lambda td: td.unflatten(leaves=[1]),  # positional-only, as in JAX
        lambda td: td.compose(inner=td),
        lambda td: td.flatten_up_to(bogus=[1]),
        lambda td: td.flatten_up_to([1], tree=[1]),
        lambda td: td.flatten_up_to(),
        lambda td: td.walk(lambda c, d: c, lambda x: x),
        lambda td: fastree.PyTreeDef.from_node_data_and_children(node_data=td.node_data()),
    ],
    ids=[
        "unflatten_keyword",
        "compose_keyword",
        "unknown_keyword",
        "given_twice",
        "missing",
        "walk_missing",
        "missing_children",
    ],
)
def test_method_argument_errors(call):
    with pytest.raises(TypeError):
        call(tu.tree_structure([1]))
