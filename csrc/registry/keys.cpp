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
#include <vector>

#include "registry/registry_state.h"
#include "util/pyutils.h"

namespace fastree {
namespace keys {
namespace {

constexpr Py_ssize_t kIndexCacheSize = Py_ssize_t{1} << 17;
constexpr Py_ssize_t kMinBlock = 256;
constexpr Py_ssize_t kStrCacheSize = 65536;  // ~100 bytes an entry: ~6.5 MB at most

// The key kinds and their caches live in the module state (registry_state.h), the entries past
// the caches in the walk state (the calling thread's on free-threaded builds).
KeysState& S() { return state::Keys(); }
KeysWalkState& W() { return state::KeysWalk(); }

PyObject* NotInstalled() {
    PyErr_SetString(PyExc_RuntimeError, "fastree: JAX key classes are not installed.");
    return nullptr;
}

// The class `kind` makes entries of, held across a maker call: should the key classes be
// re-installed while the maker runs (Python code), what it made is of the replaced class and
// must not enter the new class's caches. Held, so the comparison cannot be fooled by a new class
// at the old one's address.
class MadeFor {
 public:
    explicit MadeFor(const Ref& cls) : cls_(Ref::FromBorrowed(cls.get())) {}
    bool Current(const Ref& cls) const { return cls.get() == cls_.get(); }

