// The unflatten loop, parameterised by where leaf i comes from: a leaf list (unflatten) or a call
// of the mapped function (tree_map). Leaves are requested in order as their position is reached,
// interleaved with node construction, which is the order JAX's generator-fed unflatten has.
#pragma once

#include <unordered_map>

#include "pyutils.h"
#include "scratch.h"
#include "treedef.h"

namespace fastree {

// Builds a plain dict from `n` sorted keys and `n` owned children (consumed). The most common
// container of parameter trees, so it is built here, inline in the loop, not through BuildNode.
inline PyObject* BuildDict(PyObject* const* keys, PyObject** children, Py_ssize_t n) {
    PyObject* dict = _PyDict_NewPresized(n);
    Py_ssize_t i = 0;
    if (dict != nullptr) {
        // Insertion in sorted-key order, as JAX does: the rebuilt dict iterates sorted.
        for (; i < n; ++i) {
            if (PyDict_SetItem(dict, keys[i], children[i]) < 0) break;
            Py_DECREF(children[i]);
        }
        if (i == n) return dict;
        Py_CLEAR(dict);
    }
    for (; i < n; ++i) Py_DECREF(children[i]);
    return nullptr;
}

// `leaf(i)` returns a new reference to leaf i, or null with a Python error set.
template <class LeafSource>
PyObject* UnflattenWith(const TreeDef& def, LeafSource&& leaf) {
    // Value stack of owned references; a node pops its `arity` children off the top.
    ScratchVector stack_buf;
    std::vector<PyObject*>& stack = stack_buf.get();
    // Identity-preserving objects built so far, by node index. Owned: a parent's unflatten
    // function need not keep its children alive, and a later reference still needs them.
    std::unordered_map<Py_ssize_t, PyObject*> shared;
    auto release_shared = [&shared] {
        for (auto& entry : shared) Py_DECREF(entry.second);
        shared.clear();
    };
    Py_ssize_t next_leaf = 0;
    const Node* const nodes = def.nodes.data();
    const Py_ssize_t num_nodes = def.num_nodes();
    for (Py_ssize_t index = 0; index < num_nodes; ++index) {
        const Node& node = nodes[index];
        PyObject* built;
        if (node.kind == NodeKind::kLeaf) {
            built = leaf(next_leaf++);
        } else if (node.kind == NodeKind::kDict) {
            PyObject** children = stack.data() + (stack.size() - node.arity);
            built = BuildDict(def.keys.data() + node.keys_begin, children, node.arity);
            stack.resize(stack.size() - node.arity);
        } else if (node.kind == NodeKind::kSharedRef) {
            auto it = shared.find(node.ref);
            if (it == shared.end()) {
                PyErr_SetString(PyExc_ValueError, "fastree: malformed treedef (dangling reference)");
                built = nullptr;
            } else {
                built = Py_NewRef(it->second);
            }
        } else {
            PyObject** children = stack.data() + (stack.size() - node.arity);
            built = BuildNode(def, node, children);  // consumes the children
            stack.resize(stack.size() - node.arity);
        }
        if (built == nullptr) {
            DecrefAll(stack);
            release_shared();
            return nullptr;
        }
        if (node.shared_target) shared[index] = Py_NewRef(built);
        stack.push_back(built);
    }
    release_shared();
    if (stack.size() != 1) {
        DecrefAll(stack);
        PyErr_SetString(PyExc_ValueError, "fastree: malformed treedef (unbalanced node stack)");
        return nullptr;
    }
    PyObject* root = stack[0];
    stack.clear();
    return root;
}

}  // namespace fastree
