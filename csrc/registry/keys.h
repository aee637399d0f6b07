// Key-path entries. fastree builds JAX's own key classes (DictKey, SequenceKey, GetAttrKey,
// FlattenedIndexKey) so that `isinstance` checks and keystr() in user code keep working.
#pragma once

#include <Python.h>

namespace fastree {
namespace keys {

// Installs the four JAX key classes (held by the module state, registry_state.h, with the makers
// and the cached entries).
bool Install(PyObject* dict_key, PyObject* sequence_key, PyObject* getattr_key,
             PyObject* flattened_index_key);

// Installs the makers (each may be None): jaxlib functions that make key entries without
// calling the classes (see keys.cpp). `sequence_block(n)` / `flattened_index_block(n)` return a
// list of the entries for indices 0..n-1; `dict_key(k)` / `getattr_key(name)` one entry;
// `dict_key_block(keys)` the entries for a list of exact str (or exact int) keys, in order.
void InstallMakers(PyObject* sequence_block, PyObject* flattened_index_block,
                   PyObject* dict_key, PyObject* getattr_key, PyObject* dict_key_block);

// Held by every walk that makes key paths: entries for indices past the cache are kept only
// while some walk holds one.
class WalkScope {
 public:
    WalkScope();
    ~WalkScope();
    WalkScope(const WalkScope&) = delete;
    WalkScope& operator=(const WalkScope&) = delete;
};

// Called by a walk (inside a WalkScope) about to visit `n` children: makes the entries past the
// cache in one block. False with a Python error set.
bool ReserveSequence(Py_ssize_t n);
bool ReserveFlattenedIndex(Py_ssize_t n);
// The same for a dict's `n` keys: the ones not cached yet are made in one block.
bool ReserveDict(PyObject* const* keys, Py_ssize_t n);

// Each returns a new reference, or null with a Python error set.
PyObject* Dict(PyObject* key);
PyObject* Sequence(Py_ssize_t index);
PyObject* GetAttr(PyObject* name);
PyObject* FlattenedIndex(Py_ssize_t index);

}  // namespace keys
}  // namespace fastree
