"""Key paths: flatten_with_path, leaves_with_path, map_with_path, keystr, is_leaf_takes_path."""

import jax
from fastree.jax_interop.compat import tree as jt  # JAX's own, installed or not
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from helpers import (
    PREDICATES,
    Pair,
    TREE_DICT,
    assert_leaves_identical,
    assert_same_treedef,
    assert_trees_equal,
    is_leaf_grid,
    jax_has,
    parametrize,
    requires_jax,
)

import fastree.tree as ft
import fastree.tree_util as tu

PATH_PREDICATES = {
    "none": None,
    "depth_ge_2": lambda p, x: len(p) >= 2,
    "depth_eq_1": lambda p, x: len(p) == 1,
    "under_dict_key_a": lambda p, x: any(isinstance(k, jtu.DictKey) and k.key == "a" for k in p),
    "is_none": lambda p, x: x is None,
    "first_seq_index_0": lambda p, x: (
        bool(p) and isinstance(p[0], jtu.SequenceKey) and p[0].idx == 0
    ),
    "is_pair": lambda p, x: isinstance(x, Pair),
    "never": lambda p, x: False,
}


def assert_paths_equal(got, expected):
    """Lists of (key_path, leaf): equal key entries of the same types, identical leaves."""
    assert isinstance(got, list)
    assert len(got) == len(expected)
    for (gp, gl), (ep, el) in zip(got, expected):
        assert type(gp) is tuple
        assert gp == ep
        assert [type(k) for k in gp] == [type(k) for k in ep]
        assert gl is el


# is_leaf_grid leaves out the items whose predicate is False wherever `never` is asked: the
# tree's `never` item covers their code path (tests/helpers.py says why).
@is_leaf_grid(TREE_DICT, PREDICATES)
def test_flatten_with_path(tree, is_leaf):
    fpairs, ftd = tu.tree_flatten_with_path(tree, is_leaf=is_leaf)
    jpairs, jtd = jtu.tree_flatten_with_path(tree, is_leaf=is_leaf)
    assert_paths_equal(fpairs, jpairs)
    assert_same_treedef(ftd, jtd)
    # the leaves agree with plain flatten
    assert_leaves_identical([x for _, x in fpairs], tu.tree_leaves(tree, is_leaf=is_leaf))
    # each pair is a tuple, as in JAX
    assert all(type(p) is tuple and len(p) == 2 for p in fpairs)


@is_leaf_grid(TREE_DICT, PREDICATES)
def test_leaves_with_path(tree, is_leaf):
    assert_paths_equal(
        tu.tree_leaves_with_path(tree, is_leaf=is_leaf),
        jtu.tree_leaves_with_path(tree, is_leaf=is_leaf),
    )


@requires_jax("tree_util.tree_flatten_with_path(is_leaf_takes_path)")
@is_leaf_grid(TREE_DICT, PATH_PREDICATES, takes_path=True)
def test_is_leaf_takes_path(tree, is_leaf):
    kw = dict(is_leaf=is_leaf, is_leaf_takes_path=True)
    fpairs, ftd = tu.tree_flatten_with_path(tree, **kw)
    jpairs, jtd = jtu.tree_flatten_with_path(tree, **kw)
    assert_paths_equal(fpairs, jpairs)
    assert_same_treedef(ftd, jtd)
    assert_paths_equal(tu.tree_leaves_with_path(tree, **kw), jtu.tree_leaves_with_path(tree, **kw))
    # identity map (a subtree treated as a leaf must come back intact); record what f sees
    flog, jlog = [], []
    got = tu.tree_map_with_path(lambda p, x: flog.append((p, x)) or x, tree, **kw)
    expected = jtu.tree_map_with_path(lambda p, x: jlog.append((p, x)) or x, tree, **kw)
    assert_trees_equal(got, expected, identical_leaves=True)
    assert_paths_equal(flog, jlog)


@requires_jax("tree_util.tree_flatten_with_path(is_leaf_takes_path)")
@is_leaf_grid(TREE_DICT, {k: v for k, v in PATH_PREDICATES.items() if v}, takes_path=True)
def test_is_leaf_takes_path_call_sequence(tree, is_leaf):
    def recorder(log):
        def pred(p, x):
            log.append((p, x))
            return is_leaf(p, x)

        return pred

    jlog, flog = [], []
    jtu.tree_flatten_with_path(tree, is_leaf=recorder(jlog), is_leaf_takes_path=True)
    tu.tree_flatten_with_path(tree, is_leaf=recorder(flog), is_leaf_takes_path=True)
    assert_paths_equal(flog, jlog)


@requires_jax("tree.flatten_with_path", "tree.leaves_with_path")
@parametrize(tree=TREE_DICT)
def test_tree_module_spelling(tree):
    fpairs, ftd = ft.flatten_with_path(tree)
    jpairs, jtd = jt.flatten_with_path(tree)
    assert_paths_equal(fpairs, jpairs)
    assert_same_treedef(ftd, jtd)
    assert_paths_equal(ft.leaves_with_path(tree), jt.leaves_with_path(tree))


@parametrize(
    tree=TREE_DICT,
    style={"default": {}, "simple": {"simple": True}, "sep": {"simple": True, "separator": "/"}},
)
def test_keystr(tree, style):
    if style and not jax_has("tree_util.keystr(simple)"):
        pytest.skip(f"jax {jax.__version__}'s keystr has no simple= / separator=")
    for path, _ in jtu.tree_leaves_with_path(tree):
        assert tu.keystr(path, **style) == jtu.keystr(path, **style)


@parametrize(tree=TREE_DICT)
def test_map_with_path(tree):
    def f(path, x):
        return (tuple(path), type(x).__name__)

    got = tu.tree_map_with_path(f, tree)
    expected = jtu.tree_map_with_path(f, tree)
    assert_trees_equal(got, expected)
    if jax_has("tree.map_with_path"):
        assert_trees_equal(ft.map_with_path(f, tree), jt.map_with_path(f, tree))


