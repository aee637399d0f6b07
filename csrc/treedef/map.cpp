// tree_map and tree_map_with_path: flatten the first tree, cut the others to its structure, call f
// once per leaf position, unflatten; without JAX's Python generator, zip and intermediate lists.
// The plain tree_map(f, tree) skips all this: see map_single_pass.cpp.
// Call order here: every flatten callback (and is_leaf call), then every f call, then every
// custom unflatten. JAX pulls f's results from its generator while it builds (one leaf ahead),
// so the f calls and custom unflatten calls interleave there; only callbacks with side effects
// can tell, and the result is the same. Calling f up front keeps the rebuild a tight loop
// (interleaving measured 8% slower on transformer trees).
#include <optional>

#include "util/pyutils.h"
#include "util/scratch.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/treedef_state.h"
#include "treedef/unflatten_with.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

// The current error is a structure mismatch that FlattenUpTo raised while cutting `other` to
// `tree`'s structure. Replace it by the Python layer's key-path explanation when there is one
// (raised `from None`, as JAX does). Only fastree's own mismatch errors come here: an exception
// from a callback (a KeyboardInterrupt in a custom flatten, say) is never replaced. The hook walks
// the trees with fastree's own one-level flatten; if it raises (a callback it calls fails, or is
// interrupted), that exception propagates, with the mismatch as its __context__.
void ExplainMismatch(PyObject* tree, PyObject* other, PyObject* is_leaf, bool is_leaf_takes_path,
                     const char* func) {
    // Held for the call: the hook may be replaced while it runs.
    Ref hook = LoadHook(&TreeDefState::map_error_hook);
    if (!hook) return;
    SavedError mismatch;
    mismatch.Save(/*normalize=*/true);
    Ref name(PyUnicode_FromString(func));
    Ref exc;
    if (name) {
        PyObject* args[5] = {tree, other, is_leaf ? is_leaf : Py_None, name.get(),
                             is_leaf_takes_path ? Py_True : Py_False};
        exc = Ref(PyObject_Vectorcall(hook.get(), args, 5, nullptr));
    }
    if (!exc) {
        // The explanation failed: its exception wins, chained to the mismatch (as a raise in an
        // `except` block would be).
        ChainToCurrent(mismatch.value(), /*as_cause=*/false);
        return;
    }
    if (PyExceptionInstance_Check(exc.get())) {
        PyException_SetCause(exc.get(), nullptr);  // `raise ... from None`
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.get())), exc.get());
        return;
    }
    // No explanation: the mismatch itself.
    mismatch.Restore();
}

}  // namespace

void SetMapErrorHook(PyObject* hook) {
    StoreHook(&TreeDefState::map_error_hook, hook);
}

PyObject* Map(PyObject* f, PyObject* tree, PyObject* const* rest, Py_ssize_t num_rest,
              PyObject* is_leaf, bool with_path, bool is_leaf_takes_path) {
    // The common call, tree_map(f, tree), has a faster walk of its own. With is_leaf, JAX's
    // every-predicate-call-before-any-f order is worth keeping; other trees must be checked
    // against the first before f runs; paths are not built there.
    if (num_rest == 0 && is_leaf == nullptr && !with_path) {
        if (PyObject* out = MapLeafSequence(f, tree)) return out;
        if (PyErr_Occurred()) return nullptr;
        return MapSinglePass(f, tree);
    }
    ScratchTreeDef scratch_def;  // never leaves this call
    const TreeDef& def = scratch_def.def;
    ScratchVector leaves_buf;
    std::optional<ScratchVector> paths_buf;  // only taken from the pool when paths are wanted
    RefVector no_paths;
    if (with_path) paths_buf.emplace();
    std::vector<PyObject*>& leaves = leaves_buf.get();
    std::vector<PyObject*>& paths = with_path ? paths_buf->get() : no_paths;  // (path, leaf) pairs when with_path
    // columns[j] holds the leaves of rest[j], cut to the first tree's structure.
    std::vector<RefVector> columns(static_cast<size_t>(num_rest));
    PyObject* out = nullptr;
    auto cleanup = [&] {
        DecrefAll(leaves);
        DecrefAll(paths);
        for (auto& column : columns) DecrefAll(column);
    };

    if (!Flatten(tree, is_leaf, is_leaf_takes_path, &scratch_def, &leaves,
                 with_path ? &paths : nullptr)) {
        cleanup();
        return nullptr;
    }
    const size_t n = leaves.size();
    for (Py_ssize_t j = 0; j < num_rest; ++j) {
        columns[j].reserve(n);
        bool mismatch = false;
        if (!FlattenUpTo(def, rest[j], &columns[j], &mismatch)) {
            if (mismatch) {
                ExplainMismatch(tree, rest[j], is_leaf, is_leaf_takes_path,
                                with_path ? "tree_map_with_path tree" : "tree_map tree");
            }
            cleanup();
            return nullptr;
        }
    }
    // Arguments for one call: [path,] leaf, rest_0[i], rest_1[i], ... after one spare slot, which
    // PY_VECTORCALL_ARGUMENTS_OFFSET lets the callee use (a bound method puts `self` there
    // instead of copying the arguments into a new array on every call).
    const size_t offset = with_path ? 1 : 0;
    const size_t nargs = offset + 1 + static_cast<size_t>(num_rest);
    std::vector<PyObject*> call(1 + nargs);
    PyObject** args = call.data() + 1;
    for (size_t i = 0; i < n; ++i) {
        if (with_path) args[0] = PyTuple_GET_ITEM(paths[i], 0);
        const size_t ahead = i + static_cast<size_t>(kPrefetchDistance);
        if (ahead < n) PrefetchForWrite(leaves[ahead]);
        args[offset] = leaves[i];
        for (Py_ssize_t j = 0; j < num_rest; ++j) args[offset + 1 + j] = columns[j][i];
        PyObject* r = PyObject_Vectorcall(f, args, nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
        if (r == nullptr) {
            cleanup();
            return nullptr;
        }
        // Done with this leaf: release it now, while f has just touched it, rather than in a
        // cache-cold pass over every leaf at the end. Its slot takes the result. (Raw calls: the
        // slots are the pooled vectors' raw owned pointers, released here once per leaf.)
        Py_SETREF(leaves[i], r);
        for (Py_ssize_t j = 0; j < num_rest; ++j) Py_CLEAR(columns[j][i]);
        if (with_path) Py_CLEAR(paths[i]);
    }
    // The results' references move into the tree being built.
    out = UnflattenWith(def, [&](Py_ssize_t i) -> PyObject* {
        PyObject* r = leaves[i];
        leaves[i] = nullptr;
        return r;
    });
    cleanup();
    return out;
}

}  // namespace fastree
