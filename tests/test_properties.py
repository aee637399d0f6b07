"""Hypothesis differential tests: random trees flatten, rebuild and map exactly as in JAX."""

import collections

from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
from helpers import NT, KeysClass, NodeClass, Pair, Point, assert_trees_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastree
import fastree.tree_util as tu

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

leaves = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=3),
)
keys = st.text(alphabet="abcxyz", min_size=1, max_size=3)
int_keys = st.integers(0, 9)


def _extend(children):
    return st.one_of(
        st.tuples(children, children),
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(int_keys, children, max_size=3),
        st.lists(st.tuples(keys, children), max_size=3).map(collections.OrderedDict),
        st.tuples(children, children).map(lambda ab: NT(*ab)),
        st.tuples(children, children, st.sampled_from(["p", "q"])).map(lambda t: Pair(*t)),
        st.lists(children, max_size=3).map(lambda xs: NodeClass(*xs)),
        st.tuples(children, children).map(lambda ab: KeysClass(*ab)),
        st.tuples(children, children, st.sampled_from(["a", "b"])).map(lambda t: Point(*t)),
    )


trees = st.recursive(st.one_of(leaves, st.none()), _extend, max_leaves=20)


def _tuple_of_len(k):
    return lambda x: isinstance(x, tuple) and len(x) == k


is_leaf_preds = st.one_of(
    st.none(),
    st.integers(0, 3).map(_tuple_of_len),
    st.just(lambda x: isinstance(x, list) and len(x) % 2 == 1),
    st.just(lambda x: isinstance(x, dict) and "a" in x),
    st.just(lambda x: isinstance(x, Pair) and x.tag == "q"),
    st.just(lambda x: x is None),
    st.just(lambda x: isinstance(x, int) and x > 0),
)


@SETTINGS
@given(tree=trees, is_leaf=is_leaf_preds)
def test_flatten_differential(tree, is_leaf):
    fl, ftd = tu.tree_flatten(tree, is_leaf=is_leaf)
    jl, jtd = jtu.tree_flatten(tree, is_leaf=is_leaf)
    assert len(fl) == len(jl) and all(a is b for a, b in zip(fl, jl))
    assert ftd.to_jax() == jtd
    assert fastree.from_jax(jtd) == ftd
    assert repr(ftd) == repr(jtd)
    assert (ftd.num_leaves, ftd.num_nodes) == (jtd.num_leaves, jtd.num_nodes)
    assert_trees_equal(ftd.unflatten(fl), jtd.unflatten(jl), identical_leaves=True)


@SETTINGS
@given(tree=trees, is_leaf=is_leaf_preds)
def test_paths_differential(tree, is_leaf):
    fp, ftd = tu.tree_flatten_with_path(tree, is_leaf=is_leaf)
    jp, jtd = jtu.tree_flatten_with_path(tree, is_leaf=is_leaf)
    assert [p for p, _ in fp] == [p for p, _ in jp]
    assert all(a is b for (_, a), (_, b) in zip(fp, jp))
    assert ftd.to_jax() == jtd
    assert [tu.keystr(p) for p, _ in fp] == [jtu.keystr(p) for p, _ in jp]


@SETTINGS
@given(tree=trees, is_leaf=is_leaf_preds)
def test_map_differential(tree, is_leaf):
    def f(x):
        return ("m", x) if is_leaf is None else x

    assert_trees_equal(
        tu.tree_map(f, tree, is_leaf=is_leaf), jtu.tree_map(f, tree, is_leaf=is_leaf)
    )
    g = lambda p, x: x  # noqa: E731
    assert_trees_equal(
        tu.tree_map_with_path(g, tree, is_leaf=is_leaf),
        jtu.tree_map_with_path(g, tree, is_leaf=is_leaf),
        identical_leaves=True,
    )


@SETTINGS
@given(a=trees, b=trees)
def test_structure_equality_differential(a, b):
    fa, fb = tu.tree_structure(a), tu.tree_structure(b)
    ja, jb = jtu.tree_structure(a), jtu.tree_structure(b)
    assert (fa == fb) == (ja == jb)
    assert (fa != fb) == (ja != jb)
    if fa == fb:
        assert hash(fa) == hash(fb)


@SETTINGS
@given(tree=trees)
def test_two_tree_map_and_up_to(tree):
    other = jtu.tree_map(lambda x: [x], tree)
    f = lambda x, y: (x, y)  # noqa: E731
    assert_trees_equal(tu.tree_map(f, tree, other), jtu.tree_map(f, tree, other))
    fu = tu.tree_structure(tree).flatten_up_to(other)
    ju = jtu.tree_structure(tree).flatten_up_to(other)
    assert len(fu) == len(ju) and all(a is b for a, b in zip(fu, ju))
