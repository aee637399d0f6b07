// Key-path entries: JAX's own key classes, made by the Python layer's makers and cached.
//
// Why makers: jaxlib's key classes are nanobind types, and making an instance when memory runs
// out ends the process (nanobind lets std::bad_alloc escape a noexcept frame while it grows its
// table of live instances; jaxlib's own flatten_one_level_with_keys crashes the same way). The
// makers the Python layer installs (python/fastree/jax_interop/key_makers.py) first make sure the
// address space needed is there, raising MemoryError when it is not, and only then call the
// classes. The classes themselves are called here only if no maker is installed.
//
// Why cached: JAX's key entries are immutable (read-only properties), so equal entries can be
// shared, and making one costs far more than reusing it. Cached for the process:
// SequenceKey/FlattenedIndexKey by index below 2**17 (~40 bytes each, ~5 MB at most), made in
// blocks; DictKey/GetAttrKey for exact str and int keys, up to 65536 each (a parameter tree
// repeats 'kernel', 'bias', ... in every layer), a dict's unknown keys made in one block. Indices past 2**17 (very wide lists) come from
// one block per walk, and names past the cache's size are kept the same way: held only while
// some key-path walk is running (see WalkScope; of the calling thread, on free-threaded builds:
// KeysWalkState in registry_state.h).
#include "registry/keys.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "registry/registry_state.h"
#include "util/free_threading.h"
#include "util/pyutils.h"

namespace fastree {

IndexCache* IndexCache::New() {
    // Zeroed pages: a null slot is all-zero bits (std::atomic<PyObject*> is lock-free and has
    // the pointer's layout), and calloc's untouched pages cost nothing until used.
    static_assert(sizeof(std::atomic<PyObject*>) == sizeof(PyObject*), "");
    static_assert(sizeof(std::atomic<Py_ssize_t>) == sizeof(Py_ssize_t), "");
    return static_cast<IndexCache*>(std::calloc(1, sizeof(IndexCache)));
}

void IndexCache::Release(IndexCache* cache) {
    if (cache == nullptr) return;
    const Py_ssize_t end = cache->end.load(std::memory_order_relaxed);
    for (Py_ssize_t i = 0; i < end; ++i) {
        Py_XDECREF(cache->slots[i].exchange(nullptr, std::memory_order_relaxed));
    }
    std::free(cache);
}

namespace keys {
namespace {

constexpr Py_ssize_t kMinBlock = 256;
constexpr Py_ssize_t kStrCacheSize = 65536;  // ~100 bytes an entry: ~6.5 MB at most

// The key kinds and their caches live in the module state (registry_state.h), the entries past
// the caches in the walk state (the calling thread's on free-threaded builds). The state's lock
// guards the classes and makers: each is read under it with a new reference (Held) and called
// after; the caches are read without it (atomics, and the dicts' own locks).
KeysState& S() { return state::Keys(); }
KeysWalkState& W() { return state::KeysWalk(); }

Ref Held(const Ref& field) {
    TableLock::Hold hold(S().lock);
    return Ref::FromBorrowed(field.get());
}

PyObject* NotInstalled() {
    PyErr_SetString(PyExc_RuntimeError, "fastree: JAX key classes are not installed.");
    return nullptr;
}

// The class `kind` makes entries of, held across a maker call: should the key classes be
// re-installed while the maker runs (Python code, or another thread), what it made is of the
// replaced class and must not enter the new class's caches. Held, so the comparison cannot be
// fooled by a new class at the old one's address.
class MadeFor {
 public:
    explicit MadeFor(const Ref& cls) : cls_(Held(cls)) {}
    bool Current(const Ref& cls) const {
        TableLock::Hold hold(S().lock);
        return cls.get() == cls_.get();
    }
    const Ref& cls() const { return cls_; }

