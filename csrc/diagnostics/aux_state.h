// The diagnostics layer's part of the module state (binding/module_state.h says what the state
// is, who owns what, and how the GC sees it): the aux_data hooks, strict mode, the classifier's
// verdicts and the reports waiting for an entry point's end (aux_check.cpp). Declared here, by
// the layer that owns it; its storage, the one traversal and the one clear are
// binding/module_state.cpp's. Static storage: `state::Aux().reporter` is one load (aux_check.h's
// per-node checks read it).
#pragma once

#include <Python.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "util/never_destroyed.h"
#include "util/pyutils.h"

namespace fastree {

struct AuxState {
    Ref classify;  // (type, example) -> bool, "instances are plain data"
    Ref reporter;  // (node_type, aux, root, ...) -> warns or raises; null: no checks
    bool strict = false;
    // The classifier's verdict per value type, bounded in size. Holds each type (types seen in
    // aux data are long-lived: enums, classes).
    struct Verdict {
        Ref type;
        bool plain;
    };
    std::unordered_map<PyTypeObject*, Verdict> verdicts;
    // Bumped whenever a verdict could change (hooks, strict mode, verdicts dropped): a stamp
    // taken at an earlier epoch no longer vouches for anything (see aux::CheckStamped).
    uint64_t epoch = 1;
    // Reports found during an entry point's walk, made after it (aux::ReportScope): the
    // reporter runs Python code (it locates the node by walking the tree again, with the tree's
    // own flatten functions and is_leaf) that must not run inside the walk. Owned; visited.
    struct PendingReport {
        Ref node_type, aux, root, is_leaf, key_path;  // is_leaf, key_path: null when absent
    };
    std::vector<PendingReport> pending;
    int report_depth = 0;  // entry points in progress (nested: a callback calling fastree)
};

namespace state {
extern NeverDestroyed<AuxState> g_aux;  // binding/module_state.cpp
inline AuxState& Aux() { return g_aux.value; }
}  // namespace state

}  // namespace fastree
