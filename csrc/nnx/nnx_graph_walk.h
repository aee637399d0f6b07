// What every nnx graph walk (nnx_graph_*.cpp) shares: the attribute names flax's walks read and
// set, interned once for the module's lifetime, and the record constructor (both in
// attr/nnx_shared.h, which tree mode shares); the kind tables' lookup;
// the outcome of a step; Python's own unpacking and dict iteration, for the places where flax's
// code runs them over containers that Python code (a callback, a finalizer) can change mid-walk.
#pragma once

#include <Python.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "attr/nnx_shared.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {

// The outcome of a step: kServed, kNotServed (flax's function must run), kFailed (error set).
enum Step : int { kFailed = -1, kNotServed = 0, kServed = 1 };

// The version tag CPython keeps for `type`: a new one whenever the type or a base is changed
// (PyType_Modified: a class attribute set or deleted, a base's too), never reused for another
// state or type; 0 where the type has none (it then counts as changed at every look).
inline unsigned int TypeVersion(PyTypeObject* type) {
#if PY_VERSION_HEX >= 0x030C0000
    if (type->tp_version_tag == 0) PyUnstable_Type_AssignVersionTag(type);
    return type->tp_version_tag;
#else
    if (!PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG)) {
        // A lookup through the type's attribute cache assigns a tag where it can (no Python
        // code runs: str keys in the MRO's dicts).
        _PyType_Lookup(type, GetNames()->dict);
        if (!PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
    }
    return type->tp_version_tag;
#endif
}

// `entry` if it has a kind table entry's shape (int, impl, type); null with an error set if not.
inline Ref CheckedEntry(Ref entry) {
    if (!PyTuple_CheckExact(entry.get()) || PyTuple_GET_SIZE(entry.get()) != 3 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(entry.get(), 0))) {
        PyErr_SetString(PyExc_SystemError, "nnx graph kinds: an entry is not (int, impl, type)");
        return Ref();
    }
    return entry;
}

// The entry (kind, impl, impl.type) of `key` (a type) in a kind table (the Python side's
// TypeTable, _flax_nnx_graph_kinds.py, which `classify` fills), asking `classify` on a miss, or
// where the class changed since its entry was made. Null with an error set.
//
// The table is the one owner of what is cached of a type: each value is (entry, version), the
// type's version tag (TypeVersion) taken before `classify` read the class. Entries are computed
// from the class's attributes (a Variable class's accessors, a Pytree's graph functions), so an
// entry made before the class changed is made again; clearing or pruning the table forgets
// both at once, and nothing here outlives it.
inline Ref KindEntry(PyObject* table, PyObject* classify, PyObject* key) {
    // The table holds each type by its canonical weak reference, so that it keeps no class alive
    // that flax would let go; while it does, PyWeakref_NewRef hands back that same object, with
    // no allocation. A key that is no type (a record naming something else) has no entry: it is
    // classified at each meeting.
    Ref stamped;
    if (PyType_Check(key)) {
        Ref weak_key(PyWeakref_NewRef(key, nullptr));
        if (!weak_key) return Ref();
        // A new reference from the lookup itself: the table is a dict the classifier (Python)
        // writes to, on any thread.
        PyObject* found;
        if (DictGetItemRef(table, weak_key.get(), &found) < 0) return Ref();
        stamped = Ref(found);
    }
    if (stamped) {
        if (!PyTuple_CheckExact(stamped.get()) || PyTuple_GET_SIZE(stamped.get()) != 2 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(stamped.get(), 1))) {
            PyErr_SetString(PyExc_SystemError,
                            "nnx graph kinds: a table value is not (entry, version)");
            return Ref();
        }
        auto* type = reinterpret_cast<PyTypeObject*>(key);
        // A type no one can change (int, str, numpy's and jax's arrays:
        // Py_TPFLAGS_IMMUTABLETYPE) keeps its entry without a look at its version: most lookups
        // are of such leaf types. Any other keeps it while its tag is the one stamped (0: the
        // type has no tag, and counts as changed at every look).
        bool current = PyType_HasFeature(type, Py_TPFLAGS_IMMUTABLETYPE);
        if (!current) {
            const unsigned int version = TypeVersion(type);
            current = version != 0 &&
                      PyLong_AsUnsignedLong(PyTuple_GET_ITEM(stamped.get(), 1)) == version;
            if (PyErr_Occurred()) return Ref();
        }
        if (current) return CheckedEntry(Ref::FromBorrowed(PyTuple_GET_ITEM(stamped.get(), 0)));
    }
    // The classifier writes the table's value, stamped with the tag it read first (a change
    // while it runs shows at the next look).
    Ref entry(PyObject_CallOneArg(classify, key));
    if (!entry) return Ref();
    return CheckedEntry(std::move(entry));
}

// The kind of a KindEntry result.
inline int KindOf(PyObject* entry) {
    return static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(entry, 0)));
}