 private:
    Ref cls_;
};

// A list of the keys for indices 0..n-1, made by the block maker (or, without one, the class).
PyObject* MakeBlock(const IndexKeys& kind, const MadeFor& made_for, Py_ssize_t n) {
    // The installed objects may be replaced while Python runs: held for the calls.
    const Ref& cls = made_for.cls();
    if (!cls) return NotInstalled();
    Ref count(PyLong_FromSsize_t(n));
    if (!count) return nullptr;
    if (Ref block = Held(kind.block)) {
        Ref keys(PyObject_CallOneArg(block.get(), count.get()));
        if (!keys) return nullptr;
        if (!PyList_CheckExact(keys.get()) || PyList_GET_SIZE(keys.get()) != n) {
            PyErr_SetString(PyExc_SystemError, "fastree: a key maker returned a malformed block");
            return nullptr;
        }
        return keys.release();
    }
    // Each key is made before the list: making one runs the key class's code.
    return NewSequenceOf<false>(n, [&](Py_ssize_t i) -> PyObject* {
        Ref index(PyLong_FromSsize_t(i));
        return index ? PyObject_CallOneArg(cls.get(), index.get()) : nullptr;
    });
}

// Stores block[begin, end) into the cache's empty slots. No lock: each slot is filled once, by
// compare-exchange; a thread that loses a slot to another's entry (equal: the same class, the
// same index) releases its reference, which never frees the entry (the block still holds it).
// `block` is the caller's own list, made by the maker and checked: nothing here runs Python.
void StoreIndexKeys(IndexCache* cache, PyObject* block, Py_ssize_t begin, Py_ssize_t end) {
    for (Py_ssize_t i = begin; i < end; ++i) {
        std::atomic<PyObject*>& slot = cache->slots[i];
        if (slot.load(std::memory_order_relaxed) != nullptr) continue;
        PyObject* key = Py_NewRef(PyList_GET_ITEM(block, i));
        PyObject* expected = nullptr;
        // Release: a reader that loads the pointer (acquire) sees the entry's contents.
        if (!slot.compare_exchange_strong(expected, key, std::memory_order_release,
                                          std::memory_order_relaxed)) {
            Py_DECREF(key);  // the loser's: never the last reference
        }
    }
    Py_ssize_t seen = cache->end.load(std::memory_order_relaxed);
    while (seen < end &&
           !cache->end.compare_exchange_weak(seen, end, std::memory_order_relaxed)) {
    }
}

// Stores block[begin, end) into the walk's `overflow` (the calling thread's: no other thread
// reads it) at positions begin - kIndexCacheSize ..., where still empty.
void StoreOverflow(RefVector& overflow, PyObject* block, Py_ssize_t begin, Py_ssize_t end) {
    if (static_cast<Py_ssize_t>(overflow.size()) < end - kIndexCacheSize) {
        overflow.resize(static_cast<size_t>(end - kIndexCacheSize), nullptr);
    }
    for (Py_ssize_t i = begin; i < end; ++i) {
        PyObject*& slot = overflow[static_cast<size_t>(i - kIndexCacheSize)];  // owned
        if (slot == nullptr) slot = Py_NewRef(PyList_GET_ITEM(block, i));
    }
}

// How far the cache is filled from 0, as a hint for the size of the next block (doubling): the
// first empty slot at a power of two. Approximate on purpose (another thread may fill one
// meanwhile): it only sizes a block.
Py_ssize_t CachedPrefix(const IndexCache* cache) {
    Py_ssize_t n = 0;
    for (Py_ssize_t probe = kMinBlock; probe <= kIndexCacheSize; probe *= 2) {
        if (cache->slots[probe - 1].load(std::memory_order_relaxed) == nullptr) break;
        n = probe;
    }
    return n;
}

// The lookups below take new references straight from the caches' raw pointers: they run once
// per key of every key-path walk, and hand their reference on (no release to pair with).
// `overflow` is kind's entries past the cache, in the walk state.
PyObject* ByIndex(IndexKeys& kind, RefVector& overflow, Py_ssize_t index) {
    // Null only before the bridge's install. A re-install replaces it, keeping the old one
    // alive on free-threaded builds (Install): the slot read here is never freed under us.
    IndexCache* cache = kind.cache.load(std::memory_order_acquire);
    if (cache == nullptr) return NotInstalled();
    const bool cached = index < kIndexCacheSize;
    if (cached) {
        if (PyObject* key = cache->slots[index].load(std::memory_order_acquire)) {
            return Py_NewRef(key);
        }
    } else {
        const size_t at = static_cast<size_t>(index - kIndexCacheSize);
        if (at < overflow.size() && overflow[at] != nullptr) return Py_NewRef(overflow[at]);
    }
    // A miss: make a block reaching past `index` (doubling what is there), so a wide container
    // costs a few maker calls, not one per child.
    const Py_ssize_t have =
        cached ? CachedPrefix(cache) : kIndexCacheSize + static_cast<Py_ssize_t>(overflow.size());
    Py_ssize_t end = std::max({index + 1, 2 * have, kMinBlock});
    const Py_ssize_t begin = cached ? 0 : kIndexCacheSize;
    if (cached) end = std::min(end, kIndexCacheSize);
    const MadeFor made_for(kind.cls);
    Ref block(MakeBlock(kind, made_for, end));
    if (!block) return nullptr;
    PyObject* key = PyList_GET_ITEM(block.get(), index);
    // Of a replaced class (a re-install while the maker ran): not kept. The cache read above is
    // then not the current one either; it is stored into only while it is.
    if (!made_for.Current(kind.cls)) return Py_NewRef(key);
    if (cached) {
        if (kind.cache.load(std::memory_order_acquire) == cache) {
            StoreIndexKeys(cache, block.get(), begin, end);
        }
    } else if (W().depth > 0) {  // else nothing holds it
        StoreOverflow(overflow, block.get(), begin, end);
    }
    return Py_NewRef(key);
}

// Entries for indices up to `n` - 1 made in one block, when a walk is about to visit a container
// of `n` children reaching past the cache (one maker call instead of a doubling series).
bool Reserve(IndexKeys& kind, RefVector& overflow, Py_ssize_t n) {
    if (n <= kIndexCacheSize || W().depth == 0) return true;
    const size_t have = overflow.size();
    if (static_cast<Py_ssize_t>(have) >= n - kIndexCacheSize && have > 0 &&
        overflow.back() != nullptr) {
        return true;
    }
    const MadeFor made_for(kind.cls);
    Ref block(MakeBlock(kind, made_for, n));
    if (!block) return false;
    if (made_for.Current(kind.cls)) StoreOverflow(overflow, block.get(), kIndexCacheSize, n);
    return true;
}

bool Remember(NamedKeys& kind, PyObject* cache, Ref& overflow, PyObject* name, PyObject* entry);

PyObject* ByName(NamedKeys& kind, Ref& overflow, PyObject* name) {
    // Null only before the bridge's install; replaced only by a re-install, which keeps the old
    // dict alive on free-threaded builds (Install).
    PyObject* cache = kind.cache.load(std::memory_order_acquire);
    if (cache == nullptr) return NotInstalled();
    // Exact str and int keys hash and compare without running Python code: cacheable.
    const bool cacheable = PyUnicode_CheckExact(name) || PyLong_CheckExact(name);
    if (cacheable) {
        // The cache first, on its own: nearly every lookup of a walk ends there. The entry is
        // taken inside the dict's own lock (another thread may be inserting); no Python code
        // runs (exact str and int keys).
        PyObject* hit = nullptr;
        const int found = DictGetItemRef(cache, name, &hit);
        if (found != 0) return hit;  // a new reference, or null with the error set
        if (PyObject* past = overflow.get()) {  // the calling thread's
            if (DictGetItemRef(past, name, &hit) != 0) return hit;
        }
    }
    const MadeFor made_for(kind.cls);
    if (!made_for.cls()) return NotInstalled();
    // The maker (or class) may be replaced while it runs: held for the call.
    Ref make = Held(kind.maker);
    if (!make) make = Ref::FromBorrowed(made_for.cls().get());
    Ref made(PyObject_CallOneArg(make.get(), name));
    if (!made || !cacheable || !made_for.Current(kind.cls) ||
        kind.cache.load(std::memory_order_acquire) != cache) {
        return made.release();
    }
    if (!Remember(kind, cache, overflow, name, made.get())) return nullptr;
    return made.release();
}

// Keeps `entry` for `name` (exact str or int): in `cache` (kind's, current when the caller read
// it) while it has room, else, during a walk, in the calling thread's overflow table that the
// walk's end drops. An entry already there stays (another thread's, equal to this one): the
// cache's entries are never replaced, so none a reader took borrowed inside the dict's lock is
// freed by another thread's insert.
bool Remember(NamedKeys&, PyObject* cache, Ref& overflow, PyObject* name, PyObject* entry) {
    if (PyDict_GET_SIZE(cache) < kStrCacheSize) {
        return DictSetDefaultRef(cache, name, entry, nullptr) >= 0;
    }
    if (W().depth == 0) return true;
    if (!overflow) {
        overflow = Ref(PyDict_New());
        if (!overflow) return false;
    }
    return PyDict_SetItem(overflow.get(), name, entry) == 0;
}

// Makes, in one maker call, the entries for `names` (a list of exact str, or of exact int,
// none of them known yet) and remembers them.
bool MakeNamedBlock(NamedKeys& kind, PyObject* cache, PyObject* block_maker, Ref& overflow,
                    PyObject* names) {
    const MadeFor made_for(kind.cls);
    Ref made(PyObject_CallOneArg(block_maker, names));
    if (!made) return false;
    if (!PyList_CheckExact(made.get()) ||
        PyList_GET_SIZE(made.get()) != PyList_GET_SIZE(names)) {
        PyErr_SetString(PyExc_SystemError, "fastree: a key maker returned a malformed block");
        return false;
    }
    // Remember can run Python code (allocating the overflow table once the cache is full), and
    // both lists have been in the maker's hands (it may keep them): each pair is held across the
    // call, and both sizes and the class are read again per step (entries of a replaced class
    // are not kept).
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names) && i < PyList_GET_SIZE(made.get()) &&
                           made_for.Current(kind.cls) &&
                           kind.cache.load(std::memory_order_acquire) == cache;
         ++i) {
        Ref name = Ref::FromBorrowed(PyList_GET_ITEM(names, i));
        Ref entry = Ref::FromBorrowed(PyList_GET_ITEM(made.get(), i));
        if (!Remember(kind, cache, overflow, name.get(), entry.get())) return false;
    }
    return true;
}

bool ReserveNames(NamedKeys& kind, Ref& overflow, PyObject* const* names, Py_ssize_t n) {
    if (n < 8) return true;  // a few misses: one by one is as cheap
    PyObject* cache = kind.cache.load(std::memory_order_acquire);
    if (cache == nullptr) return true;  // not installed: the lookups say so
    // Exact str and exact int keys (the cacheable ones) not known yet, one list per type: the
    // block maker sorts them, which mixed types would not allow. (Exact str and int keys: the
    // membership tests run no Python code.)
    Ref missing_str(PyList_New(0));
    Ref missing_int(PyList_New(0));
    if (!missing_str || !missing_int) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* name = names[i];
        PyObject* list = PyUnicode_CheckExact(name) ? missing_str.get()
                         : PyLong_CheckExact(name)  ? missing_int.get()
                                                    : nullptr;
        if (list == nullptr) continue;
        bool known = false;
        for (PyObject* table : {cache, overflow.get()}) {
            if (table == nullptr || known) continue;
            const int has = PyDict_Contains(table, name);
            if (has < 0) return false;
            known = has > 0;
        }
        if (!known && PyList_Append(list, name) < 0) return false;
    }
    if (PyList_GET_SIZE(missing_str.get()) == 0 && PyList_GET_SIZE(missing_int.get()) == 0) {
        return true;
    }
    Ref block = Held(kind.block);  // may be replaced while it runs: held for the calls
    if (!block) return true;       // no block maker: one by one
    for (PyObject* list : {missing_str.get(), missing_int.get()}) {
        if (PyList_GET_SIZE(list) > 0 &&
            !MakeNamedBlock(kind, cache, block.get(), overflow, list)) {
            return false;
        }
    }
    return true;
}

