// TreeDef's own bookkeeping: releasing references, copying node ranges, navigating children.
#include "pyutils.h"
#include "treedef.h"

namespace fastree {

void TreeDef::Release() {
    // Move out before DECREF: a finalizer run by DECREF may look at this treedef again.
    std::vector<Node> old_nodes = std::move(nodes);
    std::vector<PyObject*> old_keys = std::move(keys);
    nodes.clear();
    keys.clear();
    for (Node& node : old_nodes) Py_XDECREF(node.node_data);
    for (PyObject* key : old_keys) Py_XDECREF(key);
}

void TreeDef::AppendRange(const TreeDef& src, Py_ssize_t begin, Py_ssize_t end) {
    nodes.reserve(nodes.size() + static_cast<size_t>(end - begin));
    for (Py_ssize_t i = begin; i < end; ++i) {
        Node node = src.nodes[i];
        Py_XINCREF(node.node_data);
        if (node.kind == NodeKind::kDict) {
            Py_ssize_t new_begin = static_cast<Py_ssize_t>(keys.size());
            for (Py_ssize_t k = 0; k < node.arity; ++k) {
                keys.push_back(Py_NewRef(src.keys[node.keys_begin + k]));
            }
            node.keys_begin = new_begin;
        }
        nodes.push_back(node);
    }
}

void TreeDef::ChildRoots(Py_ssize_t index, std::vector<Py_ssize_t>* out) const {
    const Node& node = nodes[index];
    out->assign(static_cast<size_t>(node.arity), 0);
    Py_ssize_t child = index - 1;
    for (Py_ssize_t k = node.arity - 1; k >= 0; --k) {
        (*out)[k] = child;
        child -= nodes[child].num_nodes;
    }
}

PyObject* TreeDef::NodeType(const Node& node) const {
    switch (node.kind) {
        case NodeKind::kLeaf:
            return Py_NewRef(Py_None);
        case NodeKind::kNone:
            return Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(Py_None)));
        case NodeKind::kTuple:
            return Py_NewRef(reinterpret_cast<PyObject*>(&PyTuple_Type));
        case NodeKind::kList:
            return Py_NewRef(reinterpret_cast<PyObject*>(&PyList_Type));
        case NodeKind::kDict:
            return Py_NewRef(reinterpret_cast<PyObject*>(&PyDict_Type));
        case NodeKind::kNamedTuple:
            return Py_NewRef(node.node_data);
        case NodeKind::kOrderedDict:
        case NodeKind::kDefaultDict:
        case NodeKind::kCustom:
        case NodeKind::kDataclass:
            return Py_NewRef(node.custom->type);
    }
    return Py_NewRef(Py_None);
}

PyObject* TreeDef::NodeData(const Node& node) const {
    if (node.kind == NodeKind::kLeaf) return Py_NewRef(Py_None);
    Ref type(NodeType(node));
    Ref data;
    switch (node.kind) {
        case NodeKind::kDict: {
            PyObject* list = PyList_New(node.arity);
            if (list == nullptr) return nullptr;
            for (Py_ssize_t i = 0; i < node.arity; ++i) {
                PyList_SET_ITEM(list, i, Py_NewRef(keys[node.keys_begin + i]));
            }
            data = Ref(list);
            break;
        }
        case NodeKind::kNamedTuple:  // JAX reports no data for a namedtuple: the type says all
        case NodeKind::kNone:
        case NodeKind::kTuple:
        case NodeKind::kList:
            data = Ref(Py_NewRef(Py_None));
            break;
        default:
            data = Ref(Py_NewRef(node.node_data));
    }
    return PyTuple_Pack(2, type.get(), data.get());
}

}  // namespace fastree
