"""Every Python-side walker under hostile shapes: cycles, shared DAGs, 100k-node trees.

The walkers: ``fastree.audit``, ``fastree.find_shared`` (both over live trees, through
``fastree._walk``), the aux_data reporter (``_aux._report``, reached through ``tree_flatten``
with a bad aux_data), ``structure_diff`` / ``PyTreeDef.diff`` / ``explain_retrace`` and
``_statetree.parse_state`` (over treedef states), ``fingerprint`` / ``serialize`` /
``deserialize`` (over states and aux values). Each must

* be linear in what it is given: a node reached by many paths is walked once (a 40-level DAG
  with two references per level has 2**40 paths), a deep or 100k-node tree is not quadratic;
* on a cycle, raise what ``tree_flatten`` raises (RecursionError for built-in containers and
  plain custom nodes, ValueError naming type and key paths through identity-preserving nodes),
  or, for values inside aux_data, a TypeError saying so;
* honour ``is_leaf`` where it takes one.

Every case runs under a time bound (``bounded``: SIGALRM raising a BaseException, which no
walker swallows) generous enough to catch only hangs and blowups; the case whose failure mode
is a hang runs in a subprocess with a timeout, so a regression fails instead of hanging.
Plain-container DAGs are only given to the walkers of live trees: ``tree_flatten`` itself
expands a DAG of plain nodes (as JAX does), so treedef walkers get DAGs of identity-preserving
nodes, whose treedefs hold shared references.
"""

from __future__ import annotations

import doctest
import importlib
import os
import subprocess
import sys
import textwrap
import warnings

import fastree
import fastree.tree_util as tu
import numpy as np
import pytest
from fastree import _core, _statetree, _walk
from fastree.diagnostics import aux as _aux
from helpers import WALK_TIME_BOUND, Plain, Shared, bounded

# The aux_data checks are under test here: on in installed runs too (conftest.py).
AUX_CHECKS = "warn"


def error_of(fn, *args, **kwargs) -> BaseException:
    with bounded():
        try:
            fn(*args, **kwargs)
        except (RecursionError, ValueError, TypeError) as e:
            return e
    raise AssertionError(f"{fn.__name__} did not raise")


# ------------------------------------------------------------------------------------------------
# node types


class Bad:
    """Its flatten puts a fresh array into aux_data: fastree warns (or raises, strict)."""

    def __init__(self, x):
        self.x = x


tu.register_pytree_node(Bad, lambda b: ((b.x,), np.zeros(1)), lambda a, c: Bad(*c))


class Endless:
    """Its flatten makes a fresh child on every call: a loop no memo by id can recognise."""


tu.register_pytree_node(Endless, lambda e: ((Endless(),), None), lambda a, c: Endless())


# ------------------------------------------------------------------------------------------------
# inputs


def self_list():
    cyclic = [1]
    cyclic.append(cyclic)
    return cyclic


def self_dict():
    cyclic = {"x": 1}
    cyclic["self"] = cyclic
    return {"root": cyclic}


def cycle_through_plain():
    node = Plain(1)
    node.kids.append([node])
    return [0, node]


def cycle_through_shared():
    node = Shared(1)
    node.kids.append({"back": [node]})
    return {"a": (0, node)}


def cycle_entering_shared_later():
    # The cycle closes at a list; the identity-preserving node is the second member.
    outer = [0]
    node = Shared(outer)
    outer.append(node)
    return {"x": outer}


CYCLES = {
    "self-list": self_list,
    "self-dict": self_dict,
    "through-plain-node": cycle_through_plain,
    "through-identity-node": cycle_through_shared,
    "identity-node-inside-cycle": cycle_entering_shared_later,
}

DEPTH = 40


def dag(make, depth=DEPTH):
    """depth levels, each holding two references to the level below."""
    x = make(0)
    for _ in range(depth):
        x = make(x, x)
    return x


DAGS = {
    "lists": lambda: dag(lambda *k: list(k)),
    "plain-nodes": lambda: dag(lambda *k: Plain(*k, aux="p")),
    "identity-nodes": lambda: dag(lambda *k: Shared(*k, aux="s")),
}


