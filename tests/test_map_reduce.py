"""tree_map (one and several trees), reductions, transpose, broadcast, one-level flattening."""

import copy
import functools
import operator

import fastree.tree as ft
import fastree.tree_util as tu
from fastree.jax_interop.compat import tree as jt  # JAX's own, installed or not
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import numpy as np
import pytest
from helpers import (
    CUSTOM_TYPES,
    PREDICATES,
    TREE_DICT,
    TupleLeaf,
    assert_leaves_identical,
    assert_trees_equal,
    capture,
    is_leaf_grid,
    leaf_equal,
    parametrize,
    requires_jax,
    stable_id,
)


def tag(x):
    return ("mapped", type(x).__name__, repr(x))


@parametrize(tree=TREE_DICT)
def test_map_single_tree(tree):
    assert_trees_equal(tu.tree_map(tag, tree), jtu.tree_map(tag, tree))
    assert_trees_equal(ft.map(tag, tree), jt.map(tag, tree))


@parametrize(tree=TREE_DICT)
def test_map_call_order(tree):
    flog, jlog = [], []
    tu.tree_map(lambda x: flog.append(x), tree)
    jtu.tree_map(lambda x: jlog.append(x), tree)
    assert_leaves_identical(flog, jlog)


# is_leaf_grid leaves out the items whose predicate is False wherever `never` is asked: the
# tree's `never` item covers their code path (tests/helpers.py says why).
@is_leaf_grid(TREE_DICT, PREDICATES)
def test_map_is_leaf(tree, is_leaf):
    # identity map: subtrees selected by is_leaf must come back intact
    flog, jlog = [], []
    got = tu.tree_map(lambda x: flog.append(x) or x, tree, is_leaf=is_leaf)
    expected = jtu.tree_map(lambda x: jlog.append(x) or x, tree, is_leaf=is_leaf)
    assert_trees_equal(got, expected, identical_leaves=True)
    assert_leaves_identical(flog, jlog)


@parametrize(tree=TREE_DICT)
def test_map_multiple_trees(tree):
    second = jtu.tree_map(lambda x: ("second", repr(x)), tree)
    third = jtu.tree_map(lambda x: [x, {"deeper": x}], tree)  # rest trees may be deeper
    f = lambda *xs: tuple(map(repr, xs))  # noqa: E731
    assert_trees_equal(tu.tree_map(f, tree, second, third), jtu.tree_map(f, tree, second, third))
    flog, jlog = [], []
    tu.tree_map(lambda *xs: flog.append(xs), tree, second, third)
    jtu.tree_map(lambda *xs: jlog.append(xs), tree, second, third)
    assert len(flog) == len(jlog)
    for fx, jx in zip(flog, jlog):
        assert fx[0] is jx[0] and fx[1] is jx[1] and fx[2] is jx[2]


@is_leaf_grid(TREE_DICT, PREDICATES)
def test_map_multiple_trees_is_leaf(tree, is_leaf):
    other = copy.deepcopy(tree)
    flog, jlog = [], []
    got = tu.tree_map(lambda x, y: flog.append(y) or x, tree, other, is_leaf=is_leaf)
    expected = jtu.tree_map(lambda x, y: jlog.append(y) or x, tree, other, is_leaf=is_leaf)
    assert_trees_equal(got, expected, identical_leaves=True)
    assert_leaves_identical(flog, jlog)


def test_map_with_arrays():
    tree = {"w": np.arange(3.0), "b": [np.ones(2), np.float32(2)]}
    f = lambda x, y: x * 2 + y  # noqa: E731
    assert_trees_equal(tu.tree_map(f, tree, tree), jtu.tree_map(f, tree, tree))


def test_map_none_is_empty_subtree():
    tree = [None, (1, None), {"a": None}]
    calls = []
    out = tu.tree_map(lambda x: calls.append(x) or x + 1, tree)
    assert calls == [1]
    assert_trees_equal(out, jtu.tree_map(lambda x: x + 1, tree))


@parametrize(
    tree=TREE_DICT,
    initializer={"no_init": (), "init": ("start",)},
)
def test_reduce(tree, initializer):
    fn = lambda acc, x: f"{acc}|{x!r}"  # noqa: E731
    try:
        expected = jtu.tree_reduce(fn, tree, *initializer)
    except TypeError as e:  # empty tree without initializer
        with pytest.raises(TypeError) as info:
            tu.tree_reduce(fn, tree, *initializer)
        assert str(info.value) == str(e)
    else:
        assert leaf_equal(tu.tree_reduce(fn, tree, *initializer), expected)
        assert leaf_equal(ft.reduce(fn, tree, *initializer), jt.reduce(fn, tree, *initializer))


@is_leaf_grid(TREE_DICT, PREDICATES)
def test_reduce_is_leaf(tree, is_leaf):
    fn = lambda acc, x: acc + [x]  # noqa: E731
    got = tu.tree_reduce(fn, tree, [], is_leaf=is_leaf)
    assert_leaves_identical(got, jtu.tree_reduce(fn, tree, [], is_leaf=is_leaf))


