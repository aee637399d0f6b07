"""flax.nnx Variables and PytreeStates rebuilt in C (tree mode): what flax's own ``Variable._new``
and ``PytreeState(initializing, is_setup)`` make.

Installed before flax, a Variable class's attribute node rebuilds an instance in C
(``trace_classes``: csrc/attr/nnx_shared.h, NewVariable) instead of calling ``cls._new``. The
rebuilt Variable must hold what ``_new`` gives it: a new ``TraceState`` of the *current* trace
(inside ``jax.jit`` that is the jit's trace, so the Variable may be updated there and not outside
it), the metadata dict, the value. Child processes run the same program plainly and installed;
the plain run is flax's own code.
"""

from __future__ import annotations

import pytest
from fastree import _core
from helpers import run_json_program, skip_unless_integration_knows

_PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
from flax import nnx
from flax.nnx import tracers

out = {}
v = nnx.Param(jnp.arange(3.0), tag="t", note=("a", 1))
w = jax.tree_util.tree_map(lambda x: x + 1, v)
out["type"] = type(w).__name__
out["value"] = [float(x) for x in w[...]]
out["metadata"] = sorted((k, repr(x)) for k, x in w.get_metadata().items())
out["fresh_metadata"] = w._var_metadata is not v._var_metadata
out["fresh_trace_state"] = w._trace_state is not v._trace_state
out["trace_state_equal"] = w._trace_state == tracers.TraceState()
out["slots"] = sorted(n for n in ("_raw_value", "_trace_state", "_var_metadata") if hasattr(w, n))

@jax.jit
def inside(v):
    u = jax.tree_util.tree_map(lambda x: x * 2, v)
    ok = u._trace_state.is_valid()   # made in this trace: it may be updated here
    u[...] = u[...] + 1
    return u, ok

u, ok = inside(v)
out["inside_valid"] = bool(ok)
out["inside_value"] = [float(x) for x in u[...]]

leaked = []
@jax.jit
def leak(v):
    u = jax.tree_util.tree_map(lambda x: x, v)
    leaked.append(u)
    return u[...]

leak(v)
try:
    leaked[0][...] = jnp.zeros(3)   # made in the jit's trace: not from outside it
    out["outside_update"] = "allowed"
except Exception as error:
    out["outside_update"] = type(error).__name__

model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
leaves, treedef = jax.tree_util.tree_flatten(model)
again = jax.tree_util.tree_unflatten(treedef, leaves)
out["model"] = [type(again.kernel).__name__, again.kernel._trace_state == tracers.TraceState()]
if len(sys.argv) > 1:
    from fastree import integrations
    out["status"] = integrations.status(nnx.Param)
