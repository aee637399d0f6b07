// The treedef layer's part of the module state (binding/module_state.h says what the state is,
// who owns what, and how the GC sees it): the PyTreeDef type (type.cpp), the bridge's to_jax
// hook (type.cpp) and tree_map's error hook (map.cpp). Declared here, by the layer that owns
// it; its storage, the one traversal and the one clear are binding/module_state.cpp's.
#pragma once

#include <utility>

#include "util/free_threading.h"
#include "util/never_destroyed.h"
#include "util/pyutils.h"

namespace fastree {

struct TreeDefState {
    Ref type;            // the PyTreeDef type (permanent); mirrored by g_PyTreeDef_Type
    Ref to_jax_hook;     // treedef -> the equal JAX treedef (the JAX bridge)
    Ref map_error_hook;  // explains tree_map's structure mismatches (fastree/_map_errors.py)
    // Guards the two hooks: each is read with a new reference (LoadHook) and replaced whole
    // (StoreHook), so a call on one thread never finds the hook another thread's re-install of
    // the bridge just released. Fourth in the lock order (registry/registry_state.h).
    TableLock hooks_lock;
};

namespace state {
extern NeverDestroyed<TreeDefState> g_treedef;  // binding/module_state.cpp
inline TreeDefState& TreeDef() { return g_treedef.value; }
}  // namespace state

// A new reference to the hook in `field` (null if none is installed).
inline Ref LoadHook(Ref TreeDefState::*field) {
    TreeDefState& s = state::TreeDef();
    TableLock::Hold hold(s.hooks_lock);
    return Ref::FromBorrowed((s.*field).get());
}

// Installs `hook` (borrowed) in `field`; the one it replaces is released after the lock, since
// releasing it can run Python code (a finalizer).
inline void StoreHook(Ref TreeDefState::*field, PyObject* hook) {
    TreeDefState& s = state::TreeDef();
    Ref replaced = Ref::FromBorrowed(hook);
    {
        TableLock::Hold hold(s.hooks_lock);
        std::swap(replaced, s.*field);  // moves only: nothing is released under the lock
    }
}

}  // namespace fastree
