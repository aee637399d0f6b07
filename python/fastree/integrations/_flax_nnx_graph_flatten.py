"""flax's ``graphlib.flatten`` in graph mode, served by the C walk (csrc/nnx/nnx_graph_flatten.cpp):
the function attach binds (:func:`make_flatten`) and the first walk's check against flax's own
(``_checked_flatten``)."""

from __future__ import annotations

import functools
from typing import Any

from .. import _core
from . import _flax_nnx_graph_compare as _compare
from . import _flax_nnx_graph_replay as _replay
from . import _flax_nnx_graph_user_code as _user_code
from ._flax_nnx_graph_tables import Graph, enter_walk, served_now, walk_done


def make_flatten(graph: Graph) -> Any:
    graphlib = graph.graphlib
    flax_flatten = graph.flax_flatten
    python_refmap = graphlib.PythonRefMap
    graph_def = graphlib.GraphDef
    flat_state = graphlib.FlatState
    graph_mode = graphlib.set_graph_mode
    native = _core.nnx_graph_flatten

    @functools.wraps(flax_flatten)
    def flatten(node: Any, /, *, with_paths: bool = True, ref_index: Any = None,
                ref_outer_index: Any = None, graph: bool | None = None) -> Any:
        mode = graph_mode.current_value() if graph is None else graph
        if ref_index is None:
            ref_index = python_refmap()
        if (
            not mode
            or not served_now(_graph_state, "flatten")
            or type(ref_index) is not python_refmap
            or (ref_outer_index is not None and type(ref_outer_index) is not python_refmap)
            or not enter_walk(_graph_state)  # last: once True, walk_done must follow
        ):
            return flax_flatten(node, with_paths=with_paths, ref_index=ref_index,
                                ref_outer_index=ref_outer_index, graph=graph)
        state = _graph_state
        try:
            state.refresh()
            mapping = ref_index._mapping
            outer = ref_outer_index._mapping if ref_outer_index else None
            try:
                result = native(node, with_paths, mapping, outer, state.context)
            except BaseException:
                state.forget_pending()  # a walk that raised checked nothing
                raise
            if type(result) is list:  # not served: flax's, given the node calls it made
                state.forget_pending()
                theirs = _replay.replaying_flatten(graphlib, flax_flatten,
                                                   state.flax_graph_flatten, result)
                return (theirs or flax_flatten)(node, with_paths=with_paths, ref_index=ref_index,
                              ref_outer_index=ref_outer_index, graph=graph)
            nodes, attributes, leaves, paths, added, called = result
            out = (graph_def(nodes=nodes, attributes=attributes, num_leaves=len(leaves)),
                   flat_state.from_sorted_keys_values(tuple(paths), leaves) if with_paths
                   else leaves)
            if state.pending:
                return _checked_flatten(state, out, added, called, node, with_paths,
                                        ref_index, ref_outer_index)
            mapping.update(added)
            return out
        finally:
            walk_done(state)

    _graph_state = graph
    return flatten


def _checked_flatten(graph: Graph, out: Any, added: dict[int, Any], called: list[Any],
                     node: Any, with_paths: bool, ref_index: Any, ref_outer_index: Any) -> Any:
    # The first walk over new types: flax's function runs too, on a copy of the map, and its
    # result is the one returned unless the two are the same. flax's walk is given the results
    # of the node functions the native walk called (_flax_nnx_graph_replay): a user's flatten
    # runs once per node, as under flax alone, and the check compares what both walks made of
    # the same results.
    met = graph.pending
    theirs_map = graph.graphlib.PythonRefMap()
    theirs_map._mapping.update(ref_index._mapping)
    # Strict: flax's walk may not call a user's flatten the native walk did not (_replay).
    user_code = functools.partial(_user_code.flatten_runs_user_code, graph)
    flax_flatten = _replay.replaying_flatten(graph.graphlib, graph.flax_flatten,
                                             graph.flax_graph_flatten, called, user_code)
    try:
        if flax_flatten is None:
            raise _replay.Diverged  # nothing to replay with: no second walk to compare
        theirs = flax_flatten(node, with_paths=with_paths, ref_index=theirs_map,
                              ref_outer_index=ref_outer_index, graph=True)
        ours_map = {**ref_index._mapping, **added}
        why = (_compare.difference(out, theirs, with_paths)
               or _compare.map_difference(ours_map, theirs_map._mapping))
    except _replay.Diverged:
        # A user's flatten changed the graph under the native walk: no second walk can be
        # compared without calling it again. The one walk made, the result flax alone would
        # give, stands; the types stay unverified, checked when next met.
        graph.forget_pending()
        ref_index._mapping.update(added)
        return out
    except BaseException:
        graph.forget_pending()  # nothing compared: the types are checked when next met
        raise
    graph.pending = []
    if why is None:
        graph.verified.update(met)
        ref_index._mapping.update(added)
        return out
    graph.fall_back(met, why)
    ref_index._mapping.clear()
    ref_index._mapping.update(theirs_map._mapping)
    return theirs
