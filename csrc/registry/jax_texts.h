// Error texts that differ between JAX releases. fastree matches the installed JAX: the Python
// layer asks it once at import (fastree/jax_interop/bridge.py) and sets these.
#pragma once

namespace fastree {

struct JaxTexts {
    // Before jax 0.7 a dict key mismatch printed the dict ("...; dict: {...}."); since, it lists
    // the keys present ("...; present keys: [...].").
    bool dict_mismatch_shows_dict = false;
    // jax 0.12 names the node type when comparing metadata (aux data) raises ("... metadata
    // fields of pytree node of type <class ...>. ..."); before, "... of pytree. ...".
    bool aux_equality_names_type = false;
    // Not a text: up to jaxlib 0.10 a dict that a callback grew during a treedef-building walk
    // ends in a RuntimeError (its size is recorded after its values); later jaxlib builds the
    // dict as the walk reached it. kinds_read.h's DictSizeKept follows the installed JAX.
    bool dict_grown_mid_walk_raises = false;
};

// The module state's texts (module_state.h): written once at import, under the GIL. Out of
// line (kept with the state's parts in binding/module_state.cpp); only error paths read them.
JaxTexts& Texts();

}  // namespace fastree
