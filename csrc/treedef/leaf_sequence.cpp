// The commonest small tree, a tuple or list whose items are all leaves (a 3-tuple of arrays, a
// flat parameter list), flattened and rebuilt without the general walkers.
//
// On such trees the walkers' set-up (pooled buffers, the walker object, a node vector grown then
// copied to its exact size) was most of the call: flatten of a 3-leaf tuple cost 1.5x the
// minimal C prototype. Here each result is allocated once at its exact size and filled in one
// pass. The results are the general path's exactly (the same node bytes, so treedefs compare
// and hash equal); anything the fast path cannot decide without running Python code (a type not
// classified yet, a tuple subclass, is_leaf, key paths) falls back to the general path.
#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "util/small_vector.h"
#include "treedef/treedef.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

// The kinds this file handles (constants: compared without a load).
constexpr NodeKind kTupleKind = kinds::TupleKind::kKind;
constexpr NodeKind kListKind = kinds::ListKind::kKind;

// The items of an exact tuple or list, or null.
PyObject* const* SequenceItems(PyObject* obj, NodeKind* kind) {
    if (PyTuple_CheckExact(obj)) {
        *kind = kTupleKind;
        return &PyTuple_GET_ITEM(obj, 0);
    }
    if (PyList_CheckExact(obj)) {
        *kind = kListKind;
        return &PyList_GET_ITEM(obj, 0);
    }
    return nullptr;
}

// The treedef of a tuple or list (`kind`) of `n` leaves: the general walk's nodes exactly.
TreeDef LeafSequenceDef(NodeKind kind, Py_ssize_t n) {
    TreeDef def;
    def.nodes.reserve(static_cast<size_t>(n) + 1);
    def.nodes.assign(static_cast<size_t>(n), kLeafNode);
    Node& root = def.AppendNode();
    root.kind = kind;
    root.arity = static_cast<Count>(n);
    root.num_leaves = static_cast<Count>(n);
    root.num_nodes = static_cast<Count>(n + 1);
    return def;
}

// At most this many leaves, tree_map gathers f's results before making the output.
constexpr Py_ssize_t kSmallMap = 8;

// MapLeafSequence for at most kSmallMap items: f's results are gathered in a buffer here and the
// output is made around them once the last is in, so it is never seen half built and is not
// hidden from the cyclic GC meanwhile (its untrack and track were a tenth of tree_map on a
// 3-tuple). Null with no error set where the general path must read `tree` (not all plain
// leaves, or resized meanwhile); null with f's error set.
PyObject* MapSmallLeafSequence(PyObject* f, PyObject* tree, NodeKind kind, Py_ssize_t n) {
    // A tuple's items are read where they are: the tuple cannot change, and the caller holds
    // it for the call. A list's are taken first (owned from here): f may remove them from it,
    // and on free-threaded builds another thread may at any time (taken in one step, classified
    // after: see FlattenLeafSequence). Their six reference count writes and the release were a
    // seventh of fastree's instructions in tree_map on a 3-tuple (callgrind).
    const bool taken = kind == kListKind;
    PyObject* held[kSmallMap];
    PyObject* const* items;
    if (!taken) {
        items = &PyTuple_GET_ITEM(tree, 0);
    } else {
#ifdef Py_GIL_DISABLED
        if (!CopyItemsIfSize(tree, n, held)) return nullptr;  // resized: the general path reads it
#else
        PyObject* const* listed = reinterpret_cast<PyListObject*>(tree)->ob_item;
        for (Py_ssize_t i = 0; i < n; ++i) held[i] = Py_NewRef(listed[i]);
#endif
        items = held;
    }
    PyObject* results[kSmallMap];
    Py_ssize_t done = 0;  // results made (owned)
    PyObject* out = nullptr;
    // Not all plain leaves: the general path reads it (items taken are also held by `tree`, so
    // releasing them runs no Python code).
    registry::PlainLeafRun plain;
    Py_ssize_t plain_items = 0;
    while (plain_items < n && plain(items[plain_items])) ++plain_items;
    if (plain_items == n) {
        for (; done < n; ++done) {
            PyObject* args[2] = {nullptr, items[done]};
            results[done] =
                PyObject_Vectorcall(f, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
            if (results[done] == nullptr) break;  // f's error
        }
        if (done == n) out = StealIntoNewSequence(results, n, kind == kTupleKind);
    }
    // Plain loops, not a closure over n and done: one kept them in memory across every call.
    if (taken) {
        for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(held[i]);
    }
    if (out == nullptr) {  // the results made, if any
        for (Py_ssize_t i = 0; i < done; ++i) Py_DECREF(results[i]);
    }
    return out;
}

}  // namespace

