// Checking what a custom node's flatten function returned, with JAX's error texts. Shared by the
// full flatten (flatten.cpp) and flatten_one_level (one_level.cpp), which JAX checks alike.
#pragma once

#include <Python.h>

#include "util/pyutils.h"

namespace fastree {

inline const char* FlattenContract(bool with_keys) {
    return with_keys ? "The to_iterable_with_keys function for a custom PyTree node should return a "
                       "(key_leaf_pairs, aux_data) tuple"
                     : "The to_iterable function for a custom PyTree node should return a "
                       "(children, aux_data) tuple";
}

// Validates a custom flatten result and returns its two halves (borrowed from `result`).
inline bool SplitFlattenResult(PyObject* result, bool with_keys, PyObject** children,
                               PyObject** aux) {
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 2) {
        PyErr_Format(PyExc_ValueError, "%s, got %s", FlattenContract(with_keys),
                     Repr(result).c_str());
        return false;
    }
    *children = PyTuple_GET_ITEM(result, 0);
    *aux = PyTuple_GET_ITEM(result, 1);
    return true;
}

// An iterator over the children (or key/child pairs) half of `result`, or null with JAX's error.
inline PyObject* IterChildren(PyObject* children, PyObject* result, bool with_keys) {
    PyObject* it = PyObject_GetIter(children);
    if (it == nullptr) {
        PyErr_Format(PyExc_ValueError, "%s where '%s' is iterable, got %s",
                     FlattenContract(with_keys), with_keys ? "key_leaf_pairs" : "children",
                     Repr(result).c_str());
    }
    return it;
}

// Checks one item of key_leaf_pairs; false with an error if it is not a (key, child) pair.
inline bool CheckKeyChildPair(PyObject* pair) {
    if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) return true;
    PyErr_Format(PyExc_ValueError, "%s where 'key_leaf_pairs' holds (key, child) pairs, got %s",
                 FlattenContract(true), Repr(pair).c_str());
    return false;
}

}  // namespace fastree
