// The core's module-level state: every Python reference and setting fastree._core keeps between
// calls, in one struct, with one owner, one GC traversal and one clear.
//
// What lives here, one sub-struct per concern (the file that uses it in brackets):
//   registry  registrations, the per-type memo, JAX's registry and callbacks   (registry.cpp)
//   keys      JAX's key classes, jaxlib's key makers, the cached key entries   (keys.cpp)
//   aux       the aux_data hooks, strict mode, the classifier's verdicts       (aux_check.cpp)
//   treedef   the PyTreeDef type, the bridge's to_jax and tree_map error hooks
//                                                       (treedef/type.cpp, treedef/map.cpp)
//   texts     the installed JAX's error-text variants                          (jax_texts.h)
//
// Who owns what: ModuleState owns every reference below (the Ref and RefVector members,
// MemoEntry::weakref, Verdict::type). Two parts are permanent, as in JAX: the Registration
// records, which own their fields as raw pointers (registry.h) and are never freed because
// treedef nodes point at them for the life of the process; and the PyTreeDef type, which a
// treedef made by a late finalizer still needs. Traverse() reports every reference, permanent
// ones included; Clear() drops all the others.
//
// How the GC sees it: through one object in the module, fastree._core._module_state, whose
// tp_traverse and tp_clear are Traverse and Clear (module_state.cpp). The module's own
// m_traverse/m_clear are out of reach: pybind11's PYBIND11_MODULE makes a PyModuleDef with
// m_size 0 and no m_traverse/m_clear, and its Py_mod_create slot returns a plain module.
//
// Why reads are direct: the state has static storage, so ModState() is a constant address and
// `ModState().keys.dict.cache` is one load, as the globals it replaced were (a PyModule_GetState
// call per leaf or per key would be measurable). The per-leaf checks in headers owned by the
// walkers read three mirrors that are plain globals, defined with the state in
// module_state.cpp and owning nothing: registry::g_memo (Classify's direct-mapped cache),
// registry::g_jax_registry (a borrowed copy of registry.jax_registry, written only by
// RegistryState::SetJaxRegistry) and g_PyTreeDef_Type (IsTreeDef; a borrowed copy of the
// permanent treedef.type).
//
// The state is per process: fastree._core runs in the main interpreter only, and is initialised
// once (NewModuleStateObject). Everything here is touched only with the GIL held.
#pragma once

#include <Python.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "registry/jax_texts.h"
#include "util/pyutils.h"
#include "registry/registry.h"

namespace fastree {

struct RegistryState {
    // Every Registration ever created, kept for the process (treedef nodes point here).
    std::vector<std::unique_ptr<Registration>> all;
    // Types registered through fastree (plus collections.OrderedDict / defaultdict) or adopted
    // from JAX. Permanent, like the records it points at; holds no references of its own.
    std::unordered_map<PyTypeObject*, const Registration*> registered;
    // Memo of ClassifySlow's answers. Each entry holds a weak reference to its type whose
    // callback (on_type_death) erases the entry when the type dies: the memo never keeps a class
    // alive, and a new class allocated at a dead one's address never inherits its answer.
    struct MemoEntry {
        const Registration* reg;
        Ref weakref;  // null for types that cannot be weakly referenced
    };
    std::unordered_map<PyTypeObject*, MemoEntry> memo;
    std::unordered_map<PyObject*, PyTypeObject*> memo_by_weakref;  // for the death callback
    Ref on_type_death;             // the weakref callback (a builtin function)
    Py_ssize_t memo_jax_size = -1;  // size of JAX's registry when the memo was last dropped
    Ref jax_registry;               // JAX's `_registry` dict; mirrored by g_jax_registry
    Ref jax_flatten_with_keys;      // JAX registry's flatten_one_level_with_keys
    Ref jax_flatten_one_level;      // JAX registry's flatten_one_level
    Ref jaxlib_adopter;             // type -> (flatten, unflatten) | None
    // The leaf types the installed JAX warns about (jaxlib 0.10.1+: iterators, dict_values, ...):
    // a tuple of types, or null where JAX does not warn; and warn(leaf), which issues the warning.
    Ref iterable_leaf_types;
    Ref iterable_leaf_warn;

