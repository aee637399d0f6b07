// PyTreeDef: the immutable description of a pytree's structure.
//
// A treedef is a post-order vector of Nodes (children before their parent, root last): the order
// unflatten consumes, and the order in which a subtree is a contiguous range [i - num_nodes + 1, i].
//
// The Python type is written against the C API rather than as a pybind11 class: flatten creates one
// per call, and a hand-made type costs one allocation where a pybind11 instance costs a type-map
// lookup and a holder on top (measurable on the 3-leaf-tuple per-call benchmark).
//
// Identity-preserving nodes: the first occurrence of a shared object is an ordinary node; every
// later occurrence is a kSharedRef node whose `ref` is the index of that first node (always
// earlier in post-order, so unflatten has already built the object it must repeat).
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "registry/registry.h"
#include "util/scratch.h"
#include "util/small_block_allocator.h"

namespace fastree {

// Counts are 32-bit and a node is 20 bytes: flattening writes one node per leaf, so on large trees
// the node vector is most of the memory traffic (and of what the GC's traverse walks). No tree
// that fits in memory has 2^31 nodes (Flatten checks).
using Count = int32_t;

// What a node needs beyond its shape, for the kinds that carry data (see Node::payload). Kept out
// of Node so that leaves and plain containers, the vast majority of nodes, stay small.
struct NodePayload {
    // Owned reference. Exactly JAX's node_data for the kind:
    //   kNamedTuple  the namedtuple class
    //   kCustom      the aux_data returned by the flatten function
    //   kDataclass   tuple of the meta-field values
    //   kAttribute   the aux data tuple of its layout (attr_node.h)
    //   kOrderedDict tuple of the keys in insertion order
    //   kDefaultDict (default_factory, tuple of the sorted keys)
    PyObject* data;
    // kCustom, kDataclass, kAttribute, kOrderedDict, kDefaultDict: the registration (never
    // freed); else null.
    const Registration* custom;
};

// The kinds whose nodes own a NodePayload.
inline bool HasPayload(NodeKind kind) {
    return kind == NodeKind::kNamedTuple || kind == NodeKind::kCustom ||
           kind == NodeKind::kDataclass || kind == NodeKind::kAttribute ||
           kind == NodeKind::kOrderedDict ||
           kind == NodeKind::kDefaultDict;
}

struct Node {
    NodeKind kind = NodeKind::kLeaf;
    // True if some kSharedRef node repeats this one (unflatten must remember what it built).
    bool shared_target = false;
    // Always zero. With no padding left, two treedefs of the same shape have byte-identical node
    // vectors, which lets Equal compare them with one memcmp.
    uint16_t reserved = 0;
    // Number of direct children (0 for leaves and None).
    Count arity = 0;
    // Leaves in the subtree rooted here.
    Count num_leaves = 0;
    // Nodes in the subtree rooted here, this one included: skipping a subtree while walking the
    // post-order vector backwards is `i -= num_nodes`.
    Count num_nodes = 0;
    // One index whose meaning depends on the kind (a node is at most one of these):
    union {
        // kDict: position of this node's first key in TreeDef::keys; its `arity` keys follow,
        // sorted. Keys live in one flat vector per treedef instead of a Python list per dict:
        // fewer objects for the GC to sweep and no allocation per dict node.
        Count keys_begin = 0;
        // kSharedRef: index of the node it repeats.
        Count ref;
        // HasPayload(kind): index of its entry in TreeDef::payloads.
        Count payload;
    };

    bool IsLeaf() const { return kind == NodeKind::kLeaf; }
    bool IsSharedRef() const { return kind == NodeKind::kSharedRef; }
    // A dict node: its keys live in TreeDef::keys from keys_begin.
    bool HasKeys() const { return kind == NodeKind::kDict; }
};
static_assert(sizeof(Node) == 20, "Node is meant to stay small: one is written per leaf");

// Every leaf's node: copied from this constant rather than assembled per leaf.
inline constexpr Node kLeafNode = [] {
    Node node;
    node.num_leaves = 1;
    node.num_nodes = 1;
    return node;
}();

// A node with every field zero, for AppendNode.
inline constexpr Node kBlankNode{};

// The node vector of a treedef, and the pooled one flatten builds nodes in (see Flatten). A small
// treedef's vector (at most kSmallNodeBlock nodes: a tuple of up to 7 leaves) comes from a list
// of kept blocks rather than malloc (util/small_block_allocator.h). (pymalloc measured no faster
// than malloc: on 3.13 it finds its state through the thread state, a __tls_get_addr call in
// pyenv's build.)
inline constexpr size_t kSmallNodeBlock = 8;
using NodeVector = std::vector<Node, SmallBlockAllocator<Node, kSmallNodeBlock>>;
using NodeScratch = Scratch<Node, SmallBlockAllocator<Node, kSmallNodeBlock>>;
static_assert(std::has_unique_object_representations_v<Node>,
              "Node must have no padding: Equal compares node vectors with memcmp");

// The structure proper; move-only, owns the references in its payloads and keys.
struct TreeDef {
    NodeVector nodes;                   // post-order, root last
    std::vector<PyObject*> keys;        // owned: the sorted keys of every kDict node
    std::vector<NodePayload> payloads;  // data of the nodes that carry some, in node order
    bool has_refs = false;              // some node is a kSharedRef (set by whoever appends one)

