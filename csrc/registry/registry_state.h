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

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "registry/registry.h"
#include "util/free_threading.h"
#include "util/never_destroyed.h"
#include "util/pyutils.h"
#include "util/thread_state.h"

namespace fastree {

// The locks of the module state's tables (util/free_threading.h, TableLock: a PyMutex on
// free-threaded builds, nothing under the GIL). Their order, the one place it matters being
// ModuleState::Clear (binding/module_state.cpp), the only code that holds more than one:
//   1. RegistryState::lock   2. KeysState::lock   3. AuxState::lock (diagnostics/aux_state.h)
//   4. TreeDefState::hooks_lock (treedef/treedef_state.h)
// Everything else holds one at a time, runs no Python code while holding it, allocates no Python
// object and releases no reference under it (free_threading.h's rule): a thread holding one
// never waits for another lock, so no order between them and the objects' own critical
// sections arises.

struct RegistryState {
    // Guards every field below but the mirrored ones' readers (g_jax_registry and the two
    // flatten_one_level mirrors, atomics) and `all`'s records once published (immutable).
    // Never held across Resolve's Python calls (JAX's registry lookup, the jaxlib adopter): those
    // run unlocked, and what they found is inserted under it after a re-check.
    TableLock lock;
    // Every Registration ever created, kept for the process (treedef nodes point here). A record
    // enters it whole: every field filled first, then published here and in `registered` in one
    // locked step (a walk on another thread reads a record through `registered` or the memo
    // without the lock).
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
    using MemoTable = std::unordered_map<PyTypeObject*, MemoEntry>;
    MemoTable memo;
    std::unordered_map<PyObject*, PyTypeObject*> memo_by_weakref;  // for the death callback
    // Times the memo was dropped: a classification that ran Python code (Resolve) while a drop
    // happened memoises nothing, its answer may predate the registration that caused the drop.
    uint64_t memo_drops = 0;
    // The weakref callback (a builtin function), made once at module init (registry::Init):
    // read without the lock by every memo miss, never replaced.
    Ref on_type_death;
    Py_ssize_t memo_jax_size = -1;  // size of JAX's registry when the memo was last dropped
    // JAX's `_registry` dict and its registry's flatten_one_level(_with_keys): owners, written
    // under the lock by InstallJax; walks read the mirrors (g_jax_registry, the two below), without
    // the lock and borrowed. So on free-threaded builds a re-install keeps what it replaces alive
    // for the process (`retired`); under the GIL a walk never holds one across another thread's
    // re-install, and the replaced objects are released as before.
    Ref jax_registry;
    Ref jax_flatten_with_keys;
    Ref jax_flatten_one_level;
    std::atomic<PyObject*> jax_flatten_with_keys_now{nullptr};  // mirrors: borrowed
    std::atomic<PyObject*> jax_flatten_one_level_now{nullptr};
    // Read under the lock, with a new reference, and called after unlocking: a replacement
    // releases the old one at once, on every build.
    Ref jaxlib_adopter;  // type -> (flatten, unflatten) | None
    // (type, flatten, unflatten) -> bool, for a type adopted from JAX's Python-side registry:
    // the library integrations register an attribute node for it if one reads it natively, and
    // say True (python/fastree/integrations/__init__.py, _adopt). Read as jaxlib_adopter is.
    Ref library_adopter;
    // The leaf types the installed JAX warns about (jaxlib 0.10.1+: iterators, dict_values, ...):
    // a tuple of types, or null where JAX does not warn; and warn(leaf), which issues the warning.
    // Read as jaxlib_adopter is.
    Ref iterable_leaf_types;
    Ref iterable_leaf_warn;
    // What re-installs replaced while walks may read it borrowed, kept for the process (free-
    // threaded builds only; registry::KeepForProcess): JAX's registry and flatten functions (the
    // bridge's two treedef hooks are read under a lock instead: treedef/treedef_state.h).
    // Owned; visited.
    RefVector retired;

    // Installs `dict` (JAX's registry, or null) with its mirror, and hands back the previous
    // one for the caller to release once every other field is in place (and the lock released):
    // releasing it runs finalizers (its entries'), which may flatten and so read g_jax_registry.
    // Under the lock, or with the world to itself (Clear).
    [[nodiscard]] Ref SetJaxRegistry(Ref dict) {
        Ref old = std::move(jax_registry);
        jax_registry = std::move(dict);
        registry::g_jax_registry.store(jax_registry.get(), std::memory_order_relaxed);
        return old;
    }
};

// SequenceKey/FlattenedIndexKey entries cached by index (keys.cpp): below this index, for the
// process; past it, per walk (KeysOverflow).
inline constexpr Py_ssize_t kIndexCacheSize = Py_ssize_t{1} << 17;

// One kind of index key's cache: a fixed array, never resized, so a reader's slot is never moved
// or freed under it (a growable vector was: docs/threads.md, R12). A slot is null or owns one
// entry; it is filled once, by compare-exchange (keys.cpp, StoreIndexKeys), and read with an
// acquire load and an INCREF, without a lock. Made zeroed by calloc (an untouched page costs no
// memory), released by IndexCache::Release.
struct IndexCache {
    // One past the highest slot ever filled (raised after the slots it covers are): the GC's
    // traversal and the release visit [0, end) only, not 2**17 slots per collection.
    std::atomic<Py_ssize_t> end;
    std::atomic<PyObject*> slots[kIndexCacheSize];