// The walk-scoped entries (past the caches), dropped when the last key-path walk ends. Moved
// out first: releasing a key could, in principle, run code that re-enters here.
void ReleaseOverflow(KeysWalkState& w) { KeysOverflow released = std::move(w.overflow); }

// What a re-install of the classes replaces (keys::Install), released after the lock on GIL
// builds, kept in the state's retired lists on free-threaded ones.
struct Replaced {
    RefVector refs;
    std::vector<IndexCache*> caches;
    ~Replaced() {
        for (IndexCache* cache : caches) IndexCache::Release(cache);
    }
};

// Installs `cls` (and a fresh cache) for an index kind, under the lock; what it replaces goes to
// `out`.
void SwapIndexKind(IndexKeys& kind, PyObject* cls, IndexCache* fresh, Replaced& out) {
    out.refs.push_back(kind.cls.release());
    kind.cls = Ref::FromBorrowed(cls);
    out.caches.push_back(kind.cache.exchange(fresh, std::memory_order_acq_rel));
}

void SwapNamedKind(NamedKeys& kind, PyObject* cls, Ref& fresh, Replaced& out) {
    out.refs.push_back(kind.cls.release());
    kind.cls = Ref::FromBorrowed(cls);
    out.refs.push_back(kind.cache.exchange(fresh.release(), std::memory_order_acq_rel));
}

}  // namespace

