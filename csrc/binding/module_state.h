// The core's module-level state: every Python reference and setting fastree._core keeps between
// calls, with one owner, one GC traversal and one clear.
//
// What lives there, one part per concern (the file that uses it in brackets), each part declared
// by the layer that owns it:
//   registry  registrations, the per-type memo, JAX's registry and callbacks   (registry.cpp)
//   keys      JAX's key classes, jaxlib's key makers, the cached key entries   (keys.cpp)
//   keys_walk the key entries past the caches, kept during key-path walks      (keys.cpp)
//             (all three: registry/registry_state.h, with the user-code epoch)
//   aux       the aux_data hooks, strict mode, the classifier's verdicts       (aux_check.cpp)
//   reports   the aux reports waiting for an entry point's end                 (aux_check.cpp)
//             (both: diagnostics/aux_state.h)
//   treedef   the PyTreeDef type, the bridge's to_jax and tree_map error hooks
//                                   (treedef/type.cpp, treedef/map.cpp; treedef/treedef_state.h)
//   texts     the installed JAX's error-text variants                          (jax_texts.h)
//
// Why the parts are declared below and composed here: each layer reads its own part, so the
// part is declared where the layer can include it without including binding/ (csrc/'s includes
// point down, docs/layout.md); this header cannot itself move down, since the state holds
// Registrations (registry.h) and this file is where every part is known. What stays here, once:
// the parts' storage, the mirrors, Traverse and Clear (module_state.cpp). One traversal, so that
// no reference is reported twice or missed; one clear, because Clear moves every part out
// before it releases anything, so a finalizer that re-enters the core finds the whole state
// empty, which a clear per part could not promise.
//
// Who owns what: the state owns every reference in its parts (the Ref and RefVector members,
// MemoEntry::weakref, Verdict::type). Two parts are permanent, as in JAX: the Registration
// records, which own their fields as raw pointers (registry.h) and are never freed because
// treedef nodes point at them for the life of the process; and the PyTreeDef type, which a
// treedef made by a late finalizer still needs. Traverse() reports every reference, permanent
// ones included; Clear() drops all the others.
//
// How the GC sees it: through one object in the module, fastree._core._module_state, whose
// tp_traverse and tp_clear are Traverse and Clear (module_state.cpp). The module's own
// m_traverse/m_clear are out of reach: pybind11's PYBIND11_MODULE makes a PyModuleDef with
// m_size 0 and no m_traverse/m_clear, and its Py_mod_create slot returns a plain module.
//
// Why reads are direct: each part has static storage (state::g_registry, ...), so state::Keys()
// is a constant address and `state::Keys().dict.cache` is one load, as the globals it replaced
// were (a PyModule_GetState call per leaf or per key would be measurable). The per-leaf checks
// in headers owned by the walkers read three mirrors that are plain globals, defined with the
// state in module_state.cpp and owning nothing: registry::g_memo (Classify's two-way
// cache), registry::g_jax_registry (a borrowed copy of registry.jax_registry, written only by
// RegistryState::SetJaxRegistry) and g_PyTreeDef_Type (IsTreeDef; a borrowed copy of the
// permanent treedef.type).
//
// The state is per process: fastree._core runs in the main interpreter only, and is initialised
// once (NewModuleStateObject). Everything here is touched only with the GIL held, except on
// free-threaded builds (docs/threads.md says what protects what there). On those, the parts that
// belong to the walks running (keys_walk, reports, the user-code epoch and registry::g_memo) are
// per thread (util/thread_state.h; reports on every build, aux_state.h): ModState() gives the
// calling thread's, so Traverse visits and Clear drops that thread's only. Another thread's are
// references its own walk holds and releases when it ends; unvisited, the GC counts them as
// references from outside, which keeps what they point at alive until then.
#pragma once

#include <Python.h>

#include "diagnostics/aux_state.h"
#include "registry/jax_texts.h"
#include "registry/registry_state.h"
#include "treedef/treedef_state.h"

namespace fastree {

// The whole state, as the traversal and the clear see it: the parts, by reference.
struct ModuleState {
    RegistryState& registry;
    KeysState& keys;
    KeysWalkState& keys_walk;  // the calling thread's on free-threaded builds
    AuxState& aux;
    AuxReports& reports;       // the calling thread's
    TreeDefState& treedef;
    JaxTexts& texts;

    // Visits every reference the state owns, permanent ones included. Runs no Python code.
    int Traverse(visitproc visit, void* arg) const;
    // Drops every reference that is not permanent. Everything is moved out of the state (and
    // the mirrors reset) before anything is released, so finalizers that re-enter the core find
    // a consistent, empty state.
    void Clear();
};

// The parts, each in its static storage (module_state.cpp). Binding code only: the layers below
// read their own part (state::Registry(), state::Keys(), state::Aux(), state::TreeDef()).
ModuleState ModState();

// The GC-tracked object through which the collector sees the state (fastree._core._module_state).
// ImportError outside the main interpreter, or when the module is initialised a second time.
PyObject* NewModuleStateObject();

}  // namespace fastree