print(json.dumps(out))
"""


skip_unless_integration_knows("flax", "flax_nnx")


def _run(installed: bool) -> dict:
    return run_json_program(_PROGRAM, installed, *(["status"] if installed else []))


def test_rebuilt_variables_are_what_flax_makes():
    plain, installed = _run(False), _run(True)
    status = installed.pop("status")
    assert installed == plain
    # and installed, the class was read natively (so the C rebuild made them)
    assert status == "native", status
    assert plain["inside_valid"] is True
    assert plain["outside_update"] != "allowed"


def test_trace_classes_is_checked():
    class Holder:
        __slots__ = ("_raw_value", "_var_metadata")

    good = (type, type, len, None)
    with pytest.raises(TypeError, match="trace_classes"):
        _core.AttrNode(
            Holder, ("_raw_value",), ("_var_metadata",), meta_items=True, trace_classes=good
        )  # no rebuild_with
    with pytest.raises(TypeError, match="trace_classes"):
        _core.AttrNode(
            Holder,
            ("_raw_value",),
            ("_var_metadata",),
            meta_items=True,
            rebuild_with="_new",
            trace_classes=(type, type, len),
        )
    with pytest.raises(TypeError, match="trace_classes"):
        _core.AttrNode(
            Holder,
            ("_raw_value",),
            ("_var_metadata",),
            meta_items=True,
            rebuild_with="_new",
            trace_classes=(1, type, len, None),
        )
    with pytest.raises(TypeError, match="holder, attribute name"):
        _core.AttrNode(
            Holder,
            ("_raw_value",),
            ("_var_metadata",),
            meta_items=True,
            rebuild_with="_new",
            trace_classes=(type, type, len, "trace"),  # not (holder, attribute name)
        )
    for where in (None, (object(), "value")):
        node = _core.AttrNode(
            Holder,
            ("_raw_value",),
            ("_var_metadata",),
            meta_items=True,
            rebuild_with="_new",
            trace_classes=(type, type, len, where),
        )
        assert node is not None


# flax.nnx's PytreeState (each Pytree's `_pytree__state`): a jax pytree of no children whose
# aux is (initializing, is_setup) and whose rebuild is PytreeState(initializing, is_setup), a
# new TraceState of the current trace first. Installed, it is an attribute node (trace_field).
_PYTREE_STATE_PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
from flax import nnx
from flax.nnx import pytreelib, tracers

model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
state = model._pytree__state
leaves, treedef = jax.tree_util.tree_flatten(state)
again = jax.tree_util.tree_unflatten(treedef, leaves)
out = {
    "treedef": str(treedef), "leaves": leaves, "type": type(again).__name__,
    "flags": [again._initializing, again._is_setup],
    "fresh_trace_state": again._trace_state is not state._trace_state,
    "trace_state_equal": again._trace_state == tracers.TraceState(),
    "slots": sorted(n for n in pytreelib.PytreeState.__slots__ if hasattr(again, n)),
}

@jax.jit
def inside(x):
    made = jax.tree_util.tree_unflatten(treedef, [])
    out["inside_valid"] = made._trace_state.is_valid()
    return x

inside(1.0)
copy = jax.tree_util.tree_map(lambda x: x + 1, model)
out["model_state"] = [type(copy._pytree__state).__name__,
                      copy._pytree__state is not model._pytree__state]
graphdef, split_state = nnx.split(model)
out["graph"] = [type(n).__name__ for n in graphdef.nodes]
if len(sys.argv) > 1:
    from fastree import integrations
    from fastree.integrations import flax_nnx_graph
    out["status"] = integrations.status(pytreelib.PytreeState)
    out["graph_kind"] = flax_nnx_graph._graph.kinds[pytreelib.PytreeState][0]
print(json.dumps(out))
"""


def test_pytree_states_are_rebuilt_as_flax_makes_them():
    from fastree.integrations._flax_nnx_graph_kinds import PYTREE_STATE

    plain = run_json_program(_PYTREE_STATE_PROGRAM, False)
    installed = run_json_program(_PYTREE_STATE_PROGRAM, True, "status")
    assert installed.pop("status") == "native"
    # graph mode still walks it as flax's own registration of PytreeState
    assert installed.pop("graph_kind") == PYTREE_STATE
    assert installed == plain
    assert plain["inside_valid"] is True and plain["trace_state_equal"] is True


def test_trace_field_is_checked():
    class State:
        __slots__ = ("_trace_state", "_initializing", "_is_setup")

    class Trace:
        pass

    # (TraceState, the opaque state's class, current_jax_trace, where jax keeps the trace): a
    # current trace of another class than the opaque one makes a plain TraceState().
    classes = (Trace, int, lambda: None, None)
    with pytest.raises(TypeError, match="trace_field"):
        _core.AttrNode(State, (), ("_initializing", "_is_setup"), trace_field="_trace_state")
    with pytest.raises(TypeError, match="trace_field"):
        _core.AttrNode(State, (), ("_initializing",), trace_classes=classes, trace_field=1)
    node = _core.AttrNode(State, (), ("_initializing", "_is_setup"), trace_classes=classes,
                          trace_field="_trace_state")
    rebuilt = node.unflatten((True, False), ())
    assert type(rebuilt._trace_state) is Trace
    assert node.flatten(rebuilt) == ((), (True, False))
