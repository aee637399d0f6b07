// What flax.nnx's two modes share in C, as python/fastree/integrations/_flax_nnx_shared.py does
// in Python: the attribute names flax's code reads and sets (Names: one interned table, the
// graph walks' own names included), object.__new__ with fields set as a frozen dataclass sets
// them (NewRecord, nnx_shared.cpp), how a TraceState is made (TraceStates), and a Variable made
// as Variable._new makes it (NewVariable). Tree mode rebuilds a Variable with them
// (attr/attr_rebuild.cpp: a meta_items node with trace_classes); graph mode (nnx/) makes its
// records, TraceStates and Variables with them. Here, in attr/, the lower of the two layers, so
// that both include it downward; in namespace nnx_graph, where graph mode uses it unqualified.
#pragma once

#include <Python.h>

#include <initializer_list>
#include <utility>

#include "attr/attr_mapping.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {

struct Names {
    PyObject* dict;              // __dict__ (vars(node))
    PyObject* is_pytree;         // Pytree._pytree__is_pytree
    PyObject* nodes;             // Pytree._pytree__nodes
    PyObject* has_int_keys;      // Pytree._pytree__has_int_keys
    PyObject* mapping;           // HashableMapping._mapping
    PyObject* raw_value;         // Variable._raw_value
    PyObject* var_metadata;      // Variable._var_metadata
    PyObject* trace_state;       // Variable._trace_state, PytreeState._trace_state
    PyObject* jax_trace;         // TraceState._jax_trace
    PyObject* trace_ref;         // jax's OpaqueTraceState._trace_ref
    PyObject* weakref;           // jax's Trace._weakref
    PyObject* hijax;             // the Variable metadata key "hijax" (and Variable.hijax)
    PyObject* ref;               // the Variable metadata key "ref" (and Variable.ref)
    PyObject* copy;              // dict.copy (a Variable's metadata, when not an exact dict)
    PyObject* initializing;      // PytreeState.initializing (property)
    PyObject* is_setup;          // PytreeState.is_setup (property)
    PyObject* initializing_slot; // PytreeState._initializing
    PyObject* is_setup_slot;     // PytreeState._is_setup
    PyObject* flatten;           // NodeImpl.flatten
    PyObject* unflatten;         // PytreeNodeImpl.unflatten
    PyObject* create_empty;      // GraphNodeImpl.create_empty
    PyObject* clear;             // GraphNodeImpl.clear
    PyObject* init;              // GraphNodeImpl.init
    PyObject* update_from_state; // Variable.update_from_state
    PyObject* set_raw_value;     // Variable.set_raw_value
    PyObject* check_can_update;  // Variable._check_can_update
    PyObject* value;             // DataElem/StaticElem/Static.value
    PyObject* type;              // NodeDef/VariableDef fields, in their order:
    PyObject* index;
    PyObject* outer_index;
    PyObject* num_attributes;
    PyObject* metadata;
    PyObject* array_refdef;
    PyObject* updates_keys;      // extract.Updates._keys (tree mode's apply_updates)
    PyObject* updates_values;    // extract.Updates._values
};

// The table, filled once at module init (InitNames, from binding/module.cpp) and read without
// synchronisation afterwards (docs/threads.md, N1). Not a function-local static built on first
// use: on a free-threaded build a second thread would wait on C++'s initialisation guard while
// attached, and the first one's allocations may need a stop-the-world GC, which waits for it: a
// deadlock. Constant-initialised (all null) and never destroyed: the strings are interned, kept
// for the process.
inline Names g_names{};

// Interns every name. False with an error set. Once, at module init (under the import lock).
inline bool InitNames() {
    Names& n = g_names;
    const std::pair<PyObject**, const char*> names[] = {
        {&n.dict, "__dict__"},
        {&n.is_pytree, "_pytree__is_pytree"},
        {&n.nodes, "_pytree__nodes"},
        {&n.has_int_keys, "_pytree__has_int_keys"},
        {&n.mapping, "_mapping"},
        {&n.raw_value, "_raw_value"},
        {&n.var_metadata, "_var_metadata"},
        {&n.trace_state, "_trace_state"},
        {&n.jax_trace, "_jax_trace"},
        {&n.trace_ref, "_trace_ref"},
        {&n.weakref, "_weakref"},
        {&n.hijax, "hijax"},
        {&n.ref, "ref"},
        {&n.copy, "copy"},
        {&n.initializing, "initializing"},
        {&n.is_setup, "is_setup"},
        {&n.initializing_slot, "_initializing"},
        {&n.is_setup_slot, "_is_setup"},
        {&n.flatten, "flatten"},
        {&n.unflatten, "unflatten"},
        {&n.create_empty, "create_empty"},
        {&n.clear, "clear"},
        {&n.init, "init"},
        {&n.update_from_state, "update_from_state"},
        {&n.set_raw_value, "set_raw_value"},
        {&n.check_can_update, "_check_can_update"},
        {&n.value, "value"},
        {&n.type, "type"},
        {&n.index, "index"},
        {&n.outer_index, "outer_index"},
        {&n.num_attributes, "num_attributes"},
        {&n.metadata, "metadata"},
        {&n.array_refdef, "array_refdef"},
        {&n.updates_keys, "_keys"},
        {&n.updates_values, "_values"},
    };
    static_assert(sizeof(names) / sizeof(names[0]) == sizeof(Names) / sizeof(PyObject*),
                  "every field of Names is interned here");
    for (const auto& [field, text] : names) {
        if (*field != nullptr) continue;
        *field = PyUnicode_InternFromString(text);
        if (*field == nullptr) return false;
    }
    return true;
}

inline const Names* GetNames() { return &g_names; }

// object.__new__(cls) with each field set in order by object.__setattr__, as the frozen
// dataclasses' own __init__ sets them: the same __dict__ (or slots), in the same order. A new
// reference, or null with an error set.
PyObject* NewRecord(PyObject* cls, std::initializer_list<std::pair<PyObject*, PyObject*>> fields);

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

}  // namespace fastree::nnx_graph