    TreeDef() = default;
    TreeDef(TreeDef&& other) noexcept
        : nodes(std::move(other.nodes)),
          keys(std::move(other.keys)),
          payloads(std::move(other.payloads)),
          has_refs(other.has_refs) {
        other.has_refs = false;
    }
    TreeDef& operator=(TreeDef&& other) noexcept {
        if (this != &other) {
            Release();
            nodes = std::move(other.nodes);
            keys = std::move(other.keys);
            payloads = std::move(other.payloads);
            has_refs = other.has_refs;
            other.has_refs = false;
        }
        return *this;
    }
    TreeDef(const TreeDef&) = delete;
    TreeDef& operator=(const TreeDef&) = delete;
    ~TreeDef() { Release(); }

    // Drops every owned reference and empties the treedef. Safe to call twice.
    void Release() {
        has_refs = false;
        // Most treedefs (builtin containers with no dicts) own no references: nothing to drop.
        if (keys.empty() && payloads.empty()) {
            nodes.clear();
            return;
        }
        ReleaseReferences();
    }

    // Release's slow path: drops the keys' and payloads' references.
    void ReleaseReferences();

    Py_ssize_t num_leaves() const { return nodes.empty() ? 0 : nodes.back().num_leaves; }
    Py_ssize_t num_nodes() const { return static_cast<Py_ssize_t>(nodes.size()); }

    // The sharing invariants live here and nowhere else: a shared reference is a one-node,
    // leafless kSharedRef pointing at an earlier node, that node is marked as a target (unflatten
    // keeps what it builds there), and the treedef knows it has references.
    void AppendLeaf() { nodes.push_back(kLeafNode); }
    // Appends a blank node for the caller to fill in place (a Node assembled on the stack and
    // then copied with wide loads stalls on store forwarding). Copied from a constant rather
    // than made by emplace_back(): GCC folds the vector's reallocation into emplace_back<>()
    // and then calls it, a 6-register frame per node, from every walker; push_back's copy is
    // inlined with only its reallocation out of line.
    Node& AppendNode() {
        nodes.push_back(kBlankNode);
        return nodes.back();
    }
    void AppendSharedRef(Py_ssize_t target) {
        Node node;
        node.kind = NodeKind::kSharedRef;
        node.num_nodes = 1;
        node.ref = static_cast<Count>(target);
        nodes.push_back(node);  // may throw (std::bad_alloc): nothing changed yet
        nodes[static_cast<size_t>(target)].shared_target = true;
        has_refs = true;
    }

    // Stores a payload (`data` is stolen) and returns its index for Node::payload.
    Count AddPayload(PyObject* data, const Registration* custom) {
        const NodePayload payload{data, custom};
        payloads.push_back(payload);  // by copy, for the reason given at AppendNode
        return static_cast<Count>(payloads.size() - 1);
    }
    // The node's data (borrowed) and registration; null for kinds without a payload.
    PyObject* Data(const Node& node) const {
        return HasPayload(node.kind) ? payloads[node.payload].data : nullptr;
    }
    const Registration* Custom(const Node& node) const {
        return HasPayload(node.kind) ? payloads[node.payload].custom : nullptr;
    }

    // Appends copies (new references) of src.nodes[begin, end), rebasing dict keys, payloads
    // and shared references. A reference to a node before `begin` is replaced by a copy of that
    // node's subtree, so the result is self-contained (sharing inside the range is kept).
    void AppendRange(const TreeDef& src, Py_ssize_t begin, Py_ssize_t end);
    // Appends a copy of one non-reference node, rebasing its keys and payload.
    void AppendCopy(const TreeDef& src, const Node& node);

    // Recomputes num_leaves/num_nodes and shared_target for nodes [from, end) from arities and
    // refs (after splicing).
    void Renormalize(Py_ssize_t from);

    bool HasSharedRefs() const { return has_refs; }

    // Indices of the roots of the children of node `index`, in child order.
    void ChildRoots(Py_ssize_t index, std::vector<Py_ssize_t>* out) const;
};

// A treedef used only within one call (tree_map's): its nodes are built in a pooled buffer, which
// goes back to the pool afterwards, instead of a fresh exactly sized vector per call.
struct ScratchTreeDef {
    ScratchTreeDef() { def.nodes.swap(buffer.get()); }
    ~ScratchTreeDef() {
        // Runs before the members' destructors: the pooled vector, emptied, goes back into
        // `buffer`; then `def` (declared last, destroyed first) releases its keys and payloads,
        // and `buffer` returns the vector to the pool.
        def.nodes.clear();
        def.nodes.swap(buffer.get());
    }
    ScratchTreeDef(const ScratchTreeDef&) = delete;
    ScratchTreeDef& operator=(const ScratchTreeDef&) = delete;

    NodeScratch buffer;
    TreeDef def;
};

// ---- The Python object.
struct PyTreeDefObject {
    PyObject_HEAD
    TreeDef def;
    // -1 until first computed; a treedef is immutable so it never changes. Read and written by
    // Hash (hash_eq.cpp) with relaxed __atomic builtins: threads may hash one treedef at once
    // (the same value; a plain field, so construction sets it as before).
    Py_hash_t hash;
    PyObject* weakrefs;
};

extern PyTypeObject* g_PyTreeDef_Type;

inline bool IsTreeDef(PyObject* obj) { return Py_TYPE(obj) == g_PyTreeDef_Type; }
inline TreeDef& DefOf(PyObject* obj) { return reinterpret_cast<PyTreeDefObject*>(obj)->def; }

// Wraps a treedef in a new Python object (consumes `def`). Null with an error on failure.
PyObject* WrapTreeDef(TreeDef&& def);
// Frees the dead treedef objects kept for reuse (type.cpp); at module teardown.
void ReleaseKeptTreeDefs();
// Creates the type (once, at module init).
PyTypeObject* CreateTreeDefType();

}  // namespace fastree
