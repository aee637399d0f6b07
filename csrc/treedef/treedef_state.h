// The treedef layer's part of the module state (binding/module_state.h says what the state is,
// who owns what, and how the GC sees it): the PyTreeDef type (type.cpp), the bridge's to_jax
// hook (type.cpp) and tree_map's error hook (map.cpp). Declared here, by the layer that owns
// it; its storage, the one traversal and the one clear are binding/module_state.cpp's.
#pragma once

#include "util/never_destroyed.h"
#include "util/pyutils.h"

namespace fastree {

struct TreeDefState {
    Ref type;            // the PyTreeDef type (permanent); mirrored by g_PyTreeDef_Type
    Ref to_jax_hook;     // treedef -> the equal JAX treedef (the JAX bridge)
    Ref map_error_hook;  // explains tree_map's structure mismatches (fastree/_map_errors.py)
};

namespace state {
extern NeverDestroyed<TreeDefState> g_treedef;  // binding/module_state.cpp
inline TreeDefState& TreeDef() { return g_treedef.value; }
}  // namespace state

}  // namespace fastree