@requires_jax("tree_util.tree_reduce_associative")
@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 16])
def test_reduce_associative(n):
    tree = {"xs": [(i,) for i in range(n)]}
    op = lambda a, b: f"({a}+{b})"  # noqa: E731
    expected = jtu.tree_reduce_associative(op, tree, identity="0")
    assert tu.tree_reduce_associative(op, tree, identity="0") == expected
    assert ft.reduce_associative(op, tree, identity="0") == expected
    if n == 0:
        e = capture(jtu.tree_reduce_associative, op, tree)
        with pytest.raises(type(e)) as info:
            tu.tree_reduce_associative(op, tree)
        assert str(info.value) == str(e)
    else:
        assert tu.tree_reduce_associative(op, tree) == jtu.tree_reduce_associative(op, tree)


@requires_jax("tree_util.tree_reduce_associative")
def test_reduce_associative_is_leaf():
    tree = [(1, 2), (3, 4), (5,)]
    op = lambda a, b: a + b  # noqa: E731
    is_leaf = lambda x: isinstance(x, tuple)  # noqa: E731
    assert tu.tree_reduce_associative(op, tree, is_leaf=is_leaf) == jtu.tree_reduce_associative(
        op, tree, is_leaf=is_leaf
    )


@pytest.mark.parametrize(
    "tree",
    [
        [],
        None,
        [1, 2, (3,)],
        [1, 0, 2],
        {"a": True, "b": [None, True]},
        {"a": True, "b": [False]},
        [np.array(True), np.array(False)],
        ["", "x"],
    ],
)
def test_all(tree):
    assert tu.tree_all(tree) == jtu.tree_all(tree)
    assert ft.all(tree) == jt.all(tree)


@pytest.mark.parametrize("is_leaf", [None, lambda x: isinstance(x, list)], ids=["none", "list"])
def test_all_is_leaf(is_leaf):
    tree = {"a": [0], "b": [1]}
    assert tu.tree_all(tree, is_leaf=is_leaf) == jtu.tree_all(tree, is_leaf=is_leaf)


TRANSPOSE_CASES = {
    "list_of_dicts": ([0, 0], {"a": 0, "b": 0}, [{"a": 1, "b": 2}, {"a": 3, "b": 4}]),
    "dict_of_tuples": ({"x": 0, "y": 0}, (0, 0, 0), {"x": (1, 2, 3), "y": (4, 5, 6)}),
    "custom": ((0, 0), TREE_DICT["pair"], (TREE_DICT["pair"], TREE_DICT["pair"])),
    "leaf_outer": (0, [0, 0], [1, 2]),
}


@parametrize(case=TRANSPOSE_CASES, infer_inner=[False, True])
def test_transpose(case, infer_inner):
    outer, inner, tree = case
    fo, jo = tu.tree_structure(outer), jtu.tree_structure(outer)
    fi = None if infer_inner else tu.tree_structure(inner)
    ji = None if infer_inner else jtu.tree_structure(inner)
    assert_trees_equal(tu.tree_transpose(fo, fi, tree), jtu.tree_transpose(jo, ji, tree))
    assert_trees_equal(ft.transpose(fo, fi, tree), jt.transpose(jo, ji, tree))


def test_transpose_mismatch_error():
    outer, inner, tree = [0, 0], (0, 0), [(1, 2), (3,)]
    e = capture(jtu.tree_transpose, jtu.tree_structure(outer), jtu.tree_structure(inner), tree)
    with pytest.raises(type(e)) as info:
        tu.tree_transpose(tu.tree_structure(outer), tu.tree_structure(inner), tree)
    assert str(info.value) == str(e)


BROADCAST_CASES = {
    "scalar_prefix": (1, {"a": [1, 2], "b": (3,)}),
    "partial_prefix": ([1, {"a": 2}], [[1, 2], {"a": (3, 4)}]),
    "none_prefix": ([1, None], [[1, 2], None]),
    "equal": ({"a": 1}, {"a": 2}),
    "custom": (TREE_DICT["pair"], TREE_DICT["pair"]),
}


@requires_jax("tree_util.tree_broadcast", "tree.broadcast")
@parametrize(case=BROADCAST_CASES)
def test_broadcast(case):
    prefix, full = case
    assert_trees_equal(tu.tree_broadcast(prefix, full), jtu.tree_broadcast(prefix, full))
    assert_trees_equal(ft.broadcast(prefix, full), jt.broadcast(prefix, full))


@requires_jax("tree_util.tree_broadcast")
def test_broadcast_is_leaf():
    prefix, full = [(1, 2), 3], [[4, 5], [6]]
    is_leaf = lambda x: isinstance(x, tuple)  # noqa: E731
    assert_trees_equal(
        tu.tree_broadcast(prefix, full, is_leaf=is_leaf),
        jtu.tree_broadcast(prefix, full, is_leaf=is_leaf),
    )


