"""structure_diff / PyTreeDef.diff / explain_retrace (fastree.diagnostics.diff)."""

from __future__ import annotations

import collections
import itertools

import fastree
import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from fastree.diagnostics.diff import _diff_states, explain_retrace
from helpers import NT, TREE_DICT, NodeClass, Pair, Point, Triple


def diffs(a, b):
    return [(tu.keystr(d.path), d.kind, d.message) for d in fastree.structure_diff(a, b)]


def test_aux_data_changed_reads_well():
    a = {"params": {"w": NodeClass(1, meta=("a",))}}
    b = {"params": {"w": NodeClass(2, meta=("b",))}}
    (d,) = fastree.structure_diff(a, b)
    assert str(d) == "['params']['w']: aux_data changed: ('a',) -> ('b',)"
    assert d.kind == "aux_data"
    assert d.path == (jtu.DictKey("params"), jtu.DictKey("w"))


def test_node_type_and_leaf_vs_node():
    assert diffs([(1, 2)], [[1, 2]]) == [("[0]", "node_type", "node type changed: tuple -> list")]
    assert diffs({"a": 1}, {"a": (1,)}) == [("['a']", "leaf_vs_node", "a leaf -> a tuple node")]
    assert diffs({"a": None}, {"a": 1}) == [("['a']", "leaf_vs_node", "a NoneType node -> a leaf")]
    assert diffs(NT(1, 2), Triple(1, 2, 3))[0][1] == "node_type"


def test_num_children():
    assert diffs([1, 2, 3], [1, 2]) == [("", "num_children", "list node has 3 children -> 2")]
    assert str(fastree.structure_diff((1,), ())[0]) == "(root): tuple node has 1 children -> 0"


def test_dict_keys_added_removed_and_children_still_compared():
    got = diffs({"a": 1, "b": 2, "c": (1,)}, {"a": 1, "d": 2, "c": [1]})
    assert got == [
        ("", "dict_keys", "dict keys differ: added ['d'], removed ['b']"),
        ("['c']", "node_type", "node type changed: tuple -> list"),
    ]


def test_ordered_and_default_dicts():
    a = collections.OrderedDict([("x", 1), ("y", 2)])
    b = collections.OrderedDict([("y", 2), ("x", 1)])
    assert diffs(a, b) == [
        ("", "dict_keys", "dict keys differ: order changed: ['x', 'y'] -> ['y', 'x']")
    ]
    da, db = collections.defaultdict(list, a=1), collections.defaultdict(int, a=(1,))
    assert diffs(da, db) == [
        ("", "aux_data", "default_factory changed: <class 'list'> -> <class 'int'>"),
        ("['a']", "leaf_vs_node", "a leaf -> a tuple node"),
    ]


def test_key_path_entries_follow_jax():
    paths = {
        d.path[-1].__class__
        for d in fastree.structure_diff(
            [NT(1, 2), Point(1, 2), Pair(1, 2)], [NT(1, (2,)), Point(1, (2,)), Pair(1, (2,))]
        )
    }
    assert paths == {jtu.GetAttrKey, jtu.FlattenedIndexKey}
    got = diffs([NT(1, 2), Point(1, 2), Pair(1, 2)], [NT(1, (2,)), Point(1, (2,)), Pair(1, (2,))])
    assert [p for p, _, _ in got] == ["[0].b", "[1].y", "[2][<flat index 1>]"]


def test_symmetric():
    a = {"a": [1, (2, 3)], "b": Pair(1, 2, tag="x"), "c": 1}
    b = {"a": [1, (2,)], "b": Pair(1, 2, tag="y"), "d": 1}
    ab, ba = fastree.structure_diff(a, b), fastree.structure_diff(b, a)
    assert [(d.path, d.kind) for d in ab] == [(d.path, d.kind) for d in ba]
    assert ab[0].message == "dict keys differ: added ['d'], removed ['c']"
    assert ba[0].message == "dict keys differ: added ['c'], removed ['d']"


