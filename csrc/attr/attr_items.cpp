// The items layout of attribute nodes (see attr_items.h for the layout).
#include "attr/attr_items.h"

#include <algorithm>

#include "attr/attr_mapping.h"
#include "attr/attr_node_internal.h"
#include "registry/dict_items.h"
#include "registry/key_sort.h"
#include "registry/keys.h"
#include "util/free_threading.h"
#include "util/pyutils.h"

namespace fastree {
namespace attr {
namespace {

// The dict's (key, value) pairs, owned, as one snapshot: taken inside its critical section (a
// bare block on GIL builds), where nothing runs Python code, and owned before leaving it. False
// (nothing taken, no error) when a key is not an exact str, or not an exact int where the first
// was one: sorted() would compare through Python code, or raise.
bool TakeSortableItems(PyObject* dict, Items& items) {
    bool sortable = true;
    FASTREE_BEGIN_CRITICAL_SECTION(dict);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    bool ints = false;
    while (sortable && PyDict_Next(dict, &pos, &key, &value)) {
        const bool is_int = PyLong_CheckExact(key);
        if (items.size() == 0) ints = is_int;  // the first key decides: all str, or all int
        sortable = is_int ? ints : (!ints && PyUnicode_CheckExact(key));
        if (sortable) {
            try {  // C++ allocation runs no Python code; a throw is caught inside the section
                items.push_back(Item{Py_NewRef(key), Py_NewRef(value)});
            } catch (...) {
                Py_DECREF(key);
                Py_DECREF(value);
                sortable = false;
            }
        }
    }
    FASTREE_END_CRITICAL_SECTION();
    if (!sortable) items.Release(0);
    return sortable;
}

// An instance the layout cannot read: the library's where the node has its functions, else a
// TypeError saying why (a node registered directly, with no library behind it).
Outcome NotReadable(const AttrNode* node, const char* why) {
    if (HasFunction(node, &AttrNode::library_flatten)) return Outcome::kLibraryOnce;
    PyErr_Format(PyExc_TypeError, "attribute node of %.200s: %s (attribute %R)",
                 reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, why, node->items_field);
    return Outcome::kError;
}

}  // namespace

Outcome ReadItems(const AttrNode* node, PyObject* dict, bool want_aux, Fields* out) {
    Ref mapping(PlainAttribute(node->cls, dict, node->items_field));
    if (!mapping) {
        if (PyErr_Occurred()) return Outcome::kError;
        return NotReadable(node, "the instance has no plain dict attribute to read");
    }
    if (!PyDict_CheckExact(mapping.get())) {
        return NotReadable(node, "the attribute to read is not an exact dict");
    }
    Items items;
    if (!TakeSortableItems(mapping.get(), items)) {
        return NotReadable(node, "the dict's keys are not all exact str or all exact int");
    }
    // Exact str or exact int keys, unique: KeyLess runs no Python code, and sorted()'s tuple
    // comparison of (key, value) pairs never reaches a value.
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        return PyUnicode_CheckExact(a.key) ? StrLess(a.key, b.key) : KeyLess(a.key, b.key);
    });
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    Ref aux;
    if (want_aux) {
        aux = Ref(PyTuple_New(n));
        if (!aux) return Outcome::kError;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        Item& item = items[static_cast<size_t>(i)];
        out->children.push_back(nullptr);  // the slot first: a push that throws leaks nothing
        out->children[static_cast<size_t>(i)] = item.value;
        item.value = nullptr;
        if (aux) {
            PyTuple_SET_ITEM(aux.get(), i, item.key);
        } else {
            Py_DECREF(item.key);
        }
        item.key = nullptr;
    }
    items.Forget();  // every pair handed on
    out->aux = std::move(aux);
    return Outcome::kNative;
}

bool CheckItemsAux(const AttrNode* node, PyObject* aux, Py_ssize_t arity) {
    if (PyTuple_Check(aux) && PyTuple_GET_SIZE(aux) == arity) return true;
    PyErr_Format(PyExc_ValueError,
                 "attribute node of %.200s: expected aux data a tuple of %zd keys, got %.200R",
                 reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, arity, aux);
    return false;
}

PyObject* BuildItems(AttrNode* node, PyObject* aux, PyObject* const* children, Py_ssize_t n) {
    if (!(PyTuple_Check(aux) && PyTuple_GET_SIZE(aux) == n) &&
        HasFunction(node, &AttrNode::library_unflatten)) {
        // Not the aux data a read makes: the library's rebuild (its zip() pairs the shorter).
        return LibraryRebuild(node, aux, children, n);
    }
    if (!CheckItemsAux(node, aux, n)) return nullptr;
    // `aux` and `children` are the caller's and stay alive. Each insertion hashes a key, as
    // dict(zip(aux, children)) does (a user's key type runs its __hash__ there too).
    Ref items(PyDict_New());
    if (!items) return nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (PyDict_SetItem(items.get(), PyTuple_GET_ITEM(aux, i), children[i]) < 0) return nullptr;
    }
    Ref obj(NewInstance(node->cls));
    if (!obj) return nullptr;
    // object.__setattr__, as the library's __init__ sets it (through super(), past the class's
    // own __setattr__, which writes into the dict instead).
    if (PyObject_GenericSetAttr(obj.get(), node->items_field, items.get()) < 0) return nullptr;
    return obj.release();
}

PyObject* ItemsChildKey(PyObject* aux, Py_ssize_t k) {
    return keys::Dict(PyTuple_GET_ITEM(aux, k));
}

}  // namespace attr
}  // namespace fastree
