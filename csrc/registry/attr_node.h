// Attribute nodes: classes whose children are named attributes of the instance (equinox Modules,
// frozen dataclasses built without __init__). One AttrNode object per registered class holds its
// layout and serves both sides:
//   - fastree's walkers read it natively (NodeKind::kAttribute, kinds_read.h), with no Python
//     frame per node;
//   - JAX is handed its C-implemented flatten / flatten_with_keys / unflatten methods, so JAX's
//     own tree functions and jit dispatch run it without a Python frame either.
//
// Layout (what one instance gives):
//   children  the data fields, in order, each read from the instance's own storage (its
//             __dict__, or a slot): never a class attribute, a property or __getattr__.
//   aux data  a tuple: the meta fields' values, in order, preceded (if extra fields are given)
//             by one item for the extra fields: `missing` when the instance __dict__ holds
//             exactly as many entries as there are data and meta fields, else the tuple of the
//             extra fields' values (each `missing` where absent). This is equinox's layout for
//             the attributes functools.wraps copies onto a Module.
//   absent    an absent data or meta field reads as `missing` when one is given, and is an
//             AttributeError otherwise.
//   rebuild   object.__new__(cls), then object.__setattr__ for each data field, the extra
//             fields written into the instance __dict__ (when not `missing`), then each meta
//             field; a field whose value is `missing` is left unset. __init__ never runs.
//
// A third layout, flax.nnx's (mapping): the fields are whatever the instance __dict__ holds,
// split into children and static values by a mapping the instance carries (attr_mapping.h).
//
// A fourth, flax.nnx's Variable's (meta_items): the children are the data fields as above
// (keys may be given other names: key_names), the aux data the sorted items of the one meta
// field, a dict; a rebuild calls the class's own constructor method (rebuild_with).
//
// A fifth, flax.nnx's State's (items_field): the children are the values of one dict attribute
// in sorted key order, the aux data those keys (attr/attr_items.h).
//
// A second aux layout, chex's (names_as_aux): the aux data is the tuple of the data field names,
// the children are in that order, and an instance whose __dict__ holds other names is one the
// library answers for (delegate_irregular). A rebuild may set the fields in another order
// (rebuild_order: the class's field order) and then call __post_init__ (post_init).
//
// Checked use: an integration (python/fastree/integrations/) may attach a checker and the
// library's own functions. The checker runs on the first instances (and on instances whose
// __dict__ holds other than the fields) before any native output leaves; if it finds a
// difference, the node delegates to the library's functions from then on (use_library).
//
// Why this header is in registry/ and its code in attr/ (attr/attr_*.cpp: read, check, rebuild,
// node_new, node_type, mapping): an attribute node is a node kind. The registry registers one
// (RegisterAttribute) and the treedef walkers read and rebuild it (treedef/kinds_read.h,
// node_kinds.cpp), so the layout and what it offers them sit below both; the code needs the
// registry's keys, dict items and DelegateAttribute, so it sits above.
#pragma once

#include <Python.h>

#include <cstdint>

#include "util/free_threading.h"
#include "util/pyutils.h"

