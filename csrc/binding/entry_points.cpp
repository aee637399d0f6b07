// The hot module-level functions, as raw METH_FASTCALL | METH_KEYWORDS C functions.
//
// pybind11's dispatcher costs a few hundred nanoseconds per call (argument loaders, overload
// resolution, casting the result), which is the whole budget of flattening a 3-leaf tuple. These
// wrappers only parse arguments and shape results; the work is in treedef/*.cpp.
#include "binding/entry_points.h"

#include <optional>

#include "diagnostics/aux_check.h"
#include "util/pyutils.h"
#include "util/scratch.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

constexpr const char* kTreeIsLeaf[] = {"tree", "is_leaf"};
constexpr const char* kTreeIsLeafPath[] = {"tree", "is_leaf", "is_leaf_takes_path"};
constexpr const char* kMapNames[] = {"f", "tree", "is_leaf"};
constexpr const char* kMapPathNames[] = {"f", "tree", "is_leaf", "is_leaf_takes_path"};
constexpr const char* kUnflattenNames[] = {"treedef", "leaves"};

PyObject* ListFrom(std::vector<PyObject*>& items) {
    PyObject* list = StealIntoList(items);
    if (list == nullptr) DecrefAll(items);
    return list;
}

// flatten with or without paths; returns (list, treedef) or just one of them.
enum class Want { kLeaves, kStructure, kBoth };

// A tuple or list of plain leaves, flattened without a walk (leaf_sequence.cpp); null with no
// error set where the walk must read it.
PyObject* FlattenLeaves(PyObject* tree, Want want) {
    return FlattenLeafSequence(tree, want != Want::kStructure, want != Want::kLeaves);
}

// The walk, inside the entry point's report scope (aux::ReportAfter).
PyObject* DoFlatten(PyObject* tree, PyObject* is_leaf, bool takes_path, bool with_path, Want want) {
    TreeDef def;
    if (want == Want::kStructure && !with_path) {  // the leaves are counted, not kept
        if (!Flatten(tree, is_leaf, takes_path, &def, nullptr, nullptr)) return nullptr;
        return WrapTreeDef(std::move(def));
    }
    ScratchVector leaves_buf;
    std::optional<ScratchVector> paths_buf;  // only taken from the pool when paths are wanted
    RefVector no_paths;
    if (with_path) paths_buf.emplace();
    std::vector<PyObject*>& leaves = leaves_buf.get();
    std::vector<PyObject*>& paths = with_path ? paths_buf->get() : no_paths;
    const bool need_def = want != Want::kLeaves;
    if (!Flatten(tree, is_leaf, takes_path, need_def ? &def : nullptr, &leaves,
                 with_path ? &paths : nullptr)) {
        DecrefAll(leaves);
        DecrefAll(paths);
        return nullptr;
    }
    if (with_path) DecrefAll(leaves);
    std::vector<PyObject*>& out = with_path ? paths : leaves;
    if (want == Want::kStructure) {
        DecrefAll(out);
        return WrapTreeDef(std::move(def));
    }
    Ref list(ListFrom(out));
    if (!list || want == Want::kLeaves) return list.release();
    Ref td(WrapTreeDef(std::move(def)));
    if (!td) return nullptr;
    PyObject* pair = PyTuple_New(2);
    if (pair == nullptr) return nullptr;
    PyTuple_SET_ITEM(pair, 0, list.release());  // steals
    PyTuple_SET_ITEM(pair, 1, td.release());
    return pair;
}

template <Want kWant>
PyObject* FlattenWalk(const char* name, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames) {
    // A tree alone, the commonest call, without the general parser.
    if (nargs == 1 && kwnames == nullptr) return DoFlatten(args[0], nullptr, false, false, kWant);
    PyObject* a[2];
    if (!ParseArgs({name, kTreeIsLeaf, 2, 1}, args, nargs, kwnames, a)) return nullptr;
    PyObject* is_leaf = OptionalArg(a[1]);
    if (is_leaf == nullptr) {
        if (PyObject* out = FlattenLeaves(a[0], kWant)) return out;
        if (PyErr_Occurred()) return nullptr;
    }
    return DoFlatten(a[0], is_leaf, false, false, kWant);
}

