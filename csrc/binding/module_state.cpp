// The module state's one traversal, one clear, the object that shows them to the GC, and the
// hot-path mirrors (see module_state.h for what lives where and why).
#include "binding/module_state.h"

#include <memory>
#include <utility>

#include "treedef/treedef.h"

namespace fastree {

// The parts' storage (each part declared by the layer that owns it; see module_state.h).
namespace state {
NeverDestroyed<RegistryState> g_registry;
NeverDestroyed<KeysState> g_keys;
NeverDestroyed<AuxState> g_aux;
NeverDestroyed<TreeDefState> g_treedef;
// The walks' own parts: the calling thread's on free-threaded builds (util/thread_state.h). (The
// pending aux reports are per thread on every build, stored in aux_state.h, which says why.)
FASTREE_PER_THREAD NeverDestroyed<KeysWalkState> g_keys_walk;
FASTREE_PER_THREAD uint64_t g_user_code_epoch = 0;
}  // namespace state
namespace {
JaxTexts g_texts;  // plain flags: nothing to release, nothing for the GC
}  // namespace

ModuleState ModState() {
    return {state::Registry(), state::Keys(),    state::KeysWalk(), state::Aux(),
            state::Reports(),  state::TreeDef(), g_texts};
}

// The mirrors: plain globals so that the per-leaf checks read them with one load.
namespace registry {
// Owns nothing; emptied whenever the memo table is dropped. Per thread on free-threaded builds,
// where emptying every thread's is moving the generation on (registry.h).
FASTREE_PER_THREAD Memo g_memo[kMemoSlots];
#ifdef Py_GIL_DISABLED
std::atomic<uint64_t> g_memo_generation{1};  // a slot's 0 never matches
#endif
PyObject* g_jax_registry = nullptr;  // borrowed: state::Registry().jax_registry
}  // namespace registry
PyTypeObject* g_PyTreeDef_Type = nullptr;  // borrowed: state::TreeDef().type (permanent)

JaxTexts& Texts() { return g_texts; }

int ModuleState::Traverse(visitproc visit, void* arg) const {
    for (const auto& reg : registry.all) {
        Py_VISIT(reg->type);
        Py_VISIT(reg->flatten);
        Py_VISIT(reg->unflatten);
        Py_VISIT(reg->flatten_with_keys);
        Py_VISIT(reg->data_fields);
        Py_VISIT(reg->meta_fields);
        Py_VISIT(reg->attr_node);
    }
    for (const auto& entry : registry.memo) Py_VISIT(entry.second.weakref.get());
    Py_VISIT(registry.on_type_death.get());
    Py_VISIT(registry.jax_registry.get());
    Py_VISIT(registry.jax_flatten_with_keys.get());
    Py_VISIT(registry.jax_flatten_one_level.get());
    Py_VISIT(registry.jaxlib_adopter.get());
    Py_VISIT(registry.iterable_leaf_types.get());
    Py_VISIT(registry.iterable_leaf_warn.get());

    for (const IndexKeys* kind : {&keys.sequence, &keys.flattened_index}) {
        Py_VISIT(kind->cls.get());
        Py_VISIT(kind->block.get());
        for (PyObject* key : kind->cache) Py_VISIT(key);
    }
    for (const NamedKeys* kind : {&keys.dict, &keys.getattr}) {
        Py_VISIT(kind->cls.get());
        Py_VISIT(kind->maker.get());
        Py_VISIT(kind->block.get());
        Py_VISIT(kind->cache.get());
    }
    for (const RefVector* overflow : {&keys_walk.overflow.sequence,
                                      &keys_walk.overflow.flattened_index}) {
        for (PyObject* key : *overflow) Py_VISIT(key);
    }
    Py_VISIT(keys_walk.overflow.dict.get());
    Py_VISIT(keys_walk.overflow.getattr.get());

    Py_VISIT(aux.classify.get());
    Py_VISIT(aux.reporter.get());
    for (const auto& entry : aux.verdicts) Py_VISIT(entry.second.type.get());
    if (reports.pending != nullptr) {
        for (const auto& report : *reports.pending) {
            Py_VISIT(report.node_type.get());
            Py_VISIT(report.aux.get());
            Py_VISIT(report.root.get());
            Py_VISIT(report.is_leaf.get());
            Py_VISIT(report.key_path.get());
        }
    }

    Py_VISIT(treedef.type.get());
    Py_VISIT(treedef.to_jax_hook.get());
    Py_VISIT(treedef.map_error_hook.get());
    return 0;
}

void ModuleState::Clear() {
    // Moved out first, released when these locals die at the end: the state is already empty
    // by then. (Moving a Ref, a RefVector or a map allocates nothing and cannot throw.)
    auto memo = std::move(registry.memo);
    registry.memo.clear();
    registry.memo_by_weakref.clear();
    registry::ClearMemoSlots();
    registry.memo_jax_size = -1;
    Ref on_type_death = std::move(registry.on_type_death);
    Ref jax_registry = registry.SetJaxRegistry(Ref());
    Ref jax_flatten_with_keys = std::move(registry.jax_flatten_with_keys);
    Ref jax_flatten_one_level = std::move(registry.jax_flatten_one_level);
    Ref jaxlib_adopter = std::move(registry.jaxlib_adopter);
    Ref iterable_leaf_types = std::move(registry.iterable_leaf_types);
    Ref iterable_leaf_warn = std::move(registry.iterable_leaf_warn);

    IndexKeys sequence = std::move(keys.sequence);
    IndexKeys flattened_index = std::move(keys.flattened_index);
    NamedKeys dict = std::move(keys.dict);
    NamedKeys getattr = std::move(keys.getattr);
    KeysOverflow overflow = std::move(keys_walk.overflow);

    Ref classify = std::move(aux.classify);
    Ref reporter = std::move(aux.reporter);
    auto verdicts = std::move(aux.verdicts);
    aux.verdicts.clear();
    std::unique_ptr<AuxReports::Pending> pending(std::exchange(reports.pending, nullptr));

    Ref to_jax_hook = std::move(treedef.to_jax_hook);
    Ref map_error_hook = std::move(treedef.map_error_hook);
}

// ---- The state object: fastree._core._module_state.

namespace {

struct ModuleStateObject {
    PyObject_HEAD
};

int StateTraverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    return ModState().Traverse(visit, arg);
}

int StateClear(PyObject*) {
    ModState().Clear();
    return 0;
}

void StateDealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    // The module is being torn down: what the state holds goes with it.
    ModState().Clear();
    tp->tp_free(self);
    Py_DECREF(tp);  // the instance's reference to its heap type
}

