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

#include "registry.h"
#include "scratch.h"

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
    //   kOrderedDict tuple of the keys in insertion order
    //   kDefaultDict (default_factory, tuple of the sorted keys)
    PyObject* data;
    // kCustom, kDataclass, kOrderedDict, kDefaultDict: the registration (never freed); else null.
    const Registration* custom;
};

// The kinds whose nodes own a NodePayload.
inline bool HasPayload(NodeKind kind) {
    return kind == NodeKind::kNamedTuple || kind == NodeKind::kCustom ||
           kind == NodeKind::kDataclass || kind == NodeKind::kOrderedDict ||
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
};
static_assert(sizeof(Node) == 20, "Node is meant to stay small: one is written per leaf");

// Every leaf's node: copied from this constant rather than assembled per leaf.
inline constexpr Node kLeafNode = [] {
    Node node;
    node.num_leaves = 1;
    node.num_nodes = 1;
    return node;
}();

// The node vector of a treedef, and the pooled one flatten builds nodes in (see Flatten). (Kept on
// std::allocator: pymalloc measured no faster once small trees stopped growing vectors at all.)
using NodeVector = std::vector<Node>;
using NodeScratch = Scratch<Node>;
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
        payloads.push_back(NodePayload{data, custom});
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

    // node_data() as JAX returns it for one node: None for a leaf, else (type, data).
    PyObject* NodeData(const Node& node) const;
    // The type this node rebuilds (new reference).
    PyObject* NodeType(const Node& node) const;
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
    Py_hash_t hash;        // -1 until first computed; a treedef is immutable so it never changes
    PyObject* weakrefs;
};

extern PyTypeObject* g_PyTreeDef_Type;

inline bool IsTreeDef(PyObject* obj) { return Py_TYPE(obj) == g_PyTreeDef_Type; }
inline TreeDef& DefOf(PyObject* obj) { return reinterpret_cast<PyTreeDefObject*>(obj)->def; }

// Wraps a treedef in a new Python object (consumes `def`). Null with an error on failure.
PyObject* WrapTreeDef(TreeDef&& def);
// Creates the type (once, at module init).
PyTypeObject* CreateTreeDefType();

// ---- Operations (one file each under treedef/).

// The tail of flatten's RecursionError message (JAX's), shared by every walk that flattens.
inline constexpr char kFlattenRecursionWhere[] =
    " in flatten; PyTree may have cyclical node references.";

// flatten.cpp. Any of def / paths may be null to skip building them. `leaves` and `paths`
// receive owned references; on failure they may hold partial output the caller must release.
// A treedef that outlives the call gets an exactly sized node vector; a ScratchTreeDef (one
// dropped before the caller returns) is filled in its pooled buffer as it is.
bool Flatten(PyObject* tree, PyObject* is_leaf, bool is_leaf_takes_path, TreeDef* def,
             std::vector<PyObject*>* leaves, std::vector<PyObject*>* paths);
bool Flatten(PyObject* tree, PyObject* is_leaf, bool is_leaf_takes_path, ScratchTreeDef* def,
             std::vector<PyObject*>* leaves, std::vector<PyObject*>* paths);

// Flattens only the root: each child becomes a leaf of `def` (and, with paths, of `paths`).
// `report_root`: the tree `node` belongs to, if not itself (for aux-data reports).
bool FlattenOneLevel(PyObject* node, TreeDef* def, std::vector<PyObject*>* children,
                     std::vector<PyObject*>* paths, PyObject* report_root = nullptr);

// unflatten.cpp. Builds one node from its children (references consumed, success or not).
PyObject* BuildNode(const TreeDef& def, const Node& node, PyObject** children);
// A register_dataclass instance from its meta-field values (a tuple) and one child per data field
// (references consumed, success or not). Every way of making a treedef checks that count.
PyObject* BuildDataclass(const Registration* reg, PyObject* meta_values, PyObject** children);
// JAX's "Too few/many leaves for PyTreeDef" errors; false with the error set.
bool CheckLeafCount(const TreeDef& def, Py_ssize_t n);
// Builds the tree from `n` borrowed leaves; raises JAX's leaf-count errors.
PyObject* Unflatten(const TreeDef& def, PyObject* const* leaves, Py_ssize_t n);
PyObject* UnflattenIterable(const TreeDef& def, PyObject* leaves);

