// flatten_one_level(_with_keys): the root's children and node data, in the container shapes
// JAX returns (a list stays a list, a tuple a tuple, dict values come as a tuple, ...).
#include "registry/custom_output.h"
#include "registry/keys.h"
#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

PyObject* PairsFromPaths(std::vector<PyObject*>& paths, bool as_tuple) {
    // paths[i] is ((key,), child): turn each into (key, child).
    // Each pair allocates (the cyclic GC can run): NewSequenceOf (pyutils.h). `paths` is the
    // caller's and owns every entry across the calls.
    const Py_ssize_t n = static_cast<Py_ssize_t>(paths.size());
    auto pair = [&](Py_ssize_t i) {
        PyObject* path = PyTuple_GET_ITEM(paths[i], 0);
        return PyTuple_Pack(2, PyTuple_GET_ITEM(path, 0), PyTuple_GET_ITEM(paths[i], 1));
    };
    return as_tuple ? NewSequenceOf<true>(n, pair) : NewSequenceOf<false>(n, pair);
}

// A custom node's own answer, checked as JAX checks it: (children, aux) with the children as the
// flatten function returned them; with keys, (list of (key, child) pairs, aux).
PyObject* CustomOneLevel(PyObject* fn, PyObject* tree, bool with_keys) {
    Ref result(PyObject_CallOneArg(fn, tree));
    if (!result) return nullptr;
    PyObject* children;
    PyObject* aux;
    if (!SplitFlattenResult(result.get(), with_keys, &children, &aux)) return nullptr;
    Ref it(IterChildren(children, result.get(), with_keys));
    if (!it) return nullptr;
    if (!with_keys) return PyTuple_Pack(2, children, aux);
    Ref pairs(PyList_New(0));
    if (!pairs) return nullptr;
    while (PyObject* pair = PyIter_Next(it.get())) {
        Ref held(pair);
        if (!CheckKeyChildPair(pair)) return nullptr;
        Ref copy(PyTuple_Pack(2, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)));
        if (!copy || PyList_Append(pairs.get(), copy.get()) < 0) return nullptr;
    }
    if (PyErr_Occurred()) return nullptr;
    return PyTuple_Pack(2, pairs.get(), aux);
}

}  // namespace

// Returns (children, node_data) or None for a leaf.
PyObject* FlattenOneLevelPy(PyObject* tree, bool with_keys) {
    const Registration* reg = registry::Classify(tree);
    if (reg->IsLeaf()) Py_RETURN_NONE;
    // Custom nodes answer with their own callback's output, checked as JAX checks it.
    if (kinds::HasCallbacks(reg->kind)) {
        // A type only JAX knows: JAX's registry answers (its dataclass kind, for one, gives
        // children as a list where its registered Python flatten gives a tuple).
        if (reg->from_jax) {
            // Held for the call: re-installing the JAX bridge replaces (and frees) the old one.
            PyObject* jax_fn =
                with_keys ? registry::JaxFlattenWithKeys() : registry::JaxFlattenOneLevel();
            if (jax_fn != nullptr) {
                Ref held = Ref::FromBorrowed(jax_fn);
                return PyObject_CallOneArg(held.get(), tree);
            }
        }
        // A registration's callbacks are never replaced or freed (registry.h): no hold needed.
        PyObject* fn = with_keys ? reg->flatten_with_keys : reg->flatten;
        if (fn != nullptr) return CustomOneLevel(fn, tree, with_keys);
    }
    TreeDef def;
    RefVector children;
    RefVector paths;
    keys::WalkScope key_scope;  // a wide node's entries made once per call (see NodeRecords)
    bool ok = FlattenOneLevel(tree, &def, &children, with_keys ? &paths : nullptr);
    Ref data;
    if (ok) {
        data = Ref(kinds::OneLevelData(PartsOf(def, def.nodes.back())));
        ok = static_cast<bool>(data);
    }
    if (!ok) {
        DecrefAll(children);
        DecrefAll(paths);
        return nullptr;
    }
    const OneLevelShape shape = kinds::OneLevelChildren(def.nodes.back().kind);
    Ref first;
    if (with_keys) {
        // JAX gives the built-in kinds' (key, child) pairs as a tuple, the others' as a list.
        first = Ref(PairsFromPaths(paths, kinds::IsBuiltin(def.nodes.back().kind)));
    } else if (shape == OneLevelShape::kSelf) {
        first = Ref::FromBorrowed(tree);
    } else if (shape == OneLevelShape::kTuple) {
        Ref list(StealIntoList(children));
        first = list ? Ref(PyList_AsTuple(list.get())) : Ref();
    } else {
        first = Ref(StealIntoList(children));
    }
    DecrefAll(children);
    DecrefAll(paths);
    if (!first) return nullptr;
    return PyTuple_Pack(2, first.get(), data.get());
}

}  // namespace fastree