    // Installs `dict` (JAX's registry, or null) with its mirror, and hands back the previous
    // one for the caller to release once every other field is in place: releasing it runs
    // finalizers (its entries'), which may flatten and so read g_jax_registry.
    [[nodiscard]] Ref SetJaxRegistry(Ref dict) {
        Ref old = std::move(jax_registry);
        jax_registry = std::move(dict);
        registry::g_jax_registry = jax_registry.get();
        return old;
    }
};

// One kind of index key (SequenceKey or FlattenedIndexKey): its class, block maker and cache.
struct IndexKeys {
    Ref cls;             // the key class
    Ref block;           // null or n -> list of the keys for 0..n-1
    RefVector cache;     // index -> key, or null
    RefVector overflow;  // index - kIndexCacheSize -> key, kept only during walks (keys.cpp)
};

// One kind of named key (DictKey or GetAttrKey).
struct NamedKeys {
    Ref cls;       // the key class
    Ref maker;     // null or key -> the entry
    Ref block;     // null or [keys of one type] -> [entries], same order
    Ref cache;     // dict: exact str/int -> entry
    Ref overflow;  // dict: entries past the cache's size, kept only during walks
};

struct KeysState {
    IndexKeys sequence;
    IndexKeys flattened_index;
    NamedKeys dict;
    NamedKeys getattr;
    int walk_depth = 0;  // key-path walks in progress (keys::WalkScope)
};

struct AuxState {
    Ref classify;  // (type, example) -> bool, "instances are plain data"
    Ref reporter;  // (node_type, aux, root, ...) -> warns or raises; null: no checks
    bool strict = false;
    // The classifier's verdict per value type, bounded in size. Holds each type (types seen in
    // aux data are long-lived: enums, classes).
    struct Verdict {
        Ref type;
        bool plain;
    };
    std::unordered_map<PyTypeObject*, Verdict> verdicts;
    // Bumped whenever a verdict could change (hooks, strict mode, verdicts dropped): a stamp
    // taken at an earlier epoch no longer vouches for anything (see aux::CheckStamped).
    uint64_t epoch = 1;
    // Reports found during an entry point's walk, made after it (aux::ReportScope): the
    // reporter runs Python code (it locates the node by walking the tree again, with the tree's
    // own flatten functions and is_leaf) that must not run inside the walk. Owned; visited.
    struct PendingReport {
        Ref node_type, aux, root, is_leaf, key_path;  // is_leaf, key_path: null when absent
    };
    std::vector<PendingReport> pending;
    int report_depth = 0;  // entry points in progress (nested: a callback calling fastree)
};

struct TreeDefState {
    Ref type;            // the PyTreeDef type (permanent); mirrored by g_PyTreeDef_Type
    Ref to_jax_hook;     // treedef -> the equal JAX treedef (the JAX bridge)
    Ref map_error_hook;  // explains tree_map's structure mismatches (fastree/_map_errors.py)
};

struct ModuleState {
    RegistryState registry;
    KeysState keys;
    AuxState aux;
    TreeDefState treedef;
    JaxTexts texts;
    // Bumped before each call into code that JAX's own flatten also runs mid-walk (is_leaf, a
    // custom node's flatten, a Python key comparison): a dict's gathered values are read again
    // from the dict once it may have changed (read::Values; jaxlib looks each value up when it
    // reaches its key). Calls JAX makes only after flattening (tree_map's f) leave it alone.
    uint64_t user_code_epoch = 0;

    // Visits every reference the state owns, permanent ones included. Runs no Python code.
    int Traverse(visitproc visit, void* arg) const;
    // Drops every reference that is not permanent. Everything is moved out of the state (and
    // the mirrors reset) before anything is released, so finalizers that re-enter the core find
    // a consistent, empty state.
    void Clear();
};

// Static storage that is never destroyed: C++ static destructors run after the interpreter has
// finalised, when releasing a reference would touch freed memory.
union ModuleStateStorage {
    ModuleStateStorage() : state() {}
    ~ModuleStateStorage() {}
    ModuleState state;
};
extern ModuleStateStorage g_module_state_storage;

inline ModuleState& ModState() { return g_module_state_storage.state; }

// See ModuleState::user_code_epoch.
inline void NoteUserCode() { ++ModState().user_code_epoch; }
inline uint64_t UserCodeEpoch() { return ModState().user_code_epoch; }

// The GC-tracked object through which the collector sees the state (fastree._core._module_state).
// ImportError outside the main interpreter, or when the module is initialised a second time.
PyObject* NewModuleStateObject();

}  // namespace fastree
