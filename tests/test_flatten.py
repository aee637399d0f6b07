"""tree_flatten / tree_leaves / tree_structure / tree_unflatten against jax.tree_util."""

import collections
import copy
import sys

from fastree.jax_interop.compat import tree as jt  # JAX's own, installed or not
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import numpy as np
import pytest
from helpers import (
    NodeClass,
    PREDICATES,
    Pair,
    TREE_DICT,
    assert_leaves_identical,
    assert_same_treedef,
    assert_trees_equal,
    is_leaf_grid,
    parametrize,
    recursion_headroom,
)

import fastree
import fastree.tree as ft
import fastree.tree_util as tu


# is_leaf_grid leaves out the items whose predicate is False wherever `never` is asked: the
# tree's `never` item covers their code path (tests/helpers.py says why).
@is_leaf_grid(TREE_DICT, PREDICATES)
def test_flatten_matches_jax(tree, is_leaf):
    jleaves, jtd = jtu.tree_flatten(tree, is_leaf=is_leaf)
    fleaves, ftd = tu.tree_flatten(tree, is_leaf=is_leaf)
    assert type(fleaves) is list
    assert_leaves_identical(fleaves, jleaves)
    assert_same_treedef(ftd, jtd)


@is_leaf_grid(TREE_DICT, PREDICATES)
def test_leaves_and_structure_match_jax(tree, is_leaf):
    fleaves = tu.tree_leaves(tree, is_leaf=is_leaf)
    assert type(fleaves) is list
    assert_leaves_identical(fleaves, jtu.tree_leaves(tree, is_leaf=is_leaf))
    assert_same_treedef(tu.tree_structure(tree, is_leaf=is_leaf), jtu.tree_structure(tree, is_leaf))


@is_leaf_grid(TREE_DICT, PREDICATES)
def test_round_trip(tree, is_leaf):
    leaves, td = tu.tree_flatten(tree, is_leaf=is_leaf)
    rebuilt = tu.tree_unflatten(td, leaves)
    jleaves, jtd = jtu.tree_flatten(tree, is_leaf=is_leaf)
    expected = jtu.tree_unflatten(jtd, jleaves)
    assert_trees_equal(rebuilt, expected, identical_leaves=True)
    assert_trees_equal(td.unflatten(leaves), expected, identical_leaves=True)
    # the rebuilt tree re-flattens to the same structure
    assert tu.tree_structure(rebuilt, is_leaf=is_leaf) == td


@parametrize(tree=TREE_DICT)
def test_unflatten_with_new_leaves(tree):
    td, jtd = tu.tree_structure(tree), jtu.tree_structure(tree)
    new = [f"leaf{i}" for i in range(td.num_leaves)]
    assert_trees_equal(
        tu.tree_unflatten(td, new), jtu.tree_unflatten(jtd, new), identical_leaves=True
    )


@parametrize(tree=TREE_DICT)
def test_tree_module_spelling(tree):
    jleaves, jtd = jt.flatten(tree)
    fleaves, ftd = ft.flatten(tree)
    assert_leaves_identical(fleaves, jleaves)
    assert_same_treedef(ftd, jtd)
    assert_leaves_identical(ft.leaves(tree), jt.leaves(tree))
    assert_same_treedef(ft.structure(tree), jt.structure(tree))
    assert_trees_equal(
        ft.unflatten(ftd, fleaves), jt.unflatten(jtd, jleaves), identical_leaves=True
    )


@is_leaf_grid(TREE_DICT, {k: v for k, v in PREDICATES.items() if v is not None})
def test_is_leaf_call_sequence(tree, is_leaf):
    """is_leaf sees the same objects in the same order as under JAX."""

    def recorder(log):
        def pred(x):
            log.append(x)
            return is_leaf(x)

        return pred

    jlog, flog = [], []
    jtu.tree_flatten(tree, is_leaf=recorder(jlog))
    tu.tree_flatten(tree, is_leaf=recorder(flog))
    assert_leaves_identical(flog, jlog)


@pytest.mark.parametrize(
    "pred",
    [
        lambda x: None,  # None counts as False
        lambda x: np.bool_(False),
        lambda x: 1,
        lambda x: [],
        lambda x: "yes",
    ],
    ids=["none", "np_bool", "int", "list", "str"],
)
def test_is_leaf_return_value_handling(pred):
    tree = [1, (2, None), {"a": 3}]
    try:
        expected = jtu.tree_leaves(tree, is_leaf=pred)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)) as info:
            tu.tree_leaves(tree, is_leaf=pred)
        assert str(info.value) == str(e)
    else:
        assert_leaves_identical(tu.tree_leaves(tree, is_leaf=pred), expected)


