// Pickling, and the public node-level view of a treedef (PyTreeDef._state()).
// State format (version 1): (1, ((type, data, arity, ref), ...)) over the post-order nodes:
//   a leaf            (None, None, 0, -1)
//   a node            (its class, what node_data() reports as data, number of children, -1)
//   a shared ref      (None, None, 0, index of the node it repeats)   [identity-preserving nodes]
// Classes pickle by qualified name, so unpickling needs the same node types importable and
// registered; the structure is rebuilt through the same validation as
// from_node_data_and_children, so a corrupt state raises instead of producing a broken treedef.
#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/walkers.h"

namespace fastree {

static constexpr long kPickleVersion = 1;

PyObject* State(const TreeDef& def) {
    // Each entry allocates (the cyclic GC can run): NewSequenceOf (pyutils.h).
    Ref nodes(NewSequenceOf<true>(def.num_nodes(), [&](Py_ssize_t i) -> PyObject* {
        const Node& node = def.nodes[i];
        if (node.IsLeaf() || node.IsSharedRef()) {
            const Py_ssize_t ref = node.IsSharedRef() ? node.ref : -1;
            return Py_BuildValue("(OOnn)", Py_None, Py_None, Py_ssize_t{0}, ref);
        }
        Ref nd(kinds::NodeData(PartsOf(def, node)));
        if (!nd) return nullptr;
        return Py_BuildValue("(OOnn)", PyTuple_GET_ITEM(nd.get(), 0), PyTuple_GET_ITEM(nd.get(), 1),
                             static_cast<Py_ssize_t>(node.arity), Py_ssize_t{-1});
    }));
    if (!nodes) return nullptr;
    return Py_BuildValue("(lO)", kPickleVersion, nodes.get());
}

PyObject* Reduce(const TreeDef& def) {
    Ref state(State(def));
    if (!state) return nullptr;
    Ref module(PyImport_ImportModule("fastree._core"));
    if (!module) return nullptr;
    Ref ctor(PyObject_GetAttrString(module.get(), "_treedef_from_state"));
    if (!ctor) return nullptr;
    // The inner tuple first, then the outer: Py_BuildValue("(O(O))") makes the outer tuple and
    // then allocates the inner one while the outer's slot is still empty (CPython 3.10), where a
    // finalizer run by that allocation can read it (tests/test_half_built_outputs.py).
    Ref args(PyTuple_Pack(1, state.get()));
    if (!args) return nullptr;
    return PyTuple_Pack(2, ctor.get(), args.get());
}

PyObject* FromState(PyObject* state) {
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 2 ||
        !PyLong_Check(PyTuple_GET_ITEM(state, 0)) || !PyTuple_Check(PyTuple_GET_ITEM(state, 1))) {
        PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef pickle state.");
        return nullptr;
    }
    int overflow = 0;
    long version = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(state, 0), &overflow);
    if (version != kPickleVersion) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "Unsupported PyTreeDef pickle version %R.",
                         PyTuple_GET_ITEM(state, 0));
        }
        return nullptr;
    }
    PyObject* nodes = PyTuple_GET_ITEM(state, 1);
    TreeDef def;
    // Subtrees not yet claimed by a parent; a valid state ends with exactly one (the root).
    Py_ssize_t open_subtrees = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nodes); ++i) {
        PyObject* entry = PyTuple_GET_ITEM(nodes, i);
        PyObject *type, *data;
        Py_ssize_t arity, ref;
        if (!PyTuple_Check(entry) || !PyArg_ParseTuple(entry, "OOnn", &type, &data, &arity, &ref)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef pickle state: bad node entry.");
            return nullptr;
        }
        if (ref != -1) {
            // A reference must repeat an earlier, non-leaf, non-reference node (earlier in
            // post-order means a finished subtree, never an ancestor: no cycles).
            if (type != Py_None || arity != 0 || ref < 0 || ref >= def.num_nodes() ||
                def.nodes[ref].IsLeaf() || def.nodes[ref].IsSharedRef()) {
                PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef state: bad shared reference.");
                return nullptr;
            }
            def.AppendSharedRef(ref);
            open_subtrees += 1;
            continue;
        }
        if (arity < 0 || arity > open_subtrees) {
            PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef pickle state: bad arity.");
            return nullptr;
        }
        if (type == Py_None) {
            def.AppendLeaf();
        } else if (!MakeRootNode(type, data, arity, &def)) {
            return nullptr;
        }
        open_subtrees += 1 - (type == Py_None ? 0 : arity);
    }
    if (open_subtrees != 1) {
        PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef pickle state: not a single tree.");
        return nullptr;
    }
    return WrapTreeDef(std::move(def));
}

}  // namespace fastree
