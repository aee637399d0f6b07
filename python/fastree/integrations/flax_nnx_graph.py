"""flax.nnx graph mode served natively: ``graphlib.flatten`` (and with it ``nnx.split``,
``nnx.state``, ``nnx.graphdef`` and the flatten inside ``nnx.jit`` and the other nnx transforms).

flax walks a module graph in Python (``flax/nnx/graphlib.py``, ``_graph_flatten``). Once fastree
is installed and flax.nnx is loaded (the first nnx class registration reaches
:func:`fastree.integrations.flax_nnx.native_node`, which calls :func:`attach`), ``graphlib.flatten``
becomes ``_flax_nnx_graph_flatten.make_flatten``'s function: the same walk in C (``csrc/nnx/nnx_graph_flatten.cpp``), making the same
``GraphDef`` (``NodeDef``/``VariableDef``/``NodeRef``/``Static`` objects, in the same order), the
same leaves and paths, and the same reference-map entries.

Exact, or not used:

- Only flax code fastree was written against is served, per walk: every function and class a
  walk mirrors (:data:`WALKS`, names from :data:`MIRRORED` and tree mode's) must be that of one
  release in ``_known_flax.KNOWN_CODE``, and none may be replaced or changed in place later
  (``_flax_nnx_graph_tables.walk_replaced``); a walk that is off is flax's own function, and
  the others stay native. The record classes must have the fields the C walk sets.
- Per type, ``_flax_nnx_graph_tables.Graph._kind`` decides what the C walk may do (``csrc/nnx/nnx_graph.h``, ``Kind``). A
  tracer, an array ref, a hijax Variable, a Variable or Pytree class with its own accessors, a
  key that is not an exact str: flax's own function runs, for the whole call.
- The first walk that meets a type is also run by flax's function, and the two results are
  compared (the same objects, the same records, the same map entries). On a difference, those
  types are left to flax from then on, flax's result is returned, and the reason is kept for
  :func:`status`.

Nothing here imports flax: :func:`attach` finds it in ``sys.modules``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any

from . import _flax_nnx_graph_compare as _compare  # noqa: F401 - tests patch its functions
from . import _flax_nnx_graph_kinds as _kinds
from . import _flax_nnx_graph_user_code as _user_code
from . import _flax_nnx_shared, _known_flax, _mirrored_code
from ._flax_nnx_alias_check import make_check_no_aliases
from ._flax_nnx_apply_updates import make_apply_updates
from ._flax_nnx_graph_flatten import make_flatten
from ._flax_nnx_graph_kinds import (  # noqa: F401 - the kinds, by name, for callers
    ARRAY_LEAF,
    DICT,
    GENERIC_PYTREE,
    GRAPH_NODE,
    LEAF,
    LIST,
    NNX_PYTREE,
    NONE,
    PYTREE_NODE,
    PYTREE_STATE,
    TUPLE,
    UNSERVED,
    VARIABLE,
)
from ._flax_nnx_graph_tables import Graph, walk_replaced
from ._flax_nnx_graph_unflatten import make_unflatten
from ._flax_nnx_graph_update import make_merge_leaves, make_update


_GRAPHLIB = "flax.nnx.graphlib"
_EXTRACT = "flax.nnx.extract"
# What the graph walks reproduce (csrc/nnx/nnx_graph_*.cpp; docs/porting-library-integrations.md
# says which C++ function mirrors which): served only where every one is code of a release in
# _known_flax.KNOWN_CODE, and only while none of them is replaced (checked at each call).
MIRRORED: tuple[_mirrored_code.Mirrored, ...] = tuple(
    _mirrored_code.Mirrored(module, name) for module, names in (
        (_GRAPHLIB, ("flatten", "_graph_flatten", "unflatten", "_graph_unflatten",
                     "_graph_update_dynamic", "_merge_to_flat_state", "get_node_impl",
                     "get_node_impl_for_type", "_flatten_pytree", "_unflatten_pytree",
                     "_get_sorted_leaves", "is_node", "NodeDef", "VariableDef", "NodeRef",
                     "Static", "GraphDef", "IndexMap", "PythonRefMap", "GraphNodeImpl",
                     "PytreeNodeImpl", "GenericPytree", "NodeAttr", "LeafAttr", "DataElem",
                     "StaticElem", "IndexesPytreeDef")),
        ("flax.nnx.pytreelib", ("Pytree._graph_node_flatten", "Pytree._graph_node_create_empty",
                                "Pytree._graph_node_clear", "Pytree._graph_node_init",
                                "PytreeState", "_flatten_pytree_state",
                                "_unflatten_pytree_state")),
        ("flax.nnx.variablelib", ("Variable.get_raw_value", "Variable.get_metadata",
                                  "Variable.var_type", "Variable.__setattr__",
                                  "Variable.from_metadata", "Variable.update_from_state",
                                  "Variable.set_raw_value", "Variable._check_can_update")),
        ("flax.nnx.statelib", ("FlatState", "State.__init__")),
        # The transforms' alias check (tree mode): _flax_nnx_alias_check.
        ("flax.nnx.extract", ("check_no_aliases", "labeled", "apply_updates", "Updates")),
        ("flax.nnx.variablelib", ("VariableMeta", "HijaxVariableMeta")),
    ) for name in names
)
# What each native walk depends on, by name (MIRRORED's and tree mode's): the functions and classes
# its C walk reproduces, read from csrc/nnx/ (the ContextItem/UnflattenItem each walk reads, and
# the flax steps its comments name), and those its first-walk check runs as flax's own (a check
# rebuilds and compares through flax's flatten, and an update's or a merge into existing objects'
# copies the graph with flax's unflatten): a user's wrapper around one of them would run again
# in a check. A walk is served where every one of its names has the code of one release in
# _known_flax, and goes back to flax alone when one of them is replaced later: a release that
# changes one function turns off only the walks that depend on it.
# Every walk also needs tree mode's code (the Variable and Pytree layouts, TraceState): _SHARED.
_SHARED = tuple(item.qualname for item in _flax_nnx_shared.MIRRORED)
# The records and impls a GraphDef is made of, and how a node's children are read.
_RECORDS = ("NodeDef", "VariableDef", "NodeRef", "Static", "GraphDef", "NodeAttr", "LeafAttr",
            "IndexesPytreeDef", "GraphNodeImpl", "PytreeNodeImpl", "GenericPytree", "PytreeState")
# graphlib.flatten: nnx_graph_flatten.cpp, nnx_graph_children.cpp; the replay
# (_flax_nnx_graph_replay) runs flatten's and _graph_flatten's code.
_FLATTEN = _RECORDS + (
    "flatten", "_graph_flatten", "get_node_impl", "_flatten_pytree", "_get_sorted_leaves",
    "is_node", "DataElem", "StaticElem", "PythonRefMap", "Pytree._graph_node_flatten",
    "Variable.get_raw_value", "Variable.get_metadata", "Variable.var_type", "FlatState")
# graphlib.unflatten: nnx_graph_unflatten.cpp (Variables made by from_metadata, or _new).
_UNFLATTEN = _RECORDS + (
    "unflatten", "_graph_unflatten", "get_node_impl_for_type", "_unflatten_pytree", "IndexMap",
    "Pytree._graph_node_create_empty", "Pytree._graph_node_clear", "Pytree._graph_node_init",
    "Variable.from_metadata", "FlatState")
# Variable.update_from_state / set_raw_value step by step, with flax's trace check
# (csrc/nnx/nnx_graph_variables.h, VariableOps::Update).
_VARIABLE_UPDATE = ("Variable.update_from_state", "Variable.set_raw_value",
                    "Variable._check_can_update", "Variable.__setattr__", "Variable.get_metadata")
WALKS: dict[str, frozenset[str]] = {
    # graphlib.flatten (nnx.split, nnx.state, nnx.graphdef, the transforms' splits).
    "flatten": frozenset(_SHARED + _FLATTEN),
    # graphlib.unflatten into new objects (nnx.merge); its check compares through flatten.
    "unflatten": frozenset(_SHARED + _UNFLATTEN + _FLATTEN),
    # graphlib.unflatten into the caller's objects (an outer index map: the end of nnx.jit and
    # of every transform): the same walk, which also updates the caller's Variables in place.
    "unflatten_into_existing": frozenset(_SHARED + _UNFLATTEN + _FLATTEN + _VARIABLE_UPDATE),
    # graphlib._graph_update_dynamic (nnx.update, the transforms' updates): nnx_graph_update.cpp,
    # a node's children as its impl's node_dict gives them (nnx_graph_children.cpp); its check
    # copies the graph (flatten, unflatten) and compares through flatten.
    "update": frozenset(_SHARED + _VARIABLE_UPDATE + _FLATTEN + _UNFLATTEN + (
        "_graph_update_dynamic", "State.__init__")),
    # graphlib._merge_to_flat_state (nnx.merge's states to leaves): nnx_graph_merge_state.cpp;
    # its check runs flax's _merge_to_flat_state alone.
    "_merge_to_flat_state": frozenset(_SHARED + ("_merge_to_flat_state", "FlatState",
                                                 "State.__init__")),
    # extract.check_no_aliases (every tree-mode transform's argument check): fastree's key-path
    # walk with flax's predicate answered without its Python __instancecheck__; flax's function
    # for an alias's error and for the first calls' check.
    "check_no_aliases": frozenset(("check_no_aliases", "labeled", "VariableMeta",
                                   "HijaxVariableMeta")),
    # extract.apply_updates (every tree-mode transform's write-back of changed Variables): the
    # Updates it reads, and Variable.update_from_state step by step as graph mode's update does.
    "apply_updates": frozenset(_SHARED + _VARIABLE_UPDATE + ("apply_updates", "Updates")),
}
# graphlib's function each walk replaces (both unflattens are one function's two cases).
_BINDS = {"flatten": "flatten", "unflatten": "unflatten", "unflatten_into_existing": "unflatten",
          "update": "_graph_update_dynamic", "_merge_to_flat_state": "_merge_to_flat_state",
          "check_no_aliases": "check_no_aliases", "apply_updates": "apply_updates"}
# The mirrored functions attach() replaces by its own: identity checks skip them.
_REPLACED = frozenset(f"{_GRAPHLIB}:{name}" for name in
                      ("flatten", "unflatten", "_graph_update_dynamic", "_merge_to_flat_state")
                      ) | {f"{_EXTRACT}:check_no_aliases", f"{_EXTRACT}:apply_updates"}


def walk_mirrored(walk: str) -> tuple[_mirrored_code.Mirrored, ...]:
    """What ``walk`` (a key of :data:`WALKS`) mirrors: tree mode's names, then :data:`MIRRORED`'s.

    >>> [item.qualname for item in walk_mirrored("_merge_to_flat_state")][-3:]
    ['_merge_to_flat_state', 'FlatState', 'State.__init__']
    """
    names = WALKS[walk]
    return tuple(dict.fromkeys(item for item in _flax_nnx_shared.MIRRORED + MIRRORED
                               if item.qualname in names))


# The fields the C walk sets on each record, in the order their dataclass __init__ sets them.
_RECORD_FIELDS = {
    "NodeDef": ("type", "index", "outer_index", "num_attributes", "metadata"),
    "VariableDef": ("type", "index", "outer_index", "metadata", "array_refdef"),
    "NodeRef": ("index",),
    "Static": ("value",),
    "GraphDef": ("nodes", "attributes", "num_leaves"),
}

_lock = threading.Lock()


_graph: Graph | None = None
_verdict: _mirrored_code.Verdict | None = None
# Per walk (WALKS' keys): whether the loaded code of what it mirrors is a known release's.
_walk_verdicts: dict[str, _mirrored_code.Verdict] = {}
_NOT_BOUND = "flax: not attached (fastree is not installed, or flax.nnx is not loaded)"
_bound = False  # whether graphlib's names are _graph's walks now (attach, until detach)


def _records_known(graphlib: Any) -> bool:
    for name, fields in _RECORD_FIELDS.items():
        cls = getattr(graphlib, name, None)
        if not dataclasses.is_dataclass(cls):
            return False
        if tuple(field.name for field in dataclasses.fields(cls)) != fields:
            return False
        if "__post_init__" in vars(cls):
            return False
    return True


def attach() -> bool:
    """Serves graphlib's walks natively, once flax.nnx.graphlib is loaded. Idempotent.

    Called while fastree is installed only (``fastree.install()``, and flax's first registration
    under an install): using fastree's own functions leaves flax's as they are. False (and flax's
    functions kept) where the loaded flax is not code fastree knows (:data:`MIRRORED`,
    :func:`code_verdict`), graphlib is not loaded yet, or its records differ from those the C walk
    makes.
    """
    global _graph, _verdict, _bound
    graphlib = sys.modules.get(_GRAPHLIB)
    # extract (the transforms' alias check) loads after graphlib, within flax.nnx's own import,
    # and registers classes of its own while it loads: waiting until it has loaded lets every
    # walk's code be judged at once (a later class registration, or the install, attaches).
    if _bound or graphlib is None or not _loaded(_EXTRACT):
        return _bound
    if not _flax_nnx_shared.known_code():
        return False
    with _lock:
        if _bound:
            return True
        if _graph is not None:
            # Attached before and detached by an uninstall: the same walks (and their tables)
            # are bound again.
            _rebind(_graph.replacements, to_ours=True)
            _bound = True
            return True
        if _verdict is None:
            _verdict = _recognise_walks()
        if not _verdict:
            return False
        kinds_differ = _kinds.kinds_differ()
        if kinds_differ is not None:
            _verdict = _mirrored_code.Verdict(None, f"fastree: {kinds_differ}")
            return False
        if not _records_known(graphlib) or graphlib.RefMap is not graphlib.PythonRefMap:
            _verdict = _mirrored_code.Verdict(None, "flax: graphlib's records or RefMap are "
                                              "not the ones the C walk makes")
            return False
        if not all(cls in graphlib.PYTREE_REGISTRY for cls in (list, tuple, dict, type(None))):
            _verdict = _mirrored_code.Verdict(None, "flax: list, tuple, dict or None is not in "
                                              "graphlib.PYTREE_REGISTRY")
            return False
        graph = Graph(graphlib)
        served = set()
        for walk, verdict in _walk_verdicts.items():
            if verdict:
                graph.watches[walk] = verdict.watch(_REPLACED)
                served.add(_BINDS[walk])
            else:
                graph.function_fallbacks[walk] = verdict.reason.removeprefix("flax: ")
        # Only the functions a served walk replaces are rebound: a walk that is off is flax's
        # own function, never a wrapper of ours around it.
        makers = {"flatten": (graph.flax_flatten, make_flatten),
                  "unflatten": (graph.flax_unflatten, make_unflatten),
                  "_graph_update_dynamic": (graph.flax_update, make_update),
                  "_merge_to_flat_state": (graph.flax_merge_leaves, make_merge_leaves),
                  "check_no_aliases": (graph.flax_check_no_aliases, _make_alias_check),
                  "apply_updates": (graph.flax_apply_updates,
                                    lambda g: make_apply_updates(g, sys.modules[_EXTRACT]))}
        graph.replacements = {name: (theirs, make(graph))
                              for name, (theirs, make) in makers.items() if name in served}
        _rebind(graph.replacements, to_ours=True)
        _graph = graph
        _bound = True
    return True


def _loaded(module_name: str) -> bool:
    # Imported and done: importlib marks a module's spec `_initializing` while its code runs.
    module = sys.modules.get(module_name)
    return module is not None and not getattr(getattr(module, "__spec__", None),
                                              "_initializing", False)


def _make_alias_check(graph: Graph) -> Any:
    return make_check_no_aliases(graph, sys.modules[_EXTRACT],
                                 sys.modules["flax.nnx.variablelib"])


def _recognise_walks() -> _mirrored_code.Verdict:
    # Each walk's verdict (_walk_verdicts), and the whole code's: a release's when every walk's
    # code is that release's, "native" with the releases of the served walks when only some are,
    # and the reason when none is.
    whole = _mirrored_code.recognise(
        "flax", tuple(dict.fromkeys(_flax_nnx_shared.MIRRORED + MIRRORED)),
        _known_flax.KNOWN_CODE)
    _walk_verdicts.clear()
    for walk in WALKS:
        mirrored = walk_mirrored(walk)
        _walk_verdicts[walk] = (
            _mirrored_code.Verdict(whole.release, "native", tuple(
                (item, obj) for item, obj in whole.objects if item in mirrored))
            if whole else _mirrored_code.recognise("flax", mirrored, _known_flax.KNOWN_CODE))
    if whole:
        return whole
    served = [walk for walk, verdict in _walk_verdicts.items() if verdict]
    if not served:
        return whole
    return _mirrored_code.Verdict(f"some walks' code ({', '.join(served)}): "
                                  f"{_walk_verdicts[served[0]].release}", "native")


def detach() -> None:
    """Gives flax its own graph walks back (fastree's uninstall). Idempotent.

    A name someone rebound after :func:`attach` keeps their object. A walk under way finishes
    with the walks it started with; a later :func:`attach` binds the same walks again.
    """
    global _bound
    with _lock:
        if _bound and _graph is not None:
            _rebind(_graph.replacements, to_ours=False)
        _bound = False


def _rebind(replacements: dict[str, tuple[Any, Any]], *, to_ours: bool) -> None:
    # nnx re-exports the functions (flax.nnx.flatten, flax.nnx.graph, compat): each name bound to
    # the other side's function is rebound; graphlib's own callers read the module globals.
    for module_name in (_GRAPHLIB, _EXTRACT, "flax.nnx", "flax.nnx.graph", "flax.nnx.compat"):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, (theirs, ours) in replacements.items():
            now, then = (ours, theirs) if to_ours else (theirs, ours)
            if getattr(module, name, None) is then:
                setattr(module, name, now)


def code_verdict() -> _mirrored_code.Verdict:
    """Whether graph mode is served: the release whose code the loaded flax has, or why not."""
    if _verdict is not None:
        return _verdict
    tree = _flax_nnx_shared.code_verdict()
    if not tree:
        return tree
    return _mirrored_code.Verdict(None, _NOT_BOUND)


def fallback_reason(cls: type) -> str | None:
    """Why flax's graph walks run with flax's own functions for ``cls``, or None."""
    graph = _graph
    return None if graph is None else graph.fallbacks.get(cls)


def status() -> dict[str, str]:
    """How flax's graph-mode walks run: ``"native"``, or ``"flax: <why>"``, per walk
    (:data:`WALKS`: a walk whose mirrored code differs from every known release's names the
    functions that differ; while ``gc.callbacks`` holds a function of the user's, every walk is
    flax's own, and says so); and per type left to flax after a difference, why (``"flax
    (updates): <why>"`` where only its updates are).

    >>> from fastree.integrations import flax_nnx_graph
    >>> sorted(flax_nnx_graph.status())
    ['_merge_to_flat_state', 'apply_updates', 'check_no_aliases', 'flatten', 'unflatten', 'unflatten_into_existing', 'update']
    """
    graph = _graph
    if graph is None or not _bound:
        verdict = code_verdict()
        why = _NOT_BOUND if verdict else verdict.reason
        return dict.fromkeys(WALKS, why)
    for walk in WALKS:
        walk_replaced(graph, walk)  # a name replaced since is reported now, not at its next call
    out = {walk: "native" if walk not in graph.function_fallbacks
           else f"flax: {graph.function_fallbacks[walk]}" for walk in WALKS}
    callbacks = _user_code.user_gc_callbacks()
    if callbacks:
        # A collection can run at any allocation, and a native walk allocates elsewhere than
        # flax's: a user's callback would see the graph at other points of the walk.
        why = (f"flax: while gc.callbacks holds a function of the user's ({', '.join(callbacks)})"
               ", every graph walk is flax's own")
        out = {walk: why if state == "native" else state for walk, state in out.items()}
    for cls, reason in graph.update_fallbacks.items():
        out[f"{cls.__module__}.{cls.__qualname__}"] = f"flax (updates): {reason}"
    for cls, reason in graph.fallbacks.items():
        out[f"{cls.__module__}.{cls.__qualname__}"] = f"flax: {reason}"
    return out