namespace fastree {
namespace attr {

// A `slots` entry: the field is read through getattr (a slot descriptor that belongs to
// another class: FindSlots).
constexpr Py_ssize_t kReadByGetAttr = -1;

struct AttrNode {
    PyObject_HEAD
    // The layout (immutable once made). All owned; all visited by the GC.
    PyObject* cls;           // the class (a type)
    PyObject* data_fields;   // tuple of interned str: the children, in order
    PyObject* meta_fields;   // tuple of interned str: the aux data values, in order
    PyObject* extra_fields;  // tuple of interned str, or null: see "aux data" above
    PyObject* missing;       // what an absent field reads as, or null: absent is an error
    PyObject* keys;          // tuple of GetAttrKey, one per data field
    PyObject* regular_aux;   // the aux of an instance holding exactly its fields, when it has
                             // no meta fields ((missing,) or ()): shared, made once
    // last_aux, aux_stamp and meta_kept are shared by every thread reading instances of the
    // class: each is read and written only inside the node's critical section (attr_read.cpp's
    // Aux, KeptMetaItems, KeepMetaItems; kinds_read.h's stamped check, StampIfShared), where no
    // Python code runs; a replaced tuple is released after the section.
    PyObject* last_aux;      // the last aux tuple made for a regular instance, or null: handed
                             // out again while the values read are the very same objects (a
                             // model's layers share their static values; an aux tuple per node
                             // per flatten was most of a treedef's cost, and fed the cyclic GC)
    uint64_t aux_stamp;      // aux::CheckStamped's record for last_aux / regular_aux
    // A meta_items node's last_aux: the sorted (key, value) pairs of the last metadata dict read,
    // handed out again while a Variable's metadata holds the very same keys and values (most of
    // a model's Variables of one class carry equal metadata). Kept only for metadata of at most
    // kMaxKeptMeta names whose values are immortal (None, bools, cached small ints): it keeps
    // alive nothing but those names. A shared aux tuple is also what makes jit's cache lookup
    // cheap: JAX compares aux data with ==, which takes identity first. meta_kept: whether
    // last_aux is such a tuple.
    static constexpr Py_ssize_t kMaxKeptMeta = 16;
    bool meta_kept;
    Py_ssize_t* slots;       // per field (data, meta, extra order): its slot offset, 0 if read
                             // from __dict__, kReadByGetAttr if through getattr (FindSlots)
                             // from __dict__ (PyMem; null when no field is a slot)
    Py_ssize_t* rebuild_order;  // data field indices in the order a rebuild sets them (PyMem;
                                // null: in order)
    bool fields_all_slots;  // every data and meta field is an own slot, none extra: __dict__
                            // is never read
    bool names_as_aux;  // the aux data is data_fields itself (chex); no meta or extra fields
    bool meta_items;    // the aux data is tuple(sorted(m.items())) for the one meta field m, an
                        // exact dict of exact str keys (flax.nnx's Variable metadata)
    PyObject* rebuild_with;  // or null: a rebuild is getattr(cls, rebuild_with)(*children,
                             // dict(aux)) (meta_items nodes: flax.nnx's Variable._new)
    PyObject* trace_classes;  // or null: with rebuild_with, that rebuild made in C as flax.nnx's
                              // Variable._new makes it (attr/nnx_shared.h, NewVariable);
                              // (TraceState, OpaqueTraceState, current_jax_trace, (holder,
                              // attribute name) of jax's current trace, or None); or with
                              // trace_field, for the fields layout
    PyObject* trace_field;    // or null: a rebuild first sets this field to a new TraceState
                              // made as flax.nnx's tracers.TraceState() makes it (flax.nnx's
                              // PytreeState, whose __init__ does so)
    bool post_init;     // a rebuild ends with obj.__post_init__() when the class has one
    bool delegate_irregular;  // instances holding other than the fields: the library answers
    // Checking against the library (null / 0 / false for a node registered directly).
    // The four functions are replaced by check_with, in the node's critical section, and read
    // with a reference taken in it (NodeFunction): a borrowed one could be freed by another
    // thread's check_with while it is called. Tests for null (HasFunction) and
    // delegate_irregular (DelegatesIrregular) read them with relaxed atomic loads, which
    // check_with's relaxed stores pair with: a plain read beside another thread's write is a
    // C++ data race on a free-threaded build (ThreadSanitizer reported it).
    PyObject* checker;                    // checker(obj) -> bool
    PyObject* library_flatten;            // the library's own functions
    PyObject* library_flatten_with_keys;
    PyObject* library_unflatten;
    // Read and written from any thread with atomics (Counter, TakeCheck, UsesLibrary,
    // SetUseLibrary below): a lost decrement would only run an extra check, but a plain field
    // read while another thread writes it is a C++ data race on a free-threaded build.
    int checks_left;            // instances still to check
    int irregular_checks_left;  // of those whose __dict__ holds other than the fields
    bool use_library;           // a check failed: the library's functions answer
    struct MappingLayout* mapping;  // or null: the mapping layout's settings (attr_mapping.h;
                                    // PyMem, its references owned and visited by the GC)
    PyObject* items_field;  // or null: the items layout's attribute (attr/attr_items.h), an
                            // interned str
    PyObject* trusted_getattribute;  // or null: a class-level __getattribute__ (the library's
                                     // own) under which an instance still reads natively
    PyObject* trusted_code;  // or null: that function's code object when it was vouched for; a
                             // function whose __code__ was replaced since is trusted no more
    PyObject* weakrefs;
};

// ---- the per-node state other threads share (docs/threads.md, A4-A6)

// node->*field (one of the checker and library functions) as a new reference, or null: taken in
// the node's critical section, where check_with replaces them.
inline Ref NodeFunction(AttrNode* node, PyObject* AttrNode::*field) {
    PyObject* fn;
    FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(node));
    fn = Py_XNewRef(node->*field);
    FASTREE_END_CRITICAL_SECTION();
    return Ref(fn);
}

// Records `stamp` (aux::CheckStamped's) as the node's, if `aux` (held by the caller) is still
// the node's shared aux tuple: a stamp made for a tuple another thread has since replaced must
// not vouch for its replacement.
inline void StampIfShared(AttrNode* node, PyObject* aux, uint64_t stamp) {
    FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(node));
    if (aux == node->last_aux || aux == node->regular_aux) node->aux_stamp = stamp;
    FASTREE_END_CRITICAL_SECTION();
}