PyObject* StateRepr(PyObject*) {
    const ModuleState& s = ModState();
    return PyUnicode_FromFormat("<fastree._core module state: %zd registrations, JAX bridge %s>",
                                static_cast<Py_ssize_t>(s.registry.all.size()),
                                s.registry.jax_registry ? "installed" : "not installed");
}

PyType_Slot kSlots[] = {
    {Py_tp_traverse, reinterpret_cast<void*>(StateTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(StateClear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(StateDealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(StateRepr)},
    {Py_tp_doc, const_cast<char*>(
        "fastree's module state: owns every reference the core keeps between calls "
        "(registrations, JAX's registry and key classes, the Python layer's hooks) and shows "
        "them to the garbage collector.")},
    {0, nullptr},
};

PyType_Spec kSpec = {
    "fastree._core.ModuleState",
    sizeof(ModuleStateObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    kSlots,
};

}  // namespace

PyObject* NewModuleStateObject() {
    // The state is the process's: a subinterpreter would share it (and objects of another
    // interpreter with it). Python 3.12+ refuses the module to isolated subinterpreters from its
    // Py_mod_multiple_interpreters slot; legacy ones (shared GIL) get this far.
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(PyExc_ImportError,
                        "fastree._core does not support subinterpreters (its state is per "
                        "process); import it in the main interpreter");
        return nullptr;
    }
    // pybind11 runs the module's init once per interpreter (a re-import finds the cached
    // module); a second state object would report the same references to the GC twice.
    static bool created = false;
    if (created) {
        PyErr_SetString(PyExc_ImportError, "fastree._core cannot be initialised twice");
        return nullptr;
    }
    Ref type(PyType_FromSpec(&kSpec));
    if (!type) return nullptr;
    PyObject* obj = PyType_GenericAlloc(reinterpret_cast<PyTypeObject*>(type.get()), 0);
    if (obj != nullptr) created = true;
    return obj;
}

}  // namespace fastree
