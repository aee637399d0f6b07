// Tree mode's Variable walk (nnx_tree_variables.h).
//
// flax's predicate is ``isinstance(x, Variable)``, which ``VariableMeta.__instancecheck__``
// answers in Python: ``type.__instancecheck__`` first (its ``super()`` call), then, for a JAX
// tracer or a hijax Variable, more of its own code. Every object the walk meets is asked, and
// most are no Variable (arrays, Modules, tuples), so the predicate was most of the walk's time.
// VariableCheck makes the same ``type.__instancecheck__`` checks in C (CPython's own steps, the
// ``__class__`` read included, so a ``__class__`` property runs as it runs under flax) and leaves
// only tracers and hijax objects to flax's ``isinstance``.
#include "nnx/nnx_tree_variables.h"

#include <vector>

#include "treedef/walkers.h"
#include "util/pointer_map.h"
#include "util/pyutils.h"

namespace fastree::nnx_tree {
namespace {

// The check's own state, a tuple held as the builtin function's `self` (its reference, seen by
// the GC through the function object): the classes it asks about and the interned name it reads.
enum CheckItem : Py_ssize_t { kVariable, kTracer, kHijax, kClassName, kCheckSize };

// getattr(obj, name) where a missing attribute is no error: 1 and a new reference, 0 (missing)
// or -1 with an error set.
int GetOptionalAttr(PyObject* obj, PyObject* name, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(obj, name, out);
#else
    return _PyObject_LookupAttr(obj, name, out);
#endif
}

// type.__instancecheck__(cls, x), as CPython computes it (object_isinstance): x's type, else the
// class its ``__class__`` names where that is another type. 1, 0, or -1 with an error set.
int TypeCheck(PyObject* cls, PyObject* x, PyObject* class_name) {
    PyTypeObject* type = reinterpret_cast<PyTypeObject*>(cls);
    if (PyObject_TypeCheck(x, type)) return 1;
    PyObject* claimed = nullptr;
    if (GetOptionalAttr(x, class_name, &claimed) < 0) return -1;
    Ref held(claimed);
    if (!held || claimed == reinterpret_cast<PyObject*>(Py_TYPE(x)) || !PyType_Check(claimed)) {
        return 0;
    }
    return PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(claimed), type);
}

// isinstance(x, Variable) as flax answers it: 1, 0, or -1 with an error set. What
// VariableMeta.__instancecheck__ says True to, type.__instancecheck__ says first; what is neither
// a tracer nor a hijax object (Tracer has no metaclass of its own, so this check is its
// isinstance) is no Variable. The rest goes to isinstance itself.
int IsVariable(PyObject* state, PyObject* x) {
    PyObject* class_name = PyTuple_GET_ITEM(state, kClassName);
    PyObject* variable = PyTuple_GET_ITEM(state, kVariable);
    int found = TypeCheck(variable, x, class_name);
    if (found != 0) return found;
    found = TypeCheck(PyTuple_GET_ITEM(state, kTracer), x, class_name);
    PyObject* hijax = PyTuple_GET_ITEM(state, kHijax);
    if (found == 0 && hijax != Py_None) found = TypeCheck(hijax, x, class_name);
    if (found <= 0) return found;
    return PyObject_IsInstance(x, variable);
}

PyObject* CallCheck(PyObject* state, PyObject* x) {
    const int found = IsVariable(state, x);
    if (found < 0) return nullptr;
    return Py_NewRef(found ? Py_True : Py_False);
}

PyMethodDef kCheckDef = {
    "is_variable", CallCheck, METH_O,
    "is_variable(x)\n--\n\n"
    "isinstance(x, flax.nnx.Variable), as flax's metaclass answers it (fastree's native check)."};

// The check's state, or null with a TypeError where `check` is not a VariableCheck.
PyObject* CheckState(PyObject* check) {
    if (PyCFunction_Check(check) &&
        reinterpret_cast<PyCFunctionObject*>(check)->m_ml == &kCheckDef) {
        return PyCFunction_GET_SELF(check);
    }
    PyErr_Format(PyExc_TypeError, "variables_by_path: expected fastree's Variable check, got %R",
                 check);
    return nullptr;
}

constexpr const char* kByPathNames[] = {"check", "tree"};

}  // namespace

PyObject* NewVariableCheck(PyObject* variable, PyObject* tracer, PyObject* hijax) {
    for (PyObject* cls : {variable, tracer}) {
        if (!PyType_Check(cls)) {
            PyErr_Format(PyExc_TypeError, "variable_check: expected a class, got %R", cls);
            return nullptr;
        }
    }
    if (hijax != Py_None && !PyType_Check(hijax)) {
        PyErr_Format(PyExc_TypeError, "variable_check: expected a class or None, got %R", hijax);
        return nullptr;
    }
    Ref class_name(PyUnicode_InternFromString("__class__"));
    if (!class_name) return nullptr;
    Ref state(PyTuple_Pack(kCheckSize, variable, tracer, hijax, class_name.get()));
    if (!state) return nullptr;
    return PyCFunction_NewEx(&kCheckDef, state.get(), nullptr);
}

PyObject* VariablesByPath(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* a[2];
    if (!ParseArgs({"variables_by_path", kByPathNames, 2, 2}, args, nargs, kwnames, a)) {
        return nullptr;
    }
    PyObject* check = a[0];
    PyObject* state = CheckState(check);
    if (state == nullptr) return nullptr;
    // Owned (path, leaf) pairs for the whole loop: the path and leaf pointers read from them stay
    // valid through the checks, hashes and comparisons below, which can run Python code.
    RefVector leaves;
    RefVector pairs;
    if (!Flatten(a[1], check, false, static_cast<TreeDef*>(nullptr), &leaves, &pairs)) {
        return nullptr;
    }
    Ref found(PyDict_New());
    if (!found) return nullptr;
    PointerMap seen;  // the Variables so far, by address (each held by its pair)
    for (PyObject* pair : pairs) {
        PyObject* path = PyTuple_GET_ITEM(pair, 0);
        PyObject* leaf = PyTuple_GET_ITEM(pair, 1);
        const int variable = IsVariable(state, leaf);  // flax's loop asks again
        if (variable < 0) return nullptr;
        if (!variable) continue;
        bool inserted = false;
        seen.FindOrInsert(leaf, 0, &inserted);
        if (!inserted) Py_RETURN_NONE;  // an alias: flax's own function raises
        if (PyDict_SetItem(found.get(), path, leaf) < 0) return nullptr;
    }
    return found.release();
}

}  // namespace fastree::nnx_tree
