"""Reference counting and garbage collection: nothing leaks, cycles through treedefs are freed."""

import collections
import gc
import sys
import weakref

import pytest
from helpers import Keyed, NodeClass, Pair, Point, parametrize

import fastree
import fastree.tree_util as tu

ITERATIONS = 10_000


class Obj:
    """A distinct, non-interned object (so its refcount is ours alone)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Obj({self.name})"


class Key:
    """A sortable, hashable dict key whose refcount we can watch."""

    def __init__(self, k):
        self.k = k

    def __lt__(self, other):
        return self.k < other.k

    def __eq__(self, other):
        return isinstance(other, Key) and self.k == other.k

    def __hash__(self):
        return hash(self.k)

    def __repr__(self):
        return f"Key({self.k})"


class Aux:
    """Custom-node aux data whose refcount we can watch."""

    def __eq__(self, other):
        return isinstance(other, Aux)

    def __hash__(self):
        return 1


def make_tree():
    leaves = [Obj(i) for i in range(8)]
    keys = [Key(i) for i in range(3)]
    aux = Aux()
    tree = {
        keys[2]: [leaves[0], (leaves[1], None)],
        keys[0]: Pair(leaves[2], {keys[1]: leaves[3]}, tag=aux),
        keys[1]: collections.OrderedDict([("b", leaves[4]), ("a", NodeClass(leaves[5], meta=aux))]),
    }
    tree[keys[1]]["c"] = Point(leaves[6], Keyed(leaves[7], None), label="l")
    return tree, leaves + keys + [aux]


def _refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


OPERATIONS = {
    "flatten": lambda t, td, lv: tu.tree_flatten(t),
    "leaves": lambda t, td, lv: tu.tree_leaves(t),
    "structure": lambda t, td, lv: tu.tree_structure(t),
    "unflatten": lambda t, td, lv: tu.tree_unflatten(td, lv),
    "unflatten_method": lambda t, td, lv: td.unflatten(lv),
    "map": lambda t, td, lv: tu.tree_map(lambda x: x, t),
    "map_two_trees": lambda t, td, lv: tu.tree_map(lambda x, y: y, t, t),
    "flatten_with_path": lambda t, td, lv: tu.tree_flatten_with_path(t),
    "map_with_path": lambda t, td, lv: tu.tree_map_with_path(lambda p, x: x, t),
    "flatten_up_to": lambda t, td, lv: td.flatten_up_to(t),
    "flatten_is_leaf": lambda t, td, lv: tu.tree_flatten(t, is_leaf=lambda x: isinstance(x, Pair)),
    "children": lambda t, td, lv: td.children(),
    "node_data": lambda t, td, lv: td.node_data(),
    "compose": lambda t, td, lv: td.compose(tu.tree_structure((1, 2))),
    "eq_hash": lambda t, td, lv: (td == tu.tree_structure(t), hash(td)),
    "repr": lambda t, td, lv: repr(td),
    "to_jax": lambda t, td, lv: td.to_jax(),
    "from_jax": lambda t, td, lv: fastree.from_jax(td.to_jax()),
    "walk": lambda t, td, lv: td.walk(lambda c, d: c, lambda x: x, lv),
    "flatten_one_level": lambda t, td, lv: tu.flatten_one_level(t),
}


@parametrize(op=OPERATIONS)
def test_refcounts_stable(op):
    tree, watched = make_tree()
    leaves, td = tu.tree_flatten(tree)
    op(tree, td, leaves)  # warm up any caches first
    gc.collect()
    before = _refcounts(watched)
    td_before = sys.getrefcount(td)
    for _ in range(ITERATIONS):
        op(tree, td, leaves)
    gc.collect()
    assert _refcounts(watched) == before
    assert sys.getrefcount(td) == td_before


ERROR_OPERATIONS = {
    "unflatten_too_few": lambda t, td, lv: td.unflatten(lv[:-1]),
    "unflatten_too_many": lambda t, td, lv: td.unflatten(lv + lv),
    "flatten_up_to_mismatch": lambda t, td, lv: td.flatten_up_to([t]),
    "map_mismatch": lambda t, td, lv: tu.tree_map(lambda x, y: x, t, [t]),
    "user_error_in_f": lambda t, td, lv: tu.tree_map(_raise_value_error, t),
    "user_error_in_is_leaf": lambda t, td, lv: tu.tree_leaves(t, is_leaf=_raise_after_some()),
    "unsortable_keys": lambda t, td, lv: tu.tree_flatten([t, {1: lv[0], "a": lv[1]}]),
}


def _raise_value_error(x):
    raise ValueError("boom")


def _raise_after_some():
    calls = []

    def pred(x):
        calls.append(None)
        if len(calls) > 5:
            raise ValueError("late boom")
        return False

    return pred


@parametrize(op=ERROR_OPERATIONS)
def test_refcounts_stable_on_error_paths(op):
    tree, watched = make_tree()
    leaves, td = tu.tree_flatten(tree)
    with pytest.raises(ValueError):
        op(tree, td, leaves)
    gc.collect()
    before = _refcounts(watched)
    for _ in range(ITERATIONS // 10):
        try:
            op(tree, td, leaves)
        except ValueError:
            pass
    gc.collect()
    assert _refcounts(watched) == before


def test_refcount_of_user_exception():
    err = ValueError("kept")

    def f(x):
        raise err

    for _ in range(100):
        try:
            tu.tree_map(f, [1, 2])
        except ValueError:
            pass
    gc.collect()
    before = sys.getrefcount(err)
    for _ in range(1000):
        try:
            tu.tree_map(f, [1, 2])
        except ValueError:
            pass
    gc.collect()
    assert sys.getrefcount(err) == before


def test_treedefs_are_freed():
    tree, watched = make_tree()
    aux = watched[-1]
    gc.collect()
    before = sys.getrefcount(aux)
    tds = [tu.tree_structure(tree) for _ in range(100)]
    assert sys.getrefcount(aux) > before  # treedefs hold the aux data
    del tds
    gc.collect()
    assert sys.getrefcount(aux) == before


# ------------------------------------------------------------------------------------------------
# cycles through treedefs


class Holder:
    """Aux data that will hold a reference back to the treedef containing it."""

    td = None

    def __eq__(self, other):
        return isinstance(other, Holder)

    def __hash__(self):
        return 0


@pytest.mark.parametrize(
    "build",
    [
        lambda h: Pair(1, 2, tag=h),
        lambda h: [NodeClass(1, meta=h), {"a": None}],
        lambda h: Point(1, 2, label=h),
        lambda h: {"k": Pair(None, 3, tag=h)},
    ],
    ids=["pair", "node_class", "dataclass_meta", "nested"],
)
def test_cycle_through_aux_data_is_collected(build):
    holder = Holder()
    td = tu.tree_structure(build(holder))
    holder.td = td  # holder -> td -> holder
    ref = weakref.ref(holder)
    del holder, td
    gc.collect()
    assert ref() is None


def test_cycle_through_dict_key_is_collected():
    key = Key(0)
    td = tu.tree_structure({key: 1})
    key.td = td  # key -> td -> key
    ref = weakref.ref(key)
    del key, td
    gc.collect()
    assert ref() is None


def test_cycle_through_child_treedef_is_collected():
    holder = Holder()
    child = tu.tree_structure(Pair(1, 2, tag=holder))
    parent = tu.treedef_tuple([child, tu.tree_structure([1])])
    holder.td = parent
    ref = weakref.ref(holder)
    del holder, child, parent
    gc.collect()
    assert ref() is None


def test_cycle_via_jax_conversion_is_collected():
    holder = Holder()
    td = tu.tree_structure(Pair(1, 2, tag=holder))
    holder.td = (td, td.to_jax(), fastree.from_jax(td.to_jax()))
    ref = weakref.ref(holder)
    del holder, td
    gc.collect()
    assert ref() is None


def test_treedef_traverse_reports_aux():
    holder = Holder()
    td = tu.tree_structure(Pair(1, 2, tag=holder))
    # the GC can see what a treedef holds (needed to break cycles at all)
    assert gc.is_tracked(td)
    assert any(r is holder for r in _transitive_referents(td, depth=3))


def test_treedef_owning_no_references_is_untracked():
    # Like a tuple of atomic objects in CPython: nothing it holds can close a cycle.
    for tree in [(1, 2.0), [None, (3,)], 5, None]:
        assert not gc.is_tracked(tu.tree_structure(tree))
    # Dict keys and node data are references: those treedefs are tracked.
    for tree in [{"a": 1}, Pair(1, 2, tag=Holder()), collections.OrderedDict(a=1)]:
        assert gc.is_tracked(tu.tree_structure(tree))
    # Derived treedefs follow the same rule.
    td = tu.tree_structure(([1], {"k": 2}))
    assert [gc.is_tracked(c) for c in td.children()] == [False, True]


def test_treedefs_made_from_dead_ones_start_afresh():
    # Dead treedef objects are kept and reused (type.cpp): a treedef made from one must not
    # keep its hash, its weak references, its tracking or its structure.
    trees = [(1, 2, 3), {"a": 1, "b": (2,)}, [None, [1]], Pair(1, 2, tag=Holder()), 7]
    expected = []
    for tree in trees:
        td = tu.tree_structure(tree)
        expected.append((td, hash(td), gc.is_tracked(td)))
    for _ in range(5):
        alive = []
        for tree, (td_expected, hash_expected, tracked_expected) in zip(trees * 20, expected * 20):
            dead = tu.tree_structure(tree)
            ref = weakref.ref(dead)
            hash(dead)
            del dead
            assert ref() is None
            td = tu.tree_structure(tree)
            assert td == td_expected
            assert hash(td) == hash_expected
            assert gc.is_tracked(td) is tracked_expected
            assert ref() is None  # a weak reference to the dead one never sees the new one
            alive.append(td)
        del alive  # 100 die at once, more than are kept; the next round takes the kept ones
        gc.collect()


def test_treedef_type_reference_count_is_balanced():
    # A kept treedef gives its type reference back when it dies and takes a new one when reused.
    tree = (1, 2, 3)
    for _ in range(100):  # fill the kept list
        tu.tree_structure(tree)
    td_type = type(tu.tree_structure(tree))
    before = sys.getrefcount(td_type)
    for _ in range(ITERATIONS):
        tu.tree_flatten(tree)
        many = [tu.tree_structure(tree) for _ in range(50)]  # more than the list keeps
        del many
    assert sys.getrefcount(td_type) == before


def test_reused_treedef_in_a_cycle_is_collected():
    # A treedef made from a kept one is tracked again when it holds references, so a cycle
    # through it is still found.
    for _ in range(100):
        tu.tree_structure((1, 2))
    holder = Holder()
    td = tu.tree_structure(Pair(1, 2, tag=holder))
    holder.ref = td
    probe = weakref.ref(holder)
    del holder, td
    gc.collect()
    assert probe() is None


def _transitive_referents(obj, depth):
    seen, frontier = [], [obj]
    for _ in range(depth):
        nxt = []
        for o in frontier:
            for r in gc.get_referents(o):
                seen.append(r)
                nxt.append(r)
        frontier = nxt
    return seen


class _HashFailsLater:
    """A dict key whose hash raises once `fail` is set (sorting it needs no hash)."""

    def __init__(self, name):
        self.name = name
        self.fail = False

    def __hash__(self):
        if self.fail:
            raise ValueError(f"cannot hash {self.name}")
        return hash(self.name)

    def __lt__(self, other):
        return self.name < other.name


@pytest.mark.parametrize("failing", [0, 1, 2])
@pytest.mark.parametrize("op", ["unflatten", "map"])
def test_dict_rebuild_failure_releases_every_child(failing, op):
    # A rebuilt dict whose key insertion fails part-way: the children already inserted go with
    # the dict, the others are released; nothing leaks and the key's error propagates.
    keys = [_HashFailsLater(n) for n in "abc"]
    leaves = [Obj(i) for i in range(3)]
    tree = {k: [leaf] for k, leaf in zip(keys, leaves)}
    treedef = tu.tree_structure(tree)
    gc.collect()
    before = _refcounts(leaves + keys)

    def break_key(x):
        keys[failing].fail = True  # flattening (which looks keys up) is over by now
        return x

    for _ in range(50):
        keys[failing].fail = False
        with pytest.raises(ValueError, match="cannot hash " + "abc"[failing]):
            if op == "unflatten":
                treedef.unflatten([break_key(leaf) for leaf in leaves])
            else:
                tu.tree_map(break_key, tree)
    keys[failing].fail = False
    gc.collect()
    assert _refcounts(leaves + keys) == before


def _runtime_str(i):
    # Built at run time, so not interned: its reference count is the dict's and ours alone.
    return "".join(["key", "-", str(i)])


@pytest.mark.parametrize("op", ["tree_leaves", "tree_flatten", "tree_structure"])
def test_dicts_of_plain_leaves_keep_reference_counts(op):
    # A dict of plain leaves is taken in one step (kinds_read.h, DictKind::Read; flatten.cpp,
    # AddLeafDict): tree_leaves references no key, a treedef one per key, and every value gets
    # one reference per returned leaf list. Each count must come back once the results are gone,
    # and the results must be JAX's (sorted keys).
    from fastree.jax_interop.compat import tree_util as jax_tu

    str_keys = [_runtime_str(i) for i in (3, 1, 2)]
    int_keys = [10**6 + i for i in (9, 7, 8)]
    values = [Obj(i) for i in range(8)]
    tree = {
        "strs": dict(zip(str_keys, values[:3])),
        "ints": dict(zip(int_keys, values[3:6])),
        "mixed": {"b": values[6], "a": {"only": values[7]}, "c": None},
        "empty": {},
    }
    watched_keys = str_keys + int_keys
    run = getattr(tu, op)
    run(tree)
    gc.collect()
    keys_before, values_before = _refcounts(watched_keys), _refcounts(values)
    held = [run(tree) for _ in range(ITERATIONS)]
    per_result_keys = 0 if op == "tree_leaves" else 1
    per_result_values = 0 if op == "tree_structure" else 1
    assert _refcounts(watched_keys) == [n + per_result_keys * ITERATIONS for n in keys_before]
    assert _refcounts(values) == [n + per_result_values * ITERATIONS for n in values_before]
    expected = getattr(jax_tu, op)(tree)
    if op == "tree_leaves":
        assert held[0] == expected
    elif op == "tree_flatten":
        assert held[0][0] == expected[0]
        assert str(held[0][1]) == str(expected[1])
    else:
        assert str(held[0]) == str(expected)
    del held, expected  # JAX's results hold the keys and values too
    gc.collect()
    assert _refcounts(watched_keys) == keys_before
    assert _refcounts(values) == values_before


def test_dicts_of_plain_leaves_make_the_treedef_a_visit_makes():
    # The one-step dict (AddLeafDict) and the child-by-child visit (taken where an is_leaf is
    # given) must build byte-identical treedefs: equal, hashing equal, and unflattening alike.
    tree = {
        "layer": {"kernel": 1.0, "bias": 2.0},
        "norm": {"scale": 3.0},
        "blocks": [{"b": 4, "a": 5}, {"y": 6.5, "x": "leaf"}],
        "ints": {3: 7, 1: 8, 2: 9},
        "empty": {},
        # Values of one type, then one of another that is not a plain leaf: not one step.
        "then_none": {"a": 1.0, "b": 2.0, "c": None},
        "then_node": {"a": 1.0, "b": 2.0, "c": (3.0, 4.0)},
    }
    leaves, fast = tu.tree_flatten(tree)
    visit_leaves, visited = tu.tree_flatten(tree, is_leaf=lambda x: False)
    assert leaves == visit_leaves
    assert fast == visited
    assert hash(fast) == hash(visited)
    assert tu.tree_unflatten(fast, leaves) == tree
    assert fast.num_nodes == visited.num_nodes and fast.num_leaves == visited.num_leaves
