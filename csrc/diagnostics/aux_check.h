// Checks of custom nodes' aux_data (the static part of a treedef, hence of every jit cache key).
//
// The common case must cost almost nothing: aux made of None/bool/int/float/complex/str/bytes/
// classes, in tuples/frozensets (and lists/dicts/sets outside strict mode), is accepted by a
// C walk with no Python call. Any other value type is shown once to the Python classifier
// (fastree.diagnostics.aux, which judges by the type alone and calls no user code) and
// remembered; only aux holding a type it rejects (arrays, tracers, ...) reaches the Python
// reporter, which warns or, in strict mode, raises. With no reporter set (fastree.config
// aux_checks "off", the default while fastree is installed into JAX) nothing is checked.
#pragma once

#include <Python.h>

#include "diagnostics/aux_state.h"
#include "util/path_stack.h"
#include "util/pyutils.h"

namespace fastree {
namespace aux {

// Where a node being checked sits, for the report: the whole tree, and what the walk knows of
// the node's place in it. With the key path the reporter names it directly; without, it finds
// it with one walk of `root` that stops where `is_leaf` (if given) stopped the flatten.
struct Site {
    PyObject* root;                    // borrowed: the tree being flattened
    PyObject* is_leaf = nullptr;       // borrowed or null: the flatten's one-argument is_leaf
    const PathStack* path = nullptr;   // the walk's key path to the node, if it keeps one
};

bool CheckSlow(PyObject* node_type, PyObject* aux, const Site& site);
bool CheckAndStamp(PyObject* node_type, PyObject* aux, const Site& site, uint64_t* stamp);

// Returns false with a Python error set if the reporter raised (strict mode).
inline bool Check(PyObject* node_type, PyObject* aux, const Site& site) {
    // No reporter until fastree._aux installs the hooks (a relaxed load: aux_state.h).
    if (!state::Aux().checking.load(std::memory_order_relaxed) || aux == Py_None) return true;
    return CheckSlow(node_type, aux, site);
}

// Check, for an aux object that is handed out again and again (an attribute node's shared aux
// tuple): `*stamp` records the epoch at which `aux` passed with nothing mutable inside (tuples,
// frozensets and values whose type has a verdict), and while that epoch lasts the walk is
// skipped. The caller resets *stamp to 0 whenever the object it refers to changes.
inline bool CheckStamped(PyObject* node_type, PyObject* aux, const Site& site, uint64_t* stamp) {
    if (!state::Aux().checking.load(std::memory_order_relaxed) || aux == Py_None) return true;
    if (*stamp == state::Aux().epoch.load(std::memory_order_relaxed)) return true;
    return CheckAndStamp(node_type, aux, site, stamp);
}

// The reports an entry point's walk finds are made once the walk is over, where the reporter's
// Python code (it walks the tree again to name the node's key path, calling the tree's flatten
// functions and is_leaf; it warns, or raises in strict mode) cannot change the walk, as JAX's
// walk runs none of it. A scope per entry point (ReportAfter below); nested entry points (a
// callback calling fastree, in the same thread) leave theirs to the outermost of their thread;
// another thread's entry points are not nested in it, whatever the GIL's hand-overs. Outside any
// scope a report is made at once.
// Every entry point opens one before it walks, so its common case (no report pending) is
// inline: as calls, the three steps were 40 instructions of a 3-leaf tuple's 750-instruction
// tree_map (callgrind). tree_flatten, tree_leaves, tree_structure and tree_map answer a tuple or
// list of plain leaves before theirs opens (binding/entry_points.cpp): nothing there is reported.
class ReportScope {
 public:
    // The thread's reports are looked up once (a thread-local: aux_state.h). The address is
    // made opaque to the compiler: GCC otherwise recomputes it after the wrapped call with a
    // second __tls_get_addr call (a shared library's thread-locals are reached through it)
    // rather than keep it in a register, 2 calls per entry point instead of 1 (callgrind).
    ReportScope() : reports_(*Opaque(&state::Reports())) { ++reports_.depth; }
    // Drops reports not made (the call failed).
    ~ReportScope() {
        if (--reports_.depth == 0 && reports_.pending != nullptr) DropPending();
    }
    ReportScope(const ReportScope&) = delete;
    ReportScope& operator=(const ReportScope&) = delete;
    // The entry point's `result` (owned, or null with an error set) once the pending reports
    // are made (outermost scope only); null with the reporter's error set where a report raises
    // (strict mode), the result released.
    PyObject* Finish(PyObject* result) {
        if (result != nullptr && !Flush()) Py_CLEAR(result);
        return result;
    }

 private:
    // Makes the pending reports (outermost scope only). False with the reporter's error set.
    bool Flush() { return reports_.depth != 1 || reports_.pending == nullptr || MakePending(); }
    static void DropPending();
    static bool MakePending();
    static AuxReports* Opaque(AuxReports* p) {
        asm("" : "+r"(p));  // no instruction: the compiler can no longer tell where p points
        return p;
    }
    AuxReports& reports_;  // the calling thread's
};

// F, with the reports its walk finds made after it returns a result (ReportScope): a strict
// mode error then replaces the result.
template <auto F>
struct ReportingAfter;

template <class... A, PyObject* (*F)(A...)>
struct ReportingAfter<F> {
    static PyObject* Call(A... args) {
        ReportScope scope;
        return scope.Finish(F(args...));
    }
};

template <auto F>
constexpr auto ReportAfter = &ReportingAfter<F>::Call;

void SetHooks(PyObject* classify, PyObject* reporter);
void SetStrict(bool strict);
bool Strict();

}  // namespace aux
}  // namespace fastree
