// The node registry: which Python types are pytree nodes, and how to take them apart.
//
// Lookup order for a type (first match wins), mirroring JAX's default registry:
//   1. exact tuple / list / dict / NoneType         (checked inline in Classify)
//   2. types registered through fastree             (by exact type, as JAX does)
//   3. types registered only with JAX               (JAX's Python-side `_registry` dict), so
//      flax/equinox/optax types work whether they were registered before or after import
//   4. types JAX's C++ registry knows (jax.tree_util.default_registry.register_node /
//      register_dataclass_node), asked with its is_node(type) where jaxlib has it
//   5. namedtuples: JAX decides per object (a tuple instance with a `_fields` attribute). A tuple
//      subclass whose class carries a plain `_fields` is decided once for the class; any other
//      tuple subclass is decided object by object (kTupleSubclass below)
//   6. everything else is a leaf
// Results are memoised per type; the memo is dropped whenever a registration is added here or
// JAX's registry grows, so a type registered late stops being a leaf.
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>

#include "util/pyutils.h"
#include "util/thread_state.h"

namespace fastree {

enum class NodeKind : uint8_t {
    kLeaf,
    kNone,
    kTuple,
    kList,
    kDict,         // exact dict; children in sorted-key order
    kNamedTuple,   // any namedtuple class not registered otherwise
    kOrderedDict,  // collections.OrderedDict, insertion order (a "custom" node to JAX)
    kDefaultDict,  // collections.defaultdict, sorted keys (a "custom" node to JAX)
    kCustom,       // flatten/unflatten callbacks (fastree- or JAX-registered)
    kDataclass,    // register_dataclass: fields read in C++, no Python callback per node
    kAttribute,    // attribute node (attr_node.h): fields read from instance storage in C++,
                   //   rebuilt without __init__; equinox Modules through the integration
    kSharedRef,    // treedef only: a repeat of an identity-preserving node seen earlier
};

// How one node type is taken apart and rebuilt. Registrations are never freed (JAX's are not
// either): treedef nodes point at them with a plain pointer for the lifetime of the process.
// All PyObject* fields are owned references, reported to the GC by the module state
// (ModuleState::Traverse, module_state.cpp).
struct Registration {
    NodeKind kind = NodeKind::kLeaf;
    PyObject* type = nullptr;               // the registered class; null for built-in kinds
    PyObject* flatten = nullptr;            // kCustom: obj -> (children, aux); may be null if
                                            //   flatten_with_keys is set
    PyObject* unflatten = nullptr;          // kCustom: (aux, children_tuple) -> obj
    PyObject* flatten_with_keys = nullptr;  // kCustom: obj -> (((key, child), ...), aux) or null
    PyObject* data_fields = nullptr;        // kDataclass: tuple[str] of child attributes
    PyObject* meta_fields = nullptr;        // kDataclass: tuple[str] of static attributes
    PyObject* attr_node = nullptr;          // kAttribute: its layout (an attr::AttrNode); flatten,
                                            //   unflatten, flatten_with_keys are its methods
    bool from_jax = false;                  // discovered in JAX's registry, not registered here
    // Identity-preserving ("PyDAG") node: an instance reached through several paths is flattened
    // once and rebuilt as one shared object (see treedef.h, NodeKind::kSharedRef).
    bool preserve_identity = false;

