// The walkers' internals: what flatten, unflatten, flatten_up_to and their fast paths offer one
// another and the Python-facing functions (treedef_ops.h). Nothing here is reached from Python
// directly.
#pragma once

#include <Python.h>

#include <string>
#include <vector>

#include "treedef/treedef.h"

namespace fastree {

// The tail of flatten's RecursionError message (JAX's), shared by every walk that flattens.
inline constexpr char kFlattenRecursionWhere[] =
    " in flatten; PyTree may have cyclical node references.";

// flatten.cpp. Any of def / paths may be null to skip building them, and `leaves` where a def
// and no paths are built (the structure alone). `leaves` and `paths` receive owned references;
// on failure they may hold partial output the caller must release.
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

// unflatten.cpp. (Building one node: kinds::Build, node_kinds.h.)
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

// map_single_pass.cpp: tree_map(f, tree) with no is_leaf and no other trees, in one walk.
PyObject* MapSinglePass(PyObject* f, PyObject* tree);

// structure.cpp.
// keystr() of the path from the root to node `index` (for error messages).
std::string KeyPathString(const TreeDef& def, Py_ssize_t index);
// Appends the root node for `type` with `arity` children (the last `arity` subtrees of `def`).
bool MakeRootNode(PyObject* type, PyObject* data, Py_ssize_t arity, TreeDef* def);

}  // namespace fastree
