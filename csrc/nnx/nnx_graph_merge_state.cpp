// flax.nnx graphlib._merge_to_flat_state (nnx.merge's states to leaves), natively (nnx_graph.h).
//
// flax: every state's `traversals.flatten_to_sequence` ((path, leaf) pairs, recursing into each
// Mapping's items, in order), all concatenated, then `list.sort()` of the pairs, then the leaves.
// Here the pairs are gathered from exact States (their `_mapping` dicts, whose nested dicts a
// State hands out as States) and dicts, and sorted by the same list.sort.
#include <vector>

#include "nnx/nnx_graph.h"
#include "nnx/nnx_graph_walk.h"
#include "nnx/nnx_graph_variables.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {
namespace {

class Gather {
 public:
    explicit Gather(PyObject* context) : ctx_(context), vars_(context) {}

    // One state of the `states` sequence.
    Step State(PyObject* state) {
        Ref raw = Raw(state);
        if (!raw) return PyErr_Occurred() ? kFailed : kNotServed;
        return Mapping(raw.get());
    }

    PyObject* SortedLeaves() {
        Ref pairs(StealIntoSequence(pairs_, false));
        if (!pairs || PyList_Sort(pairs.get()) < 0) return nullptr;
        const Py_ssize_t n = PyList_GET_SIZE(pairs.get());
        Ref leaves(NewList(n));
        if (!leaves) return nullptr;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* value = PyTuple_GET_ITEM(PyList_GET_ITEM(pairs.get(), i), 1);
            PyList_SET_ITEM(leaves.get(), i, Py_NewRef(value));
        }
        return leaves.release();
    }

 private:
    PyObject* Item(Py_ssize_t i) const { return PyTuple_GET_ITEM(ctx_, i); }

    // The dict whose items a State or dict yields, or null (no error) for another kind.
    Ref Raw(PyObject* obj) {
        if (PyDict_CheckExact(obj)) return Ref::FromBorrowed(obj);
        if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(Item(kStateType))) return Ref();
        Ref raw(PyObject_GetAttr(obj, GetNames()->mapping));
        if (raw && !PyDict_CheckExact(raw.get())) return Ref();
        return raw;
    }

    // `_flatten(xs, prefix)` over a mapping's items.
    Step Mapping(PyObject* dict) {
        if (static_cast<int>(path_.size()) >= kMaxNativeDepth) return kNotServed;
        RecursionGuard guard(" in nnx merge");
        if (!guard.ok()) return kFailed;
        // `for key, value in xs.items()`, live: a value's isinstance (or a GC) can run Python
        // code, and a change to the dict meanwhile raises as flax's loop raises.
        LiveItems items(dict);
        for (;;) {
            Ref k, v;
            const int got = items.Next(&k, &v);
            if (got < 0) return kFailed;
            if (got == 0) return kServed;
            // A key other than str or int (a user's class, whose __hash__ and __eq__ flax's
            // function runs as its dict handling does): flax's function, so that they run as
            // often as without fastree.
            if (!PyUnicode_CheckExact(k.get()) && !PyLong_CheckExact(k.get())) return kNotServed;
            PushOwned(path_, k.release());
            Step step = Value(v.get());
            Py_DECREF(path_.back());
            path_.pop_back();
            if (step != kServed) return step;
        }
    }

    Step Value(PyObject* value) {
        Ref raw = Raw(value);
        if (raw) return Mapping(raw.get());
        if (PyErr_Occurred()) return kFailed;
        // A leaf unless it is some other Mapping (flax recurses into any): a Variable or an
        // array never is; any other type is asked, and a Mapping of another kind is not served.
        Ref entry = vars_.LeafEntry(Py_TYPE(value));
        if (!entry) return kFailed;
        const int kind = KindOf(entry.get());
        if (kind != kVariable && kind != kArrayLeaf) {
            const int is = PyObject_IsInstance(value, Item(kMappingAbc));
            if (is < 0) return kFailed;
            if (is) return kNotServed;
        }
        PyObject* path = PathTuple(path_);
        if (path == nullptr) return kFailed;
        Ref held_path(path);
        PyObject* pair = PyTuple_Pack(2, path, value);
        if (pair == nullptr) return kFailed;
        PushOwned(pairs_, pair);
        return kServed;
    }

    PyObject* const ctx_;  // borrowed: the caller holds it for the call
    VariableOps vars_;
    RefVector path_;   // the keys down to the current value
    RefVector pairs_;  // (path, leaf)
};

}  // namespace

PyObject* MergeLeaves(PyObject* states, PyObject* context) {
    if (!PyTuple_CheckExact(states) || !PyTuple_CheckExact(context) ||
        PyTuple_GET_SIZE(context) != kUnflattenSize) {
        PyErr_SetString(PyExc_TypeError, "nnx_graph_merge_leaves(states: tuple, context: tuple)");
        return nullptr;
    }
    Gather gather(context);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(states); ++i) {
        Ref state = Ref::FromBorrowed(PyTuple_GET_ITEM(states, i));
        switch (gather.State(state.get())) {
            case kFailed:
                return nullptr;
            case kNotServed:
                Py_RETURN_NONE;
            case kServed:
                break;
        }
    }
    return gather.SortedLeaves();
}

}  // namespace fastree::nnx_graph
