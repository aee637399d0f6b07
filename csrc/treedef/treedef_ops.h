// The treedef operations the bindings call (PyTreeDef's methods, the module functions), and the
// hooks the Python layer installs. One definition file each under treedef/.
#pragma once

#include <Python.h>

#include "treedef/treedef.h"

namespace fastree {

// hash_eq.cpp.
Py_hash_t Hash(PyTreeDefObject* self);
int Equal(const TreeDef& a, const TreeDef& b);  // 1, 0, or -1 with an error set
// Whether `b` is `a` again in a way that no Python code need be asked about, for caches keyed by
// a structure: the same node vector, each dict key and each node's data the same object (or a
// tuple of the same objects, as a rebuilt aux is), and every node's key paths following from
// its kind and data (no custom node, whose flatten_with_keys makes its keys; no shared
// reference). Equal treedefs may still answer false; never fails, never runs Python code.
bool SameStructureAndKeys(const TreeDef& a, const TreeDef& b);
// Whether every node's children's key entries follow from its kind and data, as ChildKey makes
// them (node_kinds.h): no custom node (its flatten_with_keys makes its keys) and no shared
// reference. Runs no Python code.
bool KeysFollowFromStructure(const TreeDef& def);

// repr.cpp.
PyObject* Repr(const TreeDef& def);

// pickle.cpp.
PyObject* State(const TreeDef& def);
PyObject* Reduce(const TreeDef& def);
PyObject* FromState(PyObject* state);

// node_view.cpp: PyTreeDef._nodes(), one (kind, type, data, arity, num_leaves, ref, child_keys)
// record per post-order node.
PyObject* NodeRecords(const TreeDef& def);
// structure.cpp.
PyObject* Children(const TreeDef& def);
PyObject* Compose(const TreeDef& outer, const TreeDef& inner);
PyObject* TreeDefTuple(PyObject* treedefs);
PyObject* FromNodeDataAndChildren(PyObject* node_data, PyObject* children);
PyObject* Walk(const TreeDef& def, PyObject* f_node, PyObject* f_leaf, PyObject* leaves);
PyObject* FromIterableTree(const TreeDef& def, PyObject* obj);

// map.cpp: tree_map / tree_map_with_path. `rest` holds the extra trees.
PyObject* Map(PyObject* f, PyObject* tree, PyObject* const* rest, Py_ssize_t num_rest,
              PyObject* is_leaf, bool with_path, bool is_leaf_takes_path);
// Hook the Python layer installs to explain a structure mismatch in tree_map (JAX's key-path
// message, worked out by fastree's own walk: python/fastree/_map_errors.py). Called as
// hook(tree, other, is_leaf, func_name, is_leaf_takes_path) -> exception or None.
void SetMapErrorHook(PyObject* hook);
// Hook converting a fastree treedef to JAX's (installed by the JAX bridge). Both hooks are held by
// the module state (treedef_state.h), which reports them to the GC.
void SetToJaxHook(PyObject* hook);
// one_level.cpp: flatten_one_level(_with_keys); (children, node_data), or None for a leaf.
PyObject* FlattenOneLevelPy(PyObject* tree, bool with_keys);

}  // namespace fastree
