"""What flax.nnx's two served modes share: whether the loaded flax's tree-mode code is code
fastree reproduces, and how a Variable's TraceState is made in C.

:mod:`fastree.integrations.flax_nnx` (tree mode) and :mod:`fastree.integrations.flax_nnx_graph`
(graph mode) both import this module, and neither imports the other at import time: tree mode
attaches graph mode once flax.nnx.graphlib has loaded. Nothing here imports flax.
"""

from __future__ import annotations

from typing import Any

from ..jax_interop import compat as _jax_compat
from . import _known_flax, _mirrored_code

PYTREE_MODULE = "flax.nnx.pytreelib"
VARIABLE_MODULE = "flax.nnx.variablelib"
TYPING_MODULE = "flax.typing"
TRACERS_MODULE = "flax.nnx.tracers"

# What the tree-mode nodes reproduce (the mapping layout, csrc/attr/attr_mapping.h; the Variable node
# and its rebuild in C, csrc/attr/attr_read.cpp, csrc/attr/attr_rebuild.cpp and
# csrc/attr/nnx_shared.h). Each node kind is served only where its code is that of a release in
# _known_flax.KNOWN_CODE. Two gates, because flax registers its Variable classes before pytreelib
# is loaded.
_VARIABLE_MIRRORED = tuple(
    _mirrored_code.Mirrored(module, name) for module, names in (
        (VARIABLE_MODULE, ("_variable_flatten", "_variable_flatten_with_keys",
                            "_variable_unflatten", "Variable._new")),
        (TRACERS_MODULE, ("TraceState", "current_jax_trace")),
    ) for name in names
)
_PYTREE_MIRRORED = tuple(
    _mirrored_code.Mirrored(module, name) for module, names in (
        (PYTREE_MODULE, ("Pytree._pytree__flatten", "Pytree._pytree__flatten_with_paths",
                          "Pytree._pytree__unflatten")),
        (TYPING_MODULE, ("HashableMapping",)),
    ) for name in names
)
# A Pytree's PytreeState (its `_pytree__state`, a jax pytree of no children): flax registers it
# while pytreelib is still loading, before Pytree exists, hence a gate of its own.
_PYTREE_STATE_MIRRORED = tuple(
    _mirrored_code.Mirrored(module, name) for module, names in (
        (PYTREE_MODULE, ("PytreeState", "_flatten_pytree_state", "_unflatten_pytree_state")),
        (TRACERS_MODULE, ("TraceState", "current_jax_trace")),
    ) for name in names
)
MIRRORED: tuple[_mirrored_code.Mirrored, ...] = (
    _VARIABLE_MIRRORED + _PYTREE_MIRRORED + _PYTREE_STATE_MIRRORED[:3])
STATE_MODULE = "flax.nnx.statelib"
# nnx.State, a Mapping over its `_mapping` dict (the items layout, csrc/attr/attr_items.h): its
# three registered functions and the __init__ a rebuild stands in for. A gate of its own, out of
# MIRRORED (which the graph walks' gate reads): flax registers State while statelib still runs.
STATE_MIRRORED = tuple(
    _mirrored_code.Mirrored(STATE_MODULE, name)
    for name in ("_state_flatten_with_keys", "_state_flatten", "_state_unflatten",
                 "State.__init__")
)
state_code = _mirrored_code.Gate("flax", STATE_MIRRORED, _known_flax.KNOWN_CODE)
# nnx.Optimizer's own __getattribute__ (ModelAndOptimizer inherits it): it refuses `model` and
# passes every other name to object's, so a Pytree node may read an Optimizer's __dict__
# natively where this is the code of the release the Pytree code is (flax_nnx.native_node). Not
# in a gate, nor in MIRRORED (which the graph walks' gate reads): the class is registered while
# its module still runs, before this name exists, and a program may never load that module.
OPTIMIZER_GETATTRIBUTE = _mirrored_code.Mirrored("flax.nnx.training.optimizer",
                                                 "Optimizer.__getattribute__")
variable_code = _mirrored_code.Gate("flax", _VARIABLE_MIRRORED, _known_flax.KNOWN_CODE)
pytree_code = _mirrored_code.Gate("flax", _PYTREE_MIRRORED, _known_flax.KNOWN_CODE)
pytree_state_code = _mirrored_code.Gate("flax", _PYTREE_STATE_MIRRORED, _known_flax.KNOWN_CODE)


def code_verdict() -> _mirrored_code.Verdict:
    """Whether the loaded flax.nnx's tree-mode code is code fastree reproduces, and which
    release's (each part decided once its modules are loaded)."""
    for gate in (variable_code, pytree_state_code):
        verdict = gate.verdict()
        if not verdict:
            return verdict
    return pytree_code.verdict()


def known_code() -> bool:
    """Whether the loaded flax.nnx is code whose Pytree and Variable layout fastree reproduces."""
    return bool(code_verdict())


def trace_classes(tracers: Any) -> tuple[Any, Any, Any, Any]:
    """(TraceState, the class of current_jax_trace()'s result, current_jax_trace, where jax
    keeps the current trace or None) of flax.nnx's ``tracers`` module: what the C code needs to
    make a ``TraceState()`` as flax does (csrc/attr/nnx_shared.h). Where jax keeps the
    current trace, ``(holder, attribute)``
    (:func:`fastree.jax_interop.compat.opaque_trace_context`), is given only where flax's
    current_jax_trace is jax's get_opaque_trace_state and that reads it plainly: the C code then
    reads the current trace's weakref from it instead of calling both."""
    current = tracers.current_jax_trace
    trace_at = _jax_compat.opaque_trace_context()
    if "get_opaque_trace_state" not in getattr(getattr(current, "__code__", None), "co_names", ()):
        trace_at = None
    return (tracers.TraceState, type(current()), current, trace_at)
