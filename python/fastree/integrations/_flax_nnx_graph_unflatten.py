"""flax's ``graphlib.unflatten`` in graph mode, served by the C walk
(csrc/nnx/nnx_graph_unflatten.cpp): the function attach binds (:func:`make_unflatten`) and the
first walks' checks against flax's own, into new objects (``_checked_unflatten``) and into the
caller's (``_checked_outer_unflatten``)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from .. import _core
from . import _flax_nnx_graph_compare as _compare
from . import _flax_nnx_graph_user_code as _user_code
from ._flax_nnx_graph_tables import Graph, enter_walk, served_now, walk_done


def make_unflatten(graph: Graph) -> Any:
    graphlib = graph.graphlib
    flax_unflatten = graph.flax_unflatten
    graph_def = graphlib.GraphDef
    flat_state = graphlib.FlatState
    index_map = graph.index_map
    served_roots = (graphlib.NodeDef, graphlib.VariableDef)
    native = _core.nnx_graph_unflatten

    @functools.wraps(flax_unflatten)
    def unflatten(graphdef: Any, state: Any, /, *, index_ref: Any = None,
                  outer_index_outer_ref: Any = None, copy_variables: bool = False,
                  recreate_variables: bool = True) -> Any:
        leaves = state.leaves if type(state) is flat_state else state
        if index_ref is None:
            index_ref = index_map()
        if (
            copy_variables
            or type(graphdef) is not graph_def
            or type(leaves) is not list
            or len(leaves) != graphdef.num_leaves
            or not graphdef.nodes
            or type(graphdef.nodes[0]) not in served_roots
            or type(index_ref) is not index_map
            or (outer_index_outer_ref is not None and type(outer_index_outer_ref) is not index_map)
            or not served_now(graph, "unflatten" if outer_index_outer_ref is None
                                 else "unflatten_into_existing")
            or not enter_walk(graph)  # last: once True, walk_done must follow
        ):
            return flax_unflatten(graphdef, state, index_ref=index_ref,
                                  outer_index_outer_ref=outer_index_outer_ref,
                                  copy_variables=copy_variables,
                                  recreate_variables=recreate_variables)
        try:
            call = _Call(graph, graphdef, state, index_ref, outer_index_outer_ref,
                         recreate_variables)
            graph.refresh()
            args = (graphdef.nodes, graphdef.attributes, leaves)
            # Into the caller's objects: the outer tables and checks (Graph.outer).
            into_existing = outer_index_outer_ref is not None
            checks = graph.outer if into_existing else graph
            context = graph.outer_unflatten_context if into_existing else graph.unflatten_context
            checked = _checked_outer_unflatten if into_existing else _checked_unflatten
            for _ in range(2):
                if checks.pending or checks.pending_nodes:
                    return checked(call, args)
                try:
                    result = native(*args, index_ref, outer_index_outer_ref, recreate_variables,
                                    context)
                except BaseException:
                    checks.forget_pending()
                    raise
                if result is not False:
                    break
            return result[0] if result else call.by_flax()
        finally:
            walk_done(graph)

    return unflatten


@dataclasses.dataclass(frozen=True)
class _Call:
    """One served unflatten call's arguments (``copy_variables`` is never set on one), and flax's
    own function given them: the one way every path below hands a call to flax."""

    graph: Graph
    graphdef: Any
    state: Any
    index_ref: Any
    outer: Any
    recreate_variables: bool

    def by_flax(self, index_ref: Any = None, outer: Any = None) -> Any:
        """flax's unflatten of this call; into other maps where given (a check's copies)."""
        return self.graph.flax_unflatten(
            self.graphdef, self.state,
            index_ref=self.index_ref if index_ref is None else index_ref,
            outer_index_outer_ref=self.outer if outer is None else outer,
            recreate_variables=self.recreate_variables)


def _checked_unflatten(call: _Call, args: tuple[Any, ...]) -> Any:
    # A merge into new objects (no outer map: merges into the caller's objects are
    # _checked_outer_unflatten's) over types no checked walk met: flax's function and the
    # native one each rebuild the graph from a copy of the index map, and the results are
    # compared. The call itself is then served by the native walk if they are the same, else
    # by flax's function from then on for those types.
    graph, index_ref, recreate_variables = call.graph, call.index_ref, call.recreate_variables
    index_map = graph.index_map
    if _user_code.in_graphdef(graph, call.graphdef):
        # Two rebuilds would run a user's create_empty/init (or unflatten) twice: this call is
        # flax's alone, and the types wait for a graph without such nodes.
        graph.forget_pending()
        return call.by_flax()
    ours_map = index_map(index_ref)
    ours = _core.nnx_graph_unflatten(*args, ours_map, None, recreate_variables,
                                     graph.unflatten_context)
    if ours is False:  # more types met: classified now, the second look walks
        ours = _core.nnx_graph_unflatten(*args, ours_map, None, recreate_variables,
                                         graph.unflatten_context)
    if not ours:
        graph.forget_pending()
        return call.by_flax()
    met, met_nodes = graph.pending, graph.pending_nodes
    theirs_map = index_map(index_ref)
    try:
        theirs = call.by_flax(index_ref=theirs_map)  # (no outer map: call.outer is None)
        why = (_compare.rebuilt_difference(graph, ours[0], theirs)
               or _compare.index_difference(ours_map, theirs_map))
    except Exception:  # noqa: BLE001 - no comparison: this call is flax's, nothing is decided
        graph.forget_pending()
        return call.by_flax()
    graph.pending, graph.pending_nodes = [], []
    if why is not None:
        graph.fall_back(met + met_nodes, why)
        return call.by_flax()
    graph.verified.update(met)
    graph.verified_nodes.update(met_nodes)
    index_ref.update(ours_map)
    return ours[0]


def _checked_outer_unflatten(call: _Call, args: tuple[Any, ...]) -> Any:
    # A merge into the caller's objects over types no such merge met yet. The caller's objects
    # (the outer map's) are copied twice by flax's own flatten and unflatten; the native walk
    # merges into one copy, flax's function into the other, and the results and the two copies
    # are compared. The call itself then merges into the caller's objects, natively if they
    # were the same, else by flax's function from then on for those types. Graphs holding a
    # user's node functions are flax's alone (copies and compares would run them again).
    graph, index_ref, outer = call.graph, call.index_ref, call.outer
    recreate_variables = call.recreate_variables
    checks = graph.outer

    def flax_alone() -> Any:
        checks.forget_pending()  # (nothing pending once the check has decided)
        return call.by_flax()

    index_map = graph.index_map
    keys, objects = list(outer.keys()), list(outer.values())
    if (_user_code.in_graphdef(graph, call.graphdef) or _user_code.in_graph(graph, objects)
            or _user_code.in_state(graph, call.state)):
        return flax_alone()
    try:
        copies = []
        for _ in range(2):
            copy_def, copy_state = graph.flax_flatten(
                objects, ref_index=graph.graphlib.PythonRefMap(), graph=True)
            copies.append(graph.flax_unflatten(copy_def, copy_state, copy_variables=True))
    except Exception:  # noqa: BLE001 - no copies to compare on: this call is flax's
        return flax_alone()
    ours_copy, theirs_copy = copies
    try:
        ours_before = _compare.values_before(graph, ours_copy)
        theirs_before = _compare.values_before(graph, theirs_copy)
    except Exception:  # noqa: BLE001 - nothing to compare on: this call is flax's
        return flax_alone()
    context = graph.outer_unflatten_context
    ours = _core.nnx_graph_unflatten(*args, index_map(index_ref),
                                     index_map(zip(keys, ours_copy)), recreate_variables, context)
    if ours is False:  # more types met: classified now, the second look walks
        ours = _core.nnx_graph_unflatten(*args, index_map(index_ref),
                                         index_map(zip(keys, ours_copy)), recreate_variables,
                                         context)
    if not ours:
        return flax_alone()
    met = checks.pending + checks.pending_nodes
    try:
        theirs = call.by_flax(index_ref=index_map(index_ref),
                              outer=index_map(zip(keys, theirs_copy)))
        why = (_compare.written_copies_difference(graph, ours[0], theirs, ours_before,
                                                  theirs_before)
               or _compare.written_copies_difference(graph, ours_copy, theirs_copy,
                                                     ours_before, theirs_before))
    except Exception:  # noqa: BLE001 - no comparison: this call is flax's, nothing is decided
        return flax_alone()
    verified, verified_nodes = checks.pending, checks.pending_nodes
    checks.pending, checks.pending_nodes = [], []
    if why is not None:
        graph.fall_back(met, f"merging into existing objects: {why}")
        return flax_alone()
    checks.verified.update(verified)
    checks.verified_nodes.update(verified_nodes)
    result = _core.nnx_graph_unflatten(*args, index_ref, outer, recreate_variables, context)
    # Falsy when the tables changed meanwhile (a registration): flax's function.
    return result[0] if result else flax_alone()