    static IndexCache* New();                // null on failure (no error set)
    static void Release(IndexCache* cache);  // releases every entry, then the array
};

// One kind of index key (SequenceKey or FlattenedIndexKey): its class, block maker and cache.
struct IndexKeys {
    Ref cls;    // the key class (under KeysState::lock; attr/attr_mapping.cpp reads it too)
    Ref block;  // null or n -> list of the keys for 0..n-1 (under KeysState::lock)
    // Owned; made by keys::Install with the class it caches entries of, replaced only by a
    // re-install (the old one kept for the process on free-threaded builds:
    // KeysState::retired_caches).
    std::atomic<IndexCache*> cache{nullptr};
};

// One kind of named key (DictKey or GetAttrKey).
struct NamedKeys {
    Ref cls;    // the key class (under KeysState::lock)
    Ref maker;  // null or key -> the entry (under KeysState::lock)
    Ref block;  // null or [keys of one type] -> [entries], same order (under KeysState::lock)
    // Owned: a dict, exact str/int -> entry, made by keys::Install; read and filled without the
    // table lock, through the dict's own (DictGetItemRef, DictSetDefaultRef: an entry, once in,
    // is never replaced, so no reader's reference is freed). Replaced only by a re-install, as
    // IndexKeys::cache is (KeysState::retired).
    std::atomic<PyObject*> cache{nullptr};
};

struct KeysState {
    // Guards the classes and makers (read under it with a new reference, swapped under it) and
    // the retired lists; the caches are atomics (above). Second in the lock order (above).
    TableLock lock;
    IndexKeys sequence;
    IndexKeys flattened_index;
    NamedKeys dict;
    NamedKeys getattr;
    // Free-threaded builds: what a re-install of the key classes replaced (classes, named caches;
    // index caches), kept for the process: a walk on another thread may be reading it borrowed.
    // Under the GIL a re-install releases them. Owned; visited.
    RefVector retired;
    std::vector<IndexCache*> retired_caches;
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

namespace registry {

// A plain leaf type remembered for a whole walk, where PlainLeafRun's answer cannot be kept:
// between two questions the walk may run Python code. Code that JAX runs only after flattening
// (tree_map's f: nothing it registers changes how JAX reads the rest of that tree) is not asked
// about. Two things can still change the answer for the same type pointer, and both are checked
// on each question:
//  - code that JAX also runs mid-flatten (a custom node's flatten function, is_leaf, a Python
//    key sort) can register the type: an answer from another UserCodeEpoch is not used;
//  - the type can die and a new type be made at its address: its version tag must be the one
//    it had (CPython hands out each tag once; PyType_Modified zeroes it, and a type without one
//    is not remembered).
// tree_map: on transformer48 the memo lookups it saves were 25 instructions a leaf, about 2% of
// the call; tree_leaves and tree_flatten: one lookup per dict of leaves (callgrind, 3.13).
class KnownPlainLeafType {
 public:
    // The epoch is read last: on free-threaded builds it is a thread-local, which code in a
    // shared object reads through a __tls_get_addr call; an object of another type (every node
    // tree_map visits) is answered without it.
    [[gnu::always_inline]] bool Holds(PyObject* obj) const {
        PyTypeObject* t = Py_TYPE(obj);
        return t == type_ && VersionTag(t) == tag_ && UserCodeEpoch() == epoch_;
    }
    // `reg`: what Classify answered for `obj`; `epoch`: the UserCodeEpoch read before it asked
    // (a lookup that ran Python code must not leave its answer remembered as current).
    [[gnu::always_inline]] void Remember(PyObject* obj, const Registration* reg, uint64_t epoch) {
        if (reg != &kLeaf) return;  // a node, or a leaf JAX warns about (kIterableLeaf) each time
        PyTypeObject* t = Py_TYPE(obj);
        const unsigned int tag = VersionTag(t);
        if (tag == 0) return;
        type_ = t;
        tag_ = tag;
        epoch_ = epoch;
    }

 private:
    // Relaxed: on free-threaded builds another thread may assign or clear the tag meanwhile.
    static unsigned int VersionTag(PyTypeObject* t) {
        return __atomic_load_n(&t->tp_version_tag, __ATOMIC_RELAXED);
    }
    PyTypeObject* type_ = nullptr;  // borrowed: its tag, not a reference, tells if it is the same
    unsigned int tag_ = 0;
    uint64_t epoch_ = 0;
};

}  // namespace registry

}  // namespace fastree
