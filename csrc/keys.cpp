#include "keys.h"

namespace fastree {
namespace keys {
namespace {

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
    return true;
}

PyObject* Dict(PyObject* key) { return Make(g_dict_key, Py_NewRef(key)); }
PyObject* Sequence(Py_ssize_t index) { return Make(g_sequence_key, PyLong_FromSsize_t(index)); }
PyObject* GetAttr(PyObject* name) { return Make(g_getattr_key, Py_NewRef(name)); }
PyObject* FlattenedIndex(Py_ssize_t index) {
    return Make(g_flattened_index_key, PyLong_FromSsize_t(index));
}

int Traverse(visitproc visit, void* arg) {
    Py_VISIT(g_dict_key);
    Py_VISIT(g_sequence_key);
    Py_VISIT(g_getattr_key);
    Py_VISIT(g_flattened_index_key);
    return 0;
}

}  // namespace keys
}  // namespace fastree