@pytest.mark.parametrize(
    "items",
    [
        [],
        [1, 2.0, "s", np.zeros(2)],
        [1, None],
        [1, (2,)],
        [[]],
        [TupleLeaf((1,))],
        [TREE_DICT["static"]],
        [TREE_DICT["pair"]],
    ],
)
@pytest.mark.parametrize("is_leaf", [None, lambda x: isinstance(x, tuple)], ids=["none", "tuple"])
def test_all_leaves(items, is_leaf):
    assert tu.all_leaves(items, is_leaf=is_leaf) == jtu.all_leaves(items, is_leaf=is_leaf)
    assert tu.all_leaves(iter(items), is_leaf=is_leaf) == jtu.all_leaves(
        iter(items), is_leaf=is_leaf
    )
    assert tu.all_leaves(tuple(items), is_leaf=is_leaf) == jtu.all_leaves(
        tuple(items), is_leaf=is_leaf
    )



@requires_jax("tree_util.flatten_one_level")
@parametrize(tree=TREE_DICT)
def test_flatten_one_level(tree):
    try:
        jchildren, jaux = jtu.flatten_one_level(tree)
    except ValueError as e:
        with pytest.raises(ValueError) as info:
            tu.flatten_one_level(tree)
        assert str(info.value) == str(e)
        return
    fchildren, faux = tu.flatten_one_level(tree)
    assert_leaves_identical(list(fchildren), list(jchildren))
    assert faux == jaux


@requires_jax("tree_util.flatten_one_level_with_keys")
@parametrize(tree=TREE_DICT)
def test_flatten_one_level_with_keys(tree):
    try:
        jpairs, jaux = jtu.flatten_one_level_with_keys(tree)
    except ValueError as e:
        with pytest.raises(ValueError) as info:
            tu.flatten_one_level_with_keys(tree)
        assert str(info.value) == str(e)
        return
    fpairs, faux = tu.flatten_one_level_with_keys(tree)
    fpairs, jpairs = list(fpairs), list(jpairs)
    assert faux == jaux
    assert_leaves_identical([c for _, c in fpairs], [c for _, c in jpairs])
    if not hasattr(type(tree), "_fields"):
        # JAX 0.10.2 reports GetAttrKey of the first field for every child of a namedtuple
        # here (an accident); only non-namedtuples have their one-level keys pinned.
        assert [k for k, _ in fpairs] == [k for k, _ in jpairs]


@requires_jax("tree_util.is_tree_node")
@pytest.mark.parametrize(
    "typ",
    [tuple, list, dict, type(None), int, str, np.ndarray, TupleLeaf, type(TREE_DICT["namedtuple"])]
    + [type(TREE_DICT["ordered_dict"]), type(TREE_DICT["defaultdict"]), jtu.Partial]
    + CUSTOM_TYPES,
    ids=lambda t: t.__name__,
)
def test_is_tree_node(typ):
    assert tu.is_tree_node(typ) == jtu.is_tree_node(typ)


@requires_jax("tree_util.is_tree_node")
@pytest.mark.parametrize("obj", [1, (1, 2), "a", [1], {}, TREE_DICT["namedtuple"]], ids=stable_id)
def test_is_tree_node_of_a_non_type_is_false_as_in_jax(obj):
    assert jtu.is_tree_node(obj) is False
    assert tu.is_tree_node(obj) is False


@requires_jax("tree_util.is_tree_node")
def test_is_tree_node_of_none_is_a_type_error_as_in_jax():
    with pytest.raises(TypeError):
        jtu.is_tree_node(None)
    with pytest.raises(TypeError, match="expects a type, got None"):
        tu.is_tree_node(None)


@requires_jax("tree_util.is_tree_node")
def test_is_tree_node_registered_later():
    class Late:
        pass

    assert tu.is_tree_node(Late) is False
    tu.register_pytree_node(Late, lambda x: ((), None), lambda a, c: Late())
    assert tu.is_tree_node(Late) is True
    assert jtu.is_tree_node(Late) is True


def test_reduce_sum_numbers():
    tree = {"a": [1, 2, 3], "b": (4.5, None)}
    assert tu.tree_reduce(operator.add, tree) == jtu.tree_reduce(operator.add, tree)
    assert tu.tree_reduce(operator.add, tree, 10) == functools.reduce(
        operator.add, [1, 2, 3, 4.5], 10
    )


def test_reduce_defaults_are_jax_sentinels():
    # Leaving the initializer out, or passing JAX's own "not given" marker, is the same in both.
    import inspect

    default = inspect.signature(jtu.tree_reduce).parameters["initializer"].default
    assert inspect.signature(tu.tree_reduce).parameters["initializer"].default is default
    assert tu.tree_reduce(lambda a, b: a + b, [1, 2], default) == 3
    assert tu.tree_reduce(lambda a, b: a + b, [1, 2], 10) == 13
    if type(default) is not object:  # a marker class (recent JAX): any instance of it counts
        fresh = type(default)()
        assert jtu.tree_reduce(lambda a, b: a + b, [1, 2], fresh) == 3
        assert tu.tree_reduce(lambda a, b: a + b, [1, 2], fresh) == 3