 private:
    Ref cls_;
};

// A list of the keys for indices 0..n-1, made by the block maker (or, without one, the class).
PyObject* MakeBlock(const IndexKeys& kind, Py_ssize_t n) {
    if (!kind.cls) return NotInstalled();
    Ref count(PyLong_FromSsize_t(n));
    if (!count) return nullptr;
    // The installed objects may be replaced while Python runs: held for the calls.
    Ref cls = Ref::FromBorrowed(kind.cls.get());
    if (kind.block) {
        Ref block = Ref::FromBorrowed(kind.block.get());
        Ref keys(PyObject_CallOneArg(block.get(), count.get()));
        if (!keys) return nullptr;
        if (!PyList_CheckExact(keys.get()) || PyList_GET_SIZE(keys.get()) != n) {
            PyErr_SetString(PyExc_SystemError, "fastree: a key maker returned a malformed block");
            return nullptr;
        }
        return keys.release();
    }
    Ref keys(PyList_New(n));
    for (Py_ssize_t i = 0; keys && i < n; ++i) {
        Ref index(PyLong_FromSsize_t(i));
        PyObject* key = index ? PyObject_CallOneArg(cls.get(), index.get()) : nullptr;
        if (key == nullptr) return nullptr;
        PyList_SET_ITEM(keys.get(), i, key);
    }
    return keys.release();
}

// Stores block[begin, end) into `slots` at positions begin - offset ..., where still empty.
// `slots` is re-read per step: nothing here runs Python code, but the caller's vector may have
// been replaced while the maker ran.
void Store(std::vector<PyObject*>& slots, Py_ssize_t offset, PyObject* block, Py_ssize_t begin,
           Py_ssize_t end) {
    if (static_cast<Py_ssize_t>(slots.size()) < end - offset) {
        slots.resize(static_cast<size_t>(end - offset), nullptr);
    }
    for (Py_ssize_t i = begin; i < end; ++i) {
        PyObject*& slot = slots[static_cast<size_t>(i - offset)];  // a RefVector's: owned
        if (slot == nullptr) slot = Py_NewRef(PyList_GET_ITEM(block, i));
    }
}

// The lookups below take new references straight from the caches' raw pointers: they run once
// per key of every key-path walk, and hand their reference on (no release to pair with).
// `overflow` is kind's entries past the cache, in the walk state.
PyObject* ByIndex(IndexKeys& kind, RefVector& overflow, Py_ssize_t index) {
    std::vector<PyObject*>& slots = index < kIndexCacheSize ? kind.cache : overflow;
    const Py_ssize_t offset = index < kIndexCacheSize ? 0 : kIndexCacheSize;
    const size_t at = static_cast<size_t>(index - offset);
    if (at < slots.size() && slots[at] != nullptr) return Py_NewRef(slots[at]);
    // A miss: make a block reaching past `index` (doubling what is there), so a wide container
    // costs a few maker calls, not one per child.
    Py_ssize_t end = std::max(index + 1, 2 * (offset + static_cast<Py_ssize_t>(slots.size())));
    end = std::max(end, kMinBlock);
    if (index < kIndexCacheSize) end = std::min(end, kIndexCacheSize);
    const MadeFor made_for(kind.cls);
    Ref block(MakeBlock(kind, end));
    if (!block) return nullptr;
    PyObject* key = PyList_GET_ITEM(block.get(), index);
    if (!made_for.Current(kind.cls)) return Py_NewRef(key);  // of a replaced class: not kept
    if (index >= kIndexCacheSize && W().depth == 0) return Py_NewRef(key);  // nothing holds it
    Store(index < kIndexCacheSize ? kind.cache : overflow, offset, block.get(), offset, end);
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
    Ref block(MakeBlock(kind, n));
    if (!block) return false;
    if (made_for.Current(kind.cls)) {
        Store(overflow, kIndexCacheSize, block.get(), kIndexCacheSize, n);
    }
    return true;
}

bool Remember(NamedKeys& kind, Ref& overflow, PyObject* name, PyObject* entry);

PyObject* ByName(NamedKeys& kind, Ref& overflow, PyObject* name) {
    if (!kind.cls) return NotInstalled();
    // Exact str and int keys hash and compare without running Python code: cacheable.
    const bool cacheable = PyUnicode_CheckExact(name) || PyLong_CheckExact(name);
    if (cacheable) {
        // The cache first, on its own: nearly every lookup of a walk ends there. (The lookups
        // run no Python code: exact str and int keys.)
        if (PyObject* cache = kind.cache.get()) {
            if (PyObject* hit = PyDict_GetItemWithError(cache, name)) return Py_NewRef(hit);
            if (PyErr_Occurred()) return nullptr;
        }
        if (PyObject* past = overflow.get()) {
            if (PyObject* hit = PyDict_GetItemWithError(past, name)) return Py_NewRef(hit);
            if (PyErr_Occurred()) return nullptr;
        }
    }
    // The maker (or class) may be replaced while it runs: held for the call.
    Ref make = Ref::FromBorrowed(kind.maker ? kind.maker.get() : kind.cls.get());
    const MadeFor made_for(kind.cls);
    Ref made(PyObject_CallOneArg(make.get(), name));
    if (!made || !cacheable || !made_for.Current(kind.cls)) return made.release();
    if (!Remember(kind, overflow, name, made.get())) return nullptr;
    return made.release();
}

// Keeps `entry` for `name` (exact str or int): in the cache while it has room, else, during a
// walk, in the overflow table that the walk's end drops.
bool Remember(NamedKeys& kind, Ref& overflow, PyObject* name, PyObject* entry) {
    Ref* table = &kind.cache;
    if (kind.cache && PyDict_GET_SIZE(kind.cache.get()) >= kStrCacheSize) {
        if (W().depth == 0) return true;
        table = &overflow;
    }
    if (!*table) {
        *table = Ref(PyDict_New());
        if (!*table) return false;
    }
    return PyDict_SetItem(table->get(), name, entry) == 0;
}

// Makes, in one maker call, the entries for `names` (a list of exact str, or of exact int,
// none of them known yet) and remembers them.
bool MakeNamedBlock(NamedKeys& kind, Ref& overflow, PyObject* names) {
    Ref block = Ref::FromBorrowed(kind.block.get());  // may be replaced while it runs
    const MadeFor made_for(kind.cls);
    Ref made(PyObject_CallOneArg(block.get(), names));
    if (!made) return false;
    if (!PyList_CheckExact(made.get()) ||
        PyList_GET_SIZE(made.get()) != PyList_GET_SIZE(names)) {
        PyErr_SetString(PyExc_SystemError, "fastree: a key maker returned a malformed block");
        return false;
    }
    // Remember can run Python code (allocating the overflow table once the cache is full,
    // releasing an entry it replaces), and both lists have been in the maker's hands (it may keep
    // them): each pair is held across the call, and both sizes and the class are read again per
    // step (entries of a replaced class are not kept).
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names) && i < PyList_GET_SIZE(made.get()) &&
                           made_for.Current(kind.cls);
         ++i) {
        Ref name = Ref::FromBorrowed(PyList_GET_ITEM(names, i));
        Ref entry = Ref::FromBorrowed(PyList_GET_ITEM(made.get(), i));
        if (!Remember(kind, overflow, name.get(), entry.get())) return false;
    }
    return true;
}

bool ReserveNames(NamedKeys& kind, Ref& overflow, PyObject* const* names, Py_ssize_t n) {
    if (!kind.block || n < 8) return true;  // a few misses: one by one is as cheap
    // Exact str and exact int keys (the cacheable ones) not known yet, one list per type: the
    // block maker sorts them, which mixed types would not allow.
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
        for (PyObject* table : {kind.cache.get(), overflow.get()}) {
            if (table == nullptr || known) continue;
            const int has = PyDict_Contains(table, name);
            if (has < 0) return false;
            known = has > 0;
        }
        if (!known && PyList_Append(list, name) < 0) return false;
    }
    for (PyObject* list : {missing_str.get(), missing_int.get()}) {
        if (PyList_GET_SIZE(list) > 0 && !MakeNamedBlock(kind, overflow, list)) return false;
    }
    return true;
}

