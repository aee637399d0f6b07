"""Fuzzing: no input, however malformed, crashes fastree or leaks a reference.

Random trees mix every node kind, including custom nodes whose callbacks misbehave (raise, return
the wrong shape, mutate the tree under the flattener, change their aux data on every call). Every
operation must either succeed or raise a clean Python exception of the type JAX raises, and
afterwards the inputs hold exactly the references they held before. Garbage treedef states,
corrupted pickles and garbage ``from_node_data_and_children`` arguments either raise or build a
treedef that every other method then handles.

Each test keeps to a few seconds (``max_examples``); ``scripts/run_sanitized_tests.sh`` runs this
file under AddressSanitizer, which is where a memory error in the core would show.
"""

import collections
import gc
import os
import pickle
import sys
from typing import Any, NamedTuple

from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from helpers import Keyed, KeysClass, NodeClass, Pair, Point, StaticTag, stable_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastree
import fastree.tree_util as tu
from fastree import _core

# FASTREE_FUZZ_EXAMPLES=5000 for a long hunt; the default keeps the file near 15 s.
SETTINGS = settings(
    max_examples=int(os.environ.get("FASTREE_FUZZ_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Leaf:
    """A distinct, non-interned leaf object: its refcount belongs to the test alone."""

    __slots__ = ("n", "__weakref__")

    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return isinstance(other, Leaf) and self.n == other.n

    def __hash__(self):
        return hash(self.n)

    def __repr__(self):
        return f"Leaf({self.n})"


class FuzzError(Exception):
    """Raised on purpose by misbehaving callbacks; must reach the caller unchanged."""


class NT(NamedTuple):
    a: Any
    b: Any


# ------------------------------------------------------------------------------------------------
# A custom node whose flatten / unflatten misbehave on request.

FLATTEN_MODES = [
    "ok",
    "raise",
    "not_tuple",
    "short",
    "long",
    "none",
    "non_iterable",
    "generator",
    "iter_raises",
    "fresh_aux",
    "mutate_victim",
    "clear_victim",
    "gc",
]
UNFLATTEN_MODES = ["ok", "raise", "returns_none", "gc"]


class Fickle:
    """A custom node; ``mode`` picks how flatten misbehaves, ``victim`` is what it mutates."""

    def __init__(self, kids, mode="ok", unmode="ok", victim=None):
        self.kids, self.mode, self.unmode, self.victim = list(kids), mode, unmode, victim

    def __repr__(self):
        return f"Fickle({self.kids!r}, {self.mode!r})"


def _fickle_flatten(node):
    mode = node.mode
    kids = list(node.kids)
    aux = (node.mode, node.unmode)
    if mode == "raise":
        raise FuzzError("flatten")
    if mode == "not_tuple":
        return [kids, aux]
    if mode == "short":
        return (kids,)
    if mode == "long":
        return (kids, aux, None)
    if mode == "none":
        return None
    if mode == "non_iterable":
        return (42, aux)
    if mode == "generator":
        return ((k for k in kids), aux)
    if mode == "iter_raises":

        def gen():
            yield from kids[:1]
            raise FuzzError("children iterator")

        return (gen(), aux)
    if mode == "fresh_aux":
        return (kids, (aux, object()))
    if mode == "mutate_victim" and node.victim is not None:
        _mutate(node.victim)
    if mode == "clear_victim" and node.victim is not None:
        node.victim.clear()
    if mode == "gc":
        gc.collect(1)  # the young generations: cheap, and they hold the treedefs being built
    return (kids, aux)


def _mutate(victim):
    if isinstance(victim, list):
        victim.append(Leaf(-1))
        del victim[0]
    elif isinstance(victim, dict):
        victim[Leaf(-2)] = Leaf(-3) if not victim else victim.popitem()[1]


def _fickle_unflatten(aux, children):
    unmode = aux[1] if isinstance(aux, tuple) and len(aux) == 2 else "ok"
    if unmode == "raise":
        raise FuzzError("unflatten")
    if unmode == "returns_none":
        return None
    if unmode == "gc":
        gc.collect(1)
    return Fickle(children, "ok", "ok")


tu.register_pytree_node(Fickle, _fickle_flatten, _fickle_unflatten)


# ------------------------------------------------------------------------------------------------
# Random trees over every node kind.

_counter = iter(range(10**9))
leaves = st.one_of(
    st.builds(lambda: Leaf(next(_counter))),
    st.integers(-3, 3),
    st.text(max_size=2),
)
keys = st.text(alphabet="abcd", min_size=1, max_size=2)


def _node(children):
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=3),
        st.lists(st.tuples(keys, children), max_size=3).map(collections.OrderedDict),
        st.dictionaries(keys, children, max_size=3).map(
            lambda d: collections.defaultdict(list, d)
        ),
        st.tuples(children, children).map(lambda ab: NT(*ab)),
        st.tuples(children, children).map(lambda ab: Pair(*ab)),
        st.tuples(children, children).map(lambda ab: Keyed(*ab)),
        st.lists(children, max_size=3).map(lambda xs: NodeClass(*xs)),
        st.tuples(children, children).map(lambda ab: KeysClass(*ab)),
        st.tuples(children, children, st.sampled_from(["p", "q"])).map(lambda t: Point(*t)),
        st.sampled_from("st").map(StaticTag),
        st.lists(children, max_size=3).map(lambda xs: Fickle(xs)),
    )


trees = st.recursive(st.one_of(leaves, st.none()), _node, max_leaves=16)


@st.composite
def misbehaving_trees(draw):
    """A random tree with one misbehaving Fickle node planted in a random container."""
    tree = draw(trees)
    victim = draw(st.sampled_from(["list", "dict"]))
    mode = draw(st.sampled_from(FLATTEN_MODES))
    unmode = draw(st.sampled_from(UNFLATTEN_MODES))
    siblings = [draw(trees) for _ in range(draw(st.integers(0, 3)))]
    fickle = Fickle([draw(trees), draw(leaves)], mode, unmode)
    pos = draw(st.integers(0, len(siblings)))
    if victim == "list":
        container = siblings[:pos] + [fickle] + siblings[pos:]
    else:
        container = {f"k{i}": s for i, s in enumerate(siblings)}
        container[f"k{pos}x"] = fickle
    fickle.victim = container
    return [tree, container, (tree,)]


# ------------------------------------------------------------------------------------------------
# Helpers


def _objects_in(obj, out=None, depth=0):
    """Every object reachable through containers / known nodes (for refcount bookkeeping)."""
    if out is None:
        out = {}
    if id(obj) in out or depth > 50:
        return out
    out[id(obj)] = obj
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            _objects_in(k, out, depth + 1)
            _objects_in(v, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in list(obj):
            _objects_in(v, out, depth + 1)
    elif isinstance(obj, Fickle):
        _objects_in(obj.kids, out, depth + 1)
    elif isinstance(obj, (Pair, Keyed, KeysClass, Point, NodeClass)):
        for v in vars(obj).values():
            _objects_in(v, out, depth + 1)
    return out


def _watched(tree):
    """The objects whose refcounts must not change: ours, not interned or cached by Python."""
    return [o for o in _objects_in(tree).values() if not isinstance(o, (int, str, type(None)))]


def _outcome(fn, *args, **kwargs):
    """("ok", result) or ("raise", exception type); the exception object itself is dropped so
    its traceback keeps no frame (and no input) alive."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the caller checks the type
        return "raise", type(e)


def _settle(full=False):
    # A full collection costs ~0.1 s with JAX loaded; cycles made by the call under test are
    # young, so collecting the young generations is enough, with a full one to confirm a miss.
    if full:
        gc.collect()
    else:
        gc.collect(1)


def _refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


def assert_no_leak(objs, fn, *args):
    """Runs ``fn(*args)`` and checks the refcounts of ``objs`` are the same afterwards. Results
    stay inside ``fn``, so they are gone by the time the counts are compared.

    A first, unmeasured run fills what is filled once per type, not per call (the aux-data
    checker remembers its verdict on each type it is shown): that is a cache, not a leak.
    """
    fn(*args)
    _settle()
    before = _refcounts(objs)
    fn(*args)
    _settle()
    after = _refcounts(objs)
    if after != before:
        _settle(full=True)
        after = _refcounts(objs)
    leaked = [(o, b, a) for o, b, a in zip(objs, before, after) if a != b]
    assert not leaked, f"reference counts changed (obj, before, after): {leaked[:5]}"


# ------------------------------------------------------------------------------------------------
# Flatten / map / unflatten over misbehaving trees, against JAX.


def _same_outcome(jax_fn, fastree_fn):
    jax_kind, jax_value = _outcome(jax_fn)
    kind, value = _outcome(fastree_fn)
    if jax_kind == "raise":
        assert kind == "raise", f"JAX raised {jax_value.__name__}; fastree returned {value!r}"
        assert value is jax_value, f"JAX raised {jax_value.__name__}; fastree {value.__name__}"
    else:
        assert kind == "ok", f"JAX succeeded; fastree raised {value.__name__}"
    return kind, value


# Modes whose outcome depends on how often / in which order a library calls flatten, so only
# "no crash, no leak" is checked for them, not agreement with JAX.
_ORDER_DEPENDENT = {"mutate_victim", "clear_victim", "fresh_aux"}


@SETTINGS
@given(tree=misbehaving_trees())
def test_flatten_misbehaving_nodes(tree):
    fickle = _find_fickle(tree)
    watched = _watched(tree)
    if fickle.mode in ("mutate_victim", "clear_victim"):
        # The callback drops the victim's references to its direct members on purpose.
        victim = fickle.victim
        members = list(victim.values()) if isinstance(victim, dict) else list(victim)
        watched = [o for o in watched if not any(o is m for m in members)]
    depth = _recursion_headroom()
    assert_no_leak(watched, _flatten_all_ways, tree, fickle)
    assert _recursion_headroom() == depth, "an error path left the recursion counter raised"


# What JAX does for each misbehaviour (test_each_mode_matches_jax checks this table against JAX
# itself). The table saves calling JAX per example: jaxlib 0.10 leaks one level of the
# interpreter's recursion counter per error raised inside its flatten, so a few hundred failing
# JAX calls would leave the test process unable to recurse.
FLATTEN_ERRORS = {
    "raise": FuzzError,
    "iter_raises": FuzzError,
    "not_tuple": ValueError,
    "short": ValueError,
    "long": ValueError,
    "none": ValueError,
    "non_iterable": ValueError,
}
UNFLATTEN_ERRORS = {"raise": FuzzError}
FLATTEN_OPS = {
    "flatten": lambda lib, t: lib.tree_flatten(t),
    "leaves": lambda lib, t: lib.tree_leaves(t),
    "structure": lambda lib, t: lib.tree_structure(t),
    "with_path": lambda lib, t: lib.tree_flatten_with_path(t),
    "leaves_with_path": lambda lib, t: lib.tree_leaves_with_path(t),
}
MAP_OPS = {
    "map": lambda lib, t: lib.tree_map(lambda x: x, t),
    "map_path": lambda lib, t: lib.tree_map_with_path(lambda p, x: x, t),
    "map_two": lambda lib, t: lib.tree_map(lambda x, y: x, t, t),
    "round_trip": lambda lib, t: lib.tree_unflatten(*reversed(lib.tree_flatten(t))),
}


def _expected_error(op_name, mode, unmode):
    if mode in FLATTEN_ERRORS:
        return FLATTEN_ERRORS[mode]
    if op_name in MAP_OPS:
        return UNFLATTEN_ERRORS.get(unmode)
    return None


def _flatten_all_ways(tree, fickle):
    for name, op in {**FLATTEN_OPS, **MAP_OPS}.items():
        kind, value = _outcome(op, tu, tree)
        if fickle.mode in _ORDER_DEPENDENT:
            continue  # only "no crash, no leak"
        expected = _expected_error(name, fickle.mode, fickle.unmode)
        if expected is None:
            assert kind == "ok", f"{name}: raised {value.__name__}"
        else:
            assert kind == "raise" and value is expected, f"{name}: {kind} {value!r}"


def _find_fickle(tree):
    for obj in _objects_in(tree).values():
        if isinstance(obj, Fickle) and obj.victim is not None:
            return obj
    raise AssertionError("no planted Fickle")


@SETTINGS
@given(tree=trees, data=st.data())
def test_unflatten_misbehaving_and_wrong_leaves(tree, data):
    td = tu.tree_structure(tree)
    n = td.num_leaves
    wrong = data.draw(
        st.one_of(
            st.integers(0, n + 3).map(lambda k: [Leaf(-k)] * k),
            st.sampled_from([None, 5, 1.5, object()]),
            st.just("x" * n),
            st.integers(0, n + 2).map(lambda k: iter([Leaf(-7)] * k)),
            st.integers(0, n).map(_raising_iter),
        )
    )
    other = data.draw(trees)
    assert_no_leak(_watched(tree) + [td], _unflatten_wrong, tree, td, wrong, other)


def _unflatten_wrong(tree, td, wrong, other):
    if isinstance(wrong, (list, str)):
        # Well defined: the libraries agree (ValueError for a wrong count, with JAX's text).
        jtd = jtu.tree_structure(tree)
        _same_outcome(lambda: jtu.tree_unflatten(jtd, wrong), lambda: td.unflatten(wrong))
    else:
        # JAX's pybind11 signature rejects non-sequences with its own TypeError text.
        kind, value = _outcome(tu.tree_unflatten, td, wrong)
        if kind == "raise":
            assert issubclass(value, (TypeError, ValueError, FuzzError)), value
    _same_outcome(
        lambda: jtu.tree_map(lambda x, y: x, tree, other),
        lambda: tu.tree_map(lambda x, y: x, tree, other),
    )


def _raising_iter(k):
    yield from (Leaf(-9),) * k
    raise FuzzError("leaves iterator")


@SETTINGS
@given(tree=trees, raise_at=st.integers(0, 20), takes_path=st.booleans())
def test_is_leaf_that_raises(tree, raise_at, takes_path):
    assert_no_leak(_watched(tree), _raising_is_leaf, tree, raise_at, takes_path)


def _raising_is_leaf(tree, raise_at, takes_path):
    calls = []

    def is_leaf(*args):
        calls.append(None)
        if len(calls) > raise_at:
            raise FuzzError("is_leaf")
        return False

    plain = [] if takes_path else [tu.tree_leaves, tu.tree_flatten, tu.tree_structure]
    for fn in plain:
        calls.clear()
        kind, value = _outcome(fn, tree, is_leaf)
        assert kind == "ok" or value is FuzzError
    for fn in (tu.tree_flatten_with_path, tu.tree_leaves_with_path):
        calls.clear()
        kind, value = _outcome(fn, tree, is_leaf, is_leaf_takes_path=takes_path)
        assert kind == "ok" or value is FuzzError
    calls.clear()
    kind, value = _outcome(tu.tree_map, lambda x: x, tree, is_leaf=is_leaf)
    assert kind == "ok" or value is FuzzError


# ------------------------------------------------------------------------------------------------
# Garbage treedef states, corrupted pickles, from_node_data_and_children with garbage.

GARBAGE = [
    None,
    0,
    -1,
    2**70,
    1.5,
    "",
    "abc",
    b"\x00",
    (),
    [],
    {},
    (1,),
    ("a", "b"),
    [1, 2],
    {"a": 1},
    object(),
    Leaf(0),
    tuple,
    list,
    dict,
    type(None),
    NT,
    Pair,
    Fickle,
    Point,
    int,
    Leaf,
    collections.OrderedDict,
    collections.defaultdict,
    ([], []),
    (list, ("a",)),
    (1, ()),
    ((), ("a",)),
    (None, ("a", "a")),
    ([1], [2]),
]
garbage = st.sampled_from(GARBAGE)
# The garbage objects whose refcounts are ours to watch (ints, strs and None are shared).
WATCHED_GARBAGE = [o for o in GARBAGE if not isinstance(o, (int, str, type(None)))]
some_treedefs = st.lists(trees.map(tu.tree_structure), max_size=3)


def _exercise(td):
    """Every method of a treedef that was built from garbage: none may crash."""
    assert isinstance(td, fastree.PyTreeDef)
    for fn in (
        repr,
        hash,
        lambda t: t.num_leaves,
        lambda t: t.num_nodes,
        lambda t: t.children(),
        lambda t: t.node_data(),
        lambda t: t == t,
        lambda t: t == tu.tree_structure([1, {"a": 2}]),
        lambda t: t.unflatten([Leaf(i) for i in range(t.num_leaves)]),
        lambda t: t.unflatten([]),
        lambda t: t.flatten_up_to(t.unflatten(range(t.num_leaves))),
        lambda t: t.flatten_up_to([1, (2, 3)]),
        lambda t: t.compose(tu.tree_structure((1, 2))),
        lambda t: tu.tree_structure((1, 2)).compose(t),
        lambda t: tu.treedef_tuple([t, t]),
        lambda t: t.walk(lambda c, d: c, lambda x: x, range(t.num_leaves)),
        lambda t: pickle.loads(pickle.dumps(t)),
        lambda t: t._state(),
        lambda t: t.to_jax(),
        lambda t: tu.tree_map(lambda x: x, t.unflatten(range(t.num_leaves))),
    ):
        _outcome(fn, td)


def _garbage_state(draw):
    entry = st.one_of(
        garbage,
        st.tuples(
            st.one_of(garbage, st.sampled_from([None, tuple, list, dict, NT, Pair, Point])),
            garbage,
            st.integers(-2, 4),
            st.one_of(st.just(-1), st.integers(-3, 5)),
        ),
    )
    nodes = draw(st.one_of(st.lists(entry, max_size=6).map(tuple), garbage))
    version = draw(st.one_of(st.just(1), st.integers(-2, 3), garbage))
    return draw(st.sampled_from([(version, nodes), (version,), (version, nodes, None), nodes]))


@SETTINGS
@given(data=st.data())
def test_treedef_from_garbage_state(data):
    state = _garbage_state(data.draw)
    assert_no_leak(WATCHED_GARBAGE, _from_state, state)


def _from_state(state):
    kind, value = _outcome(_core._treedef_from_state, state)
    if kind == "ok":
        _exercise(value)
    else:
        assert issubclass(value, (ValueError, TypeError, RuntimeError, OverflowError)), value


@SETTINGS
@given(data=st.data(), blob=st.binary(max_size=64))
def test_treedef_from_random_bytes_and_corrupted_pickles(data, blob):
    tree = data.draw(trees)
    good = pickle.dumps(tu.tree_structure(tree))
    how = data.draw(st.sampled_from(["flip", "truncate", "splice", "random"]))
    if how == "flip":
        raw = bytearray(good)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        corrupted = bytes(raw)
    elif how == "truncate":
        corrupted = good[: data.draw(st.integers(0, len(good) - 1))]
    elif how == "splice":
        i = data.draw(st.integers(0, len(good)))
        corrupted = good[:i] + blob + good[i:]
    else:
        corrupted = blob
    # Raw bytes as a state must be rejected cleanly as well.
    kind, value = _outcome(_core._treedef_from_state, corrupted)
    assert kind == "raise" and issubclass(value, (ValueError, TypeError)), value
    # pickle itself raises all sorts (UnpicklingError, EOFError, KeyError, ...): any clean
    # exception is fine; a treedef that does come back must be usable.
    kind, value = _outcome(pickle.loads, corrupted)
    if kind == "ok" and isinstance(value, fastree.PyTreeDef):
        _exercise(value)


@SETTINGS
@given(node_data=st.one_of(garbage, st.tuples(garbage, garbage)), children=st.data())
def test_from_node_data_and_children_garbage(node_data, children):
    kids = children.draw(st.one_of(some_treedefs, garbage, st.lists(garbage, max_size=2)))
    assert_no_leak(WATCHED_GARBAGE, _from_node_data, node_data, kids)


def _from_node_data(node_data, kids):
    for args in ((node_data, kids), (None, node_data, kids), (node_data,), ()):
        kind, value = _outcome(fastree.PyTreeDef.from_node_data_and_children, *args)
        if kind == "ok":
            _exercise(value)
        else:
            assert issubclass(value, (ValueError, TypeError, RuntimeError)), value


@SETTINGS
@given(tree=trees, node_data=st.tuples(garbage, garbage))
def test_from_node_data_and_children_valid_children(tree, node_data):
    """Real children with wrong / mismatched node data (dict keys vs arity, None with kids...)."""
    td = tu.tree_structure(tree)
    for nd in (node_data, td.node_data()):
        for kids in ([td], [td, td], td.children(), []):
            kind, value = _outcome(fastree.PyTreeDef.from_node_data_and_children, nd, kids)
            if kind == "ok":
                _exercise(value)
            else:
                assert issubclass(value, (ValueError, TypeError, RuntimeError)), value


def test_node_data_round_trip_matches_jax_on_valid_input():
    """The non-garbage baseline: rebuilding a treedef from its own parts is the identity."""
    tree = {"a": [1, (2, None)], "b": NT(3, Pair(4, 5)), "c": collections.OrderedDict(z=6)}
    td = tu.tree_structure(tree)
    rebuilt = fastree.PyTreeDef.from_node_data_and_children(td.node_data(), td.children())
    assert rebuilt == td
    assert repr(rebuilt) == repr(jtu.tree_structure(tree))


@pytest.mark.parametrize("mode", [m for m in FLATTEN_MODES if m not in _ORDER_DEPENDENT])
def test_each_flatten_mode_matches_jax(mode):
    """The table above, against JAX (one JAX call per error mode, see FLATTEN_ERRORS)."""
    tree = [Leaf(1), {"a": Fickle([Leaf(2), (Leaf(3),)], mode)}]
    tree[1]["a"].victim = tree
    expected = FLATTEN_ERRORS.get(mode)
    jax_kind, jax_value = _outcome(jtu.tree_flatten, tree)
    assert (jax_value if jax_kind == "raise" else None) is expected
    for name, op in {**FLATTEN_OPS, **MAP_OPS}.items():
        kind, value = _outcome(op, tu, tree)
        assert (value if kind == "raise" else None) is expected, name
    if expected is None:
        assert tu.tree_leaves(tree) == jtu.tree_leaves(tree)
        assert repr(tu.tree_structure(tree)) == repr(jtu.tree_structure(tree))


@pytest.mark.parametrize("unmode", UNFLATTEN_MODES)
def test_each_unflatten_mode_matches_jax(unmode):
    tree = [Leaf(1), Fickle([Leaf(2)], "ok", unmode)]
    for name, op in MAP_OPS.items():
        _same_outcome(lambda: op(jtu, tree), lambda: op(tu, tree))
        kind, value = _outcome(op, tu, tree)
        assert (value if kind == "raise" else None) is UNFLATTEN_ERRORS.get(unmode), name


def _recursion_headroom():
    """How many more Python frames fit under the recursion limit from here."""
    depth = 0

    def dive():
        nonlocal depth
        depth += 1
        dive()

    try:
        dive()
    except RecursionError:
        pass
    return depth


def test_error_paths_leave_recursion_counter_alone():
    """Every fastree error raised while recursing unwinds Py_EnterRecursiveCall (jaxlib 0.10
    does not: each such error costs the thread one level of its recursion limit)."""
    bad_trees = [
        [{"k": [Fickle([1], mode)]}] for mode in FLATTEN_ERRORS
    ] + [[({1: 2, "a": 3},)], [[Fickle([1], "ok", "raise")]]]
    before = _recursion_headroom()
    for _ in range(50):
        for tree in bad_trees:
            for op in {**FLATTEN_OPS, **MAP_OPS}.values():
                _outcome(op, tu, tree)
            _outcome(tu.tree_leaves, tree, lambda x: 1 / 0 if isinstance(x, int) else False)
    assert _recursion_headroom() == before


@pytest.mark.parametrize(
    "tree", [{}, [{}], {"a": {}}, ({}, {"b": 1}, {}), [{"a": 1}, {}]], ids=stable_id
)
def test_empty_dicts(tree):
    """Empty dicts own no key slots: treedefs whose key vector is empty, or whose last dict is
    empty, are walked without indexing past the keys (the sanitized run checks the indexing)."""
    td = tu.tree_structure(tree)
    assert tu.tree_map(lambda x, y: x, tree, tree) == tree
    assert td.flatten_up_to(tree) == tu.tree_leaves(tree)
    assert td.unflatten(tu.tree_leaves(tree)) == tree
    assert repr(td) == repr(jtu.tree_structure(tree))
    assert td == tu.tree_structure(tree) and hash(td) == hash(tu.tree_structure(tree))
    assert tu.treedef_children(td) == td.children()
    assert pickle.loads(pickle.dumps(td)) == td
