// What flax's graph walks do to Variables, natively: make a TraceState for a new Variable or
// PytreeState, and update a Variable in place (set_raw_value, update_from_state) with flax's
// trace check. Shared by nnx_graph_unflatten.cpp and nnx_graph_update.cpp, which hold one
// VariableOps per walk (the current trace is asked of jax once per walk).
#pragma once

#include <Python.h>

#include "nnx_graph.h"
#include "nnx_graph_names.h"
#include "pyutils.h"

namespace fastree::nnx_graph {

class VariableOps {
 public:
    // `context` is the unflatten context tuple (UnflattenItem), held by the caller.
    explicit VariableOps(PyObject* context) : ctx_(context) {}

    // The table entry (kind, impl, type) of a leaf type (the flatten table), asking the Python
    // side on a miss.
    Ref LeafEntry(PyTypeObject* type) const {
        PyObject* key = reinterpret_cast<PyObject*>(type);
        Ref entry = Ref::FromBorrowed(PyDict_GetItemWithError(Item(kLeafKinds), key));
        if (!entry) {
            if (PyErr_Occurred()) return Ref();
            entry = Ref(PyObject_CallOneArg(Item(kClassifyLeaf), key));
            if (!entry) return Ref();
        }
        if (!PyTuple_CheckExact(entry.get()) || PyTuple_GET_SIZE(entry.get()) != 3 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(entry.get(), 0))) {
            PyErr_SetString(PyExc_SystemError, "nnx graph kinds: an entry is not (int, impl, type)");
            return Ref();
        }
        return entry;
    }

    static int KindOf(PyObject* entry) {
        return static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(entry, 0)));
    }

    // 1 if `value`'s type is a plain Variable class (kVariable), 0 if not, -1 on error.
    int IsPlainVariable(PyObject* value) const {
        Ref entry = LeafEntry(Py_TYPE(value));
        if (!entry) return -1;
        return KindOf(entry.get()) == kVariable ? 1 : 0;
    }

    // A new tracers.TraceState(): jax's opaque trace state of the current trace, as
    // tracers.current_jax_trace() makes it (a new object around the trace's weakref).
    Ref NewTraceState() {
        const Names* n = GetNames();
        if (!CurrentTrace()) return Ref();
        if (!trace_ref_) return Ref(PyObject_CallNoArgs(Item(kTraceStateType)));
        Ref opaque(NewRecord(Item(kOpaqueTraceState), {{n->trace_ref, trace_ref_.get()}}));
        if (!opaque) return Ref();
        return Ref(NewRecord(Item(kTraceStateType), {{n->jax_trace, opaque.get()}}));
    }

    // variable.set_raw_value(value) (from_state false) or variable.update_from_state(value)
    // (true), natively for a plain Variable class, else by the Variable's own method.
    bool Update(PyObject* variable, PyObject* value, bool from_state) {
        const Names* n = GetNames();
        const int plain = IsPlainVariable(variable);
        if (plain < 0) return false;
        if (!plain) {
            Ref done(PyObject_CallMethodOneArg(
                variable, from_state ? n->update_from_state : n->set_raw_value, value));
            return static_cast<bool>(done);
        }
        if (!CheckCanUpdate(variable)) return false;
        if (!from_state) return PyObject_GenericSetAttr(variable, n->raw_value, value) == 0;
        // update_from_state: the raw value, then the metadata only if it differs.
        Ref raw(PyObject_GetAttr(value, n->raw_value));
        if (!raw || PyObject_GenericSetAttr(variable, n->raw_value, raw.get()) < 0) return false;
        Ref ours(PyObject_GetAttr(variable, n->var_metadata));
        Ref theirs(PyObject_GetAttr(value, n->var_metadata));
        if (!ours || !theirs) return false;
        if (ours.get() == theirs.get()) return true;
        const int differs = PyObject_RichCompareBool(ours.get(), theirs.get(), Py_NE);
        if (differs < 0) return false;
        if (!differs) return true;
        Ref done(PyObject_CallMethodOneArg(variable, n->update_from_state, value));
        return static_cast<bool>(done);
    }

 private:
    PyObject* Item(Py_ssize_t i) const { return PyTuple_GET_ITEM(ctx_, i); }

    // The current trace's weakref, asked of jax once (tracers.current_jax_trace()). False with
    // an error set if asking failed; true with trace_ref_ unset if the answer is not of the class
    // the Python side saw at attach (callers then use flax's own functions).
    bool CurrentTrace() {
        if (trace_ref_ || asked_) return true;
        asked_ = true;
        Ref current(PyObject_CallNoArgs(Item(kCurrentTrace)));
        if (!current) return false;
        if (Py_TYPE(current.get()) != reinterpret_cast<PyTypeObject*>(Item(kOpaqueTraceState))) {
            return true;
        }
        trace_ref_ = Ref(PyObject_GetAttr(current.get(), GetNames()->trace_ref));
        return static_cast<bool>(trace_ref_);
    }

    // Variable._check_can_update(): a hijax Variable, or one made in the current trace, may be
    // updated. Decided here where the Variable's trace state plainly holds this trace's weakref;
    // otherwise flax's own method decides (and raises its TraceContextError).
    bool CheckCanUpdate(PyObject* variable) {
        const Names* n = GetNames();
        if (!CurrentTrace()) return false;
        const int same = trace_ref_ ? SameTrace(variable) : 0;
        if (same != 0) return same > 0;
        Ref checked(PyObject_CallMethodNoArgs(variable, n->check_can_update));
        return static_cast<bool>(checked);
    }

    // 1 if so, 0 if not (or not plainly), -1 on an error other than a missing attribute.
    int SameTrace(PyObject* variable) {
        const Names* n = GetNames();
        Ref state(PyObject_GetAttr(variable, n->trace_state));
        bool same = false;
        if (state && Py_TYPE(state.get()) == reinterpret_cast<PyTypeObject*>(Item(kTraceStateType))) {
            Ref opaque(PyObject_GetAttr(state.get(), n->jax_trace));
            if (opaque &&
                Py_TYPE(opaque.get()) == reinterpret_cast<PyTypeObject*>(Item(kOpaqueTraceState))) {
                Ref ref(PyObject_GetAttr(opaque.get(), n->trace_ref));
                same = ref && ref.get() == trace_ref_.get();
            }
        }
        if (same) return 1;
        if (PyErr_Occurred()) {
            // A slot of flax's not set: its method reads it again, and raises what it raises.
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
            PyErr_Clear();
        }
        return 0;
    }

    PyObject* const ctx_;  // borrowed: the caller holds the context for the walk
    Ref trace_ref_;
    bool asked_ = false;
};

}  // namespace fastree::nnx_graph