PyObject* FlattenLeafSequence(PyObject* tree, bool want_leaves, bool want_def) {
    NodeKind kind;
    PyObject* const* first_items = SequenceItems(tree, &kind);
    if (first_items == nullptr) return nullptr;
    const Py_ssize_t n = SharedSize(tree);
    if (n > INT32_MAX) return nullptr;
#ifndef Py_GIL_DISABLED
    if (!want_leaves) {
        // The structure alone: the items are only classified, with nothing allocated before the
        // last is (no cyclic GC, so no finalizer, can change a list `tree` meanwhile).
        registry::PlainLeafRun plain;
        for (Py_ssize_t i = 0; i < n; ++i) {
            if (!plain(first_items[i])) return nullptr;
        }
        return WrapTreeDef(LeafSequenceDef(kind, n));
    }
#endif
    // The result list first: allocating can run the cyclic GC, whose finalizers may change a
    // list `tree`. The items are read after it, and nothing from there to the end of the copy
    // runs Python code (ClassifyCached never does).
    Ref leaves(NewList(n));
    if (!leaves) return nullptr;
#ifdef Py_GIL_DISABLED
    // Another thread may resize a list `tree` or replace its items at any moment: the items are
    // taken first, in one step (CopyItemsIfSize, in the list's critical section), and classified
    // after it (nothing classifies inside a section). Not all plain leaves: `leaves` releases
    // them (another thread may have dropped `tree`'s references meanwhile: that runs outside any
    // section, like any release).
    if (!CopyItemsIfSize(tree, n, reinterpret_cast<PyListObject*>(leaves.get())->ob_item)) {
        return nullptr;  // resized meanwhile (no error: the general path reads it as it is)
    }
    registry::PlainLeafRun plain;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!plain(PyList_GET_ITEM(leaves.get(), i))) return nullptr;
    }
#else
    // Failed (error set), or resized meanwhile (no error: the general path reads it as it is).
    if (SharedSize(tree) != n) return nullptr;
    PyObject* const* items = SequenceItems(tree, &kind);
    registry::PlainLeafRun plain;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!plain(items[i])) {
            // Not all plain leaves (nodes, leaves JAX warns about), or not decidable here: drop
            // what was copied (the references are also held by `tree`, so no object dies and no
            // Python code runs).
            return nullptr;
        }
        PyList_SET_ITEM(leaves.get(), i, Py_NewRef(items[i]));
    }
#endif
    if (!want_def) return leaves.release();
    Ref treedef(WrapTreeDef(LeafSequenceDef(kind, n)));
    if (!treedef) return nullptr;
    if (!want_leaves) return treedef.release();
    PyObject* pair = PyTuple_New(2);
    if (pair == nullptr) return nullptr;
    PyTuple_SET_ITEM(pair, 0, leaves.release());  // steals
    PyTuple_SET_ITEM(pair, 1, treedef.release());
    return pair;
}