// flatten_up_to.cpp. Appends owned references to `out` (in leaf order). On failure, `mismatch`
// (if given) tells whether the error set is a structure mismatch raised by the walk itself, as
// opposed to an error from a callback, a comparison or an allocation.
bool FlattenUpTo(const TreeDef& def, PyObject* tree, std::vector<PyObject*>* out,
                 bool* mismatch = nullptr);
// The fast case of PyTreeDef.flatten_up_to: a treedef that is one tuple or list of leaves (a
// 3-leaf tuple, a flat parameter list) cut from a container of exactly that shape, whose items
// are the answer. A new list; null with no error set where the case does not apply (FlattenUpTo
// then does the work, and builds JAX's message for a mismatch); null with an error on failure.
PyObject* FlattenUpToSequence(const TreeDef& def, PyObject* tree);

// leaf_sequence.cpp: a tree that is one tuple or list of leaves, flattened or rebuilt without
// the walkers. Null with no error set where the case does not apply (the general path then does
// the work); null with an error on failure.
// The leaf list, the treedef, or (leaf list, treedef). No is_leaf, no key paths.
PyObject* FlattenLeafSequence(PyObject* tree, bool want_leaves, bool want_def);
// tree_map(f, tree) with no is_leaf or other trees, `tree` one tuple or list of leaves.
PyObject* MapLeafSequence(PyObject* f, PyObject* tree);
// `def` is one tuple or list of leaves and `leaves` an exact list or tuple of its length.
PyObject* UnflattenLeafSequence(const TreeDef& def, PyObject* leaves);

// hash_eq.cpp.
Py_hash_t Hash(PyTreeDefObject* self);
int Equal(const TreeDef& a, const TreeDef& b);  // 1, 0, or -1 with an error set

// repr.cpp.
PyObject* Repr(const TreeDef& def);

// pickle.cpp.
PyObject* State(const TreeDef& def);
PyObject* Reduce(const TreeDef& def);
PyObject* FromState(PyObject* state);

}  // namespace fastree

namespace fastree {
// structure.cpp.
// The key entry of child `k` of `node` (new reference), as flatten_with_path produces it for the
// built-in kinds; a custom node's children report their flattened index.
PyObject* ChildKey(const TreeDef& def, const Node& node, Py_ssize_t k);
// node_view.cpp: PyTreeDef._nodes(), one (kind, type, data, arity, num_leaves, ref, child_keys)
// record per post-order node.
PyObject* NodeRecords(const TreeDef& def);
// keystr() of the path from the root to node `index` (for error messages).
std::string KeyPathString(const TreeDef& def, Py_ssize_t index);
// Appends the root node for `type` with `arity` children (the last `arity` subtrees of `def`).
bool MakeRootNode(PyObject* type, PyObject* data, Py_ssize_t arity, TreeDef* def);
PyObject* Children(const TreeDef& def);
PyObject* Compose(const TreeDef& outer, const TreeDef& inner);
PyObject* TreeDefTuple(PyObject* treedefs);
PyObject* FromNodeDataAndChildren(PyObject* node_data, PyObject* children);
PyObject* Walk(const TreeDef& def, PyObject* f_node, PyObject* f_leaf, PyObject* leaves);
PyObject* FromIterableTree(const TreeDef& def, PyObject* obj);

// map.cpp: tree_map / tree_map_with_path. `rest` holds the extra trees.
PyObject* Map(PyObject* f, PyObject* tree, PyObject* const* rest, Py_ssize_t num_rest,
              PyObject* is_leaf, bool with_path, bool is_leaf_takes_path);
// map_single_pass.cpp: tree_map(f, tree) with no is_leaf and no other trees, in one walk.
PyObject* MapSinglePass(PyObject* f, PyObject* tree);
// Hook the Python layer installs to explain a structure mismatch in tree_map (JAX's key-path
// message, worked out by fastree's own walk: python/fastree/_map_errors.py). Called as
// hook(tree, other, is_leaf, func_name, is_leaf_takes_path) -> exception or None.
void SetMapErrorHook(PyObject* hook);
// Hook converting a fastree treedef to JAX's (installed by the JAX bridge).
void SetToJaxHook(PyObject* hook);
PyObject* ToJaxHook();
// GC visibility for the two hooks above (called from the registry object's tp_traverse).
int TraverseHooks(visitproc visit, void* arg);
}  // namespace fastree

namespace fastree {
// one_level.cpp: flatten_one_level(_with_keys); (children, node_data), or None for a leaf.
PyObject* FlattenOneLevelPy(PyObject* tree, bool with_keys);
}  // namespace fastree
