"""flax's ``graphlib._graph_update_dynamic`` (nnx.update, the updates of the transforms) and
``_merge_to_flat_state`` (nnx.merge's states) in graph mode, served by the C walks
(csrc/nnx/nnx_graph_update.cpp, nnx_graph_merge_state.cpp): the functions attach binds
(:func:`make_update`, :func:`make_merge_leaves`) and the first update's check per root type."""

from __future__ import annotations

import functools
import threading
from typing import Any

from .. import _core
from . import _flax_nnx_graph_compare as _compare
from . import _flax_nnx_graph_user_code as _user_code
from ._flax_nnx_graph_tables import Graph, served_now

# Whether this thread is inside a native update: a subtree the walk hands to flax's function comes
# back to graphlib._graph_update_dynamic (flax's recursion), which must stay flax's from there on
# (each native entry is C stack).
_updating = threading.local()


def make_update(graph: Graph) -> Any:
    flax_update = graph.flax_update

    @functools.wraps(flax_update)
    def _graph_update_dynamic(node: Any, state: Any) -> None:
        root = type(node)
        if (
            getattr(_updating, "active", False)
            or getattr(_updating, "checking", False)
            or root in graph.fallbacks
            or root in graph.update_fallbacks
            or not served_now(graph, "update")
            or not graph.lock.acquire(blocking=False)  # another thread walks: flax's (Graph.lock)
        ):
            return flax_update(node, state)
        try:
            graph.refresh()
            if root not in graph.verified_updates and not _checked_update(graph, node, state):
                return flax_update(node, state)
            return _native_update(graph, node, state)
        finally:
            graph.lock.release()

    return _graph_update_dynamic


def _native_update(graph: Graph, node: Any, state: Any) -> None:
    _updating.active = True
    try:
        return _core.nnx_graph_update(node, state, graph.unflatten_context)
    finally:
        _updating.active = False


def _checked_update(graph: Graph, node: Any, state: Any) -> bool:
    # The first update of a root type: flax's function and the native walk each update a copy
    # of the graph (made by flax's own flatten and unflatten), and the two are compared. True
    # if the native walk may serve the call (and later ones for this root type). flax's update
    # recurses through graphlib._graph_update_dynamic, which is ours: while a check runs, those
    # calls are flax's (no check per level, which made a chain's first update quadratic).
    _updating.checking = True
    try:
        # Copies, two updates and their comparison would run a user's node functions again,
        # and each update compares a Variable's metadata with the state's (a user's ==).
        user_code = _user_code.in_graph(graph, node) or _user_code.in_state(graph, state)
        decided = None if user_code else _compare_update(graph, node, state)
    finally:
        _updating.checking = False
    root = type(node)
    if decided is None:
        # Undecided (no copy could be made, a difference that cannot be judged, or a check
        # that would run a user's functions twice): after a few such checks the root type stays
        # flax's, rather than paying a check per update.
        count = graph.undecided_updates.get(root, 0) + 1
        graph.undecided_updates[root] = count
        if count >= _UNDECIDED_LIMIT:
            graph.update_fallbacks[root] = (
                "its graph or state holds user code a check would run again (a node's own "
                "functions, a metadata value's ==)" if user_code
                else f"the first {count} updates' checks could not decide")
        return False
    return decided


_UNDECIDED_LIMIT = 3


def _compare_update(graph: Graph, node: Any, state: Any) -> bool | None:
    # True/False: decided (and recorded); None: undecided.
    root = type(node)
    copies = []
    try:
        for _ in range(2):
            graphdef, flat = graph.flax_flatten(node, ref_index=graph.graphlib.PythonRefMap(),
                                                graph=True)
            copies.append(graph.flax_unflatten(graphdef, flat, copy_variables=True))
    except Exception:  # noqa: BLE001 - no copies to compare on: this call is flax's, undecided
        return None
    theirs, ours = copies
    try:
        theirs_before = _compare.values_before(graph, theirs)
        ours_before = _compare.values_before(graph, ours)
    except Exception:  # noqa: BLE001 - nothing to compare on: this call is flax's, undecided
        return None
    errors = []
    for run, target in ((graph.flax_update, theirs),
                        (lambda n, s: _native_update(graph, n, s), ours)):
        try:
            run(target, state)
            errors.append(None)
        except Exception as error:  # noqa: BLE001 - compared below, then raised by the real call
            errors.append(type(error))
    why = None
    if errors[0] is not errors[1]:
        why = "the update raises differently"
    elif errors[0] is None:
        try:
            why = _compare.written_copies_difference(graph, ours, theirs, ours_before,
                                                     theirs_before)
        except Exception:  # noqa: BLE001 - Undecidable, or flax's flatten of a copy raised
            return None
    if why is None:
        graph.verified_updates.add(root)
        return True
    graph.fallbacks[root] = why
    return False


def make_merge_leaves(graph: Graph) -> Any:
    flax_merge_leaves = graph.flax_merge_leaves
    native = _core.nnx_graph_merge_leaves

    @functools.wraps(flax_merge_leaves)
    def _merge_to_flat_state(states: Any) -> Any:
        if (
            type(states) is tuple
            and "_merge_to_flat_state" not in graph.function_fallbacks
            and served_now(graph, "_merge_to_flat_state")
            and graph.lock.acquire(blocking=False)  # another thread walks: flax's (Graph.lock)
        ):
            try:
                graph.refresh()
                leaves = native(states, graph.unflatten_context)
                if leaves is not None:
                    if graph.merge_checked:
                        return leaves
                    # The first served call: flax's function too, and the same leaves, or
                    # flax's function from then on.
                    theirs = flax_merge_leaves(states)
                    graph.merge_checked = True
                    if len(leaves) == len(theirs) and all(a is b for a, b in zip(leaves, theirs)):
                        return leaves
                    graph.function_fallbacks["_merge_to_flat_state"] = "the leaves differ"
                    return theirs
            finally:
                graph.lock.release()
        return flax_merge_leaves(states)

    return _merge_to_flat_state
