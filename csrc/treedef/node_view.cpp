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

// The interned name of each kind, made once (the strings are immortal for the process: the
// module holds no other state for them).
PyObject* KindName(NodeKind kind) {
    static PyObject* names[kinds::kNumKinds] = {};
    PyObject*& name = names[static_cast<size_t>(kind)];
    if (name == nullptr) name = PyUnicode_InternFromString(kinds::Name(kind));
    return Py_XNewRef(name);
}

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

PyObject* NodeRecords(const TreeDef& def) {
    // The key entries of a container past the key cache's 2**17 children are made in one block
    // and kept for the whole call: outside a walk, each would come from a block of its own,
    // thrown away (quadratic in the arity: tests/test_linear_work.py).
    keys::WalkScope key_scope;
    // Each record runs Python code (allocations, key makers): NewSequenceOf (pyutils.h).
    return NewSequenceOf<true>(def.num_nodes(), [&](Py_ssize_t i) { return NodeRecord(def, i); });
}

}  // namespace fastree
