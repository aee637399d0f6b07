// The unflatten loop, parameterised by where leaf i comes from: a leaf list (unflatten) or a call
// of the mapped function (tree_map). Leaves are requested in order as their position is reached,
// interleaved with node construction, which is the order JAX's generator-fed unflatten has.
#pragma once

#include <memory>
#include <unordered_map>

#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "util/scratch.h"
#include "treedef/treedef.h"
#include "treedef/walkers.h"

namespace fastree {

// The objects built for identity-preserving nodes during one rebuild (unflatten, walk,
// from_iterable_tree), by node index: a later kSharedRef node repeats them. Owned: a parent's
// unflatten function need not keep its children alive, and a later reference still needs them.
// Released when the map dies, on success, on error and when a C++ exception unwinds.
class SharedObjects {
 public:
    SharedObjects() = default;
    SharedObjects(const SharedObjects&) = delete;
    SharedObjects& operator=(const SharedObjects&) = delete;
    ~SharedObjects() { Release(); }

    // The object built at node `index` (borrowed: the caller takes its own reference before
    // anything can run Python code), or null.
    PyObject* Find(Py_ssize_t index) const {
        if (!map_) return nullptr;
        auto it = map_->find(index);
        return it == map_->end() ? nullptr : it->second;
    }
    // Remembers `obj` (a new reference is taken) as the object built at node `index`. The
    // reference is taken once the slot exists, so a throwing insertion leaks nothing.
    void Add(Py_ssize_t index, PyObject* obj) {
        if (!map_) map_ = std::make_unique<Map>();
        PyObject*& slot = (*map_)[index];
        Py_INCREF(obj);
        Py_XSETREF(slot, obj);
    }
    void Release() {
        // Moved out first: a finalizer run by a DECREF must not find a half-released map.
        std::unique_ptr<Map> old = std::move(map_);
        if (old) {
            for (auto& entry : *old) Py_DECREF(entry.second);
        }
    }

 private:
    using Map = std::unordered_map<Py_ssize_t, PyObject*>;
    // Allocated by the first Add: most treedefs have no identity-preserving node, and an empty
    // map's construction and teardown were a sixth of a 3-leaf unflatten.
    std::unique_ptr<Map> map_;
};

// `leaf(i)` returns a new reference to leaf i, or null with a Python error set.
template <class LeafSource>
PyObject* UnflattenWith(const TreeDef& def, LeafSource&& leaf) {
    // Value stack of owned references; a node pops its `arity` children off the top.
    ScratchVector stack_buf;
    std::vector<PyObject*>& stack = stack_buf.get();
    // Identity-preserving objects built so far, by node index (owned).
    SharedObjects shared;
    Py_ssize_t next_leaf = 0;
    const Node* const nodes = def.nodes.data();
    const Py_ssize_t num_nodes = def.num_nodes();
    // The stack never holds more than one value per node: reserved up front (this may throw,
    // while nothing is owned yet), every push below fits and cannot throw.
    stack.reserve(static_cast<size_t>(num_nodes));
    for (Py_ssize_t index = 0; index < num_nodes; ++index) {
        const Node& node = nodes[index];
        PyObject* built;
        if (node.IsLeaf()) {
            built = leaf(next_leaf++);
        } else if (node.HasKeys()) {
            // Dicts, the most common container of parameter trees, are built inline here.
            // `children` points into `stack` across Python code (key hashes, unflatten
            // functions): safe, as only this loop touches `stack` (a re-entrant unflatten has a
            // pooled stack of its own), and nothing throws before the resize that follows.
            PyObject** children = stack.data() + (stack.size() - node.arity);
            built = kinds::DictKind::BuildDict(def.keys.data() + node.keys_begin, children, node.arity);
            stack.erase(stack.end() - node.arity, stack.end());  // (resize was a call)
        } else if (node.IsSharedRef()) {
            PyObject* target = shared.Find(node.ref);
            if (target == nullptr) {
                PyErr_SetString(PyExc_ValueError, "fastree: malformed treedef (dangling reference)");
                built = nullptr;
            } else {
                built = Py_NewRef(target);
            }
        } else {
            PyObject** children = stack.data() + (stack.size() - node.arity);
            built = kinds::Build(PartsOf(def, node), children);  // consumes the children
            stack.erase(stack.end() - node.arity, stack.end());  // (resize was a call)
        }
        if (built == nullptr) {
            DecrefAll(stack);
            return nullptr;  // `shared` releases its objects
        }
        stack.push_back(built);  // within the reserved capacity: no reallocation, no throw
        if (node.shared_target) shared.Add(index, built);
    }
    shared.Release();
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
