// Unflatten: (treedef, leaves) -> tree. Walks the post-order nodes with a value stack.
#include "util/pyutils.h"
#include "treedef/treedef.h"
#include "treedef/walkers.h"
#include "treedef/unflatten_with.h"

namespace fastree {
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
        Ref held = Ref::FromBorrowed(leaves);
        const Py_ssize_t expected = def.num_leaves();
        Ref out(UnflattenWith(def, [leaves, expected](Py_ssize_t i) -> PyObject* {
#ifndef Py_GIL_DISABLED
            // No read ahead where another thread may resize the list (a data race on its item
            // array); ListItemRef below takes each leaf with PyList_GetItemRef there.
            if (i + kPrefetchDistance < PyList_GET_SIZE(leaves)) {
                PrefetchForWrite(PyList_GET_ITEM(leaves, i + kPrefetchDistance));
            }
#endif
            PyObject* leaf = ListItemRef(leaves, i);
            if (leaf == nullptr) {
                PyErr_Format(PyExc_ValueError,
                             "Too few leaves for PyTreeDef; expected %zd, got %zd", expected, i);
            }
            return leaf;
        }));
        if (out && PyList_GET_SIZE(leaves) != expected) {
            // Dropping the built tree may run finalizers; the error is set after that.
            out = Ref();
            PyErr_Format(PyExc_ValueError, "Too many leaves for PyTreeDef; expected %zd.",
                         expected);
        }
        return out.release();
    }
    Ref seq(PySequence_Tuple(leaves));
    if (!seq) return nullptr;
    return Unflatten(def, &PyTuple_GET_ITEM(seq.get(), 0), PyTuple_GET_SIZE(seq.get()));
}

}  // namespace fastree
