"""The Python layer's walkers, as reorganised for issue 14: one of each kind.

* ``_walk.Walk``, the one walker of live trees: its modes for the mismatch explanation of
  ``tree_map`` / ``tree_broadcast`` (every path, ``is_leaf`` with a path, skipping a node) and
  the core's kind of each node (``Walk.kind``, which the audit lists custom nodes by);
* ``_values.ValueWalk``, the one walker of the values inside aux_data (the aux checks, the
  audit, ``short_repr``, the fingerprint/serialize encoder);
* the treedef walks over the core's node records (``_statetree.parse_nodes``), among them the
  JAX conversions, now iterative.

Each is linear (a 40-level shared DAG in well under the time bound), goes as deep as its input
does without a RecursionError of its own (10,000 levels) where its input allows it, and meets a
cycle with the documented error. ``tests/test_walkers.py`` pins the same for the public entry
points; this file covers what is new.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import fastree
import fastree.tree_util as tu
import numpy as np
import pytest
from fastree import _core, _statetree, _values, _walk
from fastree.diagnostics import audit as _audit
from fastree.diagnostics import aux as _aux
from fastree.jax_interop import bridge as _jax_bridge
from fastree.jax_interop import map_errors as _map_errors
from fastree.jax_interop.compat import tree_util as jtu
from helpers import Plain, Shared, bounded

DEPTH = 40
DEEP = 10_000


class Point(NamedTuple):
    x: object
    y: object


@tu.register_dataclass
@dataclasses.dataclass
class Cell:
    a: object
    meta: int = dataclasses.field(default=0, metadata={"static": True})


def identity_dag(bottom, depth=DEPTH):
    x = bottom
    for _ in range(depth):
        x = Shared(x, x, aux="s")
    return x


def pairs(depth=DEPTH):
    x = ()
    for _ in range(depth):
        x = (x, x)
    return x


def deep_list(depth):
    x = 0
    for _ in range(depth):
        x = [x]
    return x


def self_list():
    cyclic = [1]
    cyclic.append(cyclic)
    return cyclic


# ------------------------------------------------------------------------------------------------
# _walk.Walk: every path, is_leaf with a path, skip, position, kind


def test_every_path_mode_expands_a_dag_of_plain_nodes_as_flatten_does():
    shared = [1, 2]
    walk = _walk.Walk({"a": shared, "b": shared}, once=False)
    everything = list(walk)
    occurrences = [o for o in everything if o.obj is shared]
    assert [o.first for o in occurrences] == [True, True]
    assert occurrences[0].index != occurrences[1].index
    assert [walk.path_of(o) for o in occurrences] == [(tu.DictKey("a"),), (tu.DictKey("b"),)]
    assert [o.position for o in everything if o.parent == occurrences[1].index] == [0, 1]


@pytest.mark.parametrize("once", [True, False])
def test_a_cycle_raises_what_flatten_raises(once):
    with pytest.raises(RecursionError, match="in flatten; PyTree may have cyclical"):
        list(_walk.Walk(self_list(), once=once))
    node = Shared(1)
    node.kids.append([node])
    with pytest.raises(ValueError, match="Reference cycle through an identity-preserving node"):
        list(_walk.Walk({"a": node}, once=once))


def test_is_leaf_takes_path_and_skip():
    tree = {"a": [1, [2]], "b": (3,)}
    seen = []

    def is_leaf(path, x):
        seen.append(tu.keystr(path))
        return path == (tu.DictKey("b"),)

    walk = _walk.Walk(tree, is_leaf, is_leaf_takes_path=True, once=False)
    objects = []
    for occurrence in walk:
        objects.append(occurrence.obj)
        if occurrence.obj == [2]:
            walk.skip()
    assert seen == ["", "['a']", "['a'][0]", "['a'][1]", "['b']"]
    assert 2 not in objects and (3,) in objects and 3 not in objects


def test_kind_is_the_cores():
    trees = [
        {"a": 1},
        (1,),
        [1],
        None,
        Point(1, 2),
        collections.OrderedDict(a=1),
        collections.defaultdict(list, a=1),
        Plain(1, aux="p"),
        Shared(1),
        Cell(1),
        jtu.Partial(print, 1),
    ]
    walk = _walk.Walk(trees)
    kinds = {id(o.obj): walk.kind(o) for o in walk if o.node is not None and o.parent == 0}
    assert [kinds[id(t)] for t in trees] == [tu.tree_structure(t)._nodes()[-1][0] for t in trees]


def test_mismatch_explanation_of_an_identity_dag_is_linear():
    a = identity_dag((1,))
    b = identity_dag((1, 2))
    with bounded():
        explained = _map_errors.first_difference(a, b, None, False)
        error = pytest.raises(ValueError, tu.tree_map, lambda x, y: x, a, b).value
    assert explained is not None
    text = str(explained("tree"))
    assert text.startswith("pytree structure error: different lengths of tuple at key path")
    assert "[<flat index 0>]" * DEPTH in text
    if _map_errors._ENABLED:
        assert str(error).startswith("pytree structure error: different lengths of tuple")


def test_broadcast_mismatch_is_jaxs_and_walks_every_path_once():
    prefix, full = ([1, 2], {"a": 3}), ([0, 0, 0], {"a": 0})
    ours = pytest.raises(ValueError, tu.tree_broadcast, prefix, full).value
    theirs = pytest.raises(ValueError, jtu.tree_broadcast, prefix, full).value
    assert str(ours) == str(theirs)
    with bounded():  # a prefix found on the far side of a deep subtree
        deep = deep_list(500)
        ours = pytest.raises(ValueError, tu.tree_broadcast, (deep, [1, 2]), (deep, (1, 2))).value
    assert str(ours).splitlines()[:2] == [
        "pytree structure error: different types at key path",
        "    broadcast_prefix prefix_tree[1]",
    ]


# ------------------------------------------------------------------------------------------------
# _values.ValueWalk


def _is_builtin(value, depth):
    return type(value) in (tuple, list, dict, set, frozenset)


def test_value_walk_events_cycles_and_repeats():
    shared = (1, 2)
    cyclic = self_list()
    walk = _values.ValueWalk(_is_builtin, _aux.items)
    events = [(e, v) for e, v, _, _ in walk.events({"k": [shared, shared], "c": cyclic})]
    assert events.count((_values.REPEAT, shared)) == 1
    assert (_values.CYCLE, cyclic) in events
    enters = sum(e == _values.ENTER for e, _ in events)
    assert enters == sum(e == _values.LEAVE for e, _ in events) == 4


def test_value_walk_memo_outlives_one_value():
    shared = (1, 2)
    walk = _values.ValueWalk(_is_builtin, list)
    first = [e for e, *_ in walk.events(shared)]
    again = [e for e, *_ in walk.events([shared])]
    assert first == ["enter", "atom", "atom", "leave"]
    assert again == ["enter", "repeat", "leave"]


def test_value_walk_never_memoizes_and_stops_at_its_limit():
    shared = (1,)
    events = list(_values.ValueWalk(_is_builtin, list, memo_key=_values.never).events([shared] * 3))
    assert sum(e == _values.ENTER for e, *_ in events) == 4
    limited = _values.ValueWalk(_is_builtin, list, max_containers=2)
    assert sum(e == _values.ENTER for e, *_ in limited.events([[[[1]]]])) == 2


def test_every_value_walker_on_a_40_level_dag():
    value = pairs()
    with bounded():
        assert _aux._find_problems(value, strict=True) == []
        assert _aux._hashable(value)
        assert _audit._aux_problems(value) == []
        assert _audit.short_repr(value, limit=30) == "(" * 27 + "..."
        error = pytest.raises(TypeError, tu.tree_structure(Plain(aux=value)).fingerprint)
    assert "shared so often" in str(error.value)


def test_every_value_walker_10_000_levels_deep():
    value = deep_list(DEEP)
    bad = deep_list(DEEP)
    bad[0] = np.zeros(1)  # deep inside: still found
    with bounded():
        assert _aux._find_problems(value, strict=False) == []
        assert [k for k, _ in _aux._find_problems(bad, strict=False)] == ["array"]
        assert not _aux._hashable(value)
        assert _audit._aux_problems(value) == ["mutable container: list", _UNHASHABLE]
        # Written piece by piece without recursion (repr itself would raise RecursionError).
        assert _audit.short_repr(value, limit=20) == "[" * 17 + "..."
        for method in ("fingerprint", "serialize"):
            error = pytest.raises(TypeError, getattr(tu.tree_structure(Plain(aux=value)), method))
            assert "value nested too deeply (more than 64 levels)" in str(error.value)


_UNHASHABLE = "unhashable: hash(aux_data) fails (strict mode rejects it)"


def test_every_value_walker_on_a_cycle():
    cyclic = self_list()
    with bounded():
        assert _aux._find_problems(cyclic, strict=True) == [("unhashable", cyclic)]
        assert not _aux._hashable((cyclic,))
        assert _audit._aux_problems(cyclic) == ["mutable container: list", _UNHASHABLE]
        assert _audit.short_repr(cyclic) == repr(cyclic) == "[1, [...]]"
        error = pytest.raises(TypeError, tu.tree_structure(Plain(aux=cyclic)).serialize)
    assert "contains itself (a cycle)" in str(error.value)


def test_audit_problems_keep_their_order():
    # Last item first, a dict's values before its keys: the order audits have always listed.
    problems = _audit._aux_problems((0.5, [1], {"k": {2}}))
    assert problems == [
        "mutable container: dict",
        "mutable container: set",
        "mutable container: list",
        "float: 0.5 changes the jit cache key whenever the value changes",
        _UNHASHABLE,
    ]


# ------------------------------------------------------------------------------------------------
# treedef walks over the core's node records


def test_parse_nodes_reads_the_cores_kinds_and_keys():
    td = tu.tree_structure({"p": Point(1, 2), "c": Cell([3]), "s": Plain(4)})
    nodes = _statetree.parse_nodes(td)
    kinds = [n.kind for n in nodes if not n.is_leaf]
    assert kinds == ["list", "dataclass", "namedtuple", "custom", "dict"]
    paths = [p for p, _ in tu.tree_leaves_with_path(td.unflatten(range(4)))]
    assert [n.path for n in nodes if n.is_leaf] == paths
    root = nodes[-1]
    assert root.num_nodes == len(nodes) and root.first == 0 and root.num_leaves == 4


@pytest.mark.parametrize("route", ["from_node_data", "pickled_state"])
def test_jax_conversions_10_000_levels_deep(route):
    if route == "from_node_data" and not fastree.jax_interop.compat.JAXLIB_BUILDS_FROM_NODE_DATA:
        pytest.skip("jaxlib < 0.7")
    entries = [(None, None, 0, -1)] + [(list, None, 1, -1)] * DEEP
    td = _core._treedef_from_state((1, tuple(entries)))
    nodes = _statetree.parse_nodes(td)
    with bounded():
        convert = (
            _jax_bridge._to_jax if route == "from_node_data" else _jax_bridge._to_jax_from_state
        )
        converted = convert(td, nodes)
        assert converted.num_nodes == DEEP + 1
        assert fastree.from_jax(converted) == td


def test_jax_conversions_of_nested_identity_nodes_with_sharing():
    # Sharing inside one identity-preserving node each (what a JAX treedef can hold).
    inner, other = Shared(1, aux="inner"), Shared(5)
    outer = Shared(inner, [inner, Shared(2)], aux="outer")
    tree = {"a": outer, "b": (3, Shared(other, [other]))}
    td = tu.tree_structure(tree)
    nodes = _statetree.parse_nodes(td)
    routes = [_jax_bridge._to_jax_from_state]
    if fastree.jax_interop.compat.JAXLIB_BUILDS_FROM_NODE_DATA:
        routes.append(_jax_bridge._to_jax)
    for route in routes:
        converted = route(td, nodes)
        assert fastree.from_jax(converted) == td
        leaves = jtu.tree_leaves(converted.unflatten(range(converted.num_leaves)))
        assert len(leaves) == td.num_leaves