def test_unflatten_accepts_any_iterable():
    tree = {"a": [1, 2], "b": (3, None)}
    td, jtd = tu.tree_structure(tree), jtu.tree_structure(tree)
    for make in (list, tuple, iter, lambda xs: (x for x in xs), np.array):
        got = tu.tree_unflatten(td, make([7, 8, 9]))
        expected = jtu.tree_unflatten(jtd, make([7, 8, 9]))
        assert_trees_equal(got, expected)


def test_leaf_treedef_unflatten_returns_object():
    obj = object()
    td = tu.tree_structure(obj)
    assert td.num_leaves == 1 and td.num_nodes == 1
    assert tu.tree_unflatten(td, [obj]) is obj
    assert tu.treedef_is_leaf(td)


@pytest.mark.parametrize(
    "tree",
    [
        {1: "a", 2.5: "b", -3: "c"},
        {"b": 1, "a": 2, "B": 3, "": 4},
        {(2, "a"): 1, (1, "b"): 2},
        {frozenset(): 1},
        # str keys sort by code point: prefixes, shared prefixes, ASCII against non-ASCII (the
        # ASCII fast comparison must agree with Python's ordering everywhere)
        {"ab": 1, "a": 2, "abc": 3, "b": 4, "aB": 5, "é": 6, "e": 7, "\u4e00": 8, "\U0001f600": 9},
        {"fc2": 1, "fc1": 2, "fc10": 3, "f": 4, "fc": 5, "\x00": 6, "\x7f": 7, "\x80": 8},
        collections.OrderedDict([(3, 0), (1, 1), (2, 2)]),
        collections.defaultdict(list, {"z": 1, "a": 2}),
    ],
    ids=[
        "numeric",
        "strings",
        "tuples",
        "single_frozenset",
        "str_code_points",
        "str_prefixes",
        "ordered",
        "defaultdict",
    ],
)
def test_dict_key_order(tree):
    assert_leaves_identical(tu.tree_leaves(tree), jtu.tree_leaves(tree))
    assert_same_treedef(tu.tree_structure(tree), jtu.tree_structure(tree))
    rebuilt = tu.tree_unflatten(tu.tree_structure(tree), tu.tree_leaves(tree))
    assert type(rebuilt) is type(tree)
    assert list(rebuilt) == list(jtu.tree_unflatten(*reversed(jtu.tree_flatten(tree))))


def test_defaultdict_factory_preserved():
    tree = collections.defaultdict(set, {"a": 1})
    rebuilt = tu.tree_unflatten(*reversed(tu.tree_flatten(tree)))
    assert type(rebuilt) is collections.defaultdict
    assert rebuilt.default_factory is set


def test_partial_round_trip_callable():
    p = jtu.Partial(lambda a, b, c=0: a * 10 + b + c, 1, c=3)
    leaves, td = tu.tree_flatten(p)
    assert_leaves_identical(leaves, jtu.tree_leaves(p))
    rebuilt = td.unflatten([4, 5])
    assert isinstance(rebuilt, jtu.Partial)
    assert rebuilt(2) == 4 * 10 + 2 + 5


@pytest.mark.parametrize("n", [0, 1, 10_000])
def test_wide_containers(n):
    for tree in ([*range(n)], tuple(range(n)), {f"k{i:05d}": i for i in range(n)}):
        assert_leaves_identical(tu.tree_leaves(tree), jtu.tree_leaves(tree))
        assert_same_treedef(tu.tree_structure(tree), jtu.tree_structure(tree))


@pytest.mark.parametrize("depth", [1, 50, 400])
def test_moderately_deep_nesting(depth):
    tree = leaf = ["x"]
    for i in range(depth):
        tree = [tree, {"d": (i,)}]
    with recursion_headroom(2000):
        assert_leaves_identical(tu.tree_leaves(tree), jtu.tree_leaves(tree))
        td = tu.tree_structure(tree)
        assert_same_treedef(td, jtu.tree_structure(tree))
        assert_trees_equal(td.unflatten(tu.tree_leaves(tree)), tree, identical_leaves=True)
    assert leaf[0] == "x"


@parametrize(tree=TREE_DICT)
def test_flatten_does_not_mutate_input(tree):
    before = copy.deepcopy(tree)
    tu.tree_flatten(tree)
    tu.tree_flatten_with_path(tree)
    assert_trees_equal(tree, before)


def test_leaves_are_not_copied():
    arr = np.zeros(3)
    lst_leaf = object()
    tree = {"a": arr, "b": [lst_leaf]}
    leaves = tu.tree_leaves(tree)
    assert leaves[0] is arr and leaves[1] is lst_leaf


