"""Classification of objects by type, through the core's per-type memo and its two-way cache.

The cache holds answers for many types at once, two per set of slots, so each test here makes a
cached answer go stale in some way (a type registered later, a type that dies and whose address
is reused, sets shared by many types, nodes and leaves alike) and checks that no stale answer is
ever used.
"""

from __future__ import annotations

import gc

from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest

import fastree.tree_util as ftu


def _make_leaf_types(n: int) -> list[type]:
    return [type(f"Leafy{i}", (), {}) for i in range(n)]


def test_many_interleaved_types_classify_as_jax_does():
    # More types than the cache has slots, interleaved with nodes: every answer stays right.
    leaf_types = _make_leaf_types(40)
    tree = [{"a": cls(), "b": (cls(), [cls()]), "c": None} for cls in leaf_types] * 3
    leaves, treedef = ftu.tree_flatten(tree)
    assert leaves == jtu.tree_leaves(tree)
    assert [type(x) for x in leaves] == [cls for cls in leaf_types for _ in range(3)] * 3
    assert ftu.tree_unflatten(treedef, leaves) == tree


def test_a_cached_leaf_type_registered_later_becomes_a_node_in_every_slot():
    # Several leaf types are cached at once; registering one of them with JAX afterwards must
    # be seen even though it is not the most recently classified type.
    leaf_types = _make_leaf_types(12)
    objs = [cls() for cls in leaf_types]
    assert ftu.tree_leaves(objs) == objs  # all cached as leaves now
    target = leaf_types[3]
    jtu.register_pytree_node(target, lambda o: ((1, 2), None), lambda _, c: target())
    leaves = ftu.tree_leaves(objs)
    assert leaves == jtu.tree_leaves(objs)
    assert leaves[3:5] == [1, 2]
    assert len(leaves) == len(objs) + 1


def test_a_dead_type_never_lends_its_answer_to_a_new_type():
    # Classes are created and dropped in a loop, alternately leaves and registered nodes, so
    # new classes are often allocated where a classified one died. Each must get its own answer.
    for i in range(60):
        registered = i % 2 == 0

        class Thing:
            pass

        if registered:
            ftu.register_pytree_node(Thing, lambda o: ((7,), None), lambda _, c: Thing())
            assert ftu.tree_leaves([Thing()]) == [7]
        else:
            obj = Thing()
            assert ftu.tree_leaves([obj]) == [obj]
            del obj
            del Thing  # unregistered: the class can die and its address be reused
            gc.collect()


def test_reassigned_class_is_classified_by_its_current_type():
    class Plain:
        pass

    @jtu.register_pytree_node_class
    class Node:
        def tree_flatten(self):
            return (5,), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls()

    obj = Plain()
    assert ftu.tree_leaves([obj]) == [obj]
    obj.__class__ = Node
    assert ftu.tree_leaves([obj]) == [5]
    obj.__class__ = Plain
    assert ftu.tree_leaves([obj]) == [obj]


@pytest.mark.parametrize("n_types", [1, 16, 17, 64, 65, 200])
def test_structure_is_stable_across_repeated_flattens_of_many_types(n_types):
    leaf_types = _make_leaf_types(n_types)
    tree = {f"k{i}": [cls(), (cls(),)] for i, cls in enumerate(leaf_types)}
    first = ftu.tree_structure(tree)
    for _ in range(3):
        assert ftu.tree_structure(tree) == first
    assert first.num_leaves == 2 * n_types


def test_node_and_leaf_types_sharing_sets_keep_their_own_answers():
    # 150 node types and 150 leaf types over 32 sets of two slots: every set is shared by
    # several of each, in every order of memoising and evicting. Each node holds a leaf of the
    # next leaf type, so each visit changes type twice.
    leaf_types = _make_leaf_types(150)
    node_types = []
    for i in range(150):
        node_type = type(f"Nodey{i}", (), {})
        ftu.register_pytree_node(
            node_type,
            lambda o: ((o.child,), None),
            lambda _, c, node_type=node_type: _with_child(node_type(), c[0]),
        )
        node_types.append(node_type)
    nodes = [_with_child(node_type(), leaf_types[i]()) for i, node_type in enumerate(node_types)]
    tree = [nodes, nodes[::-1], nodes[::7]]
    want = [n.child for n in nodes] + [n.child for n in nodes[::-1]] + [n.child for n in nodes[::7]]
    for _ in range(3):
        assert ftu.tree_leaves(tree) == want
        assert jtu.tree_leaves(tree) == want
        assert ftu.tree_structure(tree).num_nodes == 4 + 2 * len(want)  # 4 lists
        mapped = ftu.tree_map(lambda x: type(x).__name__, tree)
        assert ftu.tree_leaves(mapped) == [type(x).__name__ for x in want]


def _with_child(node, child):
    node.child = child
    return node


@pytest.mark.parametrize("container", [list, tuple])
def test_all_leaves_sees_a_registration_made_by_a_type_lookup_mid_run(container):
    # all_leaves asks once per run of one leaf type. A type's first lookup hashes it, which runs
    # a metaclass's __hash__: here it registers the run's type as a node, so the run must end.
    Plain = type("Plain", (), {})
    assert ftu.all_leaves([Plain(), Plain()])  # Plain's answer memoised: a plain leaf

    class RegisteringMeta(type):
        def __hash__(cls):
            if not registered:
                registered.append(cls)
                ftu.register_pytree_node(Plain, lambda o: ((1,), None), lambda _, c: Plain())
            return id(cls) >> 4

    registered = []
    Fresh = RegisteringMeta("Fresh", (), {})
    items = container([Plain(), Plain(), Fresh(), Plain()])
    assert not ftu.all_leaves(items)
    assert registered == [Fresh]
    assert ftu.all_leaves(container([Fresh(), Fresh()]))
