// Pickling. State format (version 1): (1, ((type_or_None, data, arity), ...)) over the post-order
// nodes, where type is the node's class (None for a leaf) and data is what node_data() reports
// (dict keys as a list). Classes pickle by qualified name, so unpickling needs the same node
// types importable and registered; the structure is rebuilt through the same validation as
// from_node_data_and_children, so a corrupt state raises instead of producing a broken treedef.
#include "pyutils.h"
#include "treedef.h"

namespace fastree {

static constexpr long kPickleVersion = 1;

PyObject* Reduce(const TreeDef& def) {
    Ref nodes(PyTuple_New(def.num_nodes()));
    if (!nodes) return nullptr;
    for (Py_ssize_t i = 0; i < def.num_nodes(); ++i) {
        const Node& node = def.nodes[i];
        PyObject* entry;
        if (node.kind == NodeKind::kLeaf) {
            entry = Py_BuildValue("(OOn)", Py_None, Py_None, static_cast<Py_ssize_t>(0));
        } else {
            Ref nd(def.NodeData(node));
            if (!nd) return nullptr;
            entry = Py_BuildValue("(OOn)", PyTuple_GET_ITEM(nd.get(), 0),
                                  PyTuple_GET_ITEM(nd.get(), 1), node.arity);
        }
        if (entry == nullptr) return nullptr;
        PyTuple_SET_ITEM(nodes.get(), i, entry);
    }
    PyObject* module = PyImport_ImportModule("fastree._core");
    if (module == nullptr) return nullptr;
    PyObject* ctor = PyObject_GetAttrString(module, "_treedef_from_state");
    Py_DECREF(module);
    if (ctor == nullptr) return nullptr;
    return Py_BuildValue("(N((lO)))", ctor, kPickleVersion, nodes.get());
}

PyObject* FromState(PyObject* state) {
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 2 ||
        !PyLong_Check(PyTuple_GET_ITEM(state, 0)) || !PyTuple_Check(PyTuple_GET_ITEM(state, 1))) {
        PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef pickle state.");
        return nullptr;
    }
    long version = PyLong_AsLong(PyTuple_GET_ITEM(state, 0));
    if (version != kPickleVersion) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "Unsupported PyTreeDef pickle version %ld.", version);
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
        Py_ssize_t arity;
        if (!PyTuple_Check(entry) || !PyArg_ParseTuple(entry, "OOn", &type, &data, &arity)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef pickle state: bad node entry.");
            return nullptr;
        }
        if (arity < 0 || arity > open_subtrees) {
            PyErr_SetString(PyExc_ValueError, "Malformed PyTreeDef pickle state: bad arity.");
            return nullptr;
        }
        if (type == Py_None) {
            Node leaf;
            leaf.num_leaves = 1;
            leaf.num_nodes = 1;
            def.nodes.push_back(leaf);
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
