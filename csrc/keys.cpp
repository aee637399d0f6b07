// Key-path entries: JAX's own key classes, made through jaxlib functions and cached.
//
// Why not call the classes: jaxlib's key classes are nanobind types, and nanobind's constructor
// path lets a C++ std::bad_alloc escape a noexcept frame (growing its table of live instances),
// which aborts the process where a MemoryError was due. jaxlib's bound *functions* translate
// the same failure into MemoryError, so every entry is made by one of them (the makers the
// Python layer installs: a list or dict flattened one level by jaxlib's registry). The classes
// themselves are used only if no maker is installed.
//
// Why cached: JAX's key entries are immutable (read-only properties), so equal entries can be
// shared, and making one costs far more than reusing it. Cached for the process:
// SequenceKey/FlattenedIndexKey by index below 2**17 (~40 bytes each, ~5 MB at most), made in
// blocks; DictKey/GetAttrKey for exact str and int keys, up to 65536 each (a parameter tree
// repeats 'kernel', 'bias', ... in every layer), a dict's unknown keys made in one block. Indices past 2**17 (very wide lists) come from
// one block per walk, and names past the cache's size are kept the same way: held only while
// some key-path walk is running (see WalkScope).
#include "keys.h"

#include <algorithm>
#include <vector>

#include "pyutils.h"

