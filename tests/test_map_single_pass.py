"""tree_map(f, tree) with no is_leaf and no other trees: the single-pass walk (map_single_pass.cpp).

It calls f while it walks, where JAX flattens everything first. These tests pin down what must
still be JAX's: results, which exception wins, which unflatten functions run after f fails, the
depth at which RecursionError comes, reference counts on every exit, aux-data reports' key paths,
and an f that mutates the tree it is mapping over.
"""

import collections
import gc
import sys
import warnings
from typing import Any, NamedTuple

import fastree
import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import numpy as np
import pytest
from helpers import (
    KeysClass,
    NodeClass,
    Pair,
    Point,
    TREE_DICT,
    WithKeys,
    assert_same_error,
    assert_trees_equal,
    parametrize,
    stable_id,
    used_recursion_depth,
)

# The aux_data checks are under test here: on in installed runs too (conftest.py).
AUX_CHECKS = "warn"


class Boom(Exception):
    pass


def boom(x):
    raise Boom(x)


class Logged:
    """A custom node (registered with both libraries) that logs its flatten/unflatten calls."""

    log: list[tuple[str, Any]] = []

    def __init__(self, *kids):
        self.kids = list(kids)

    def __eq__(self, other):
        return type(other) is Logged and self.kids == other.kids

    __hash__ = None


def _flatten_logged(node):
    Logged.log.append(("flatten", len(node.kids)))
    return node.kids, len(node.kids)


def _unflatten_logged(aux, kids):
    Logged.log.append(("unflatten", aux))
    return Logged(*kids)


jtu.register_pytree_node(Logged, _flatten_logged, _unflatten_logged)


class Pt(NamedTuple):
    x: Any
    y: Any


def _mixed_tree():
    return {
        "params": [{"w": np.ones(2), "b": 0.5}, {"w": np.zeros(2), "b": None}],
        "state": (Pt(1, [2, 3]), collections.OrderedDict(z=4, a=5)),
        "extra": collections.defaultdict(list, {"q": (6,), "p": 7}),
        "logged": Logged(8, Logged(9)),
        "custom": [Pair(10, 11), NodeClass(10, 11), KeysClass(10, 11), WithKeys(10, 11)],
        "dataclass": Point(12, 13, "p"),
    }


# ------------------------------------------------------------------------------------------------
# results


@parametrize(tree=TREE_DICT)
def test_results_and_leaf_order_match_jax(tree):
    flog, jlog = [], []
    got = tu.tree_map(lambda x: flog.append(x) or ("m", repr(x)), tree)
    expected = jtu.tree_map(lambda x: jlog.append(x) or ("m", repr(x)), tree)
    assert_trees_equal(got, expected)
    assert [id(x) for x in flog] == [id(x) for x in jlog]


def test_every_node_kind_in_one_tree():
    tree = _mixed_tree()
    got = tu.tree_map(lambda x: ("m", repr(x)), tree)
    assert_trees_equal(got, jtu.tree_map(lambda x: ("m", repr(x)), tree))
    assert type(got["state"][0]) is Pt
    assert list(got["state"][1]) == ["z", "a"]  # OrderedDict keeps insertion order
    assert got["extra"].default_factory is list


def test_rebuilt_dicts_iterate_in_sorted_key_order():
    got = tu.tree_map(lambda x: x, {"b": 1, "a": {"d": 2, "c": 3}})
    assert list(got) == ["a", "b"] and list(got["a"]) == ["c", "d"]


def test_identity_map_returns_new_containers_and_same_leaves():
    leaf = object()
    tree = {"a": [leaf, (leaf,)], "n": None}
    got = tu.tree_map(lambda x: x, tree)
    assert got == tree and got is not tree and got["a"] is not tree["a"]
    assert got["a"][0] is leaf and got["a"][1][0] is leaf


@pytest.mark.parametrize("tree", [1, None, (), [], {}, [[], {}, ()], "leaf"], ids=stable_id)
def test_trivial_trees(tree):
    assert_trees_equal(tu.tree_map(lambda x: [x], tree), jtu.tree_map(lambda x: [x], tree))


