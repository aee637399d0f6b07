// Tree mode's per-call Variable walk, natively: flax's ``extract.check_no_aliases`` (which every
// tree-mode transform calls on its arguments) asks ``isinstance(x, Variable)`` of every object
// its ``jax.tree.leaves_with_path`` meets, then builds a path -> Variable dict in a Python loop.
// Here the question is a C function (VariableCheck: no Python frame, the same answers and the
// same user code as flax's metaclass), and the walk, the loop and the dict are one call
// (VariablesByPath). python/fastree/integrations/_flax_nnx_alias_check.py binds them.
#pragma once

#include <Python.h>

namespace fastree::nnx_tree {

// A callable `check(x) -> bool` answering ``isinstance(x, variable)`` as flax's
// ``VariableMeta.__instancecheck__`` does (tracers and hijax Variables by flax's own isinstance).
// `tracer` is JAX's Tracer class, `hijax` flax's HijaxVariable class or None. A new reference, or
// null with an error set.
PyObject* NewVariableCheck(PyObject* variable, PyObject* tracer, PyObject* hijax);

// variables_by_path(check, tree, structure=False): the dict flax's check_no_aliases returns for
// `tree` (the labeled arguments): each Variable leaf of a key-path walk that stops at Variables,
// by its path, in walk order. None where a Variable is met twice (flax's function then raises its
// own error). `check` must be a NewVariableCheck callable. With `structure`: (that, the walk's
// treedef, the Variables' positions among its leaves), what VariablesUnchanged compares with;
// the treedef is None where its key paths do not follow from it (KeysFollowFromStructure).
PyObject* VariablesByPath(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);

// variables_unchanged(check, tree, treedef, positions, variables): whether a walk of `tree` that
// stops at Variables has `treedef`'s structure and key paths without asking Python code
// (SameStructureAndKeys), the same Variable objects at `positions` among its leaves, and no
// other Variable: then variables_by_path would give the same paths naming the same Variables.
PyObject* VariablesUnchanged(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                             PyObject* kwnames);

// apply_updates(variables, updates, updates_type, context): flax's ``extract.apply_updates``
// (after a tree-mode call, each Variable the traced function changed gets its new state): for
// each ``(path, update)`` of each ``Updates`` in `updates`, ``variables[path]``'s
// ``update_from_state(update)``, as graph mode updates a Variable (nnx_graph_variables.h: plain
// Variable classes natively, with flax's trace check, others by their own method). True once
// applied; False, with nothing applied, where flax's function must run instead: `variables` not
// a dict, `updates` not a list of exact `updates_type`, a path missing or naming no Variable
// (flax's function then raises its own error). `context` is the graph walks' unflatten context.
PyObject* ApplyUpdates(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);

}  // namespace fastree::nnx_tree