def big_tree(n=100_000):
    """About n nodes and leaves: dicts, tuples, lists, None and custom nodes."""
    return {f"k{i}": (i, [Plain(i, aux=("m", i % 3)), None]) for i in range(n // 6)}


def deep_list(depth):
    x = 0
    for _ in range(depth):
        x = [x]
    return x


# ------------------------------------------------------------------------------------------------
# fastree.audit and fastree.find_shared: errors on cycles are flatten's


WALKERS = {"audit": fastree.audit, "find_shared": fastree.find_shared}


@pytest.mark.parametrize("walker", list(WALKERS.values()), ids=list(WALKERS))
@pytest.mark.parametrize("build", list(CYCLES.values()), ids=list(CYCLES))
def test_cycle_raises_what_flatten_raises(walker, build):
    expected = error_of(tu.tree_flatten, build())
    got = error_of(walker, build())
    assert type(got) is type(expected)
    if isinstance(expected, ValueError) or build in (self_list, self_dict):
        assert str(got) == str(expected)  # names the same node and key paths


def test_flatten_recursion_text_is_the_cores():
    assert str(error_of(tu.tree_flatten, self_list())) == _walk.FLATTEN_RECURSION_MESSAGE


def test_identity_cycle_message_names_type_and_both_paths():
    message = str(error_of(fastree.audit, cycle_entering_shared_later()))
    assert message == (
        f"Reference cycle through an identity-preserving node: the {Shared!r} at key path "
        "['x'][1] contains itself (again at key path ['x'][1][<flat index 0>][1])."
    )


@pytest.mark.parametrize("walker", list(WALKERS.values()), ids=list(WALKERS))
def test_too_deep_and_endless_raise_recursion_error(walker):
    assert isinstance(error_of(tu.tree_flatten, deep_list(5000)), RecursionError)
    assert isinstance(error_of(walker, deep_list(5000)), RecursionError)
    assert isinstance(error_of(tu.tree_flatten, Endless()), RecursionError)
    assert isinstance(error_of(walker, Endless()), RecursionError)


@pytest.mark.parametrize("walker", list(WALKERS.values()), ids=list(WALKERS))
@pytest.mark.parametrize("build", list(CYCLES.values()), ids=list(CYCLES))
def test_is_leaf_stops_before_a_cycle(walker, build):
    # The cycle made a leaf by is_leaf: the walker answers as if a plain leaf stood there. The
    # rest of the tree holds one custom node (audit lists it) and one shared array (find_shared
    # lists it), so the answers compared are not empty.
    tree = build()
    shared = np.zeros(1)
    rest = [Plain(shared, aux="a"), shared]
    with bounded():
        got = walker([tree, *rest], is_leaf=lambda x: x is tree)
    expected = walker([object(), *rest])
    assert _answer(got) == _answer(expected)
    assert len(_answer(expected)) == 1


def test_is_leaf_stops_before_an_endless_node_and_a_deep_list():
    deep = deep_list(5000)
    tree = (Endless(), deep, deep)
    is_leaf = lambda x: isinstance(x, (Endless, list))  # noqa: E731
    with bounded():
        assert fastree.audit(tree, is_leaf=is_leaf).entries == ()
        found = fastree.find_shared(tree, is_leaf=is_leaf)
    assert [(s.obj, s.paths) for s in found] == [
        (deep, [(tu.SequenceKey(1),), (tu.SequenceKey(2),)])
    ]


def _answer(result) -> list:
    # What a walker reported, comparable across calls: audit's entries as printed (key path,
    # node type, aux_data, verdict), find_shared's objects by identity with their key paths.
    if isinstance(result, fastree.AuditReport):
        return str(result).splitlines()[1:]
    return [(id(s.obj), s.paths) for s in result]


@pytest.mark.parametrize("build", list(DAGS.values()), ids=list(DAGS))
def test_audit_walks_a_shared_node_once(build):
    with bounded():
        report = fastree.audit(build())
    if build is DAGS["lists"]:
        assert report.entries == ()
    else:  # one entry per node object, at its first path: [0][0]...[0]
        assert len(report.entries) == DEPTH + 1
        assert [len(e.path) for e in report.entries] == list(range(DEPTH + 1))
        assert report.ok


@pytest.mark.parametrize("build", list(DAGS.values()), ids=list(DAGS))
def test_find_shared_on_a_dag(build):
    with bounded():
        found = fastree.find_shared(build())
    assert len(found) == DEPTH  # every level below the root, each at 2 paths
    assert all(len(s.paths) == 2 for s in found)
    # The second path of a level leaves its parent's first path by the second child.
    assert len(found[0].paths[0]) == len(found[0].paths[1]) == 1


def test_audit_and_find_shared_on_100k_nodes():
    tree = big_tree()
    with bounded():
        report = fastree.audit(tree)
        assert len(report.entries) == 100_000 // 6
        last = (tu.DictKey(max(tree)), tu.SequenceKey(1), tu.SequenceKey(0))  # sorted keys
        assert report.entries[-1].path == last
        assert fastree.find_shared(tree) == []
        flat = list(range(100_000))
        shared = np.zeros(2)
        flat[-1] = flat[0] = shared
        (found,) = fastree.find_shared(flat)
        assert found.paths == [(tu.SequenceKey(0),), (tu.SequenceKey(99_999),)]


def test_audit_of_a_value_shared_and_cyclic_inside_aux():
    pairs = ()
    for _ in range(DEPTH):
        pairs = (pairs, pairs)
    cyclic = self_list()
    with bounded():
        report = fastree.audit([Plain(aux=pairs), Plain(aux=cyclic)])
    assert report.entries[0].problems == ()  # hashable, checked without hashing 2**40 tuples
    assert report.entries[1].aux_repr == "[1, [...]]"
    assert any(p.startswith("mutable container") for p in report.entries[1].problems)


def test_short_repr_is_repr_up_to_its_limit():
    pairs = ()
    for _ in range(DEPTH):
        pairs = (pairs, pairs)
    values = [np.zeros(3), {"a": np.ones(2), 1: (None,)}, [], set(), frozenset({1}), (1,)]
    values += [self_list(), self_dict(), {3: "x", 1: "y"}, [(), [], {}]]
    for value in values:
        assert fastree.diagnostics.audit.short_repr(value, limit=10_000) == repr(value)
    with bounded():
        assert fastree.diagnostics.audit.short_repr(pairs, limit=30) == "(" * 27 + "..."


# ------------------------------------------------------------------------------------------------
# the aux_data reporter (reached through tree_flatten)


@pytest.fixture
def fresh_aux_state():
    _aux._reset_warnings()
    yield
    fastree.config.strict_aux = False
    _aux._reset_warnings()


def flatten_warnings(tree, **kwargs):
    """tree_flatten under the time bound; returns the AuxDataWarning messages."""
    with bounded(), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        tu.tree_flatten(tree, **kwargs)
    return [str(w.message) for w in record if issubclass(w.category, fastree.AuxDataWarning)]


CYCLE_STOPPED_BY_IS_LEAF = textwrap.dedent(
    """
    import numpy as np
    import fastree.tree_util as ftu

    class Bad:
        def __init__(self, x): self.x = x
    ftu.register_pytree_node(Bad, lambda b: ((b.x,), np.zeros(1)), lambda a, c: Bad(*c))

    graph = []
    graph.append(graph)
    leaves, td = ftu.tree_flatten([graph, Bad(1.0)], is_leaf=lambda x: x is graph)
    print("returned", td)
    """
)


def test_is_leaf_stopping_at_a_cycle_returns_at_once():
    # A reporter that re-walked the cycle would make up to a million visits, building a path
    # tuple of length d at depth d (about 30 minutes). In a subprocess, so that such a
    # regression fails this test by its timeout instead of hanging the suite.
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", CYCLE_STOPPED_BY_IS_LEAF],
        capture_output=True,
        text=True,
        timeout=WALK_TIME_BOUND,
        # the checks on, should this session run installed (where "auto" turns them off)
        env={**os.environ, "FASTREE_AUX_CHECKS": "warn"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "returned PyTreeDef([*, CustomNode(Bad[[0.]], [*])])" in proc.stdout
    assert "aux_data of the __main__.Bad node at key path [1] holds a numpy.ndarray" in proc.stderr


@pytest.mark.usefixtures("fresh_aux_state")
@pytest.mark.parametrize("build", list(CYCLES.values()) + [Endless], ids=[*CYCLES, "endless"])
def test_reporter_with_is_leaf_stopping_at_a_cycle(build):
    stopped = build()
    (message,) = flatten_warnings([stopped, Bad(1.0)], is_leaf=lambda x: x is stopped)
    # The core passes the flatten's is_leaf to the reporter, so its walk stops where flatten
    # stopped: the cycle and the endless subtree are never entered.
    assert "Bad node at key path [1] holds a numpy.ndarray" in message


@pytest.mark.usefixtures("fresh_aux_state")
@pytest.mark.parametrize("build", [self_list, cycle_through_plain], ids=["list", "plain-node"])
def test_a_walk_that_fails_reports_nothing_and_raises_its_error(build):
    # Reports are made once the walk is over (aux::ReportScope); a walk that fails (here at a
    # cycle, after the Bad node) raises its own error, and no reporter runs beside it.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        error = error_of(tu.tree_flatten, [Bad(1.0), build()])
    assert isinstance(error, RecursionError)
    assert record == []
    # The same node in a tree that flattens is reported, at its key path.
    (message,) = flatten_warnings([Bad(1.0), [1]])
    assert "Bad node at key path [0] holds" in message


@pytest.mark.usefixtures("fresh_aux_state")
def test_reporter_with_stopped_dags_and_an_identity_dag():
    lists = DAGS["lists"]()
    (message,) = flatten_warnings([lists, Bad(1.0)], is_leaf=lambda x: x is lists)
    assert "Bad node at key path [1] holds" in message
    _aux._reset_warnings()
    bottom = Shared(Bad(2.0))
    tree = dag(lambda *k: Shared(*k) if k != (0,) else bottom)
    (message,) = flatten_warnings({"m": tree})
    path = "['m']" + "[<flat index 0>]" * (DEPTH + 1)
    assert f"Bad node at key path {path} holds" in message


@pytest.mark.usefixtures("fresh_aux_state")
def test_reporter_on_100k_nodes_and_strict_mode():
    tree = big_tree()
    tree["zz"] = [Bad(1.0)]
    (message,) = flatten_warnings(tree)
    assert "Bad node at key path ['zz'][0] holds" in message
    fastree.config.strict_aux = True
    error = error_of(tu.tree_structure, tree)
    assert isinstance(error, TypeError) and "at key path ['zz'][0]" in str(error)


@pytest.mark.usefixtures("fresh_aux_state")
def test_reporter_uses_key_path_and_is_leaf_when_given():
    # The contract for a core that passes what it knows (see _aux's module docstring).
    endless = Endless()
    bad = Bad(1.0)
    aux = np.zeros(1)
    assert _aux._locate([endless, bad], Bad, aux, "array", False) is None
    assert _aux._locate(
        [endless, bad], Bad, aux, "array", False, is_leaf=lambda x: x is endless
    ) == (tu.SequenceKey(1),)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _aux._report(Bad, aux, None, key_path=(tu.DictKey("given"),))
    assert "Bad node at key path ['given'] holds" in str(record[0].message)


# ------------------------------------------------------------------------------------------------
# treedef walkers: structure_diff / diff / explain_retrace, parse_state, fingerprint, serialize


def deep_state(depth, top=list):
    entries = [(None, None, 0, -1)] + [(list, None, 1, -1)] * (depth - 1) + [(top, None, 1, -1)]
    return (1, tuple(entries))


@pytest.mark.parametrize(
    "walker", [fastree.structure_diff, lambda a, b: fastree.structure_diff(b, a)]
)
@pytest.mark.parametrize("build", list(CYCLES.values()), ids=list(CYCLES))
def test_structure_diff_of_a_cycle_raises_what_flatten_raises(walker, build):
    expected = error_of(tu.tree_flatten, build())
    got = error_of(walker, build(), [1])
    assert type(got) is type(expected)


def test_treedef_walkers_on_an_identity_dag():
    a, b = DAGS["identity-nodes"](), DAGS["identity-nodes"]()
    b.kids[1] = Shared(b.kids[1].kids[0], b.kids[1].kids[1], aux="s")  # a copy: no longer shared
    with bounded():
        ta, tb = tu.tree_structure(a), tu.tree_structure(b)
        assert ta.num_nodes < 200
        (d,) = ta.diff(tb)
        assert d.kind == "sharing" and d.path == (tu.FlattenedIndexKey(1),)
        assert fastree.structure_diff(a, DAGS["identity-nodes"]()) == []
        assert "1 place(s)" in fastree.diagnostics.diff.explain_retrace(tb, [ta])
        assert ta.fingerprint() != tb.fingerprint()
        assert fastree.deserialize(ta.serialize()) == ta


def test_treedef_walkers_on_100k_nodes():
    tree = big_tree()
    other = dict(tree)
    other["k0"] = (0, [Plain(0, aux=("m", 1)), None])
    with bounded():
        ta, tb = tu.tree_structure(tree), tu.tree_structure(other)
        (d,) = ta.diff(tb)
        assert d.path == (tu.DictKey("k0"), tu.SequenceKey(1), tu.SequenceKey(0))
        assert ta.fingerprint() != tb.fingerprint()
        assert fastree.deserialize(ta.serialize()) == ta
        assert len(_statetree.parse_state(ta._state())) == ta.num_nodes


def test_treedef_walkers_on_a_deep_treedef():
    # Deeper than flatten goes, as _treedef_from_state (or deserialize) can build: key paths
    # must not be built for every node (20,000-deep: 2e8 key copies before).
    depth = 20_000
    ta = _core._treedef_from_state(deep_state(depth))
    tb = _core._treedef_from_state(deep_state(depth, top=tuple))
    with bounded():
        (d,) = fastree.structure_diff(tb, ta)
        assert d.path == () and d.kind == "node_type"
        nodes = _statetree.parse_state(ta._state())
        assert len(nodes[0].path) == depth
        assert ta.fingerprint() != tb.fingerprint()


def test_fingerprint_of_shared_and_cyclic_aux_values():
    def pairs(depth):
        x = ("leaf",)
        for _ in range(depth):
            x = (x, x)
        return x

    def unshared(x):
        return tuple(unshared(i) for i in x) if type(x) is tuple else x

    with bounded():
        # A shared value is encoded once and written out by value: the same as unshared.
        small = pairs(14)
        fp = tu.tree_structure(Plain(aux=small)).fingerprint()
        assert fp == tu.tree_structure(Plain(aux=unshared(small))).fingerprint()
        # 2**40 copies: refused, quickly, instead of running for days.
        error = error_of(tu.tree_structure(Plain(aux=pairs(DEPTH))).fingerprint)
        assert "shared so often" in str(error) and "Plain node at (root)" in str(error)
        cyclic = self_list()
        for method in ("fingerprint", "serialize"):
            error = error_of(getattr(tu.tree_structure({"p": Plain(aux=cyclic)}), method))
            assert isinstance(error, TypeError)
            assert "Plain node at ['p']: a list value ([1, [...]]) contains itself" in str(error)


# ------------------------------------------------------------------------------------------------
# the docstrings' examples run


@pytest.mark.parametrize(
    "module", ["_walk", "_identity", "_statetree", "diagnostics.audit", "_serialize"]
)
def test_docstring_examples(module):
    mod = importlib.import_module(f"fastree.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