bool Install(PyObject* dict_key, PyObject* sequence_key, PyObject* getattr_key,
             PyObject* flattened_index_key) {
    // Entries cached for previously installed classes would be of the wrong type now: every
    // install brings fresh caches with its classes. (The makers stay.) The new ones are made
    // first (allocation: never under the lock), swapped in under it, and what they replace is
    // released after it, under the GIL; on free-threaded builds it is kept for the process
    // instead (KeysState::retired): another thread's walk may be reading an old class or cache
    // borrowed. The entries past the caches moved out are the calling thread's: another thread's
    // walk keeps its own until it ends. The bridge installs at import, before any walk.
    IndexCache* fresh_sequence = IndexCache::New();
    IndexCache* fresh_flattened_index = IndexCache::New();
    Ref fresh_dict(PyDict_New());
    Ref fresh_getattr(PyDict_New());
    if (fresh_sequence == nullptr || fresh_flattened_index == nullptr || !fresh_dict ||
        !fresh_getattr) {
        std::free(fresh_sequence);
        std::free(fresh_flattened_index);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return false;
    }
    KeysState& s = S();
    Replaced replaced;  // released after the lock (GIL builds)
    replaced.refs.reserve(6);
    replaced.caches.reserve(2);
    KeysOverflow old_overflow = std::move(W().overflow);
    {
        TableLock::Hold hold(s.lock);
#ifdef Py_GIL_DISABLED
        s.retired.reserve(s.retired.size() + 6);  // the moves below cannot throw
        s.retired_caches.reserve(s.retired_caches.size() + 2);
#endif
        SwapIndexKind(s.sequence, sequence_key, fresh_sequence, replaced);
        SwapIndexKind(s.flattened_index, flattened_index_key, fresh_flattened_index, replaced);
        SwapNamedKind(s.dict, dict_key, fresh_dict, replaced);
        SwapNamedKind(s.getattr, getattr_key, fresh_getattr, replaced);
#ifdef Py_GIL_DISABLED
        // (A class installed again, as the bridge's install does, stays alive as the current
        // one: released after the lock, as under the GIL.)
        for (PyObject*& old : replaced.refs) {
            const bool current = old == s.sequence.cls.get() ||
                                 old == s.flattened_index.cls.get() ||
                                 old == s.dict.cls.get() || old == s.getattr.cls.get();
            if (old != nullptr && !current) s.retired.push_back(std::exchange(old, nullptr));
        }
        for (IndexCache*& old : replaced.caches) {
            if (old != nullptr) s.retired_caches.push_back(std::exchange(old, nullptr));
        }
#endif
    }
    return true;
}

