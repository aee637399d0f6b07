// What flax's graph walks do to Variables, natively: make a TraceState for a new Variable or
// PytreeState, and update a Variable in place (set_raw_value, update_from_state) with flax's
// trace check. Shared by nnx_graph_unflatten.cpp and nnx_graph_update.cpp, which hold one
// VariableOps per walk (the current trace is asked of jax once per walk). TraceStates and
// NewVariable, which tree mode uses too, are attr/nnx_shared.h's.
#pragma once

#include <Python.h>

#include "attr/nnx_shared.h"
#include "nnx/nnx_graph.h"
#include "nnx/nnx_graph_walk.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {

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
