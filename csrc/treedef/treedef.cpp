// TreeDef's own bookkeeping: releasing references, copying node ranges, navigating children.
#include <unordered_map>
#include <utility>

#include "pyutils.h"
#include "treedef.h"

namespace fastree {

void TreeDef::ReleaseReferences() {
    // Move out before DECREF: a finalizer run by DECREF may look at this treedef again.
    NodeVector old_nodes = std::move(nodes);
    std::vector<PyObject*> old_keys = std::move(keys);
    std::vector<NodePayload> old_payloads = std::move(payloads);
    nodes.clear();
    keys.clear();
    payloads.clear();
    for (NodePayload& payload : old_payloads) Py_XDECREF(payload.data);
    for (PyObject* key : old_keys) Py_XDECREF(key);
}

namespace {

// Copies src.nodes[begin, end) into dst. `remap` maps source node indices to their copies, so
// shared references inside the range point at the copies; a reference to a node outside the
// range copies that node's subtree in its place (once: later references repeat the copy).
void CopyRange(const TreeDef& src, Py_ssize_t begin, Py_ssize_t end, TreeDef* dst,
               std::unordered_map<Py_ssize_t, Py_ssize_t>* remap) {
    for (Py_ssize_t i = begin; i < end; ++i) {
        const Node& node = src.nodes[i];
        if (node.kind == NodeKind::kSharedRef) {
            auto it = remap->find(node.ref);
            if (it == remap->end()) {
                const Node& target = src.nodes[node.ref];
                CopyRange(src, node.ref - target.num_nodes + 1, node.ref + 1, dst, remap);
                continue;  // the copy stands in for the reference
            }
            dst->AppendSharedRef(it->second);
            continue;
        }
        (*remap)[i] = dst->num_nodes();
        dst->AppendCopy(src, node);
    }
}

}  // namespace

void TreeDef::AppendCopy(const TreeDef& src, const Node& node) {
    Node copy = node;
    if (node.kind == NodeKind::kDict) {
        copy.keys_begin = static_cast<Count>(keys.size());
        for (Py_ssize_t k = 0; k < node.arity; ++k) {
            PushNewRef(keys, src.keys[node.keys_begin + k]);
        }
    } else if (HasPayload(node.kind)) {
        const NodePayload& payload = src.payloads[node.payload];
        // Stored first, referenced once stored (as PushNewRef): a push that throws
        // (std::bad_alloc) leaks nothing.
        copy.payload = AddPayload(payload.data, payload.custom);
        Py_XINCREF(payload.data);
    }
    nodes.push_back(copy);
}

void TreeDef::AppendRange(const TreeDef& src, Py_ssize_t begin, Py_ssize_t end) {
    const Py_ssize_t from = num_nodes();
    if (!src.HasSharedRefs()) {  // the common case: a flat copy
        // No reserve here: callers append many small ranges, and an exact reserve per call
        // would defeat the vector's geometric growth (quadratic compose/treedef_tuple).
        for (Py_ssize_t i = begin; i < end; ++i) AppendCopy(src, src.nodes[i]);
        return;
    }
    std::unordered_map<Py_ssize_t, Py_ssize_t> remap;
    CopyRange(src, begin, end, this, &remap);
    Renormalize(from);
}

void TreeDef::Renormalize(Py_ssize_t from) {
    // (leaves, nodes) of each finished subtree, as a post-order stack.
    std::vector<std::pair<Py_ssize_t, Py_ssize_t>> stack;
    for (Py_ssize_t i = from; i < num_nodes(); ++i) {
        Node& node = nodes[i];
        node.shared_target = false;
        Py_ssize_t leaves = node.kind == NodeKind::kLeaf ? 1 : 0;
        Py_ssize_t count = 1;
        for (Py_ssize_t k = 0; k < node.arity && !stack.empty(); ++k) {
            leaves += stack.back().first;
            count += stack.back().second;
            stack.pop_back();
        }
        node.num_leaves = leaves;
        node.num_nodes = count;
        stack.emplace_back(leaves, count);
    }
    for (Py_ssize_t i = from; i < num_nodes(); ++i) {
        if (nodes[i].kind == NodeKind::kSharedRef) nodes[nodes[i].ref].shared_target = true;
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
        case NodeKind::kSharedRef:
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
            return Py_NewRef(Data(node));
        case NodeKind::kOrderedDict:
        case NodeKind::kDefaultDict:
        case NodeKind::kCustom:
        case NodeKind::kDataclass:
            return Py_NewRef(Custom(node)->type);
    }
    return Py_NewRef(Py_None);
}

PyObject* TreeDef::NodeData(const Node& node) const {
    if (node.kind == NodeKind::kLeaf || node.kind == NodeKind::kSharedRef) {
        return Py_NewRef(Py_None);
    }
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
            data = Ref(Py_NewRef(Data(node)));
    }
    return PyTuple_Pack(2, type.get(), data.get());
}

}  // namespace fastree