def test_flat_list_of_100k_floats():
    tree = [float(i) for i in range(100_000)]
    got = tu.tree_map(lambda x: x + 1, tree)
    assert type(got) is list and got[0] == 1.0 and got[-1] == 100_000.0 and len(got) == 100_000


# ------------------------------------------------------------------------------------------------
# exceptions: JAX flattens first, so a flatten error wins over f's


def test_f_error_propagates_unchanged():
    err = Boom("mine")

    def f(x):
        raise err

    with pytest.raises(Boom) as info:
        tu.tree_map(f, {"a": [1, 2]})
    assert info.value is err


@pytest.mark.parametrize(
    "later",
    [
        {1: "x", "a": "y"},  # unsortable keys
        collections.defaultdict(list, {1: "x", "a": "y"}),  # sorted() raises TypeError there
    ],
    ids=["dict_keys", "defaultdict_keys"],
)
def test_flatten_error_after_f_error_wins_as_in_jax(later):
    tree = [1, {"a": 2}, later]
    err = assert_same_error(lambda: jtu.tree_map(boom, tree), lambda: tu.tree_map(boom, tree))
    assert not isinstance(err, Boom)


def test_custom_flatten_error_after_f_error_wins_as_in_jax():
    class Bad:
        pass

    jtu.register_pytree_node(Bad, lambda b: 1 / 0, lambda a, c: Bad())
    tree = {"a": 1, "b": Bad()}
    assert_same_error(lambda: jtu.tree_map(boom, tree), lambda: tu.tree_map(boom, tree))


def test_recursion_error_after_f_error_wins():
    deep = 1
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    with pytest.raises(RecursionError, match="in flatten"):
        tu.tree_map(boom, [1, deep])


def test_f_error_after_f_error_keeps_the_first():
    seen = []

    def f(x):
        seen.append(x)
        raise Boom(x)

    with pytest.raises(Boom) as info:
        tu.tree_map(f, [1, [2, 3], {"k": 4}])
    assert info.value.args == (1,)
    assert seen == [1]  # f is not called again once it has failed


def test_no_unflatten_after_f_fails_and_every_flatten_still_runs():
    tree = [Logged(1, 2), Logged(3, Logged(4, 5)), Logged(6)]

    def f(x):
        if x == 4:
            raise Boom(x)
        return x

    Logged.log = []
    with pytest.raises(Boom):
        tu.tree_map(f, tree)
    log = Logged.log
    # Every node was flattened (as JAX does before any f call) ...
    assert sorted(e for e in log if e[0] == "flatten") == sorted(
        [("flatten", 2), ("flatten", 2), ("flatten", 2), ("flatten", 1)]
    )
    # ... and only the node completed before the failing leaf was rebuilt (as in JAX).
    assert [e for e in log if e[0] == "unflatten"] == [("unflatten", 2)]


def test_each_node_flattened_and_unflattened_once_as_in_jax():
    tree = [Logged(1, 2), {"k": Logged(3, Logged(4, 5))}, Logged(6)]
    Logged.log = []
    tu.tree_map(lambda x: x, tree)
    ours = sorted(Logged.log)
    Logged.log = []
    jtu.tree_map(lambda x: x, tree)
    assert ours == sorted(Logged.log)


# ------------------------------------------------------------------------------------------------
# depth


@pytest.mark.parametrize(
    ("wrap", "slack"),
    [
        (lambda t: [t], 0),
        (lambda t: {"k": t}, 0),
        (lambda t: (t, None), 0),
        # Rebuilding calls Python code (the namedtuple's __new__, an unflatten function) inside
        # the walk, where JAX calls it from the top: on Python <= 3.11 its frames count against
        # the same limit, so the deepest tree that maps can be a level or two shallower.
        (lambda t: Pt(t, 1), 2),
        (lambda t: Logged(t), 2),
    ],
    ids=["list", "dict", "tuple", "namedtuple", "custom"],
)
def test_recursion_error_at_the_depth_of_the_general_path(wrap, slack):
    # The general path (taken with is_leaf) and the single pass give up at (nearly) the same
    # depth, set by sys.setrecursionlimit.
    def deepest_ok(run):
        for depth in range(100, 400):
            tree = 1
            for _ in range(depth):
                tree = wrap(tree)
            try:
                run(tree)
            except RecursionError:
                return depth - 1
        raise AssertionError("no RecursionError")

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(used_recursion_depth() + 300)
    try:
        single = deepest_ok(lambda t: tu.tree_map(lambda x: x, t))
        general = deepest_ok(lambda t: tu.tree_map(lambda x: x, t, is_leaf=lambda x: False))
    finally:
        sys.setrecursionlimit(old)
    assert general - slack <= single <= general