namespace fastree {
namespace keys {
namespace {

constexpr Py_ssize_t kIndexCacheSize = Py_ssize_t{1} << 17;
constexpr Py_ssize_t kMinBlock = 256;
constexpr Py_ssize_t kStrCacheSize = 65536;  // ~100 bytes an entry: ~6.5 MB at most

// One kind of index key: its class, its block maker, its cache.
struct IndexKeys {
    PyObject* cls = nullptr;    // owned: SequenceKey or FlattenedIndexKey
    PyObject* block = nullptr;  // owned or null: n -> list of the keys for 0..n-1
    std::vector<PyObject*> cache;     // owned; index -> key, or null
    std::vector<PyObject*> overflow;  // owned; index - kIndexCacheSize -> key (during walks)
};
IndexKeys g_sequence;
IndexKeys g_flattened_index;

struct NamedKeys {
    PyObject* cls = nullptr;       // owned: DictKey or GetAttrKey
    PyObject* maker = nullptr;     // owned or null: key -> the entry
    PyObject* block = nullptr;     // owned or null: [keys of one type] -> [entries], same order
    PyObject* cache = nullptr;     // owned dict: exact str/int -> entry
    PyObject* overflow = nullptr;  // owned dict: entries past the cache's size (during walks)
};
NamedKeys g_dict;
NamedKeys g_getattr;

int g_walk_depth = 0;  // key-path walks in progress (guarded by the GIL)

PyObject* NotInstalled() {
    PyErr_SetString(PyExc_RuntimeError, "fastree: JAX key classes are not installed.");
    return nullptr;
}

// A list of the keys for indices 0..n-1, made by the block maker (or, without one, the class).
PyObject* MakeBlock(const IndexKeys& kind, Py_ssize_t n) {
    if (kind.cls == nullptr) return NotInstalled();
    Ref count(PyLong_FromSsize_t(n));
    if (!count) return nullptr;
    Ref cls(Py_NewRef(kind.cls));  // the installed objects may be replaced while Python runs
    if (kind.block != nullptr) {
        Ref block(Py_NewRef(kind.block));
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
        PyObject*& slot = slots[static_cast<size_t>(i - offset)];
        if (slot == nullptr) slot = Py_NewRef(PyList_GET_ITEM(block, i));
    }
}

PyObject* ByIndex(IndexKeys& kind, Py_ssize_t index) {
    std::vector<PyObject*>& slots = index < kIndexCacheSize ? kind.cache : kind.overflow;
    const Py_ssize_t offset = index < kIndexCacheSize ? 0 : kIndexCacheSize;
    const size_t at = static_cast<size_t>(index - offset);
    if (at < slots.size() && slots[at] != nullptr) return Py_NewRef(slots[at]);
    // A miss: make a block reaching past `index` (doubling what is there), so a wide container
    // costs a few maker calls, not one per child.
    Py_ssize_t end = std::max(index + 1, 2 * (offset + static_cast<Py_ssize_t>(slots.size())));
    end = std::max(end, kMinBlock);
    if (index < kIndexCacheSize) end = std::min(end, kIndexCacheSize);
    Ref block(MakeBlock(kind, end));
    if (!block) return nullptr;
    PyObject* key = PyList_GET_ITEM(block.get(), index);
    if (index >= kIndexCacheSize && g_walk_depth == 0) return Py_NewRef(key);  // nothing holds it
    Store(index < kIndexCacheSize ? kind.cache : kind.overflow, offset, block.get(), offset, end);
    return Py_NewRef(key);
}

// Entries for indices up to `n` - 1 made in one block, when a walk is about to visit a container
// of `n` children reaching past the cache (one maker call instead of a doubling series).
bool Reserve(IndexKeys& kind, Py_ssize_t n) {
    if (n <= kIndexCacheSize || g_walk_depth == 0) return true;
    const size_t have = kind.overflow.size();
    if (static_cast<Py_ssize_t>(have) >= n - kIndexCacheSize && have > 0 &&
        kind.overflow.back() != nullptr) {
        return true;
    }
    Ref block(MakeBlock(kind, n));
    if (!block) return false;
    Store(kind.overflow, kIndexCacheSize, block.get(), kIndexCacheSize, n);
    return true;
}

bool Remember(NamedKeys& kind, PyObject* name, PyObject* entry);

PyObject* ByName(NamedKeys& kind, PyObject* name) {
    if (kind.cls == nullptr) return NotInstalled();
    // Exact str and int keys hash and compare without running Python code: cacheable.
    const bool cacheable = PyUnicode_CheckExact(name) || PyLong_CheckExact(name);
    if (cacheable) {
        // The cache first, on its own: nearly every lookup of a walk ends there. (The lookups
        // run no Python code: exact str and int keys.)
        if (kind.cache != nullptr) {
            if (PyObject* hit = PyDict_GetItemWithError(kind.cache, name)) return Py_NewRef(hit);
            if (PyErr_Occurred()) return nullptr;
        }
        if (kind.overflow != nullptr) {
            if (PyObject* hit = PyDict_GetItemWithError(kind.overflow, name)) {
                return Py_NewRef(hit);
            }
            if (PyErr_Occurred()) return nullptr;
        }
    }
    Ref made;
    if (kind.maker != nullptr) {
        Ref maker(Py_NewRef(kind.maker));
        made = Ref(PyObject_CallOneArg(maker.get(), name));
    } else {
        Ref cls(Py_NewRef(kind.cls));
        made = Ref(PyObject_CallOneArg(cls.get(), name));
    }
    if (!made || !cacheable) return made.release();
    if (!Remember(kind, name, made.get())) return nullptr;
    return made.release();
}

// Keeps `entry` for `name` (exact str or int): in the cache while it has room, else, during a
// walk, in the overflow table that the walk's end drops.
bool Remember(NamedKeys& kind, PyObject* name, PyObject* entry) {
    PyObject** table = &kind.cache;
    if (kind.cache != nullptr && PyDict_GET_SIZE(kind.cache) >= kStrCacheSize) {
        if (g_walk_depth == 0) return true;
        table = &kind.overflow;
    }
    if (*table == nullptr) {
        *table = PyDict_New();
        if (*table == nullptr) return false;
    }
    return PyDict_SetItem(*table, name, entry) == 0;
}

// Makes, in one maker call, the entries for `names` (a list of exact str, or of exact int,
// none of them known yet) and remembers them.
bool MakeNamedBlock(NamedKeys& kind, PyObject* names) {
    Ref block(Py_NewRef(kind.block));
    Ref made(PyObject_CallOneArg(block.get(), names));
    if (!made) return false;
    if (!PyList_CheckExact(made.get()) ||
        PyList_GET_SIZE(made.get()) != PyList_GET_SIZE(names)) {
        PyErr_SetString(PyExc_SystemError, "fastree: a key maker returned a malformed block");
        return false;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); ++i) {
        if (!Remember(kind, PyList_GET_ITEM(names, i), PyList_GET_ITEM(made.get(), i))) {
            return false;
        }
    }
    return true;
}

bool ReserveNames(NamedKeys& kind, PyObject* const* names, Py_ssize_t n) {
    if (kind.block == nullptr || n < 8) return true;  // a few misses: one by one is as cheap
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
        for (PyObject* table : {kind.cache, kind.overflow}) {
            if (table == nullptr || known) continue;
            const int has = PyDict_Contains(table, name);
            if (has < 0) return false;
            known = has > 0;
        }
        if (!known && PyList_Append(list, name) < 0) return false;
    }
    for (PyObject* list : {missing_str.get(), missing_int.get()}) {
        if (PyList_GET_SIZE(list) > 0 && !MakeNamedBlock(kind, list)) return false;
    }
    return true;
}

void ClearIndexKeys(IndexKeys& kind) {
    // Moved out first: releasing a key could, in principle, run code that re-enters here.
    std::vector<PyObject*> cache = std::move(kind.cache);
    std::vector<PyObject*> overflow = std::move(kind.overflow);
    kind.cache.clear();
    kind.overflow.clear();
    for (PyObject* key : cache) Py_XDECREF(key);
    for (PyObject* key : overflow) Py_XDECREF(key);
}

void ReleaseOverflow(IndexKeys& kind) {
    std::vector<PyObject*> overflow = std::move(kind.overflow);
    kind.overflow.clear();
    for (PyObject* key : overflow) Py_XDECREF(key);
}

}  // namespace

