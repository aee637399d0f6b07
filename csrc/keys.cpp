#include "keys.h"

#include <vector>

namespace fastree {
namespace keys {
namespace {

// JAX's key entries are immutable (read-only properties), so equal entries can be shared:
// building one through its Python class costs 0.2-0.5 us, which dominated flatten_with_path on
// wide lists. Cached: SequenceKey/FlattenedIndexKey by index, DictKey/GetAttrKey for exact-str
// keys (a parameter tree repeats 'kernel', 'bias', ... in every layer). Bounded: index entries
// are made on first use and cost ~40 bytes each, so a process that has key-pathed a list of the
// maximum length holds ~5 MB of them.
constexpr Py_ssize_t kIndexCacheSize = Py_ssize_t{1} << 17;
constexpr Py_ssize_t kStrCacheSize = 8192;
std::vector<PyObject*> g_sequence_cache;         // owned; index -> SequenceKey(index) or null
std::vector<PyObject*> g_flattened_index_cache;  // owned; index -> FlattenedIndexKey(index)
PyObject* g_dict_key_cache = nullptr;            // owned dict: str -> DictKey(str)
PyObject* g_getattr_key_cache = nullptr;         // owned dict: str -> GetAttrKey(str)

PyObject* g_dict_key = nullptr;
PyObject* g_sequence_key = nullptr;
PyObject* g_getattr_key = nullptr;
PyObject* g_flattened_index_key = nullptr;

PyObject* Make(PyObject* cls, PyObject* arg /* stolen */) {
    if (arg == nullptr) return nullptr;
    if (cls == nullptr) {
        Py_DECREF(arg);
        PyErr_SetString(PyExc_RuntimeError, "fastree: JAX key classes are not installed.");
        return nullptr;
    }
    PyObject* out = PyObject_CallOneArg(cls, arg);
    Py_DECREF(arg);
    return out;
}

}  // namespace

bool Install(PyObject* dict_key, PyObject* sequence_key, PyObject* getattr_key,
             PyObject* flattened_index_key) {
    Py_XSETREF(g_dict_key, Py_NewRef(dict_key));
    Py_XSETREF(g_sequence_key, Py_NewRef(sequence_key));
    Py_XSETREF(g_getattr_key, Py_NewRef(getattr_key));
    Py_XSETREF(g_flattened_index_key, Py_NewRef(flattened_index_key));
    // Entries cached for previously installed classes would be of the wrong type now.
    for (PyObject*& key : g_sequence_cache) Py_CLEAR(key);
    for (PyObject*& key : g_flattened_index_cache) Py_CLEAR(key);
    Py_CLEAR(g_dict_key_cache);
    Py_CLEAR(g_getattr_key_cache);
    return true;
}

namespace {

PyObject* CachedByIndex(std::vector<PyObject*>& cache, PyObject* cls, Py_ssize_t index) {
    if (index >= kIndexCacheSize) return Make(cls, PyLong_FromSsize_t(index));
    if (static_cast<size_t>(index) >= cache.size()) cache.resize(static_cast<size_t>(index) + 1);
    PyObject*& slot = cache[static_cast<size_t>(index)];
    if (slot == nullptr) {
        slot = Make(cls, PyLong_FromSsize_t(index));
        if (slot == nullptr) return nullptr;
    }
    return Py_NewRef(slot);
}

PyObject* CachedByStr(PyObject** cache, PyObject* cls, PyObject* key) {
    if (!PyUnicode_CheckExact(key)) return Make(cls, Py_NewRef(key));
    if (*cache == nullptr) {
        *cache = PyDict_New();
        if (*cache == nullptr) return nullptr;
    }
    PyObject* hit = PyDict_GetItemWithError(*cache, key);
    if (hit != nullptr) return Py_NewRef(hit);
    if (PyErr_Occurred()) return nullptr;
    PyObject* made = Make(cls, Py_NewRef(key));
    if (made != nullptr && PyDict_GET_SIZE(*cache) < kStrCacheSize &&
        PyDict_SetItem(*cache, key, made) < 0) {
        Py_DECREF(made);
        return nullptr;
    }
    return made;
}

}  // namespace

PyObject* Dict(PyObject* key) { return CachedByStr(&g_dict_key_cache, g_dict_key, key); }
PyObject* Sequence(Py_ssize_t index) {
    return CachedByIndex(g_sequence_cache, g_sequence_key, index);
}
PyObject* GetAttr(PyObject* name) { return CachedByStr(&g_getattr_key_cache, g_getattr_key, name); }
PyObject* FlattenedIndex(Py_ssize_t index) {
    return CachedByIndex(g_flattened_index_cache, g_flattened_index_key, index);
}

int Traverse(visitproc visit, void* arg) {
    Py_VISIT(g_dict_key);
    Py_VISIT(g_sequence_key);
    Py_VISIT(g_getattr_key);
    Py_VISIT(g_flattened_index_key);
    for (PyObject* key : g_sequence_cache) Py_VISIT(key);
    for (PyObject* key : g_flattened_index_cache) Py_VISIT(key);
    Py_VISIT(g_dict_key_cache);
    Py_VISIT(g_getattr_key_cache);
    return 0;
}

}  // namespace keys
}  // namespace fastree
