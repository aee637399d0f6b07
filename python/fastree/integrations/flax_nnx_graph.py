"""flax.nnx graph mode served natively: ``graphlib.flatten`` (and with it ``nnx.split``,
``nnx.state``, ``nnx.graphdef`` and the flatten inside ``nnx.jit`` and the other nnx transforms).

flax walks a module graph in Python (``flax/nnx/graphlib.py``, ``_graph_flatten``). Once fastree
is installed and flax.nnx is loaded (the first nnx class registration reaches
:func:`fastree.integrations.flax_nnx.native_node`, which calls :func:`attach`), ``graphlib.flatten``
becomes ``_flax_nnx_graph_flatten.make_flatten``'s function: the same walk in C (``csrc/nnx/nnx_graph_flatten.cpp``), making the same
``GraphDef`` (``NodeDef``/``VariableDef``/``NodeRef``/``Static`` objects, in the same order), the
same leaves and paths, and the same reference-map entries.

Exact, or not used:

- Only flax code fastree was written against is served: every function and class in
  :data:`MIRRORED` (and tree mode's) must be that of a release in ``_known_flax.KNOWN_CODE``, and
  none may be replaced or changed in place later (``_flax_nnx_graph_tables.code_replaced``);
  the record classes must have the fields the C walk sets.
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
from . import _flax_nnx_shared, _known_flax, _mirrored_code
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
from ._flax_nnx_graph_tables import Graph
from ._flax_nnx_graph_unflatten import make_unflatten
from ._flax_nnx_graph_update import make_merge_leaves, make_update


_GRAPHLIB = "flax.nnx.graphlib"
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
    ) for name in names
)
# The mirrored functions attach() replaces by its own: identity checks skip them.
_REPLACED = frozenset(f"{_GRAPHLIB}:{name}" for name in
                      ("flatten", "unflatten", "_graph_update_dynamic", "_merge_to_flat_state"))
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
    if _bound or graphlib is None:
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
            _verdict = _mirrored_code.recognise("flax", MIRRORED, _known_flax.KNOWN_CODE)
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
        graph.watch = _verdict.watch(_REPLACED)
        graph.replacements = {"flatten": (graph.flax_flatten, make_flatten(graph)),
                              "unflatten": (graph.flax_unflatten, make_unflatten(graph)),
                              "_graph_update_dynamic": (graph.flax_update, make_update(graph)),
                              "_merge_to_flat_state": (graph.flax_merge_leaves,
                                                       make_merge_leaves(graph))}
        _rebind(graph.replacements, to_ours=True)
        _graph = graph
        _bound = True
    return True


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
    for module_name in (_GRAPHLIB, "flax.nnx", "flax.nnx.graph", "flax.nnx.compat"):
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
    """How flax's graph-mode functions run: ``"native"``, or ``"flax: <why>"``, per function;
    and per type left to flax after a difference, why (``"flax (updates): <why>"`` where only
    its updates are).

    >>> from fastree.integrations import flax_nnx_graph
    >>> sorted(flax_nnx_graph.status())
    ['flatten', 'unflatten', 'update']
    """
    graph = _graph
    if graph is None or not _bound:
        verdict = code_verdict()
        why = _NOT_BOUND if verdict else verdict.reason
        return {"flatten": why, "unflatten": why, "update": why}
    replaced = graph.function_fallbacks.get("code")
    out = {name: "native" if replaced is None else f"flax: {replaced}"
           for name in ("flatten", "unflatten", "update")}
    for name, reason in graph.function_fallbacks.items():
        if name != "code":
            out[name] = f"flax: {reason}"
    for cls, reason in graph.update_fallbacks.items():
        out[f"{cls.__module__}.{cls.__qualname__}"] = f"flax (updates): {reason}"
    for cls, reason in graph.fallbacks.items():
        out[f"{cls.__module__}.{cls.__qualname__}"] = f"flax: {reason}"
    return out

