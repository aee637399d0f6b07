// Raw C entry points registered in the module (see entry_points.cpp for why they bypass pybind11).
#pragma once

#include <Python.h>

namespace fastree {

PyObject* TreeFlatten(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* TreeLeaves(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* TreeStructure(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* TreeFlattenWithPath(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* TreeLeavesWithPath(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* TreeUnflatten(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* TreeMap(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* TreeMapWithPath(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* AllLeaves(PyObject*, PyObject* iterable);
PyObject* FlattenOneLevelEntry(PyObject*, PyObject* tree);
PyObject* FlattenOneLevelWithKeysEntry(PyObject*, PyObject* tree);
PyObject* IsNodeType(PyObject*, PyObject* type);
PyObject* TreeDefTupleEntry(PyObject*, PyObject* treedefs);
PyObject* TreeDefFromState(PyObject*, PyObject* state);

}  // namespace fastree
