// flax.nnx's graph mode (nnx.split / state / graphdef / merge and the flatten and unflatten inside
// nnx.jit and the other nnx transforms), served natively for the flax versions
// python/fastree/integrations/flax_nnx_graph.py knows.
//
// flax walks a module graph in Python (flax/nnx/graphlib.py, `_graph_flatten` and
// `_graph_unflatten`): per node an isinstance through Variable's metaclass, `sorted(vars(node))`,
// a reference map keyed by id(), and frozen dataclasses (NodeDef, VariableDef, NodeRef, Static)
// built one __init__ at a time. These functions make the same objects, in the same order, from
// C. Everything flax-specific they need comes in from Python as a `Context` tuple (the classes,
// the singletons, a per-type table of kinds): nothing here names a flax symbol, and the Python
// side decides, per type, what may be served natively (kinds below).
//
// A walk that meets anything it does not serve (an array ref, a tracer, a hijax Variable, a key
// that is not an exact str or int) returns None before it has changed anything the caller can
// see, and the Python side runs flax's own function instead.
#pragma once

#include <Python.h>

namespace fastree::nnx_graph {

// How deep the native walks nest before leaving the rest to flax's own Python: flax's walks are
// Python recursion (heap frames from 3.11, bounded by sys.getrecursionlimit() alone), the native
// ones use the C stack. Past this depth (nnx graphs are rarely 20 deep) a flatten, an unflatten
// and a merge are flax's from the start and an update's deeper subtree is flax's.
inline constexpr int kMaxNativeDepth = 1000;

// What a type is to flax's graph walk: the `kind` in a Context table entry (code, impl,
// impl.type). The Python side computes it once per type (flax_nnx_graph._classify).
enum Kind : int {
    kLeaf = 0,          // no node impl, not a Variable, never an array ref: a leaf; a static
                        // attribute unless its owner marks it data
    kArrayLeaf = 1,     // a numpy or jax array (never a ref): always a leaf attribute
    kVariable = 2,      // a Variable class with flax's own slots and accessors
    kNnxPytree = 3,     // a graph node flattened by Pytree._graph_node_flatten (read natively)
    kGraphNode = 4,     // another GraphNodeImpl: its flatten function is called
    kPytreeNode = 5,    // a PytreeNodeImpl (registry entry or JAX pytree): its flatten is called
    kList = 6,          // list, with flax's own registration (enumerate)
    kTuple = 7,         // tuple, with flax's own registration (enumerate)
    kNone = 8,          // None, with flax's own registration (no children)
    kDict = 9,          // dict, with flax's own registration (sorted items)
    kUnserved = 10,     // a tracer, an array ref, a hijax Variable...: flax's function runs
    kPytreeState = 11,  // pytreelib.PytreeState through the generic pytree impl: no children,
                        // metadata IndexesPytreeDef({}, treedef of its (initializing, is_setup))
    kGenericPytree = 12,  // unflatten only: NodeDef.type GenericPytree (the generic impl); a
                          // PytreeState's node is rebuilt natively, any other by impl.unflatten
};

inline constexpr int kKindCount = kGenericPytree + 1;
// The kinds' names, in code order: exported as _core.NNX_GRAPH_KINDS, from which the Python side
// takes every code (integrations/_flax_nnx_graph_kinds.py) and which attach checks against the
// kinds it classifies into, so that neither side's list can drift from the other's.
inline constexpr const char* kKindNames[] = {
    "LEAF", "ARRAY_LEAF", "VARIABLE", "NNX_PYTREE", "GRAPH_NODE", "PYTREE_NODE", "LIST",
    "TUPLE", "NONE", "DICT", "UNSERVED", "PYTREE_STATE", "GENERIC_PYTREE",
};
static_assert(sizeof(kKindNames) / sizeof(kKindNames[0]) == kKindCount, "one name per Kind");

// The positions in the Context tuple the Python side passes to every call.
enum ContextItem : Py_ssize_t {
    kKinds = 0,          // dict: type -> (kind, impl, impl.type), filled by kClassify
    kClassify,           // callable(type) -> that entry (and stores it in kKinds)
    kNodeDefType,        // graphlib.NodeDef
    kVariableDefType,    // graphlib.VariableDef
    kNodeRefType,        // graphlib.NodeRef
    kStaticType,         // graphlib.Static
    kHashableMapping,    // flax.typing.HashableMapping
    kNodeAttr,           // graphlib.NODE_ATTR
    kLeafAttr,           // graphlib.LEAF_ATTR
    kDataElem,           // graphlib.DataElem
    kStaticElem,         // graphlib.StaticElem
    kIndexesPytreeDef,   // graphlib.IndexesPytreeDef (a NamedTuple)
    kStateTreedefs,      // dict: (initializing, is_setup) -> the IndexesPytreeDef flax made for it
    kContextSize,
};
// The names of the Context items, in ContextItem order: the Python side builds the tuple from
// these (flax_nnx_graph.py, by name), so a reordered or added item cannot go unnoticed there.
inline constexpr const char* kContextNames[] = {
    "kinds", "classify", "NodeDef", "VariableDef", "NodeRef", "Static", "HashableMapping",
    "NODE_ATTR", "LEAF_ATTR", "DataElem", "StaticElem", "IndexesPytreeDef", "state_treedefs",
};
static_assert(sizeof(kContextNames) / sizeof(kContextNames[0]) == kContextSize,
              "one name per ContextItem");

// The positions in the tuple the Python side passes to every Unflatten call.
enum UnflattenItem : Py_ssize_t {
    kLeafKinds = 0,       // the flatten Context's kKinds (type -> entry), for leaves
    kClassifyLeaf,        // its kClassify
    kNodeKinds,           // dict: NodeDef/VariableDef type -> (kind, impl, type), by
                          // get_node_impl_for_type (filled by kClassifyNodeType)
    kClassifyNodeType,    // callable(type) -> that entry (and stores it)
    kUNodeDef,            // graphlib.NodeDef
    kUVariableDef,        // graphlib.VariableDef
    kUNodeRef,            // graphlib.NodeRef
    kUStatic,             // graphlib.Static
    kUNodeAttr,           // graphlib.NodeAttr (the class)
    kULeafAttr,           // graphlib.LeafAttr (the class)
    kUHashableMapping,    // flax.typing.HashableMapping
    kUIndexesPytreeDef,   // graphlib.IndexesPytreeDef
    kStateAuxes,          // dict: id(treedef) -> (treedef, aux) for PytreeState treedefs
    kLearnStateAux,       // callable(treedef) -> its PytreeState aux (and stores it), or None
    kPytreeStateType,     // pytreelib.PytreeState
    kTraceClasses,        // (tracers.TraceState, the class of tracers.current_jax_trace()'s
                          // result, tracers.current_jax_trace, where jax keeps the current
                          // trace: (holder, attribute name) or None):
                          // attr/nnx_shared.h's TraceStates
    kUVariableBase,       // variablelib.Variable
    kStateType,           // statelib.State (update only)
    kUpdateDynamic,       // flax's own graphlib._graph_update_dynamic (update only)
    kMappingAbc,          // collections.abc.Mapping (MergeLeaves only)
    kUnflattenSize,
};
// The names of the UnflattenItems, in order (as kContextNames).
inline constexpr const char* kUnflattenNames[] = {
    "leaf_kinds", "classify_leaf", "node_kinds", "classify_node_type", "NodeDef", "VariableDef",
    "NodeRef", "Static", "NodeAttr", "LeafAttr", "HashableMapping", "IndexesPytreeDef",
    "state_auxes", "learn_state_aux", "PytreeState", "trace_classes", "Variable", "State",
    "update_dynamic", "Mapping",
};
static_assert(sizeof(kUnflattenNames) / sizeof(kUnflattenNames[0]) == kUnflattenSize,
              "one name per UnflattenItem");

// graphlib.unflatten(graphdef, leaves, index_ref=..., outer_index_outer_ref=...,
// copy_variables=False, recreate_variables=...) for a graphdef whose first node is a NodeDef or
// VariableDef: `nodes`, `attributes` are the GraphDef's lists, `leaves` the state's leaves (a
// list), `index_ref` the IndexMap (a dict) written to, `outer_ref` the outer IndexMap or None.
// Returns (node,); False where the first look classified a type not met before (nothing is
// changed: the Python side decides whether to check the walk, then calls again); None where a first look at the graphdef and leaves finds something not
// served (before anything is changed); or null with an error set, as flax's walk raises.
PyObject* Unflatten(PyObject* nodes, PyObject* attributes, PyObject* leaves, PyObject* index_ref,
                    PyObject* outer_ref, bool recreate_variables, PyObject* context);

// graphlib._graph_update_dynamic(node, state) (nnx.update, and the updates of the transforms):
// the walk over `state`'s items and the node's children natively where both are of served kinds
// (exact State or dict; nnx Pytree, list, tuple, dict, None nodes; plain Variables), and flax's
// own function for any other subtree or key. `context` is the unflatten context. Returns None, or
// null with an error set, as flax's function raises.
PyObject* Update(PyObject* node, PyObject* state, PyObject* context);

// graphlib._merge_to_flat_state(states) (nnx.merge): the leaves of nested States and dicts, in
// the order of their sorted paths. Served where each state is an exact State or dict whose nested
// values are exact States, dicts or types no Mapping can be; returns the list, None where not
// served, or null with an error set (list.sort's, comparing equal paths' values as flax does).
PyObject* MergeLeaves(PyObject* states, PyObject* context);

// graphlib.flatten(node, with_paths=..., ref_index=..., ref_outer_index=...) in graph mode, for
// a Python-side RefMap: `ref_mapping` is its `_mapping` dict (id -> (object, index)), read only;
// `outer_mapping` the outer RefMap's, or None. Returns (nodes, attributes, leaves, paths or
// None, added, called) where `added` holds the entries the walk gives the RefMap, in order (the
// caller merges them in), and `called` is [node, result, ...], each node impl's flatten the walk
// called and what it returned; where the walk is not served, `called` alone (a list); or null
// with an error set.
PyObject* Flatten(PyObject* node, bool with_paths, PyObject* ref_mapping, PyObject* outer_mapping,
                  PyObject* context);

}  // namespace fastree::nnx_graph
