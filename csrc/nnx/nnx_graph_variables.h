// What flax's graph walks do to Variables, natively: make a TraceState for a new Variable or
// PytreeState, and update a Variable in place (set_raw_value, update_from_state) with flax's
// trace check. Shared by nnx_graph_unflatten.cpp and nnx_graph_update.cpp, which hold one
// VariableOps per walk (the current trace is asked of jax once per walk).
#pragma once

#include <Python.h>

#include "attr/attr_mapping.h"
#include "nnx/nnx_graph.h"
#include "nnx/nnx_graph_walk.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {

// Makes flax's TraceState objects: tracers.TraceState() is a new object around jax's opaque trace
// state of the current trace (tracers.current_jax_trace(): a new OpaqueTraceState around the
// trace's weakref). `classes` is (TraceState, the OpaqueTraceState class, current_jax_trace,
// where jax keeps the current trace: (holder, attribute name) or None), borrowed from a holder that outlives this. The current trace is asked of jax once per
// TraceStates: a walk's lifetime, or one rebuild.
class TraceStates {
 public:
    explicit TraceStates(PyObject* classes) : classes_(classes) {}

    Ref New() {
        const Names* n = GetNames();
        if (!Current()) return Ref();
        if (!trace_ref_) return Ref(PyObject_CallNoArgs(TraceStateType()));
        Ref opaque(NewRecord(OpaqueType(), {{n->trace_ref, trace_ref_.get()}}));
        if (!opaque) return Ref();
        return Ref(NewRecord(TraceStateType(), {{n->jax_trace, opaque.get()}}));
    }

    // The current trace's weakref, asked of jax once. False with an error set if asking failed;
    // true with TraceRef() null if the answer is not of the class the Python side saw at attach
    // (callers then use flax's own functions).
    bool Current() {
        if (trace_ref_ || asked_) return true;
        asked_ = true;
        PyObject* trace_at = PyTuple_GET_ITEM(classes_, 3);  // (holder, attribute) or None
        if (PyTuple_CheckExact(trace_at) && PyTuple_GET_SIZE(trace_at) == 2) {
            // get_opaque_trace_state()'s own reads: trace_ctx.trace._weakref, the trace read
            // where trace_ctx.trace reads it (jax_interop/compat.py, opaque_trace_context; the
            // Python side checked at attach that this is what it does); a missing trace asks
            // jax's function, which says so as it does.
            Ref trace(PyObject_GetAttr(PyTuple_GET_ITEM(trace_at, 0),
                                       PyTuple_GET_ITEM(trace_at, 1)));
            if (!trace) return false;
            if (trace.get() != Py_None) {
                trace_ref_ = Ref(PyObject_GetAttr(trace.get(), GetNames()->weakref));
                return static_cast<bool>(trace_ref_);
            }
        }
        Ref current(PyObject_CallNoArgs(PyTuple_GET_ITEM(classes_, 2)));
        if (!current) return false;
        if (Py_TYPE(current.get()) != reinterpret_cast<PyTypeObject*>(OpaqueType())) return true;
        trace_ref_ = Ref(PyObject_GetAttr(current.get(), GetNames()->trace_ref));
        return static_cast<bool>(trace_ref_);
    }

    PyObject* TraceRef() const { return trace_ref_.get(); }
    PyObject* TraceStateType() const { return PyTuple_GET_ITEM(classes_, 0); }
    PyObject* OpaqueType() const { return PyTuple_GET_ITEM(classes_, 1); }

 private:
    PyObject* const classes_;
    Ref trace_ref_;
    bool asked_ = false;
};

// cls._new(value, metadata) for a plain Variable class (its own _new is Variable's): object.__new__
// (cls), then a new TraceState, the metadata dict and the raw value, set as object.__setattr__
// sets them. A new reference, or null with an error set.
inline PyObject* NewVariable(PyObject* cls, PyObject* value, PyObject* metadata,
                             TraceStates* states) {
    const Names* n = GetNames();
    Ref state = states->New();
    if (!state) return nullptr;
    Ref obj(attr::NewInstance(cls));
    if (!obj || PyObject_GenericSetAttr(obj.get(), n->trace_state, state.get()) < 0 ||
        PyObject_GenericSetAttr(obj.get(), n->var_metadata, metadata) < 0 ||
        PyObject_GenericSetAttr(obj.get(), n->raw_value, value) < 0) {
        return nullptr;
    }
    return obj.release();
}

class VariableOps {
 public:
    // `context` is the unflatten context tuple (UnflattenItem), held by the caller.
    explicit VariableOps(PyObject* context) : ctx_(context), states_(TraceClasses(context)) {}

