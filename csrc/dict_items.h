// Gathering a dict's items in JAX's order (sorted keys), shared by flatten and flatten_up_to.
#pragma once

#include <Python.h>

#include <algorithm>
#include <utility>

#include "pyutils.h"
#include "small_vector.h"

namespace fastree {

// An owned (key, value) pair gathered from a dict before recursing, so a callback that mutates
// the dict cannot free what we are about to visit.
struct Item {
    PyObject* key;
    PyObject* value;
};
using Items = SmallVector<Item, 8>;

inline void ReleaseItems(Items& items, size_t from) {
    for (size_t i = from; i < items.size(); ++i) {
        Py_XDECREF(items[i].key);
        Py_XDECREF(items[i].value);
    }
    items.clear();
}

// `a < b` for two exact str keys, in code-point order (Python's). ASCII keys, nearly all pytree
// keys, compare byte by byte inline: sorting is a visible share of flattening parameter dicts, and
// PyUnicode_Compare re-checks types and kinds on every call.
inline bool StrLess(PyObject* a, PyObject* b) {
    if (PyUnicode_IS_COMPACT_ASCII(a) && PyUnicode_IS_COMPACT_ASCII(b)) {
        const Py_UCS1* pa = PyUnicode_1BYTE_DATA(a);
        const Py_UCS1* pb = PyUnicode_1BYTE_DATA(b);
        const Py_ssize_t la = PyUnicode_GET_LENGTH(a);
        const Py_ssize_t lb = PyUnicode_GET_LENGTH(b);
        const Py_ssize_t common = la < lb ? la : lb;
        // Keys are short and usually differ early: a byte loop beats a call to memcmp.
        for (Py_ssize_t i = 0; i < common; ++i) {
            if (pa[i] != pb[i]) return pa[i] < pb[i];
        }
        return la < lb;
    }
    return PyUnicode_Compare(a, b) < 0;
}

// Sorts dict items by key as Python's sorted() would. Exact-str keys (nearly every parameter
// tree) compare in C without calling __lt__; anything else goes through list.sort so mixed or
// exotic keys behave exactly as in JAX, including its error for unorderable keys.
inline bool SortItems(PyObject* dict, Items& items, bool wrap_error) {
    const size_t n = items.size();
    if (n < 2) return true;
    bool all_str = true;
    for (size_t i = 0; i < n; ++i) {
        if (!PyUnicode_CheckExact(items[i].key)) {
            all_str = false;
            break;
        }
    }
    if (all_str) {
        if (n == 2) {  // {"kernel", "bias"}-style dicts are the common case
            if (StrLess(items[1].key, items[0].key)) std::swap(items[0], items[1]);
        } else {
            std::sort(items.begin(), items.end(),
                      [](const Item& a, const Item& b) { return StrLess(a.key, b.key); });
        }
        return true;
    }
    PyObject* keys = PyList_New(static_cast<Py_ssize_t>(n));
    if (keys == nullptr) return false;
    for (size_t i = 0; i < n; ++i) {
        PyList_SET_ITEM(keys, static_cast<Py_ssize_t>(i), Py_NewRef(items[i].key));
    }
    if (PyList_Sort(keys) < 0) {
        Py_DECREF(keys);
        if (wrap_error) {
            RaiseFromCurrent(PyExc_ValueError,
                             "Comparator raised exception while sorting pytree dictionary keys.");
        }
        return false;
    }
    // Re-pair values with the sorted keys.
    Items sorted;
    for (size_t i = 0; i < n; ++i) {
        PyObject* key = PyList_GET_ITEM(keys, static_cast<Py_ssize_t>(i));
        PyObject* value = PyDict_GetItemWithError(dict, key);
        if (value == nullptr) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
            ReleaseItems(sorted, 0);
            Py_DECREF(keys);
            return false;
        }
        sorted.push_back(Item{Py_NewRef(key), Py_NewRef(value)});
    }
    Py_DECREF(keys);
    ReleaseItems(items, 0);
    items = std::move(sorted);
    return true;
}

// `wrap_error`: a dict's unorderable keys raise JAX's C++ ValueError; a defaultdict (flattened
// by a Python function in JAX) lets sorted()'s own TypeError through.
inline bool GatherDictItems(PyObject* dict, Items& items, bool wrap_error = true) {
    PyObject* key;
    PyObject* value;
    Py_ssize_t pos = 0;
    // Borrowed while gathering (PyDict_Next runs no Python code), with every value's cache miss
    // requested up front so they overlap; the references are taken once all are in flight.
    while (PyDict_Next(dict, &pos, &key, &value)) {
        PrefetchForWrite(value);
        items.push_back(Item{key, value});
    }
    for (Item& item : items) {
        Py_INCREF(item.key);
        Py_INCREF(item.value);
    }
    if (!SortItems(dict, items, wrap_error)) {
        ReleaseItems(items, 0);
        return false;
    }
    return true;
}

// An OrderedDict's items in its own iteration order (it can differ from the underlying dict's):
// the keys first, then each value by lookup. Owned pairs; on failure `items` is left empty.
inline bool GatherOrderedItems(PyObject* obj, Items& items) {
    PyObject* keys = PySequence_List(obj);
    if (keys == nullptr) return false;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); ++i) {
        PyObject* key = PyList_GET_ITEM(keys, i);
        PyObject* value = PyObject_GetItem(obj, key);
        if (value == nullptr) {
            ReleaseItems(items, 0);
            Py_DECREF(keys);
            return false;
        }
        items.push_back(Item{Py_NewRef(key), value});
    }
    Py_DECREF(keys);
    return true;
}

}  // namespace fastree