// The walk-scoped entries (past the caches), dropped when the last key-path walk ends. Moved
// out first: releasing a key could, in principle, run code that re-enters here.
void ReleaseOverflow(KeysWalkState& w) { KeysOverflow released = std::move(w.overflow); }

}  // namespace

bool Install(PyObject* dict_key, PyObject* sequence_key, PyObject* getattr_key,
             PyObject* flattened_index_key) {
    KeysState& s = S();
    // Entries cached for previously installed classes would be of the wrong type now: the old
    // classes and entries are moved out here, and released at the end, the new classes in place.
    // (The makers stay.) On free-threaded builds the entries past the caches moved out are the
    // calling thread's: another thread's walk keeps its own until it ends. The bridge installs
    // at import, before any walk; a re-install racing walks is docs/threads.md's R11.
    IndexKeys old_sequence{std::move(s.sequence.cls), Ref(), std::move(s.sequence.cache)};
    IndexKeys old_flattened_index{std::move(s.flattened_index.cls), Ref(),
                                  std::move(s.flattened_index.cache)};
    NamedKeys old_dict{std::move(s.dict.cls), Ref(), Ref(), std::move(s.dict.cache)};
    NamedKeys old_getattr{std::move(s.getattr.cls), Ref(), Ref(), std::move(s.getattr.cache)};
    KeysOverflow old_overflow = std::move(W().overflow);
    s.dict.cls = Ref::FromBorrowed(dict_key);
    s.sequence.cls = Ref::FromBorrowed(sequence_key);
    s.getattr.cls = Ref::FromBorrowed(getattr_key);
    s.flattened_index.cls = Ref::FromBorrowed(flattened_index_key);
    return true;
}

void InstallMakers(PyObject* sequence_block, PyObject* flattened_index_block,
                   PyObject* dict_key, PyObject* getattr_key, PyObject* dict_key_block) {
    KeysState& s = S();
    s.dict.block = OptionalRef(dict_key_block);
    s.sequence.block = OptionalRef(sequence_block);
    s.flattened_index.block = OptionalRef(flattened_index_block);
    s.dict.maker = OptionalRef(dict_key);
    s.getattr.maker = OptionalRef(getattr_key);
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
