// The module state's one traversal, one clear, the object that shows them to the GC, and the
// hot-path mirrors (see module_state.h for what lives where and why).
#include "binding/module_state.h"

#include <atomic>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

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
std::atomic<PyObject*> g_jax_registry{nullptr};  // borrowed: state::Registry().jax_registry
}  // namespace registry
PyTypeObject* g_PyTreeDef_Type = nullptr;  // borrowed: state::TreeDef().type (permanent)

JaxTexts& Texts() { return g_texts; }

// Traverse takes no lock. On free-threaded builds the collector runs it with the world stopped:
// every other thread is parked outside the interpreter, and none is inside a table operation
// (a thread detaches only to wait for a lock, and each wait is outside any other lock's table
// operation: Clear waits holding locks, but between its moves, never inside one). Taking a lock
// here could wait forever on a parked holder.
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
    Py_VISIT(registry.library_adopter.get());
    Py_VISIT(registry.iterable_leaf_types.get());
    Py_VISIT(registry.iterable_leaf_warn.get());
    for (PyObject* old : registry.retired) Py_VISIT(old);

    auto visit_cache = [&](const IndexCache* cache) -> int {
        if (cache == nullptr) return 0;
        const Py_ssize_t end = cache->end.load(std::memory_order_relaxed);
        for (Py_ssize_t i = 0; i < end; ++i) {
            Py_VISIT(cache->slots[i].load(std::memory_order_relaxed));
        }
        return 0;
    };
    for (const IndexKeys* kind : {&keys.sequence, &keys.flattened_index}) {
        Py_VISIT(kind->cls.get());
        Py_VISIT(kind->block.get());
        if (int err = visit_cache(kind->cache.load(std::memory_order_relaxed))) return err;
    }
    for (const NamedKeys* kind : {&keys.dict, &keys.getattr}) {
        Py_VISIT(kind->cls.get());
        Py_VISIT(kind->maker.get());
        Py_VISIT(kind->block.get());
        Py_VISIT(kind->cache.load(std::memory_order_relaxed));
    }
    for (PyObject* old : keys.retired) Py_VISIT(old);
    for (const IndexCache* old : keys.retired_caches) {
        if (int err = visit_cache(old)) return err;
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
    // by then. (Moving a Ref, a RefVector or a map allocates nothing and cannot throw.) The
    // moves happen under the table locks, taken in the order registry_state.h writes down, so a
    // walk still running on another thread (free-threaded builds: the module made garbage while
    // a daemon thread walks) sees each table whole, before or after; nothing is released under
    // them. Declared before the locks, so released after them.
    RegistryState::MemoTable memo;
    Ref on_type_death, jax_registry, jax_flatten_with_keys, jax_flatten_one_level;
    Ref jaxlib_adopter, library_adopter, iterable_leaf_types, iterable_leaf_warn;
    RefVector registry_retired;
    Ref sequence_cls, sequence_block, flattened_index_cls, flattened_index_block;
    Ref dict_cls, dict_maker, dict_block, dict_cache, getattr_cls, getattr_maker, getattr_block,
        getattr_cache;
    RefVector keys_retired;
    std::vector<IndexCache*> index_caches;
    IndexCache* sequence_cache = nullptr;
    IndexCache* flattened_index_cache = nullptr;
    KeysOverflow overflow;
    Ref classify, reporter;
    std::unordered_map<PyTypeObject*, AuxState::Verdict> verdicts;
    std::unique_ptr<AuxReports::Pending> pending;
    Ref to_jax_hook, map_error_hook;
    {
        TableLock::Hold registry_hold(registry.lock);
        TableLock::Hold keys_hold(keys.lock);
        TableLock::Hold aux_hold(aux.lock);
        TableLock::Hold hooks_hold(treedef.hooks_lock);
        memo = std::move(registry.memo);
        registry.memo.clear();
        registry.memo_by_weakref.clear();
        ++registry.memo_drops;
        registry::ClearMemoSlots();
        registry.memo_jax_size = -1;
        on_type_death = std::move(registry.on_type_death);
        jax_registry = registry.SetJaxRegistry(Ref());
        jax_flatten_with_keys = std::move(registry.jax_flatten_with_keys);
        jax_flatten_one_level = std::move(registry.jax_flatten_one_level);
        registry.jax_flatten_with_keys_now.store(nullptr, std::memory_order_relaxed);
        registry.jax_flatten_one_level_now.store(nullptr, std::memory_order_relaxed);
        jaxlib_adopter = std::move(registry.jaxlib_adopter);
        library_adopter = std::move(registry.library_adopter);
        iterable_leaf_types = std::move(registry.iterable_leaf_types);
        iterable_leaf_warn = std::move(registry.iterable_leaf_warn);
        registry_retired.swap(registry.retired);

        sequence_cls = std::move(keys.sequence.cls);
        sequence_block = std::move(keys.sequence.block);
        flattened_index_cls = std::move(keys.flattened_index.cls);
        flattened_index_block = std::move(keys.flattened_index.block);
        dict_cls = std::move(keys.dict.cls);
        dict_maker = std::move(keys.dict.maker);
        dict_block = std::move(keys.dict.block);
        dict_cache = Ref(keys.dict.cache.exchange(nullptr, std::memory_order_acq_rel));
        getattr_cls = std::move(keys.getattr.cls);
        getattr_maker = std::move(keys.getattr.maker);
        getattr_block = std::move(keys.getattr.block);
        getattr_cache = Ref(keys.getattr.cache.exchange(nullptr, std::memory_order_acq_rel));
        keys_retired.swap(keys.retired);
        index_caches.swap(keys.retired_caches);
        sequence_cache = keys.sequence.cache.exchange(nullptr, std::memory_order_acq_rel);
        flattened_index_cache =
            keys.flattened_index.cache.exchange(nullptr, std::memory_order_acq_rel);
        // (RefVector swaps: moving one allocates nothing, but it has no move assignment.)
        overflow.sequence.swap(keys_walk.overflow.sequence);
        overflow.flattened_index.swap(keys_walk.overflow.flattened_index);
        overflow.dict = std::move(keys_walk.overflow.dict);
        overflow.getattr = std::move(keys_walk.overflow.getattr);

        classify = std::move(aux.classify);
        reporter = std::move(aux.reporter);
        aux.checking.store(false, std::memory_order_relaxed);
        verdicts = std::move(aux.verdicts);
        aux.verdicts.clear();
        pending.reset(std::exchange(reports.pending, nullptr));

        to_jax_hook = std::move(treedef.to_jax_hook);
        map_error_hook = std::move(treedef.map_error_hook);
    }
    // Released here, after the locks: the caches' entries, then every Ref above as it dies.
    IndexCache::Release(sequence_cache);
    IndexCache::Release(flattened_index_cache);
    for (IndexCache* cache : index_caches) IndexCache::Release(cache);
    ReleaseKeptTreeDefs();
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
    ModuleState s = ModState();
    Py_ssize_t registrations;
    bool installed;
    {
        TableLock::Hold hold(s.registry.lock);  // read under it, formatted after
        registrations = static_cast<Py_ssize_t>(s.registry.all.size());
        installed = static_cast<bool>(s.registry.jax_registry);
    }
    return PyUnicode_FromFormat("<fastree._core module state: %zd registrations, JAX bridge %s>",
                                registrations, installed ? "installed" : "not installed");
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
