"""The one-tuple-or-list-of-leaves fast path (csrc/treedef/leaf_sequence.cpp).

Flatten, leaves, structure, unflatten and tree_map of such trees skip the general walkers; these
tests pin that the results are the general path's exactly, that anything the fast path cannot
decide falls back, and that callbacks mutating the input are handled as JAX handles them.
"""

import gc

import fastree.tree_util as tu
import numpy as np
import pytest
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
from helpers import assert_same_error


class Opaque:
    """A leaf type no test has classified yet when it first appears (a memo miss)."""


FLAT = [
    (),
    [],
    (1.5, 2.5, 3.5),
    [1, "a", None.__class__, b"x"],
    (np.zeros(2), np.ones(3)),
    [Opaque(), Opaque()],
    (1, 2.0, "mixed", Opaque()),
]
class Pair:
    """A registered node (two children), met after leaves of one type."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return type(other) is Pair and (self.a, self.b) == (other.a, other.b)

    __hash__ = None


tu.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, children: Pair(*children))
NOT_FLAT = [
    (1, (2,)),
    [1, None],
    [{"a": 1}, 2],
    (1, [2, 3]),
    # After items of one type found plain leaves (the type is not looked up again), an item of
    # another type is: a node, None, a container.
    (1.5, 2.5, 3.5, None),
    [np.zeros(1), np.zeros(2), (np.ones(1),)],
    (2.5, 3.5, Pair(1.0, 2.0)),
]
# Ids by position: a repr holds object addresses (Opaque), which differ between processes and so
# between pytest-xdist's workers.
FLAT_IDS = [f"flat{i}" for i in range(len(FLAT))]
NOT_FLAT_IDS = [f"not_flat{i}" for i in range(len(NOT_FLAT))]


@pytest.mark.parametrize("tree", FLAT + NOT_FLAT, ids=FLAT_IDS + NOT_FLAT_IDS)
def test_same_results_as_jax_and_as_the_walkers(tree):
    leaves, td = tu.tree_flatten(tree)
    jleaves, jtd = jtu.tree_flatten(tree)
    assert leaves == jleaves and all(a is b for a, b in zip(leaves, jleaves))
    assert td == tu.tree_structure(tree) and hash(td) == hash(tu.tree_structure(tree))
    assert td.to_jax() == jtd
    assert tu.tree_leaves(tree) == leaves
    # A treedef made the general way (from its state) is equal and hashes equal.
    rebuilt = (
        tu.PyTreeDef.from_node_data_and_children(td.node_data(), td.children())
        if (td.node_data() is not None)
        else td
    )
    assert rebuilt == td and hash(rebuilt) == hash(td)
    back = tu.tree_unflatten(td, leaves)
    assert type(back) is type(tree) and back == tree
    assert tu.tree_map(lambda x: x, tree) == jtu.tree_map(lambda x: x, tree)


@pytest.mark.parametrize("tree", FLAT, ids=FLAT_IDS)
def test_unflatten_from_any_sequence(tree):
    _, td = tu.tree_flatten(tree)
    leaves = tu.tree_leaves(tree)
    for source in (list(leaves), tuple(leaves), iter(leaves)):
        out = tu.tree_unflatten(td, source)
        assert type(out) is type(tree) and out == tree


@pytest.mark.parametrize("tree", [(1, 2, 3), [1, 2, 3]], ids=["tuple", "list"])
@pytest.mark.parametrize(
    "leaves", [[1, 2], (1, 2, 3, 4), [], range(5)], ids=["too_few", "too_many", "none", "range"]
)
def test_leaf_count_errors_are_jax_texts(tree, leaves):
    td, jtd = tu.tree_structure(tree), jtu.tree_structure(tree)
    assert_same_error(
        lambda: jtu.tree_unflatten(jtd, leaves), lambda: tu.tree_unflatten(td, leaves)
    )


def test_is_leaf_and_paths_take_the_general_path():
    tree = (1, 2)
    assert tu.tree_leaves(tree, is_leaf=lambda x: isinstance(x, tuple)) == [tree]
    assert [p for p, _ in tu.tree_flatten_with_path(tree)[0]] == [
        (jtu.SequenceKey(0),),
        (jtu.SequenceKey(1),),
    ]


class Result:
    """What f returns: a new object per call, so a result kept by mistake shows as a live one."""


# 4 leaves: gathered before the output is made (at most 8); 20: written into it as they come.
@pytest.mark.parametrize("size", [4, 20])
@pytest.mark.parametrize("container", [list, tuple])
def test_map_error_from_f_propagates_and_nothing_leaks(container, size):
    import weakref

    items = [object() for _ in range(size)]
    before = [len(gc.get_referrers(x)) for x in items]
    made = []

    def f(x):
        if x is items[size // 2]:
            raise KeyError("boom")
        result = Result()
        made.append(weakref.ref(result))
        return result

    with pytest.raises(KeyError, match="boom"):
        tu.tree_map(f, container(items))
    gc.collect()
    assert [len(gc.get_referrers(x)) for x in items] == before
    assert len(made) == size // 2 and all(ref() is None for ref in made)


def test_map_of_a_tuple_whose_only_holder_is_the_call():
    # A small tuple's items are read where they are, not taken: the tuple, held by the call,
    # keeps them alive while f runs the cyclic GC and drops every other reference it can.
    import weakref

    class Item:
        pass

    refs = []

    def f(x):
        refs.append(weakref.ref(x))
        gc.collect()
        return type(x).__name__

    assert tu.tree_map(f, (Item(), Item(), Item())) == ("Item", "Item", "Item")
    gc.collect()
    assert len(refs) == 3 and all(ref() is None for ref in refs)


def test_map_sees_the_list_as_it_was_when_f_mutates_it():
    tree = [1, 2, 3]
    seen = []

    def f(x):
        seen.append(x)
        tree.clear()  # JAX has flattened before f runs: every leaf is still mapped
        return x * 10

    assert tu.tree_map(f, tree) == [10, 20, 30]
    assert seen == [1, 2, 3]


def test_refcounts_balance():
    import sys

    x = object()
    base = sys.getrefcount(x)
    for _ in range(100):
        leaves, td = tu.tree_flatten((x, x, x))
        tu.tree_unflatten(td, leaves)
        tu.tree_map(lambda v: v, [x, x])
        tu.tree_map(lambda v: v, (x, x, x))
        tu.tree_map(lambda v: v, [x] * 12)
        tu.tree_leaves([x])
    del leaves, td
    assert sys.getrefcount(x) == base


def test_finalizer_shrinking_the_list_during_allocation():
    # A finalizer run by the cyclic GC (which any allocation can start) empties the list being
    # flattened: the result is the list as it is when read, never a stale item.
    victim = [object() for _ in range(50)]

    class Shrinker:
        def __del__(self):
            victim.clear()

    def make_garbage():
        a = Shrinker()
        a.self = a  # a cycle, so only the cyclic GC frees it

    thresholds = gc.get_threshold()
    try:
        gc.set_threshold(1)
        for _ in range(20):
            victim[:] = [object() for _ in range(50)]
            make_garbage()
            leaves = tu.tree_leaves(victim)
            assert all(type(v) is object for v in leaves)
            make_garbage()
            out = tu.tree_map(lambda v: v, victim)
            assert all(type(v) is object for v in out)
    finally:
        gc.set_threshold(*thresholds)
