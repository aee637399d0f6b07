// Checks of custom nodes' aux_data (the static part of a treedef, hence of every jit cache key).
//
// The common case must cost almost nothing: aux made of None/bool/int/float/complex/str/bytes/
// classes, in tuples/frozensets (and lists/dicts/sets outside strict mode), is accepted by a
// C walk with no Python call. Any other value type is shown once to the Python classifier
// (fastree._aux) and remembered; only aux holding a type it rejects (arrays, tracers, values
// whose == is not a bool) reaches the Python reporter, which warns or, in strict mode, raises.
#pragma once

#include <Python.h>

namespace fastree {
namespace aux {

extern PyObject* g_reporter;  // owned; null until fastree._aux installs the hooks

bool CheckSlow(PyObject* node_type, PyObject* aux, PyObject* root);

// Returns false with a Python error set if the reporter raised (strict mode).
inline bool Check(PyObject* node_type, PyObject* aux, PyObject* root) {
    if (g_reporter == nullptr || aux == Py_None) return true;
    return CheckSlow(node_type, aux, root);
}

void SetHooks(PyObject* classify, PyObject* reporter);
void SetStrict(bool strict);
bool Strict();
int Traverse(visitproc visit, void* arg);

}  // namespace aux
}  // namespace fastree