def test_empty_iff_equal_over_corpus():
    trees = list(TREE_DICT.values())
    for a, b in itertools.product(trees[::2], trees[::3]):
        ta, tb = tu.tree_structure(a), tu.tree_structure(b)
        assert (fastree.structure_diff(ta, tb) == []) == (ta == tb)
    for t in trees:
        assert tu.tree_structure(t).diff(tu.tree_structure(t)) == []


def test_accepts_jax_treedefs_and_method():
    td = tu.tree_structure({"a": (1, 2)})
    assert [str(d) for d in td.diff(jtu.tree_structure({"a": (1,)}))] == [
        "['a']: tuple node has 2 children -> 1"
    ]


# ------------------------------------------------------------------------------------------------
# sharing (hand-made states: the treedefs with shared references come with the lead's feature)

LEAF = (None, None, 0, -1)


def ref(i):
    return (None, None, 0, i)


# [x, x] with x = (leaf,): post-order leaf, tuple, <ref to 1>, list
SHARED = (1, (LEAF, (tuple, None, 1, -1), ref(1), (list, None, 2, -1)))
COPIED = (1, (LEAF, (tuple, None, 1, -1), LEAF, (tuple, None, 1, -1), (list, None, 2, -1)))
# [x, y, x] and [x, y, y] with x = (leaf,), y = [leaf]: the third child repeats another node
X_Y_X = (1, (LEAF, (tuple, None, 1, -1), LEAF, (list, None, 1, -1), ref(1), (list, None, 3, -1)))
X_Y_Y = (1, (LEAF, (tuple, None, 1, -1), LEAF, (list, None, 1, -1), ref(3), (list, None, 3, -1)))


def test_sharing_ref_vs_copy():
    (d,) = _diff_states(SHARED, COPIED)
    assert (tu.keystr(d.path), d.kind) == ("[1]", "sharing")
    assert d.message == "was the same object as [0], now a tuple node of its own"
    (d,) = _diff_states(COPIED, SHARED)
    assert d.message == "was a tuple node of its own, now the same object as [0]"


def test_sharing_refs_to_different_nodes():
    (d,) = _diff_states(X_Y_X, X_Y_Y)
    assert str(d) == "[2]: shared reference changed: same object as [0] -> same object as [1]"
    assert _diff_states(SHARED, SHARED) == []


def test_malformed_state_raises_value_error():
    with pytest.raises(ValueError):
        _diff_states((1, (LEAF, (list, None, 2, -1))), SHARED)
    with pytest.raises(ValueError):
        _diff_states((1, (ref(3), LEAF)), SHARED)


# ------------------------------------------------------------------------------------------------
# explain_retrace


def test_explain_retrace_picks_closest():
    seen = [tu.tree_structure(x) for x in ([1], {"a": 1, "b": (1, 2)}, {"a": 1})]
    text = explain_retrace(tu.tree_structure({"a": 1, "b": (1, [2])}), seen)
    assert text.splitlines() == [
        "new structure differs from the closest of 3 seen structure(s) in 1 place(s):",
        "  ['b'][1]: a leaf -> a list node",
    ]
    assert "equals a previously seen one" in explain_retrace(seen[0], seen)
    assert explain_retrace(seen[0], []) == "no structure was seen before"


class Shared:
    """An identity-preserving node: a repeated instance becomes a shared reference."""

    def __init__(self, x):
        self.x = x


tu.register_pytree_node(
    Shared, lambda s: ((s.x,), None), lambda _, c: Shared(*c), preserve_identity=True
)


def test_sharing_on_real_treedefs():
    s, t = Shared(1), Shared(2)
    shared = tu.tree_structure({"a": s, "b": s, "c": t})
    copied = tu.tree_structure({"a": s, "b": Shared(1), "c": t})
    other = tu.tree_structure({"a": s, "b": t, "c": t})
    assert [str(d) for d in shared.diff(copied)] == [
        "['b']: was the same object as ['a'], now a test_structure_diff.Shared node of its own"
    ]
    assert [d.kind for d in shared.diff(other)] == ["sharing", "sharing"]
    assert shared.diff(tu.tree_structure({"a": s, "b": s, "c": t})) == []