    // The table entry (kind, impl, type) of a leaf type (the flatten table).
    Ref LeafEntry(PyTypeObject* type) const {
        return KindEntry(Item(kLeafKinds), Item(kClassifyLeaf), reinterpret_cast<PyObject*>(type));
    }

    // 1 if `value`'s type is a plain Variable class (kVariable), 0 if not, -1 on error.
    int IsPlainVariable(PyObject* value) const {
        Ref entry = LeafEntry(Py_TYPE(value));
        if (!entry) return -1;
        return KindOf(entry.get()) == kVariable ? 1 : 0;
    }

    Ref NewTraceState() { return states_.New(); }
    TraceStates* States() { return &states_; }

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
        // Variable.update_from_state, step by step (each `self.x = ...` is Variable.__setattr__:
        // the update check, then object.__setattr__), so that the metadata's == runs once, as
        // in flax: the raw value; then, only if `self._var_metadata != state._var_metadata`,
        // state.get_metadata() (a copy) with 'hijax' and 'ref' from self, as the metadata.
        Ref raw(PyObject_GetAttr(value, n->raw_value));
        if (!raw || PyObject_GenericSetAttr(variable, n->raw_value, raw.get()) < 0) return false;
        Ref ours(PyObject_GetAttr(variable, n->var_metadata));
        Ref theirs(PyObject_GetAttr(value, n->var_metadata));
        if (!ours || !theirs) return false;
        // `!=` itself, not RichCompareBool: no identity shortcut beyond what `!=` takes (an exact
        // dict compares its values with RichCompareBool, identity first, as flax's `!=` does).
        Ref ne(PyObject_RichCompare(ours.get(), theirs.get(), Py_NE));
        if (!ne) return false;
        const int differs = PyObject_IsTrue(ne.get());
        if (differs <= 0) return differs == 0;
        // get_metadata(): `self._var_metadata.copy()` (read again: the == ran Python code).
        theirs = Ref(PyObject_GetAttr(value, n->var_metadata));
        if (!theirs) return false;
        Ref metadata(PyDict_CheckExact(theirs.get())
                         ? PyDict_Copy(theirs.get())
                         : PyObject_CallMethodNoArgs(theirs.get(), n->copy));
        if (!metadata) return false;
        for (PyObject* name : {n->hijax, n->ref}) {
            Ref flag(PyObject_GetAttr(variable, name));  // self.hijax, self.ref (properties)
            if (!flag || PyObject_SetItem(metadata.get(), name, flag.get()) < 0) return false;
        }
        if (!CheckCanUpdate(variable)) return false;
        return PyObject_GenericSetAttr(variable, n->var_metadata, metadata.get()) == 0;
    }

 private:
    PyObject* Item(Py_ssize_t i) const { return PyTuple_GET_ITEM(ctx_, i); }

    // (TraceState, OpaqueTraceState, current_jax_trace): the context's kTraceClasses item.
    static PyObject* TraceClasses(PyObject* context) {
        return PyTuple_GET_ITEM(context, kTraceClasses);
    }

    // Variable._check_can_update(): a hijax Variable, or one made in the current trace, may be
    // updated. Decided here where the Variable's trace state plainly holds this trace's weakref;
    // otherwise flax's own method decides (and raises its TraceContextError).
    bool CheckCanUpdate(PyObject* variable) {
        const Names* n = GetNames();
        if (!states_.Current()) return false;
        const int same = states_.TraceRef() ? SameTrace(variable) : 0;
        if (same != 0) return same > 0;
        Ref checked(PyObject_CallMethodNoArgs(variable, n->check_can_update));
        return static_cast<bool>(checked);
    }

    // 1 if so, 0 if not (or not plainly), -1 on an error other than a missing attribute.
    int SameTrace(PyObject* variable) {
        const Names* n = GetNames();
        Ref state(PyObject_GetAttr(variable, n->trace_state));
        bool same = false;
        if (state &&
            Py_TYPE(state.get()) == reinterpret_cast<PyTypeObject*>(states_.TraceStateType())) {
            Ref opaque(PyObject_GetAttr(state.get(), n->jax_trace));
            if (opaque &&
                Py_TYPE(opaque.get()) == reinterpret_cast<PyTypeObject*>(states_.OpaqueType())) {
                Ref ref(PyObject_GetAttr(opaque.get(), n->trace_ref));
                same = ref && ref.get() == states_.TraceRef();
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
    TraceStates states_;
};

}  // namespace fastree::nnx_graph