def test_cycle_through_lists_is_a_recursion_error():
    cyc = [1]
    cyc.append(cyc)
    with pytest.raises(RecursionError, match="PyTree may have cyclical node references"):
        tu.tree_map(lambda x: x, cyc)


# ------------------------------------------------------------------------------------------------
# references


def _refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


@pytest.mark.parametrize("outcome", ["ok", "f_error", "flatten_error", "flatten_error_after_f"])
def test_refcounts_unchanged_on_every_exit(outcome):
    leaves = [object() for _ in range(6)]
    keys = [f"key_{i}_{id(leaves)}" for i in range(3)]
    tree = {
        keys[0]: [leaves[0], (leaves[1], Pt(leaves[2], None))],
        keys[1]: Logged(leaves[3], {keys[2]: leaves[4]}),
        "z": leaves[5],
    }
    if outcome.startswith("flatten_error"):
        tree["zz"] = {1: 0, "a": 0}
    fail_at = leaves[0] if outcome in ("f_error", "flatten_error_after_f") else None

    def f(x):
        if x is fail_at:
            raise Boom()
        return x

    before = _refcounts(leaves + keys)
    for _ in range(2000):
        try:
            tu.tree_map(f, tree)
        except (Boom, ValueError):
            pass
    gc.collect()
    assert _refcounts(leaves + keys) == before