bool Install(PyObject* dict_key, PyObject* sequence_key, PyObject* getattr_key,
             PyObject* flattened_index_key) {
    Py_XSETREF(g_dict.cls, Py_NewRef(dict_key));
    Py_XSETREF(g_sequence.cls, Py_NewRef(sequence_key));
    Py_XSETREF(g_getattr.cls, Py_NewRef(getattr_key));
    Py_XSETREF(g_flattened_index.cls, Py_NewRef(flattened_index_key));
    // Entries cached for previously installed classes would be of the wrong type now.
    ClearIndexKeys(g_sequence);
    ClearIndexKeys(g_flattened_index);
    Py_CLEAR(g_dict.cache);
    Py_CLEAR(g_getattr.cache);
    Py_CLEAR(g_dict.overflow);
    Py_CLEAR(g_getattr.overflow);
    return true;
}

void InstallMakers(PyObject* sequence_block, PyObject* flattened_index_block,
                   PyObject* dict_key, PyObject* getattr_key, PyObject* dict_key_block) {
    auto opt = [](PyObject* f) { return f == Py_None ? nullptr : Py_XNewRef(f); };
    Py_XSETREF(g_dict.block, opt(dict_key_block));
    Py_XSETREF(g_sequence.block, opt(sequence_block));
    Py_XSETREF(g_flattened_index.block, opt(flattened_index_block));
    Py_XSETREF(g_dict.maker, opt(dict_key));
    Py_XSETREF(g_getattr.maker, opt(getattr_key));
}

WalkScope::WalkScope() { ++g_walk_depth; }
WalkScope::~WalkScope() {
    if (--g_walk_depth == 0) {
        ReleaseOverflow(g_sequence);
        ReleaseOverflow(g_flattened_index);
        Py_CLEAR(g_dict.overflow);
        Py_CLEAR(g_getattr.overflow);
    }
}

bool ReserveSequence(Py_ssize_t n) { return Reserve(g_sequence, n); }
bool ReserveDict(PyObject* const* keys, Py_ssize_t n) { return ReserveNames(g_dict, keys, n); }
bool ReserveFlattenedIndex(Py_ssize_t n) { return Reserve(g_flattened_index, n); }

PyObject* Dict(PyObject* key) { return ByName(g_dict, key); }
PyObject* Sequence(Py_ssize_t index) { return ByIndex(g_sequence, index); }
PyObject* GetAttr(PyObject* name) { return ByName(g_getattr, name); }
PyObject* FlattenedIndex(Py_ssize_t index) { return ByIndex(g_flattened_index, index); }

int Traverse(visitproc visit, void* arg) {
    for (const IndexKeys* kind : {&g_sequence, &g_flattened_index}) {
        Py_VISIT(kind->cls);
        Py_VISIT(kind->block);
        for (PyObject* key : kind->cache) Py_VISIT(key);
        for (PyObject* key : kind->overflow) Py_VISIT(key);
    }
    for (const NamedKeys* kind : {&g_dict, &g_getattr}) {
        Py_VISIT(kind->cls);
        Py_VISIT(kind->maker);
        Py_VISIT(kind->block);
        Py_VISIT(kind->cache);
        Py_VISIT(kind->overflow);
    }
    return 0;
}

}  // namespace keys
}  // namespace fastree