// The walk in its report scope, in a function of its own: inlined, the scope's frame would cost
// the fast path before it its own (six saved registers, callgrind).
template <Want kWant>
[[gnu::noinline]] PyObject* ScopedFlattenWalk(const char* name, PyObject* const* args,
                                              Py_ssize_t nargs, PyObject* kwnames) {
    aux::ReportScope scope;
    return scope.Finish(FlattenWalk<kWant>(name, args, nargs, kwnames));
}

// The entry points whose fast path runs before their report scope opens (module.cpp registers
// them without aux::ReportAfter). A tuple or list of plain leaves holds no custom node, so its
// flatten or map finds no aux_data to report, and nothing of it can be disturbed by a reporter
// running before the call returns: f's own calls into fastree (tree_map) make their reports
// when they end, as calls made outside any walk do. The scope's thread-local lookup and its
// bookkeeping were 55 of the 693 instructions of tree_map on a 3-tuple (callgrind, 3.13).
template <Want kWant>
PyObject* FlattenEntry(const char* name, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
    if (nargs == 1 && kwnames == nullptr) {
        if (PyObject* out = FlattenLeaves(args[0], kWant)) return out;
        if (PyErr_Occurred()) return nullptr;
    }
    return ScopedFlattenWalk<kWant>(name, args, nargs, kwnames);
}

PyObject* FlattenWithPathEntry(const char* name, PyObject* const* args, Py_ssize_t nargs,
                               PyObject* kwnames, Want want) {
    PyObject* a[3];
    if (!ParseArgs({name, kTreeIsLeafPath, 3, 1}, args, nargs, kwnames, a)) return nullptr;
    int takes_path = TruthArg(a[2]);
    if (takes_path < 0) return nullptr;
    return DoFlatten(a[0], OptionalArg(a[1]), takes_path != 0, true, want);
}

}  // namespace

PyObject* TreeFlatten(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    return FlattenEntry<Want::kBoth>("tree_flatten", args, nargs, kwnames);
}

PyObject* TreeLeaves(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    return FlattenEntry<Want::kLeaves>("tree_leaves", args, nargs, kwnames);
}

PyObject* TreeStructure(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    return FlattenEntry<Want::kStructure>("tree_structure", args, nargs, kwnames);
}

PyObject* TreeFlattenWithPath(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kwnames) {
    return FlattenWithPathEntry("tree_flatten_with_path", args, nargs, kwnames, Want::kBoth);
}

PyObject* TreeLeavesWithPath(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                             PyObject* kwnames) {
    return FlattenWithPathEntry("tree_leaves_with_path", args, nargs, kwnames, Want::kLeaves);
}

PyObject* TreeUnflatten(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* a[2];
    if (!ParseArgs({"tree_unflatten", kUnflattenNames, 2, 2}, args, nargs, kwnames, a)) {
        return nullptr;
    }
    if (!IsTreeDef(a[0])) {
        // JAX's tree_unflatten is `treedef.unflatten(leaves)`: a JAX treedef works, and
        // anything else fails the way that method call fails (AttributeError for None, ...).
        Ref method(PyUnicode_InternFromString("unflatten"));
        if (!method) return nullptr;
        PyObject* call[2] = {a[0], a[1]};
        return PyObject_VectorcallMethod(method.get(), call, 2, nullptr);
    }
    return UnflattenIterable(DefOf(a[0]), a[1]);
}

namespace {

// tree_map past its leaf-sequence path, in its report scope. Not inlined: the scope's frame
// would cost the fast path its own (six saved registers, callgrind).
[[gnu::noinline]] PyObject* TreeMapWalk(PyObject* const* args, Py_ssize_t nargs,
                                        PyObject* kwnames) {
    aux::ReportScope scope;
    if (nargs == 2 && kwnames == nullptr) return scope.Finish(MapSinglePass(args[0], args[1]));
    PyObject* a[3];
    PyObject* const* rest;
    Py_ssize_t num_rest;
    ArgSpec spec{"tree_map", kMapNames, 3, 2, /*rest_after=*/2};
    if (!ParseArgs(spec, args, nargs, kwnames, a, &rest, &num_rest)) return nullptr;
    return scope.Finish(Map(a[0], a[1], rest, num_rest, OptionalArg(a[2]), false, false));
}

}  // namespace

PyObject* TreeMap(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    // tree_map(f, tree), the commonest call, without the general parser (a sixth of fastree's
    // instructions in tree_map on a 3-tuple, callgrind), and on a tuple or list of plain leaves
    // before the report scope opens (see FlattenEntry).
    if (nargs == 2 && kwnames == nullptr) {
        if (PyObject* out = MapLeafSequence(args[0], args[1])) return out;
        if (PyErr_Occurred()) return nullptr;
    }
    return TreeMapWalk(args, nargs, kwnames);
}