    bool IsLeaf() const { return kind == NodeKind::kLeaf; }
};

namespace registry {

// Shared registrations for the kinds handled natively.
extern const Registration kLeaf;
extern const Registration kNone;
extern const Registration kTuple;
extern const Registration kList;
extern const Registration kDict;
extern const Registration kNamedTuple;
// Memo marker for a tuple subclass whose instances may or may not have `_fields` (an instance
// attribute, a descriptor, a custom __getattribute__): Classify asks the object. Its kind is
// kLeaf, which is what a question about the type alone (ClassifyType) answers.
extern const Registration kTupleSubclass;
// A leaf of a type the installed JAX warns about when it meets one in a flatten (jaxlib 0.10.1+:
// "Python iterable type '...' is treated as a leaf": iterators, generators, dict_values).
// Classify answers it instead of kLeaf for those types; its kind is kLeaf, so every walker
// treats it as a leaf, and the flattening walkers warn first (WarnIterableLeaf).
extern const Registration kIterableLeaf;

// Classify's answer for an object of a kTupleSubclass type: a namedtuple if it has `_fields`
// (getattr can run Python code).
const Registration* ClassifyTupleSubclass(PyObject* obj);

// A small memo in front of the per-type table: sets of two slots, one set per type hash. Trees
// mix few types (arrays under dicts, a handful of module classes over arrays); with a one-entry
// memo, every change of type went to the hash table (a tree of custom nodes over arrays: at
// every node and every leaf after one, 5% of its tree_map). Two slots per set, because where
// two types a tree alternates between share a set, a single slot sends each of them to the
// table in turn: with 16 one-slot sets, two of the 4 types of the benchmark's `custom-nodes`
// tree share one in a third of processes (addresses differ from run to run; 2 of 8 in a trial),
// and tree_leaves on it then read up to 20% slower than in a process where they did not.
//
// On free-threaded builds the slots are per thread (util/thread_state.h): a slot is three words,
// and a reader sharing it with a writer could match `type` and take another entry's `reg`. A
// thread cannot empty other threads' slots, so there each slot also carries the generation it
// was written in, and emptying them all is moving g_memo_generation on (a registration, JAX's
// registry growing, a memoised type's death: its address may be reused by a new type). The
// generation is read before the answer is looked up, so a slot written from an answer that a
// drop in between made stale is stale from the start.
struct Memo {
    PyTypeObject* type = nullptr;
    const Registration* reg = nullptr;
    Py_ssize_t jax_size = -1;  // size of JAX's registry when memoised
#ifdef Py_GIL_DISABLED
    uint64_t generation = 0;  // g_memo_generation before the answer was looked up
#endif
};
inline constexpr size_t kMemoWays = 2;
inline constexpr size_t kMemoSets = 32;
inline constexpr size_t kMemoSlots = kMemoSets * kMemoWays;
// binding/module_state.cpp; owns nothing; the calling thread's on free-threaded builds. Set i
// is slots 2i and 2i + 1; the first holds the type memoised last.
extern FASTREE_PER_THREAD Memo g_memo[kMemoSlots];
#ifdef Py_GIL_DISABLED
extern std::atomic<uint64_t> g_memo_generation;  // binding/module_state.cpp; starts at 1
#endif
// The generation a slot written now would carry (free-threaded builds; 0 under the GIL, where
// emptying the slots empties them).
inline uint64_t MemoGeneration() {
#ifdef Py_GIL_DISABLED
    return g_memo_generation.load(std::memory_order_relaxed);
#else
    return 0;
#endif
}
// Whether a slot whose `type` matches still holds a current answer (JAX's registry aside).
[[gnu::always_inline]] inline bool MemoCurrent([[maybe_unused]] const Memo& memo) {
#ifdef Py_GIL_DISABLED
    return memo.generation == g_memo_generation.load(std::memory_order_relaxed);
#else
    return true;
#endif
}
// A slot's contents: `reg` for `type`, looked up in `generation` (MemoGeneration()).
inline Memo NewMemo(PyTypeObject* type, const Registration* reg, Py_ssize_t jax_size,
                    [[maybe_unused]] uint64_t generation) {
    Memo memo{type, reg, jax_size};
#ifdef Py_GIL_DISABLED
    memo.generation = generation;
#endif
    return memo;
}
// The set where `t`'s answer may be: its two slots.
inline Memo* MemoSet(PyTypeObject* t) {
    // Fibonacci hashing: type objects are allocated with a common stride, so their low address
    // bits alone would crowd a few sets.
    return &g_memo[((reinterpret_cast<uintptr_t>(t) * 0x9E3779B97F4A7C15u) >> 59) * kMemoWays];
}
static_assert(kMemoSets == 32, "MemoSet keeps the top 5 bits of the hash");
static_assert(kMemoWays == 2, "FindMemo and StoreMemo are written for two slots a set");
// The slot that holds an answer for `t` (current or not), or null. The first slot is tried
// alone first: picking the way without a branch made every hit two dependent loads, and
// all_leaves on 100,000 floats read 12% slower.
[[gnu::always_inline]] inline const Memo* FindMemo(PyTypeObject* t) {
    const Memo* set = MemoSet(t);
    if (set[0].type == t) return &set[0];
    if (set[1].type == t) return &set[1];
    return nullptr;
}
// Writes `memo` into its type's set, in the first slot; the type that was there moves to the
// second, whose own is dropped (unless the first already held this type). The set never holds
// one type twice.
inline void StoreMemo(const Memo& memo) {
    Memo* set = MemoSet(memo.type);
    if (set[0].type != memo.type) set[1] = set[0];
    set[0] = memo;
}
// Empties the slot that holds `t`, if any (its answer can no longer be trusted, or a new type
// now has its address).
inline void ForgetMemo(PyTypeObject* t) {
    Memo* set = MemoSet(t);
    for (size_t way = 0; way < kMemoWays; ++way) {
        if (set[way].type == t) set[way] = Memo{};
    }
}
// Empties every slot (whenever the per-type table is dropped): every thread's, on free-threaded
// builds, by moving the generation on.
inline void ClearMemoSlots() {
#ifdef Py_GIL_DISABLED
    g_memo_generation.fetch_add(1, std::memory_order_relaxed);
#else
    for (Memo& slot : g_memo) slot = Memo{};
#endif
}
// Empties the slot holding `dead`, a memoised type being freed (a new type may take its address):
// on free-threaded builds any thread's slot may hold it, so every slot.
inline void ForgetMemoSlot([[maybe_unused]] PyTypeObject* dead) {
#ifdef Py_GIL_DISABLED
    ClearMemoSlots();
#else
    ForgetMemo(dead);
#endif
}
// Borrowed from the bridge's owned copy: JAX's `_registry` dict, read per leaf without a lock.
// An atomic (a relaxed load is a plain one) because a re-install writes it while walks read it;
// what it pointed at is then kept alive (registry_state.h, RegistryState::retired). The dict was
// made and published by JAX's import long before it is installed here, so relaxed is enough.
extern std::atomic<PyObject*> g_jax_registry;  // binding/module_state.cpp

// JAX only adds to its registry: a size read is the "may a type have become a node" check.
// PyDict_GET_SIZE is an atomic load of the size on free-threaded builds.
inline Py_ssize_t JaxRegistrySize() {
    PyObject* dict = g_jax_registry.load(std::memory_order_relaxed);
    return dict ? PyDict_GET_SIZE(dict) : 0;
}

const Registration* ClassifySlow(PyTypeObject* type);

// Classify's answer where it needs neither the slow lookup nor a look at the object (both of
// which can run Python code): the builtin containers and a memo hit. Else null.
[[gnu::always_inline]] inline const Registration* ClassifyCached(PyObject* obj) {
    PyTypeObject* t = Py_TYPE(obj);
    if (t == &PyTuple_Type) return &kTuple;
    if (t == &PyList_Type) return &kList;
    if (t == &PyDict_Type) return &kDict;
    if (obj == Py_None) return &kNone;
    const Memo* memo = FindMemo(t);
    if (memo == nullptr || memo->jax_size != JaxRegistrySize() || !MemoCurrent(*memo)) {
        return nullptr;
    }
    return memo->reg == &kTupleSubclass ? nullptr : memo->reg;
}

// ClassifyCached's "a plain leaf" asked of a run of objects (a sequence's items, a dict's values)
// that are often of one type (a tuple of arrays): an object of the type that has just answered
// yes is not looked up again. A memo answer depends on the type alone, and the caller runs no
// Python code between two questions, so it cannot have changed. On a tuple of three arrays'
// tree_map, the two lookups saved were about 55 of fastree's own 450 instructions (callgrind).
class PlainLeafRun {
 public:
    [[gnu::always_inline]] bool operator()(PyObject* obj) {
        return InRun(obj) || Cached(obj) == &kLeaf;
    }
    // Whether `obj` is of the type that has just answered "a plain leaf".
    [[gnu::always_inline]] bool InRun(PyObject* obj) const { return Py_TYPE(obj) == last_; }
    // ClassifyCached's answer for `obj`, or null; a plain leaf's type starts a run. For callers
    // that also want a cached "not a plain leaf" (all_leaves stops at the first node without
    // looking it up twice): they ask InRun first, which keeps a run's loop to one comparison.
    [[gnu::always_inline]] const Registration* Cached(PyObject* obj) {
        const Registration* reg = ClassifyCached(obj);
        if (reg == &kLeaf) last_ = Py_TYPE(obj);
        return reg;
    }

