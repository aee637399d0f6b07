// Key-path entries. fastree builds JAX's own key classes (DictKey, SequenceKey, GetAttrKey,
// FlattenedIndexKey) so that `isinstance` checks and keystr() in user code keep working.
#pragma once

#include <Python.h>

namespace fastree {
namespace keys {

// Installs the four JAX key classes (owned references, released at interpreter exit).
bool Install(PyObject* dict_key, PyObject* sequence_key, PyObject* getattr_key,
             PyObject* flattened_index_key);

// Each returns a new reference, or null with a Python error set.
PyObject* Dict(PyObject* key);
PyObject* Sequence(Py_ssize_t index);
PyObject* GetAttr(PyObject* name);
PyObject* FlattenedIndex(Py_ssize_t index);

// GC visibility for the installed classes.
int Traverse(visitproc visit, void* arg);

}  // namespace keys
}  // namespace fastree
