// Unflatten: (treedef, leaves) -> tree. Walks the post-order nodes with a value stack.
#include "pyutils.h"
#include "treedef.h"
#include "walkers.h"
#include "unflatten_with.h"

namespace fastree {
namespace {

// Moves `n` owned references into a new tuple.
PyObject* StealTuple(PyObject** items, Py_ssize_t n) {
    PyObject* t = PyTuple_New(n);
    if (t == nullptr) {
        for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(items[i]);
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

// Fills `mapping` with keys[i] -> children[i] (children consumed).
bool FillMapping(PyObject* mapping, PyObject* const* keys, PyObject** children, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (PyObject_SetItem(mapping, keys[i], children[i]) < 0) {
            for (Py_ssize_t j = i; j < n; ++j) Py_DECREF(children[j]);
            return false;
        }
        Py_DECREF(children[i]);
    }
    return true;
}

PyObject* BuildMapping(PyObject* mapping, PyObject* keys_tuple, PyObject** children, Py_ssize_t n) {
    if (mapping == nullptr) {
        for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(children[i]);
        return nullptr;
    }
    if (!PyTuple_Check(keys_tuple) || PyTuple_GET_SIZE(keys_tuple) != n) {
        PyErr_SetString(PyExc_ValueError, "fastree: corrupt mapping node data");
        for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(children[i]);
        Py_DECREF(mapping);
        return nullptr;
    }
    if (!FillMapping(mapping, &PyTuple_GET_ITEM(keys_tuple, 0), children, n)) {
        Py_DECREF(mapping);
        return nullptr;
    }
    return mapping;
}

}  // namespace

PyObject* BuildDataclass(const Registration* reg, PyObject* meta_values, PyObject** children) {
    const Py_ssize_t n = PyTuple_GET_SIZE(reg->data_fields);
    PyObject* kwargs = PyDict_New();
    bool ok = kwargs != nullptr;
    const Py_ssize_t m = PyTuple_GET_SIZE(reg->meta_fields);
    for (Py_ssize_t i = 0; ok && i < m; ++i) {
        ok = PyDict_SetItem(kwargs, PyTuple_GET_ITEM(reg->meta_fields, i),
                            PyTuple_GET_ITEM(meta_values, i)) == 0;
    }
    for (Py_ssize_t i = 0; ok && i < n; ++i) {
        ok = PyDict_SetItem(kwargs, PyTuple_GET_ITEM(reg->data_fields, i), children[i]) == 0;
    }
    for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(children[i]);
    if (!ok) {
        Py_XDECREF(kwargs);
        return nullptr;
    }
    PyObject* empty = PyTuple_New(0);
    PyObject* out = empty ? PyObject_Call(reg->type, empty, kwargs) : nullptr;
    Py_XDECREF(empty);
    Py_DECREF(kwargs);
    return out;
}

PyObject* BuildNode(const TreeDef& def, const Node& node, PyObject** children) {
    const Py_ssize_t n = node.arity;
    // Only valid for the kinds with a payload (the cases below that use it).
    auto payload = [&]() -> const NodePayload& { return def.payloads[node.payload]; };
    switch (node.kind) {
        case NodeKind::kLeaf:
        case NodeKind::kSharedRef:
            PyErr_SetString(PyExc_SystemError, "fastree: BuildNode called on a leaf or reference");
            return nullptr;
        case NodeKind::kNone:
            return Py_NewRef(Py_None);
        case NodeKind::kTuple:
            return StealTuple(children, n);
        case NodeKind::kList: {
            PyObject* list = PyList_New(n);
            if (list == nullptr) {
                for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(children[i]);
                return nullptr;
            }
            for (Py_ssize_t i = 0; i < n; ++i) PyList_SET_ITEM(list, i, children[i]);
            return list;
        }
        case NodeKind::kDict:
            return BuildDict(def.keys.data() + node.keys_begin, children, n);
        case NodeKind::kNamedTuple: {
            PyObject* args = StealTuple(children, n);
            if (args == nullptr) return nullptr;
            PyObject* out = PyObject_Call(payload().data, args, nullptr);
            Py_DECREF(args);
            return out;
        }
        case NodeKind::kOrderedDict:
            return BuildMapping(PyObject_CallNoArgs(payload().custom->type), payload().data,
                                children, n);
        case NodeKind::kDefaultDict:
            return BuildMapping(PyObject_CallOneArg(payload().custom->type,
                                                    PyTuple_GET_ITEM(payload().data, 0)),
                                PyTuple_GET_ITEM(payload().data, 1), children, n);
        case NodeKind::kDataclass:
            return BuildDataclass(payload().custom, payload().data, children);
        case NodeKind::kCustom: {
            PyObject* tuple = StealTuple(children, n);
            if (tuple == nullptr) return nullptr;
            PyObject* args[2] = {payload().data, tuple};
            PyObject* out = PyObject_Vectorcall(payload().custom->unflatten, args, 2, nullptr);
            Py_DECREF(tuple);
            return out;
        }
    }
    PyErr_SetString(PyExc_SystemError, "fastree: unknown node kind");
    return nullptr;
}

bool CheckLeafCount(const TreeDef& def, Py_ssize_t n) {
    const Py_ssize_t expected = def.num_leaves();
    if (n < expected) {
        PyErr_Format(PyExc_ValueError, "Too few leaves for PyTreeDef; expected %zd, got %zd",
                     expected, n);
        return false;
    }
    if (n > expected) {
        PyErr_Format(PyExc_ValueError, "Too many leaves for PyTreeDef; expected %zd.", expected);
        return false;
    }
    return true;
}

PyObject* Unflatten(const TreeDef& def, PyObject* const* leaves, Py_ssize_t n) {
    if (!CheckLeafCount(def, n)) return nullptr;
    return UnflattenWith(def, [leaves, n](Py_ssize_t i) {
        if (i + kPrefetchDistance < n) PrefetchForWrite(leaves[i + kPrefetchDistance]);
        return Py_NewRef(leaves[i]);
    });
}

PyObject* UnflattenIterable(const TreeDef& def, PyObject* leaves) {
    if (PyObject* out = UnflattenLeafSequence(def, leaves)) return out;
    if (PyErr_Occurred()) return nullptr;
    if (PyTuple_CheckExact(leaves)) {
        return Unflatten(def, &PyTuple_GET_ITEM(leaves, 0), PyTuple_GET_SIZE(leaves));
    }
    if (PyList_CheckExact(leaves)) {
        if (!CheckLeafCount(def, PyList_GET_SIZE(leaves))) return nullptr;
        // Read in place rather than snapshotted (a copy and an extra INCREF/DECREF of every
        // leaf). A custom unflatten function may mutate the list meanwhile, so, as JAX's
        // iteration over it does, each position is read (bounds-checked) when it is reached,
        // and the list must end where the treedef does: a list that shrank gives "Too few
        // leaves", one that grew "Too many leaves", never a tree built from a shifted list.
        // The list itself is held so that it outlives any such callback.
        Ref held(Py_NewRef(leaves));
        const Py_ssize_t expected = def.num_leaves();
        Ref out(UnflattenWith(def, [leaves, expected](Py_ssize_t i) -> PyObject* {
            if (i + kPrefetchDistance < PyList_GET_SIZE(leaves)) {
                PrefetchForWrite(PyList_GET_ITEM(leaves, i + kPrefetchDistance));
            }
            if (i >= PyList_GET_SIZE(leaves)) {
                PyErr_Format(PyExc_ValueError,
                             "Too few leaves for PyTreeDef; expected %zd, got %zd", expected, i);
                return nullptr;
            }
            return Py_NewRef(PyList_GET_ITEM(leaves, i));
        }));
        if (out && PyList_GET_SIZE(leaves) != expected) {
            // Dropping the built tree may run finalizers; the error is set after that.
            out = Ref();
            PyErr_Format(PyExc_ValueError, "Too many leaves for PyTreeDef; expected %zd.",
                         expected);
        }
        return out.release();
    }
    PyObject* seq = PySequence_Tuple(leaves);
    if (seq == nullptr) return nullptr;
    PyObject* out = Unflatten(def, &PyTuple_GET_ITEM(seq, 0), PyTuple_GET_SIZE(seq));
    Py_DECREF(seq);
    return out;
}

}  // namespace fastree