 private:
    PyTypeObject* last_ = nullptr;  // the last type found a plain leaf
};

// Classify's answer where ClassifyCached had none: the per-type table, and a tuple subclass's
// look at the object. Can run Python code (a metaclass's __hash__ or __eq__).
inline const Registration* ClassifyUncached(PyObject* obj) {
    const Registration* reg = ClassifySlow(Py_TYPE(obj));
    return reg == &kTupleSubclass ? ClassifyTupleSubclass(obj) : reg;
}

// The registration that applies to `obj`. Never fails, never returns null. Forced inline: it
// runs once per leaf, and as a call it was a fifth of flattening a list of floats.
[[gnu::always_inline]] inline const Registration* Classify(PyObject* obj) {
    if (const Registration* reg = ClassifyCached(obj)) return reg;
    return ClassifyUncached(obj);
}

inline const Registration* ClassifyType(PyTypeObject* t) {
    if (t == &PyTuple_Type) return &kTuple;
    if (t == &PyList_Type) return &kList;
    if (t == &PyDict_Type) return &kDict;
    if (t == Py_TYPE(Py_None)) return &kNone;
    return ClassifySlow(t);
}

// Registration entry points (called from the Python layer after JAX accepted the same
// registration, so duplicate errors come from JAX with JAX's text). Return false with a
// Python error set on failure.
bool RegisterCustom(PyObject* type, PyObject* flatten, PyObject* unflatten,
                    PyObject* flatten_with_keys, bool preserve_identity);
bool RegisterDataclass(PyObject* type, PyObject* data_fields, PyObject* meta_fields,
                       bool preserve_identity);
bool RegisterAttribute(PyObject* node, bool preserve_identity);
// An attribute node that now delegates to its library's functions: if it is its class's
// registration here, the class becomes a kCustom node with those functions (treedefs made
// before keep the old record). False with an error set.
bool DelegateAttribute(PyObject* node);

// Installs JAX's registry dict and its registry's flatten_one_level(_with_keys): the latter gives
// key paths of JAX-only types, both answer flatten_one_level on them. The module state keeps the
// owned references.
bool InstallJax(PyObject* jax_registry_dict, PyObject* jax_flatten_one_level,
                PyObject* jax_flatten_one_level_with_keys);
// Installs the Python layer's adopter for types registered only in jaxlib's C++ registry:
// adopter(type) -> (flatten, unflatten) or None. Asked once per type (memoised).
void InstallJaxlibAdopter(PyObject* adopter);
// Installs the library integrations' adopter for types found in JAX's Python-side registry:
// adopter(type, flatten, unflatten) -> True once it registered an attribute node for the type,
// else False. Asked once per type (memoised); null or None uninstalls it.
void InstallLibraryAdopter(PyObject* adopter);

// Installs the leaf types JAX warns about (a tuple of types; None: JAX does not warn) and
// warn(leaf), which issues JAX's DeprecationWarning. False with an error set if `types` is not
// a tuple of types.
bool InstallIterableLeafWarning(PyObject* types, PyObject* warn);

// Issues the installed JAX's warning for a kIterableLeaf leaf met by a flatten. False with the
// error set when the warning is an error (warnings filters) or warn() fails.
bool WarnIterableLeaf(PyObject* leaf);

// A flatten's check on a leaf it met (after is_leaf, if any, said no): true to go on.
[[gnu::always_inline]] inline bool CheckLeaf(const Registration* reg, PyObject* leaf) {
    return reg != &kIterableLeaf || WarnIterableLeaf(leaf);
}
// Borrowed; may be null. Valid while the module lives: a re-install keeps the replaced one alive
// on free-threaded builds (RegistryState::retired); under the GIL the caller holds it across any
// Python code it runs, as before.
PyObject* JaxFlattenWithKeys();
PyObject* JaxFlattenOneLevel();

// Module init, before any walk: makes what is set once and read without a lock (the weakref
// callback of the per-type memo, docs/threads.md R7). False with an error set.
bool Init();

// Keeps `old`, an object an install just replaced, alive for the process on free-threaded
// builds, where a walk on another thread may still be reading it through a borrowed pointer (the
// bridge's hooks, binding/module.cpp). Under the GIL it is released here, as before: no walk
// holds a borrowed pointer across another thread's install there.
void KeepForProcess(Ref old);

}  // namespace registry
}  // namespace fastree
