// TreeDef's own bookkeeping: releasing references, copying node ranges, navigating children.
#include <unordered_map>
#include <utility>

#include "util/pyutils.h"
#include "treedef/treedef.h"

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
        if (node.IsSharedRef()) {
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
    if (node.HasKeys()) {
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
        Py_ssize_t leaves = node.IsLeaf() ? 1 : 0;
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
        if (nodes[i].IsSharedRef()) nodes[nodes[i].ref].shared_target = true;
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

}  // namespace fastree
