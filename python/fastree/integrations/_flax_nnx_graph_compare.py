"""How flax_nnx_graph compares a native walk's result with flax's own (its first-walk checks).

Identity where flax hands out the objects it was given (leaves, static values, Variables), equal
ints and strs where it makes them anew (indexes, keys), ``==`` only where flax's own GraphDef
equality uses it (a node impl's metadata), and a rebuilt graph through flax's own flatten. A
comparison never raises for a user's ``==``: that counts as a difference.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from ._flax_nnx_graph_kinds import UNSERVED, VARIABLE


class Undecidable(Exception):
    """The two results hold objects no comparison can match (tracers a rebuild makes anew):
    the check decides nothing, and the call is flax's."""



def same_value(a: Any, b: Any) -> bool:
    # Identity, or equal ints and strs (indexes and keys flax makes anew); never == on
    # anything else (an array would raise).
    if a is b:
        return True
    return type(a) is type(b) and type(a) in (int, str) and a == b


def equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an == that raises is a difference, not an error
        return False


def same_record(a: Any, b: Any) -> bool:
    # The same record class, with each field the same value (HashableMapping: the same items).
    if type(a) is not type(b):
        return False
    if not dataclasses.is_dataclass(a):
        return same_value(a, b)
    hashable_mapping = sys.modules["flax.typing"].HashableMapping
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if type(x) is hashable_mapping and type(y) is hashable_mapping:
            x, y = x._mapping, y._mapping
            if list(x) != list(y) or not all(same_value(x[k], y[k]) for k in x):
                return False
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            if not same_record(x, y):
                return False
        elif field.name == "metadata":
            # A node impl's flatten makes its metadata anew (the generic pytree impl: a
            # treedef and an index map); flax's GraphDef equality compares it with ==.
            if not equal(x, y):
                return False
        elif not same_value(x, y):
            return False
    return True


def difference(ours: Any, theirs: Any, with_paths: bool) -> str | None:
    ours_def, ours_state = ours
    theirs_def, theirs_state = theirs
    if len(ours_def.nodes) != len(theirs_def.nodes) or not all(
        same_record(a, b) for a, b in zip(ours_def.nodes, theirs_def.nodes)
    ):
        return "the GraphDef's node records differ"
    if len(ours_def.attributes) != len(theirs_def.attributes) or not all(
        same_value(ka, kb) and same_record(a, b)
        for (ka, a), (kb, b) in zip(ours_def.attributes, theirs_def.attributes)
    ):
        return "the GraphDef's attributes differ"
    if ours_def.num_leaves != theirs_def.num_leaves:
        return "the number of leaves differs"
    ours_leaves = ours_state.leaves if with_paths else ours_state
    theirs_leaves = theirs_state.leaves if with_paths else theirs_state
    if len(ours_leaves) != len(theirs_leaves) or not all(
        a is b for a, b in zip(ours_leaves, theirs_leaves)
    ):
        return "the leaves differ"
    if with_paths and (
        len(ours_state.paths) != len(theirs_state.paths)
        or not all(
            len(p) == len(q) and all(same_value(x, y) for x, y in zip(p, q))
            for p, q in zip(ours_state.paths, theirs_state.paths)
        )
    ):
        return "the paths differ"
    return None


def map_difference(ours: dict[int, Any], theirs: dict[int, Any]) -> str | None:
    if list(ours) != list(theirs) or not all(
        ours[k][0] is theirs[k][0] and same_value(ours[k][1], theirs[k][1]) for k in ours
    ):
        return "the reference map differs"
    return None


def same_leaf(graph: Any, a: Any, b: Any) -> bool:
    # The same object, or Variables of a plain class rebuilt alike: class, raw value, metadata,
    # trace state.
    if a is b:
        return True
    kind = graph.kind_of(type(a))[0]
    if kind == UNSERVED:
        raise Undecidable(type(a).__qualname__)
    if type(a) is not type(b) or kind != VARIABLE:
        return False
    return (
        a._raw_value is b._raw_value
        and equal(a._var_metadata, b._var_metadata)
        and equal(a._trace_state, b._trace_state)
    )


def rebuilt_difference(graph: Any, ours: Any, theirs: Any) -> str | None:
    # Two rebuilt graphs compared through flax's own flatten of each.
    fresh = graph.graphlib.PythonRefMap
    ours_def, ours_state = graph.flax_flatten(ours, ref_index=fresh(), graph=True)
    theirs_def, theirs_state = graph.flax_flatten(theirs, ref_index=fresh(), graph=True)
    if type(ours) is not type(theirs):
        return "the rebuilt node's class differs"
    if not equal(ours_def, theirs_def):
        return "the rebuilt graph differs"
    if len(ours_state.leaves) != len(theirs_state.leaves) or not all(
        same_leaf(graph, a, b) for a, b in zip(ours_state.leaves, theirs_state.leaves)
    ):
        return "the rebuilt leaves differ"
    return None


def values_before(graph: Any, copy: Any) -> dict[int, tuple[int, Any, Any]]:
    """A copy's Variables before a write into it: id -> (position, the Variable, its value)."""
    _, state = graph.flax_flatten(copy, ref_index=graph.graphlib.PythonRefMap(), graph=True)
    return {id(leaf): (i, leaf, getattr(leaf, "_raw_value", None))
            for i, leaf in enumerate(state.leaves)}


def written_copies_difference(graph: Any, ours: Any, theirs: Any,
                              ours_before: dict[int, tuple[int, Any, Any]],
                              theirs_before: dict[int, tuple[int, Any, Any]]) -> str | None:
    """Two copies of the caller's objects after the native walk wrote into one (a merge into
    existing objects, an update) and flax's function into the other, compared as
    rebuilt_difference compares, except that a Variable whose value neither write replaced
    holds its own copy's copy of one original value: that counts as the same when both sat at
    the same place before. (flax's copies copy a dict value, and give each Variable that holds
    an array ref a new ref of its own.)

    A ref's contents are not compared: no read of a ref returns the object last written, and
    inside a trace each read is a new tracer. The native walks never write into a ref; every
    key whose Variable holds one is handed to flax's own function, in both copies alike.
    """
    if type(ours) is not type(theirs):
        return "the written copies' classes differ"
    fresh = graph.graphlib.PythonRefMap
    ours_def, ours_state = graph.flax_flatten(ours, ref_index=fresh(), graph=True)
    theirs_def, theirs_state = graph.flax_flatten(theirs, ref_index=fresh(), graph=True)
    if not equal(ours_def, theirs_def):
        return "the written copies' graphs differ"
    if len(ours_state.leaves) != len(theirs_state.leaves):
        return "the written copies' leaves differ"
    for a, b in zip(ours_state.leaves, theirs_state.leaves):
        if same_leaf(graph, a, b):
            continue
        before_a, before_b = ours_before.get(id(a)), theirs_before.get(id(b))
        untouched = (
            before_a is not None and before_b is not None
            and before_a[1] is a and before_b[1] is b
            and before_a[0] == before_b[0]
            and a._raw_value is before_a[2] and b._raw_value is before_b[2]
            and type(a) is type(b)
            and equal(a._var_metadata, b._var_metadata)
            and equal(a._trace_state, b._trace_state)
        )
        if not untouched:
            return "the written copies' leaves differ"
    return None


def index_difference(ours: dict[Any, Any], theirs: dict[Any, Any]) -> str | None:
    if list(ours) != list(theirs) or not all(type(ours[k]) is type(theirs[k]) for k in ours):
        return "the index map differs"
    return None
