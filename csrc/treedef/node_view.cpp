// PyTreeDef._nodes(): the core's own description of every node, so the Python layer (diffs,
// fingerprints, serialization, audits) reads kinds and child keys instead of re-deriving them
// from types and node data.
#include "registry/keys.h"
#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

// The interned name of each kind, made once at module init (InitKindNames) and read without
// synchronisation afterwards (docs/threads.md, R16: filled on first use, two threads raced to
// fill one slot). The strings are kept for the process: the module holds no other state for them.
PyObject* g_kind_names[kinds::kNumKinds] = {};

PyObject* KindName(NodeKind kind) { return Py_XNewRef(g_kind_names[static_cast<size_t>(kind)]); }

// (kind, type, data, arity, num_leaves, ref, child_keys) for one node.
PyObject* NodeRecord(const TreeDef& def, Py_ssize_t index) {
    const Node& node = def.nodes[static_cast<size_t>(index)];
    Ref kind(KindName(node.kind));
    if (!kind) return nullptr;
    Ref type = Ref::FromBorrowed(Py_None);
    Ref data = Ref::FromBorrowed(Py_None);
    const NodeParts parts = PartsOf(def, node);
    if (!node.IsLeaf() && !node.IsSharedRef()) {
        Ref nd(kinds::NodeData(parts));
        if (!nd) return nullptr;
        type = Ref::FromBorrowed(PyTuple_GET_ITEM(nd.get(), 0));
        data = Ref::FromBorrowed(PyTuple_GET_ITEM(nd.get(), 1));
    }
    // Making a key can run Python code (the key makers): NewSequenceOf (pyutils.h).
    Ref keys(NewSequenceOf<true>(node.arity,
                                 [&](Py_ssize_t k) { return kinds::ChildKey(parts, k); }));
    if (!keys) return nullptr;
    const Py_ssize_t ref = node.IsSharedRef() ? node.ref : -1;
    return Py_BuildValue("(OOOnnnO)", kind.get(), type.get(), data.get(),
                         static_cast<Py_ssize_t>(node.arity),
                         static_cast<Py_ssize_t>(node.num_leaves), ref, keys.get());
}

}  // namespace

bool InitKindNames() {
    for (size_t k = 0; k < kinds::kNumKinds; ++k) {
        if (g_kind_names[k] != nullptr) continue;
        g_kind_names[k] = PyUnicode_InternFromString(kinds::Name(static_cast<NodeKind>(k)));
        if (g_kind_names[k] == nullptr) return false;
    }
    return true;
}

PyObject* NodeRecords(const TreeDef& def) {
    // The key entries of a container past the key cache's 2**17 children are made in one block
    // and kept for the whole call: outside a walk, each would come from a block of its own,
    // thrown away (quadratic in the arity: tests/test_linear_work.py).
    keys::WalkScope key_scope;
    // Each record runs Python code (allocations, key makers): NewSequenceOf (pyutils.h).
    return NewSequenceOf<true>(def.num_nodes(), [&](Py_ssize_t i) { return NodeRecord(def, i); });
}

}  // namespace fastree