PyObject* MapLeafSequence(PyObject* f, PyObject* tree) {
    NodeKind kind;
    if (SequenceItems(tree, &kind) == nullptr) return nullptr;
    const Py_ssize_t n = SharedSize(tree);
    if (n == 0) {
        // Nothing to map (and PyTuple_New(0) is a shared singleton, never to be untracked).
        return kind == kTupleKind ? PyTuple_New(0) : PyList_New(0);
    }
    if (n <= kSmallMap) return MapSmallLeafSequence(f, tree, kind, n);
    // The output is f's results' only home, and until the last one is in it is the walk's
    // private buffer: untracked by the cyclic GC at once, so no gc.get_referrers finds it half
    // built, and no reference to it leaves here before it is complete. A container Python could
    // reach half built could be resized under the walk (tests/test_half_built_outputs.py).
    // Allocating can run the cyclic GC, whose finalizers may change a list `tree`: the items are
    // read after it, and nothing from there to the end of the first pass runs Python code.
    Ref out(kind == kTupleKind ? PyTuple_New(n) : NewList(n));
    if (!out) return nullptr;
    PyObject_GC_UnTrack(out.get());
    PyObject** slots = kind == kTupleKind ? &PyTuple_GET_ITEM(out.get(), 0)
                                          : reinterpret_cast<PyListObject*>(out.get())->ob_item;
#ifdef Py_GIL_DISABLED
    // Taken first in one step, classified after (see FlattenLeafSequence).
    if (!CopyItemsIfSize(tree, n, slots)) return nullptr;  // resized: the general path reads it
    registry::PlainLeafRun plain;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!plain(slots[i])) return nullptr;
    }
#else
    if (SharedSize(tree) != n) return nullptr;  // resized meanwhile: the general path reads it
    PyObject* const* items = SequenceItems(tree, &kind);
    // One pass: each item classified and taken. Owning them all before f first runs keeps the
    // items f may remove from a list `tree` (JAX, flattening first, maps them all).
    registry::PlainLeafRun plain;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!plain(items[i])) {
            // Not all plain leaves (see FlattenLeafSequence): `out` releases what was taken
            // (also held by `tree`: no object dies, no Python code runs).
            return nullptr;
        }
        slots[i] = Py_NewRef(items[i]);
    }
#endif
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* args[2] = {nullptr, slots[i]};
        PyObject* r = PyObject_Vectorcall(f, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
        if (r == nullptr) return nullptr;  // f's error; `out` releases the rest
        Py_SETREF(slots[i], r);
    }
    PyObject_GC_Track(out.get());  // complete: from here on an ordinary container
    return out.release();
}

PyObject* UnflattenLeafSequence(const TreeDef& def, PyObject* leaves) {
    if (def.nodes.empty()) return nullptr;
    const Node& root = def.nodes.back();
    if (root.kind != kTupleKind && root.kind != kListKind) return nullptr;
    if (root.num_nodes != root.arity + 1 || root.num_leaves != root.arity) return nullptr;
    NodeKind leaves_kind;
    if (SequenceItems(leaves, &leaves_kind) == nullptr || SharedSize(leaves) != root.arity) {
        return nullptr;  // the general path reads other iterables and raises the count errors
    }
    const Py_ssize_t n = root.arity;
    Ref out(root.kind == kTupleKind ? PyTuple_New(n) : NewList(n));
    // Read after the allocation (see FlattenLeafSequence); a list resized meanwhile is left to
    // the general path, which raises JAX's leaf-count error for it.
    if (!out) return nullptr;
    // Raw references, one per leaf, written straight into `out`'s slots: `out` owns them. The
    // size check and the copy are one step (CopyItemsIfSize: a list's critical section on
    // free-threaded builds).
    PyObject** target = root.kind == kTupleKind
                            ? &PyTuple_GET_ITEM(out.get(), 0)
                            : reinterpret_cast<PyListObject*>(out.get())->ob_item;
    if (!CopyItemsIfSize(leaves, n, target)) return nullptr;
    return out.release();
}

}  // namespace fastree