PyObject* TreeMapWithPath(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* a[4];
    PyObject* const* rest;
    Py_ssize_t num_rest;
    ArgSpec spec{"tree_map_with_path", kMapPathNames, 4, 2, /*rest_after=*/2};
    if (!ParseArgs(spec, args, nargs, kwnames, a, &rest, &num_rest)) return nullptr;
    int takes_path = TruthArg(a[3]);
    if (takes_path < 0) return nullptr;
    return Map(a[0], a[1], rest, num_rest, OptionalArg(a[2]), true, takes_path != 0);
}

PyObject* AllLeaves(PyObject*, PyObject* iterable) {
    // The usual argument, a list or tuple of leaves, is read by index, with no reference taken
    // where the answer is memoised (ClassifyCached runs no Python code). On 3.12 and 3.13 an
    // iterator's new reference per item cost more than the rest: Py_INCREF stores the low 32
    // bits of the count, and the Py_DECREF right after loads all 64, which the CPU cannot forward
    // from that store (1000 arrays on 3.13: 7.0 us, against 4.5 on 3.11 and 3.14). A type's
    // first lookup can run Python code that changes the list: the item is held for it, and the
    // loop reads the list's size afresh each time, as the list's iterator would. A tuple's items
    // live as long as the tuple, which the caller holds.
    // Items of the type just found a plain leaf are not looked up again (PlainLeafRun: a run of
    // arrays or floats, the usual argument, costs a type comparison per item). A lookup that may
    // have run Python code ends the run.
    registry::PlainLeafRun plain;
    if (PyTuple_CheckExact(iterable)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(iterable); ++i) {
            PyObject* item = PyTuple_GET_ITEM(iterable, i);
            if (plain.InRun(item)) continue;
            const Registration* reg = plain.Cached(item);
            if (reg == nullptr) {
                reg = registry::ClassifyUncached(item);
                plain = registry::PlainLeafRun();
            }
            if (!reg->IsLeaf()) Py_RETURN_FALSE;
        }
        Py_RETURN_TRUE;
    }
    if (PyList_CheckExact(iterable)) {
        for (Py_ssize_t i = 0;; ++i) {
#ifndef Py_GIL_DISABLED  // another thread may replace the item: free-threaded, always hold it
            if (i >= PyList_GET_SIZE(iterable)) Py_RETURN_TRUE;
            if (plain.InRun(PyList_GET_ITEM(iterable, i))) continue;
            if (const Registration* reg = plain.Cached(PyList_GET_ITEM(iterable, i))) {
                if (!reg->IsLeaf()) Py_RETURN_FALSE;
                continue;
            }
            plain = registry::PlainLeafRun();
#endif
            Ref item(ListItemRef(iterable, i));
            if (!item) Py_RETURN_TRUE;
            if (!registry::Classify(item.get())->IsLeaf()) Py_RETURN_FALSE;
        }
    }
    Ref it(PyObject_GetIter(iterable));
    if (!it) return nullptr;
    while (Ref item{PyIter_Next(it.get())}) {
        if (!registry::Classify(item.get())->IsLeaf()) Py_RETURN_FALSE;
    }
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_TRUE;
}

PyObject* FlattenOneLevelEntry(PyObject*, PyObject* tree) { return FlattenOneLevelPy(tree, false); }

PyObject* FlattenOneLevelWithKeysEntry(PyObject*, PyObject* tree) {
    return FlattenOneLevelPy(tree, true);
}

PyObject* IsNodeType(PyObject*, PyObject* type) {
    // JAX's registry answers False for an object that is not a type, and rejects None (its
    // binding's argument conversion fails); the same here.
    if (type == Py_None) {
        PyErr_SetString(PyExc_TypeError, "is_tree_node() expects a type, got None.");
        return nullptr;
    }
    if (!PyType_Check(type)) Py_RETURN_FALSE;
    const Registration* reg = registry::ClassifyType(reinterpret_cast<PyTypeObject*>(type));
    return PyBool_FromLong(!reg->IsLeaf());
}

PyObject* TreeDefTupleEntry(PyObject*, PyObject* treedefs) { return TreeDefTuple(treedefs); }

PyObject* TreeDefFromState(PyObject*, PyObject* state) { return FromState(state); }

}  // namespace fastree
