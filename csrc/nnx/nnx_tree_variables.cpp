// Tree mode's Variable walk (nnx_tree_variables.h).
//
// flax's predicate is ``isinstance(x, Variable)``, which ``VariableMeta.__instancecheck__``
// answers in Python: ``type.__instancecheck__`` first (its ``super()`` call), then, for a JAX
// tracer or a hijax Variable, more of its own code. Every object the walk meets is asked, and
// most are no Variable (arrays, Modules, tuples), so the predicate was most of the walk's time.
// VariableCheck makes the same ``type.__instancecheck__`` checks in C (CPython's own steps, the
// ``__class__`` read included, so a ``__class__`` property runs as it runs under flax; skipped
// only where it could run no code) and leaves only tracers and hijax objects to flax's
// ``isinstance``.
#include "nnx/nnx_tree_variables.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "nnx/nnx_graph_variables.h"
#include "registry/attr_node.h"
#include "registry/registry.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/walkers.h"
#include "util/free_threading.h"
#include "util/pointer_map.h"
#include "util/pyutils.h"

namespace fastree::nnx_tree {
namespace {

// The check's own state, a tuple held as the builtin function's `self` (its reference, seen by
// the GC through the function object): the classes it asks about, the interned name it reads and
// object's own `__class__` descriptor.
enum CheckItem : Py_ssize_t {
    kVariable,
    kTracer,
    kHijax,
    kClassName,    // "__class__"
    kObjectClass,  // object.__class__ (the descriptor)
    kCheckSize
};

// getattr(obj, name) where a missing attribute is no error: 1 and a new reference, 0 (missing)
// or -1 with an error set.
int GetOptionalAttr(PyObject* obj, PyObject* name, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(obj, name, out);
#else
    return _PyObject_LookupAttr(obj, name, out);
#endif
}

// Whether reading `x.__class__` gives type(x) and runs no code: x's class reads attributes with
// object's own __getattribute__ (a __getattr__ of its own runs only for a missing attribute, and
// __class__ is never missing), and `__class__` on its MRO is object's own descriptor (a data
// descriptor: no instance dict shadows it). The lookup is the type's attribute cache; its result
// is compared, never used.
bool PlainClassRead(PyObject* x, PyObject* state) {
    PyTypeObject* type = Py_TYPE(x);
    return attr::UsesObjectGetattribute(type) &&
           _PyType_Lookup(type, PyTuple_GET_ITEM(state, kClassName)) ==
               PyTuple_GET_ITEM(state, kObjectClass);
}

// type.__instancecheck__(cls, x), as CPython computes it (object_isinstance): x's type, else the
// class its ``__class__`` names where that is another type. 1, 0, or -1 with an error set. The
// read is skipped where it could only give type(x) with no code run (PlainClassRead), the answer
// then being the type's alone.
int TypeCheck(PyObject* cls, PyObject* x, PyObject* state, bool plain_class) {
    PyTypeObject* type = reinterpret_cast<PyTypeObject*>(cls);
    if (PyObject_TypeCheck(x, type)) return 1;
    if (plain_class) return 0;
    PyObject* claimed = nullptr;
    if (GetOptionalAttr(x, PyTuple_GET_ITEM(state, kClassName), &claimed) < 0) return -1;
    Ref held(claimed);
    if (!held || claimed == reinterpret_cast<PyObject*>(Py_TYPE(x)) || !PyType_Check(claimed)) {
        return 0;
    }
    return PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(claimed), type);
}

// isinstance(x, Variable) as flax answers it: 1, 0, or -1 with an error set. What
// VariableMeta.__instancecheck__ says True to, type.__instancecheck__ says first; what is neither
// a tracer nor a hijax object (Tracer has no metaclass of its own, so this check is its
// isinstance) is no Variable. The rest goes to isinstance itself.
int IsVariable(PyObject* state, PyObject* x) {
    PyObject* variable = PyTuple_GET_ITEM(state, kVariable);
    const bool plain_class = PlainClassRead(x, state);
    int found = TypeCheck(variable, x, state, plain_class);
    if (found != 0) return found;
    found = TypeCheck(PyTuple_GET_ITEM(state, kTracer), x, state, plain_class);
    PyObject* hijax = PyTuple_GET_ITEM(state, kHijax);
    if (found == 0 && hijax != Py_None) found = TypeCheck(hijax, x, state, plain_class);
    if (found <= 0) return found;
    return PyObject_IsInstance(x, variable);
}

PyObject* CallCheck(PyObject* state, PyObject* x) {
    const int found = IsVariable(state, x);
    if (found < 0) return nullptr;
    return Py_NewRef(found ? Py_True : Py_False);
}

PyMethodDef kCheckDef = {
    "is_variable", CallCheck, METH_O,
    "is_variable(x)\n--\n\n"
    "isinstance(x, flax.nnx.Variable), as flax's metaclass answers it (fastree's native check)."};

// The check's state, or null with a TypeError where `check` is not a VariableCheck.
PyObject* CheckState(PyObject* check) {
    if (PyCFunction_Check(check) &&
        reinterpret_cast<PyCFunctionObject*>(check)->m_ml == &kCheckDef) {
        return PyCFunction_GET_SELF(check);
    }
    PyErr_Format(PyExc_TypeError, "variables_by_path: expected fastree's Variable check, got %R",
                 check);
    return nullptr;
}

// The predicate of VariablesUnchanged's walk (CallGuarded): the check's answer, except that a
// node whose keys its own functions make (a custom node, an identity-preserving one) is taken as
// a leaf and noted, so that its functions never run in a walk flax's check would not make
// (flax's walk calls flatten_with_keys, this one would call flatten), and the walk is found
// changed. GuardedWalk is what the walk found, owned by a capsule in the predicate's `self`, the
// tuple (capsule, the check's state): a profiler may keep the function object past the walk, and
// the tuple shows the state to the GC.
struct GuardedWalk {
    bool keyed_node_met = false;
};

void DeleteGuardedWalk(PyObject* capsule) {
    delete static_cast<GuardedWalk*>(PyCapsule_GetPointer(capsule, nullptr));
}

PyObject* CallGuarded(PyObject* self, PyObject* x) {
    auto* walk = static_cast<GuardedWalk*>(PyCapsule_GetPointer(PyTuple_GET_ITEM(self, 0), nullptr));
    if (walk == nullptr) return nullptr;
    const int found = IsVariable(PyTuple_GET_ITEM(self, 1), x);
    if (found < 0) return nullptr;
    if (found) Py_RETURN_TRUE;
    const Registration* reg = registry::Classify(x);
    if (reg->kind == NodeKind::kCustom || reg->preserve_identity) {
        walk->keyed_node_met = true;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

PyMethodDef kGuardedDef = {"is_variable_or_keyed_node", CallGuarded, METH_O, nullptr};

constexpr const char* kByPathNames[] = {"check", "tree", "structure"};
constexpr const char* kUnchangedNames[] = {"check", "tree", "treedef", "positions", "variables"};
constexpr const char* kApplyNames[] = {"variables", "updates", "updates_type", "context"};

// A list attribute of an Updates (its `_keys` or `_values` slot) as an owned tuple, read in one
// go (another thread may append to the list); null without an error where it is no exact list.
Ref SlotItems(PyObject* updates, PyObject* name) {
    Ref list(PyObject_GetAttr(updates, name));
    if (!list) return Ref();
    if (!PyList_CheckExact(list.get())) return Ref();
    return Ref(PyList_AsTuple(list.get()));
}

// The (Variable, update) pairs flax's loop would update, in its order: false with an error set on
// an error; false without one where flax's function must run (see ApplyUpdates).
bool Resolve(PyObject* variables, PyObject* updates, PyObject* updates_type,
             nnx_graph::VariableOps* ops, std::vector<std::pair<Ref, Ref>>* out) {
    const nnx_graph::Names* n = nnx_graph::GetNames();
    Ref states(PyList_AsTuple(updates));  // flax's `for flat_state in updates`, as it stood
    if (!states) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(states.get()); ++i) {
        PyObject* state = PyTuple_GET_ITEM(states.get(), i);  // held by `states`
        if (Py_TYPE(state) != reinterpret_cast<PyTypeObject*>(updates_type)) return false;
        Ref keys(SlotItems(state, n->updates_keys));
        if (!keys) return false;
        Ref values(SlotItems(state, n->updates_values));
        if (!values) return false;
        // Updates.__iter__ is zip(_keys, _values): as many pairs as the shorter list.
        const Py_ssize_t count =
            std::min(PyTuple_GET_SIZE(keys.get()), PyTuple_GET_SIZE(values.get()));
        for (Py_ssize_t k = 0; k < count; ++k) {
            PyObject* found = nullptr;
            if (DictGetItemRef(variables, PyTuple_GET_ITEM(keys.get(), k), &found) < 0) {
                return false;
            }
            Ref variable(found);
            if (!variable) return false;  // flax raises its "Variable not found" error
            // flax asserts isinstance(variable, Variable); a plain Variable class is one.
            const int plain = ops->IsPlainVariable(variable.get());
            if (plain <= 0) return false;
            out->emplace_back(std::move(variable),
                              Ref::FromBorrowed(PyTuple_GET_ITEM(values.get(), k)));
        }
    }
    return true;
}

}  // namespace

PyObject* NewVariableCheck(PyObject* variable, PyObject* tracer, PyObject* hijax) {
    for (PyObject* cls : {variable, tracer}) {
        if (!PyType_Check(cls)) {
            PyErr_Format(PyExc_TypeError, "variable_check: expected a class, got %R", cls);
            return nullptr;
        }
    }
    if (hijax != Py_None && !PyType_Check(hijax)) {
        PyErr_Format(PyExc_TypeError, "variable_check: expected a class or None, got %R", hijax);
        return nullptr;
    }
    Ref class_name(PyUnicode_InternFromString("__class__"));
    if (!class_name) return nullptr;
    // object's own, held by `object` for the process: borrowed until the tuple holds it.
    PyObject* object_class = _PyType_Lookup(&PyBaseObject_Type, class_name.get());
    if (object_class == nullptr) {
        PyErr_SetString(PyExc_SystemError, "fastree: object has no __class__");
        return nullptr;
    }
    Ref state(PyTuple_Pack(kCheckSize, variable, tracer, hijax, class_name.get(), object_class));
    if (!state) return nullptr;
    return PyCFunction_NewEx(&kCheckDef, state.get(), nullptr);
}

PyObject* VariablesByPath(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* a[3];
    if (!ParseArgs({"variables_by_path", kByPathNames, 3, 2}, args, nargs, kwnames, a)) {
        return nullptr;
    }
    PyObject* check = a[0];
    PyObject* state = CheckState(check);
    if (state == nullptr) return nullptr;
    const int structure = TruthArg(a[2]);
    if (structure < 0) return nullptr;
    // Owned (path, leaf) pairs for the whole loop: the path and leaf pointers read from them stay
    // valid through the checks, hashes and comparisons below, which can run Python code.
    RefVector leaves;
    RefVector pairs;
    TreeDef def;
    if (!Flatten(a[1], check, false, structure ? &def : nullptr, &leaves, &pairs)) return nullptr;
    Ref found(PyDict_New());
    if (!found) return nullptr;
    Ref positions(structure ? PyList_New(0) : nullptr);
    if (structure && !positions) return nullptr;
    PointerMap seen;  // the Variables so far, by address (each held by its pair)
    bool alias = false;
    for (size_t i = 0; i < pairs.size(); ++i) {
        PyObject* path = PyTuple_GET_ITEM(pairs[i], 0);
        PyObject* leaf = PyTuple_GET_ITEM(pairs[i], 1);
        const int variable = IsVariable(state, leaf);  // flax's loop asks again
        if (variable < 0) return nullptr;
        if (!variable) continue;
        bool inserted = false;
        seen.FindOrInsert(leaf, 0, &inserted);
        if (!inserted) {  // an alias: flax's own function raises
            alias = true;
            break;
        }
        if (PyDict_SetItem(found.get(), path, leaf) < 0) return nullptr;
        if (structure) {
            Ref index(PyLong_FromSize_t(i));
            if (!index || PyList_Append(positions.get(), index.get()) < 0) return nullptr;
        }
    }
    Ref result = alias ? Ref::FromBorrowed(Py_None) : std::move(found);
    if (!structure) return result.release();
    // A structure VariablesUnchanged could never find again (custom nodes' keys are their own
    // functions'): None, so that no caller keeps it.
    Ref treedef(KeysFollowFromStructure(def) ? WrapTreeDef(std::move(def))
                                              : Py_NewRef(Py_None));
    if (!treedef) return nullptr;
    return PyTuple_Pack(3, result.get(), treedef.get(), positions.get());
}

PyObject* VariablesUnchanged(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                             PyObject* kwnames) {
    PyObject* a[5];
    if (!ParseArgs({"variables_unchanged", kUnchangedNames, 5, 5}, args, nargs, kwnames, a)) {
        return nullptr;
    }
    PyObject* check = a[0];
    PyObject* state = CheckState(check);
    if (state == nullptr) return nullptr;
    PyObject* positions = a[3];
    PyObject* variables = a[4];
    if (!IsTreeDef(a[2]) || !PyTuple_CheckExact(positions) || !PyTuple_CheckExact(variables) ||
        PyTuple_GET_SIZE(positions) != PyTuple_GET_SIZE(variables)) {
        PyErr_SetString(PyExc_TypeError, "variables_unchanged: expected a treedef and two "
                        "tuples of one length");
        return nullptr;
    }
    auto* walk = new GuardedWalk;
    Ref capsule(PyCapsule_New(walk, nullptr, DeleteGuardedWalk));
    if (!capsule) {
        delete walk;
        return nullptr;
    }
    Ref self(PyTuple_Pack(2, capsule.get(), state));
    if (!self) return nullptr;
    Ref guarded(PyCFunction_NewEx(&kGuardedDef, self.get(), nullptr));
    if (!guarded) return nullptr;
    RefVector leaves;
    ScratchTreeDef def;
    if (!Flatten(a[1], guarded.get(), false, &def, &leaves, nullptr)) return nullptr;
    if (walk->keyed_node_met || !SameStructureAndKeys(DefOf(a[2]), def.def)) Py_RETURN_FALSE;
    // Each Variable where it was, and no new one among the other leaves.
    const Py_ssize_t count = PyTuple_GET_SIZE(positions);
    Py_ssize_t k = 0;
    for (size_t i = 0; i < leaves.size(); ++i) {
        if (k < count) {
            const Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, k));
            if (at == -1 && PyErr_Occurred()) return nullptr;
            if (static_cast<size_t>(at) == i) {
                if (leaves[i] != PyTuple_GET_ITEM(variables, k)) Py_RETURN_FALSE;
                ++k;
                continue;
            }
        }
        const int variable = IsVariable(state, leaves[i]);
        if (variable < 0) return nullptr;
        if (variable) Py_RETURN_FALSE;
    }
    if (k != count) Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

PyObject* ApplyUpdates(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* a[4];
    if (!ParseArgs({"apply_updates", kApplyNames, 4, 4}, args, nargs, kwnames, a)) return nullptr;
    PyObject* variables = a[0];
    PyObject* updates = a[1];
    if (!PyDict_CheckExact(variables) || !PyList_CheckExact(updates) || !PyType_Check(a[2]) ||
        !PyTuple_CheckExact(a[3]) || PyTuple_GET_SIZE(a[3]) != nnx_graph::kUnflattenSize) {
        Py_RETURN_FALSE;
    }
    nnx_graph::VariableOps ops(a[3]);
    // Every pair first: where flax's function must run, it runs on Variables none of which this
    // call has touched, and raises (or applies) exactly as it would have alone.
    std::vector<std::pair<Ref, Ref>> pairs;
    if (!Resolve(variables, updates, a[2], &ops, &pairs)) {
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_FALSE;
    }
    for (const auto& [variable, update] : pairs) {
        if (!ops.Update(variable.get(), update.get(), /*from_state=*/true)) return nullptr;
    }
    Py_RETURN_TRUE;
}

}  // namespace fastree::nnx_tree