def test_custom_children_iterables():
    """Custom flatten may return any iterable of children; JAX materialises it."""

    class Gen:
        def __init__(self, items):
            self.items = items

    tu.register_pytree_node(
        Gen,
        lambda g: ((x for x in g.items), len(g.items)),
        lambda n, ch: Gen(list(ch)),
    )
    tree = [Gen([1, 2, 3]), Gen([])]
    assert_leaves_identical(tu.tree_leaves(tree), jtu.tree_leaves(tree))
    assert_same_treedef(tu.tree_structure(tree), jtu.tree_structure(tree))
    rebuilt = tu.tree_unflatten(tu.tree_structure(tree), ["a", "b", "c"])
    assert rebuilt[0].items == ["a", "b", "c"] and rebuilt[1].items == []


def test_custom_unflatten_receives_same_aux_object():
    seen = []
    aux = {"unhashable": ["aux"]}

    class Box:
        def __init__(self, v):
            self.v = v

    tu.register_pytree_node(Box, lambda b: ((b.v,), aux), lambda a, ch: seen.append(a) or Box(*ch))
    td = tu.tree_structure(Box(1))
    td.unflatten([2])
    assert seen and seen[-1] is aux


def test_node_types_distinguished():
    trees = [(1,), [1], {"a": 1}, Pair(1, 2), NodeClass(1), None]
    tds = [tu.tree_structure(t) for t in trees]
    for i, a in enumerate(tds):
        for j, b in enumerate(tds):
            assert (a == b) == (i == j)


def test_fastree_module_treedef_class():
    assert isinstance(tu.tree_structure(1), fastree.PyTreeDef)


# ---- tree_structure counts the leaves it meets and keeps none (csrc/treedef/flatten.cpp,
# kLeavesMode; csrc/treedef/leaf_sequence.cpp for a tuple or list of leaves)


class _Shared:
    def __init__(self, *kids):
        self.kids = kids


tu.register_pytree_node(
    _Shared, lambda s: (s.kids, None), lambda _, kids: _Shared(*kids), preserve_identity=True
)


def _structure_cases():
    shared = _Shared(1.0, [2.0, {"w": 3.0}])
    return {
        "flat_list": [1.0] * 20,
        # Inner lists are read by the walk: their plain leaves are counted without a reference,
        # a leaf of a type met for the first time (not memoised yet) is visited.
        "nested_lists": [[1.0, 2.0], [3.0, [4.0, None]], [type("Fresh", (), {})()]],
        "flat_tuple": (1, "a", b"x"),
        "empty": [],
        "leaf_dicts": [{"kernel": np.zeros(2), "bias": 1.0} for _ in range(3)],
        "mixed": {"a": [1, (2, None)], "b": collections.OrderedDict(z=1, y=[2]),
                  "c": collections.defaultdict(list, k=[3])},
        "custom": [Pair(1, [2, 3]), NodeClass(4)],
        "shared_twice": [shared, {"again": shared}, 5.0],
        "namedtuple": collections.namedtuple("P", "x y")(1, [2, 3]),
    }


@pytest.mark.parametrize("name", list(_structure_cases()))
@pytest.mark.parametrize("is_leaf", [None, lambda x: isinstance(x, tuple)], ids=["plain", "is_leaf"])
def test_structure_is_the_flattens_treedef(name, is_leaf):
    tree = _structure_cases()[name]
    td = tu.tree_structure(tree, is_leaf=is_leaf)
    leaves, flat_td = tu.tree_flatten(tree, is_leaf=is_leaf)
    assert td == flat_td and hash(td) == hash(flat_td) and repr(td) == repr(flat_td)
    assert (td.num_leaves, td.num_nodes) == (len(leaves), flat_td.num_nodes)
    assert [d.num_leaves for d in td.children()] == [d.num_leaves for d in flat_td.children()]
    assert tu.tree_unflatten(td, leaves) is not None


@pytest.mark.parametrize("name", list(_structure_cases()))
def test_structure_takes_no_reference_to_a_leaf(name):
    tree = _structure_cases()[name]
    leaves = tu.tree_leaves(tree)
    before = [sys.getrefcount(x) for x in leaves]
    for _ in range(100):
        tu.tree_structure(tree)
    assert [sys.getrefcount(x) for x in leaves] == before


def test_structure_releases_a_leaf_only_the_walk_held_and_fails_as_flatten_does():
    # is_leaf pops the item it is asked about: the walk's reference is then its only one, which
    # tree_structure drops when the item's visit ends (its finalizer runs mid-walk) and
    # tree_flatten keeps in its leaves. The list shrank either way: both raise the same error.
    deaths = []

    class Dying:
        def __del__(self):
            deaths.append(1)

    def run(fn):
        tree = [Dying(), 1.0, 2.0]

        def is_leaf(x):
            if isinstance(x, Dying):
                tree.pop(0)
            return False

        with pytest.raises(RuntimeError, match="changed size while it was being flattened"):
            fn(tree, is_leaf=is_leaf)

    run(tu.tree_structure)
    assert deaths == [1]
    run(tu.tree_flatten)
    assert deaths == [1, 1]