// The counters and the switch, as relaxed atomics on the plain fields (A5): one load or store
// each, the same instructions as a plain access on x86 and ARM.
inline int Counter(const int& counter) { return __atomic_load_n(&counter, __ATOMIC_RELAXED); }
inline void SetCounter(int& counter, int value) {
    __atomic_store_n(&counter, value, __ATOMIC_RELAXED);
}
// Takes one check from `counter` if any is left: never below zero, whatever other threads take.
inline bool TakeCheck(int& counter) {
    int left = Counter(counter);
    while (left > 0) {
        if (__atomic_compare_exchange_n(&counter, &left, left - 1, /*weak=*/true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return true;
        }
    }
    return false;
}
// Whether node->*field (a checker or library function) is set; nothing is dereferenced.
inline bool HasFunction(const AttrNode* node, PyObject* const AttrNode::*field) {
    return __atomic_load_n(&(node->*field), __ATOMIC_RELAXED) != nullptr;
}
inline bool DelegatesIrregular(const AttrNode* node) {
    return __atomic_load_n(&node->delegate_irregular, __ATOMIC_RELAXED);
}
// The switch is stored with release and read with acquire: a thread that sees it set also sees
// the class's custom record the switch published before setting it (attr/attr_check.cpp).
inline bool UsesLibrary(const AttrNode* node) {
    return __atomic_load_n(&node->use_library, __ATOMIC_ACQUIRE);
}
inline void SetUseLibrary(AttrNode* node, bool on) {
    __atomic_store_n(&node->use_library, on, __ATOMIC_RELEASE);
}

// Creates the AttrNode type; null with an error set. Called once, at module init.
PyTypeObject* CreateType();
bool IsNode(PyObject* obj);
inline AttrNode* AsNode(PyObject* obj) { return reinterpret_cast<AttrNode*>(obj); }

// What a read of one instance found: its children (owned) and, if asked for, its aux data.
struct Fields {
    RefSmallVector<16> children;
    Ref aux;
};

// kLibrary: the node now delegates for good (a check failed). kLibraryOnce: this instance is one
// the library answers for (delegate_irregular), the node stays native.
enum class Outcome : uint8_t { kNative, kLibrary, kLibraryOnce, kError };

// Reads `obj` natively into `out` (aux only if want_aux). Runs the checker first where one is
// due: kLibrary when the node now delegates to the library (nothing read), kError with an error
// set. `obj` must be an instance of node->cls.
Outcome Read(AttrNode* node, PyObject* obj, bool want_aux, Fields* out);

// Rebuilds an instance from aux data and `n` children (borrowed). Null with an error set when
// the aux data or the number of children does not fit the layout.
PyObject* Build(AttrNode* node, PyObject* aux, PyObject* const* children, Py_ssize_t n);

// Whether `aux` fits the layout (a tuple of the right length; of `arity` names when the names
// are the aux data): false with a ValueError set.
bool CheckAux(AttrNode* node, PyObject* aux, Py_ssize_t arity);

// The key of child k of a node with aux data `aux` (a new reference).
PyObject* ChildKey(AttrNode* node, PyObject* aux, Py_ssize_t k);

inline Py_ssize_t NumChildren(const AttrNode* node) { return PyTuple_GET_SIZE(node->data_fields); }

// Whether instances of `t` read attributes with object's own __getattribute__: the generic
// lookup, or a class that adds only __getattr__ (it runs for names the lookup misses). Runs no
// Python code (_PyType_Lookup: the type's method cache). attr/attr_read.cpp; valid once the
// AttrNode type is made (module init).
bool UsesObjectGetattribute(PyTypeObject* t);

}  // namespace attr
}  // namespace fastree
