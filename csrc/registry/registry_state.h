// The registry layer's parts of the module state (binding/module_state.h says what the state is,
// who owns what, and how the GC sees it): the registrations, the per-type memo and JAX's registry
// (RegistryState, registry.cpp); JAX's key classes, jaxlib's key makers and the cached key
// entries (KeysState, keys.cpp); the entries kept past the caches during key-path walks
// (KeysWalkState, keys.cpp); and the user-code epoch (key_sort.h and the walkers). The last two
// belong to the walks running: per thread on free-threaded builds (util/thread_state.h).
//
// Declared here, by the layer that owns them, so that the registry and everything above it read
// their part with no include of binding/; the storage, the one traversal and the one clear are
// binding/module_state.cpp's. Each part has static storage: state::Registry() is a constant
// address, and `state::Keys().dict.cache` one load, as the globals the state replaced were.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "registry/registry.h"
#include "util/never_destroyed.h"
#include "util/pyutils.h"
#include "util/thread_state.h"

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
    Ref cls;          // the key class
    Ref block;        // null or n -> list of the keys for 0..n-1
    RefVector cache;  // index -> key, or null
};

// One kind of named key (DictKey or GetAttrKey).
struct NamedKeys {
    Ref cls;    // the key class
    Ref maker;  // null or key -> the entry
    Ref block;  // null or [keys of one type] -> [entries], same order
    Ref cache;  // dict: exact str/int -> entry
};

struct KeysState {
    IndexKeys sequence;
    IndexKeys flattened_index;
    NamedKeys dict;
    NamedKeys getattr;
};

// The entries past the caches' sizes, kept only while a key-path walk runs (keys.cpp): what one
// walk made is then reused by the rest of it and by walks nested in it, and released when the
// outermost ends. Per thread on free-threaded builds, so that a walk's end releases only what
// its own thread's walks kept, never an entry another thread's walk is reading. Owned; empty
// whenever no key-path walk of the thread is running.
struct KeysOverflow {
    RefVector sequence;         // index - kIndexCacheSize -> SequenceKey, or null
    RefVector flattened_index;  // index - kIndexCacheSize -> FlattenedIndexKey, or null
    Ref dict;                   // null or a dict: exact str/int -> DictKey entry
    Ref getattr;                // null or a dict: exact str -> GetAttrKey entry
};
struct KeysWalkState {
    KeysOverflow overflow;
    int depth = 0;  // key-path walks in progress (keys::WalkScope)
};

namespace state {
extern NeverDestroyed<RegistryState> g_registry;  // binding/module_state.cpp
extern NeverDestroyed<KeysState> g_keys;          // binding/module_state.cpp
// binding/module_state.cpp; the calling thread's on free-threaded builds
extern FASTREE_PER_THREAD NeverDestroyed<KeysWalkState> g_keys_walk;
inline RegistryState& Registry() { return g_registry.value; }
inline KeysState& Keys() { return g_keys.value; }
inline KeysWalkState& KeysWalk() { return g_keys_walk.value; }

// Bumped before each call into code that JAX's own flatten also runs mid-walk (is_leaf, a
// custom node's flatten, a Python key comparison): a dict's gathered values are read again
// from the dict once it may have changed (read::Values; jaxlib looks each value up when it
// reaches its key). Calls JAX makes only after flattening (tree_map's f) leave it alone.
// Per thread on free-threaded builds: it says whether the calling thread's walk ran such code.
// (A dict another thread changes mid-walk is a matter for the dict's own lock, docs/threads.md.)
extern FASTREE_PER_THREAD uint64_t g_user_code_epoch;  // binding/module_state.cpp; a count
}  // namespace state

// See state::g_user_code_epoch.
inline void NoteUserCode() { ++state::g_user_code_epoch; }
inline uint64_t UserCodeEpoch() { return state::g_user_code_epoch; }

}  // namespace fastree