void InstallMakers(PyObject* sequence_block, PyObject* flattened_index_block,
                   PyObject* dict_key, PyObject* getattr_key, PyObject* dict_key_block) {
    KeysState& s = S();
    // Swapped under the lock; the replaced makers are released after it (the locals below die
    // after the Hold). Every reader takes its own reference under the lock (Held).
    Ref dict_block = OptionalRef(dict_key_block);
    Ref sequence = OptionalRef(sequence_block);
    Ref flattened_index = OptionalRef(flattened_index_block);
    Ref dict = OptionalRef(dict_key);
    Ref getattr = OptionalRef(getattr_key);
    TableLock::Hold hold(s.lock);
    std::swap(s.dict.block, dict_block);
    std::swap(s.sequence.block, sequence);
    std::swap(s.flattened_index.block, flattened_index);
    std::swap(s.dict.maker, dict);
    std::swap(s.getattr.maker, getattr);
}

WalkScope::WalkScope() { ++W().depth; }
WalkScope::~WalkScope() {
    KeysWalkState& w = W();
    if (--w.depth == 0) ReleaseOverflow(w);
}

bool ReserveSequence(Py_ssize_t n) { return Reserve(S().sequence, W().overflow.sequence, n); }
bool ReserveDict(PyObject* const* keys, Py_ssize_t n) {
    return ReserveNames(S().dict, W().overflow.dict, keys, n);
}
bool ReserveFlattenedIndex(Py_ssize_t n) {
    return Reserve(S().flattened_index, W().overflow.flattened_index, n);
}

PyObject* Dict(PyObject* key) { return ByName(S().dict, W().overflow.dict, key); }
PyObject* Sequence(Py_ssize_t index) { return ByIndex(S().sequence, W().overflow.sequence, index); }
PyObject* GetAttr(PyObject* name) { return ByName(S().getattr, W().overflow.getattr, name); }
PyObject* FlattenedIndex(Py_ssize_t index) {
    return ByIndex(S().flattened_index, W().overflow.flattened_index, index);
}

}  // namespace keys
}  // namespace fastree