// `first, second = obj`, as Python unpacks it (flax's `key, value = next(attribute_iter)`): an
// exact 2-tuple or 2-list at once, anything else through iter(); the TypeError and ValueErrors
// CPython raises. Both outputs owned. False with an error set.
inline bool UnpackPair(PyObject* obj, Ref* first, Ref* second) {
    if (PyTuple_CheckExact(obj) && PyTuple_GET_SIZE(obj) == 2) {
        *first = Ref::FromBorrowed(PyTuple_GET_ITEM(obj, 0));
        *second = Ref::FromBorrowed(PyTuple_GET_ITEM(obj, 1));
        return true;
    }
    if (PyList_CheckExact(obj)) {
        // Both taken in one step (CopyItemsIfSize: the list's critical section on free-threaded
        // builds, where another thread may change it).
        PyObject* pair[2];
        if (CopyItemsIfSize(obj, 2, pair)) {
            *first = Ref(pair[0]);
            *second = Ref(pair[1]);
            return true;
        }
    }
    Ref it(PyObject_GetIter(obj));
    if (!it) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) && Py_TYPE(obj)->tp_iter == nullptr &&
            !PySequence_Check(obj)) {
            PyErr_Format(PyExc_TypeError, "cannot unpack non-iterable %.200s object",
                         Py_TYPE(obj)->tp_name);
        }
        return false;
    }
    Ref* outs[2] = {first, second};
    for (int i = 0; i < 2; ++i) {
        *outs[i] = Ref(PyIter_Next(it.get()));
        if (!*outs[i]) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "not enough values to unpack (expected 2, got %d)",
                             i);
            }
            return false;
        }
    }
    Ref extra(PyIter_Next(it.get()));
    if (extra) {
#if PY_VERSION_HEX >= 0x030E0000
        // 3.14 names the count where the object has a length it knows.
        if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj) || PyDict_CheckExact(obj)) {
            PyErr_Format(PyExc_ValueError, "too many values to unpack (expected 2, got %zd)",
                         PyObject_Length(obj));
            return false;
        }
#endif
        PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        return false;
    }
    return !PyErr_Occurred();
}

// `for key, value in d.items()` over an exact dict, read live as Python's dict iterator reads it:
// the size taken when iteration starts, "dictionary changed size during iteration" at the next
// step once it differs, "dictionary keys changed during iteration" once more entries come than
// there were. flax's walks iterate so while they run Python code (an allocation's GC, a flag's
// __bool__, an update): a snapshot would hide a change that makes flax's walk raise.
class LiveItems {
 public:
    explicit LiveItems(PyObject* dict)
        : dict_(Ref::FromBorrowed(dict)), used_(PyDict_GET_SIZE(dict)), left_(used_) {}

    // 1 with both set (owned), 0 at the end, -1 with the RuntimeError set.
    // Each step reads the size and the next entry, and takes its references, in the dict's
    // critical section (a bare block under the GIL): another thread may change the dict between
    // steps, as the walk's own Python code may, and is seen the same way; the errors are set
    // after the section.
    int Next(Ref* key, Ref* value) {
        int got;
        PyObject* k = nullptr;
        PyObject* v = nullptr;
        FASTREE_BEGIN_CRITICAL_SECTION(dict_.get());
        if (used_ != PyDict_GET_SIZE(dict_.get())) {
            got = -1;
        } else if (!PyDict_Next(dict_.get(), &pos_, &k, &v)) {
            got = 0;
        } else if (left_ == 0) {
            got = -2;
        } else {
            --left_;
            Py_INCREF(k);
            Py_INCREF(v);
            got = 1;
        }
        FASTREE_END_CRITICAL_SECTION();
        if (got == -1) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
            return -1;
        }
        if (got == -2) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary keys changed during iteration");
            return -1;
        }
        if (got == 1) {
            *key = Ref(k);
            *value = Ref(v);
        }
        return got;
    }

 private:
    Ref dict_;
    const Py_ssize_t used_;
    Py_ssize_t left_;
    Py_ssize_t pos_ = 0;
};

// The key path being walked as a tuple (a leaf's path in the flatten, a merged state's path).
// A new reference, or null with an error set. `keys` are held by the caller throughout.
inline PyObject* PathTuple(const std::vector<PyObject*>& keys) {
    PyObject* path = PyTuple_New(static_cast<Py_ssize_t>(keys.size()));
    if (path == nullptr) return nullptr;
    for (size_t i = 0; i < keys.size(); ++i) {
        PyTuple_SET_ITEM(path, static_cast<Py_ssize_t>(i), Py_NewRef(keys[i]));
    }
    return path;
}

// A (key, value) child of a node, and whether the node marks it data (1), static (0), or
// leaves it to the value's kind (-1), as flax's DataElem/StaticElem wrappers do.
struct Child {
    Ref key;
    Ref value;
    int is_data;
};

// Pytree._graph_node_flatten's nodes: `sorted(vars(self).items())`, names read as ints where
// the class has int keys, each marked data or static by `_pytree__nodes` (an exact
// `flags_type`, flax's HashableMapping). vars(self) is read live, as flax's generators read it.
// kNotServed (nothing taken) for names other than exact str or flags of another type.
Step PytreeChildren(PyObject* node, PyObject* flags_type, std::vector<Child>* children);

// flax's own list/tuple/dict/None registrations: enumerate, sorted items (exact str keys only:
// kNotServed otherwise), nothing. `kind` is kList, kTuple, kDict or kNone.
Step BuiltinChildren(PyObject* node, int kind, std::vector<Child>* children);

}  // namespace fastree::nnx_graph