@parametrize(tree=TREE_DICT)
def test_map_with_path_multiple_trees(tree):
    other = jtu.tree_map(lambda x: ("other", id(x)), tree)
    seen_f, seen_j = [], []

    def rec(log):
        return lambda p, x, y: log.append((p, x, y)) or len(log)

    got = tu.tree_map_with_path(rec(seen_f), tree, other)
    expected = jtu.tree_map_with_path(rec(seen_j), tree, other)
    assert_trees_equal(got, expected)
    assert len(seen_f) == len(seen_j)
    for (fp, fx, fy), (jp, jx, jy) in zip(seen_f, seen_j):
        assert fp == jp and fx is jx and fy == jy


@is_leaf_grid(TREE_DICT, PREDICATES)
def test_map_with_path_is_leaf(tree, is_leaf):
    flog, jlog = [], []
    got = tu.tree_map_with_path(lambda p, x: flog.append((p, x)) or x, tree, is_leaf=is_leaf)
    expected = jtu.tree_map_with_path(lambda p, x: jlog.append((p, x)) or x, tree, is_leaf=is_leaf)
    assert_trees_equal(got, expected, identical_leaves=True)
    assert_paths_equal(flog, jlog)


@pytest.mark.parametrize(
    ("tree", "first_type"),
    [
        ({"a": 1}, jtu.DictKey),
        ([1], jtu.SequenceKey),
        ((1,), jtu.SequenceKey),
        (TREE_DICT["namedtuple"], jtu.GetAttrKey),
        (TREE_DICT["point"], jtu.GetAttrKey),
        (TREE_DICT["pair"], jtu.FlattenedIndexKey),
        (TREE_DICT["keyed"], jtu.GetAttrKey),
    ],
)
def test_key_entry_classes_are_jax_classes(tree, first_type):
    for path, _ in tu.tree_leaves_with_path(tree):
        assert isinstance(path[0], first_type)
        for k in path:
            assert isinstance(
                k, (jtu.DictKey, jtu.SequenceKey, jtu.GetAttrKey, jtu.FlattenedIndexKey)
            )


def test_sequence_keys_of_a_long_list():
    # Index keys are cached (immutable JAX objects) up to a bound; around and past that bound,
    # every key must still be the right one.
    n = (1 << 17) + 3
    tree = list(range(n))
    for _ in range(2):  # first call fills the cache, second reads it
        paths = [path for path, _ in tu.tree_flatten_with_path(tree)[0]]
        for i in (0, 4095, 4096, n - 4, n - 3, n - 2, n - 1):
            assert paths[i] == (jtu.SequenceKey(i),)
            assert type(paths[i][0]) is jtu.SequenceKey
            assert paths[i][0].idx == i
    assert len(paths) == n


# ------------------------------------------------------------------------------------------------
# deep paths: past the first few levels, a path tuple's references to its (shared, cached) key
# entries are added per distinct entry (csrc/util/path_stack.h); counts must come out exactly right.


class _Watched:
    """A custom node keyed by one watched object at every level (the worst case for sharing)."""

    def __init__(self, child):
        self.child = child


_WATCHED_KEY = jtu.GetAttrKey("watched_child")
tu.register_pytree_with_keys(
    _Watched,
    lambda n: (((_WATCHED_KEY, n.child),), None),
    lambda aux, kids: _Watched(*kids),
)


def _deep(depth, wrap):
    tree = object()
    for i in range(depth):
        tree = wrap(tree, i)
    return tree


_DEEP_WRAPS = {
    "lists": lambda t, i: [i, t],
    "dicts": lambda t, i: {"k": t, "leaf": i},
    "mixed": lambda t, i: [{"k": (i, t)}] if i % 2 else (t, i),
    "one_shared_key": lambda t, i: _Watched(t),
}


@pytest.mark.parametrize("wrap", list(_DEEP_WRAPS), ids=list(_DEEP_WRAPS))
@pytest.mark.parametrize("depth", [7, 8, 9, 40])
def test_deep_paths_match_jax(wrap, depth):
    tree = _deep(depth, _DEEP_WRAPS[wrap])
    assert_paths_equal(tu.tree_flatten_with_path(tree)[0], jtu.tree_flatten_with_path(tree)[0])
    assert_paths_equal(tu.tree_leaves_with_path(tree), jtu.tree_leaves_with_path(tree))
    got = tu.tree_map_with_path(lambda p, x: (len(p), x), tree)
    assert_trees_equal(got, jtu.tree_map_with_path(lambda p, x: (len(p), x), tree))


def test_deep_path_refcounts_exact():
    import gc
    import sys

    tree = _deep(60, _DEEP_WRAPS["one_shared_key"])
    gc.collect()
    before = sys.getrefcount(_WATCHED_KEY)
    paths = tu.tree_flatten_with_path(tree)[0]
    # One reference per occurrence in the one 60-entry path tuple.
    assert sys.getrefcount(_WATCHED_KEY) == before + 60
    del paths
    for _ in range(2000):
        tu.tree_flatten_with_path(tree)
        tu.tree_map_with_path(lambda p, x: x, tree)
    # is_leaf with paths raising deep inside: the partial paths are released exactly once too.
    calls = []

    def late(path, x):
        calls.append(1)
        if len(path) > 30:
            raise ValueError("deep")
        return False

    for _ in range(200):
        with pytest.raises(ValueError, match="deep"):
            tu.tree_flatten_with_path(tree, is_leaf=late, is_leaf_takes_path=True)
    gc.collect()
    assert sys.getrefcount(_WATCHED_KEY) == before
