// The diagnostics layer's part of the module state (binding/module_state.h says what the state
// is, who owns what, and how the GC sees it): the aux_data hooks, strict mode, the classifier's
// verdicts (AuxState), and the reports waiting for an entry point's end (AuxReports, per thread
// on every build) (aux_check.cpp). Declared here, by the layer that owns it; AuxState's storage,
// and the one traversal and the one clear of both, are binding/module_state.cpp's (AuxReports'
// storage is below). Static storage: `state::Aux().checking` is one load (aux_check.h's per-node
// checks read it).
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "util/free_threading.h"
#include "util/never_destroyed.h"
#include "util/pyutils.h"

namespace fastree {

struct AuxState {
    // Guards classify, reporter and verdicts: each hook is swapped under it and read under it
    // with a new reference (the caller calls it after unlocking: a swap cannot free a hook being
    // called); the verdicts are read and written under it, the classifier runs unlocked. Third in
    // the lock order written in registry/registry_state.h (ModuleState::Clear takes all three).
    TableLock lock;
    Ref classify;  // (type, example) -> bool, "instances are plain data"
    Ref reporter;  // (node_type, aux, root, ...) -> warns or raises; null: no checks
    // Whether a reporter is set: the per-node test (aux_check.h, Check) is this relaxed load,
    // without the lock. A walk that sees it set and then finds the reporter gone checks for
    // nothing (Report: a null reporter reports nothing).
    std::atomic<bool> checking{false};
    std::atomic<bool> strict{false};
    // The classifier's verdict per value type, bounded in size. Holds each type (types seen in
    // aux data are long-lived: enums, classes).
    struct Verdict {
        Ref type;
        bool plain;
    };
    std::unordered_map<PyTypeObject*, Verdict> verdicts;
    // Bumped whenever a verdict could change (hooks, strict mode, verdicts dropped): a stamp
    // taken at an earlier epoch no longer vouches for anything (see aux::CheckStamped). Relaxed:
    // a stamp is only ever compared with it.
    std::atomic<uint64_t> epoch{1};
};

// Reports found during an entry point's walk, made after it (aux::ReportScope): the reporter
// runs Python code (it locates the node by walking the tree again, with the tree's own flatten
// functions and is_leaf) that must not run inside the walk. Owned; visited; empty whenever no
// entry point of the thread is running.
//
// Per thread on every build, GIL builds included (not FASTREE_PER_THREAD): the GIL does not keep
// entry points apart. A walk hands the GIL over wherever it runs Python code (a custom flatten,
// is_leaf), so another thread's entry point can open and close while this one is mid-walk. With
// one process-wide copy, the other thread's scope was nested in this one's: its strict-mode error
// was left pending, its call returned a result, and this thread's call raised that error instead
// (tests/concurrent/test_concurrent_aux_checks.py). The cost is one thread-local lookup per entry
// point (ReportScope keeps the reference it gets), none per node: 35 instructions of a 3-leaf
// tuple's 2,200-instruction tree_map (callgrind, a GIL build). The storage is constant-initialised
// and defined inline here, not in module_state.cpp with the other parts: an `extern thread_local`
// is reached through an initialisation wrapper, and cost 59.
struct AuxReports {
    struct PendingReport {
        Ref node_type, aux, root, is_leaf, key_path;  // is_leaf, key_path: null when absent
    };
    using Pending = std::vector<PendingReport>;
    // Owned; null while no report waits: made by the first report a walk finds inside an entry
    // point, deleted when the outermost one makes or drops the reports (a pointer, so that the
    // thread-local storage is trivial: no construction check per lookup, no destructor to run
    // at thread exit).
    Pending* pending = nullptr;
    int depth = 0;  // entry points in progress (nested: a callback calling fastree)
};

namespace state {
extern NeverDestroyed<AuxState> g_aux;  // binding/module_state.cpp
// The calling thread's reports, on every build (above); stored here, not in module_state.cpp.
inline thread_local AuxReports g_aux_reports;
inline AuxState& Aux() { return g_aux.value; }
inline AuxReports& Reports() { return g_aux_reports; }
}  // namespace state

}  // namespace fastree