class KeysOnly:
    """Registered in the core with only a with-keys flatten function (the public functions always
    add a keyless one): the single pass takes such nodes apart through a one-level flatten."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return type(other) is KeysOnly and (self.a, self.b) == (other.a, other.b)

    __hash__ = None


def _keys_only_flatten(node):
    return [(jtu.GetAttrKey("a"), node.a), (jtu.GetAttrKey("b"), node.b)], "aux"


jtu.register_pytree_with_keys(KeysOnly, _keys_only_flatten, lambda aux, kids: KeysOnly(*kids))
fastree._core.register_node(
    KeysOnly, None, lambda aux, kids: KeysOnly(*kids), _keys_only_flatten, False
)

_KINDS = {
    "list": lambda a, b: [a, b],
    "tuple": lambda a, b: (a, b),
    "dict": lambda a, b: {"b": a, "a": b},
    "namedtuple": Pt,
    "ordered_dict": lambda a, b: collections.OrderedDict(b=a, a=b),
    "defaultdict": lambda a, b: collections.defaultdict(list, b=a, a=b),
    "custom": Logged,
    "custom_with_keys": KeysClass,
    "custom_with_keys_only": KeysOnly,
    "dataclass": lambda a, b: Point(a, b, "p"),
}


@pytest.mark.parametrize("kind", list(_KINDS))
def test_each_node_kind_maps_as_in_jax_and_leaks_nothing(kind):
    make = _KINDS[kind]
    leaves = [object() for _ in range(4)]
    tree = [make(leaves[0], make(leaves[1], leaves[2])), leaves[3]]
    got = tu.tree_map(lambda x: ("m", id(x)), tree)
    assert_trees_equal(got, jtu.tree_map(lambda x: ("m", id(x)), tree))

    def fail_on_third(x):
        if x is leaves[2]:
            raise Boom()
        return x

    before = _refcounts(leaves)
    for _ in range(500):
        tu.tree_map(lambda x: x, tree)
        with pytest.raises(Boom):
            tu.tree_map(fail_on_third, tree)
    gc.collect()
    assert _refcounts(leaves) == before


def test_results_own_their_references():
    out = object()
    tree = {"a": [1, 2], "b": (3,)}
    before = sys.getrefcount(out)
    results = [tu.tree_map(lambda x: out, tree) for _ in range(100)]
    assert sys.getrefcount(out) == before + 300
    del results
    assert sys.getrefcount(out) == before


# ------------------------------------------------------------------------------------------------
# f mutating the tree it maps


def test_f_clearing_a_later_list_never_crashes():
    later = [object() for _ in range(50)]
    tree = [0, later]

    def f(x):
        if x == 0:
            later.clear()
            gc.collect()
        return x

    got = tu.tree_map(f, tree)
    assert got == [0, []]  # the list is read when the walk reaches it


def test_f_mutating_the_current_dict_never_crashes():
    inner = {"a": 1, "b": object(), "c": object()}
    tree = {"x": inner}

    def f(x):
        inner.clear()
        gc.collect()
        return x

    got = tu.tree_map(f, tree)
    assert list(got["x"]) == ["a", "b", "c"]  # the items were taken before any was mapped


def test_f_mutating_the_current_list_never_crashes():
    items = [object() for _ in range(20)]
    tree = [list(items)]

    def f(x):
        tree[0].clear()
        gc.collect()
        return x

    got = tu.tree_map(f, tree)
    assert got == [items]


# ------------------------------------------------------------------------------------------------
# aux-data reports name the node's key path in the whole tree


class ArrayAux:
    def __init__(self, x, aux):
        self.x, self.aux = x, aux


tu.register_pytree_node(ArrayAux, lambda n: ((n.x,), n.aux), lambda aux, c: ArrayAux(c[0], aux))


def test_aux_report_names_the_key_path_from_the_root():
    from fastree.diagnostics import aux as _aux

    _aux._reset_warnings()
    tree = {"outer": [0, {"inner": ArrayAux(1, np.zeros(2))}]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tu.tree_map(lambda x: x, tree)
    messages = [str(w.message) for w in caught if issubclass(w.category, fastree.AuxDataWarning)]
    assert len(messages) == 1
    assert "key path ['outer'][1]['inner']" in messages[0]


# ------------------------------------------------------------------------------------------------
# registrations made while the walk runs: JAX reads the whole tree before f first runs


def _new_box_class():
    class Box:
        def __init__(self, v):
            self.v = v

    return Box


def _calls_when_f_registers_the_leaf_type(lib):
    Box = _new_box_class()
    tree = {"a": Box(1), "b": [Box(2), {"c": Box(3)}], "d": (Box(4),)}
    calls = []

    def f(x):
        calls.append(("box", x.v) if isinstance(x, Box) else x)
        if len(calls) == 1:
            lib.register_pytree_node(Box, lambda b: ((b.v,), None), lambda _, c: Box(c[0]))
        return x

    out = lib.tree_map(f, tree)
    return calls, out, tree


def test_a_leaf_type_f_registers_stays_a_leaf_for_the_rest_of_the_walk():
    jax_calls, _, _ = _calls_when_f_registers_the_leaf_type(jtu)
    calls, out, tree = _calls_when_f_registers_the_leaf_type(tu)
    assert jax_calls == [("box", 1), ("box", 2), ("box", 3), ("box", 4)]  # read before f ran
    assert calls == jax_calls
    assert out["b"][0] is tree["b"][0] and out["d"][0] is tree["d"][0]


def _calls_when_a_flatten_function_registers_the_leaf_type(lib):
    Box = _new_box_class()

    class Registers:
        pass

    def flatten_registers(node):
        lib.register_pytree_node(Box, lambda b: ((b.v,), None), lambda _, c: Box(c[0]))
        return (), None

    lib.register_pytree_node(Registers, flatten_registers, lambda _, c: Registers())
    calls = []

    def f(x):
        calls.append(("box", x.v) if isinstance(x, Box) else x)
        return x

    lib.tree_map(f, {"a": Box(1), "b": Registers(), "c": [Box(2), Box(3)]})
    return calls


def test_a_leaf_type_a_flatten_function_registers_is_a_node_after_it_as_in_jax():
    jax_calls = _calls_when_a_flatten_function_registers_the_leaf_type(jtu)
    assert jax_calls == [("box", 1), 2, 3]  # the Boxes after the registration are nodes
    assert _calls_when_a_flatten_function_registers_the_leaf_type(tu) == jax_calls
