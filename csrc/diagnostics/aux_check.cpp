#include "diagnostics/aux_check.h"

#include <memory>
#include <unordered_map>
#include <utility>

#include "util/free_threading.h"
#include "util/pyutils.h"

namespace fastree {
namespace aux {

namespace {

// The hooks, strict mode and verdicts live in the module state (aux_state.h); the pending
// reports in the calling thread's AuxReports. The state's lock guards the hooks and verdicts
// (aux_state.h); nothing runs Python code or releases a reference while holding it.
AuxState& S() { return state::Aux(); }
AuxReports& R() { return state::Reports(); }

using Verdicts = std::unordered_map<PyTypeObject*, AuxState::Verdict>;

// Under the lock: empties the verdicts into `dropped` (released by the caller after unlocking:
// releasing a type can run Python code) and moves the epoch on.
void ClearVerdictsLocked(AuxState& s, Verdicts& dropped) {
    dropped = std::move(s.verdicts);
    s.verdicts.clear();
    s.epoch.fetch_add(1, std::memory_order_relaxed);
}

// A new reference to a hook, read under the lock: a swap releases the old one after unlocking,
// so the hook read here lives while the caller calls it.
Ref Held(const Ref& hook) {
    TableLock::Hold hold(S().lock);
    return Ref::FromBorrowed(hook.get());
}

enum class Walk { kPlain, kReport, kError };

bool IsAtom(PyTypeObject* t) {
    return t == Py_TYPE(Py_None) || t == &PyBool_Type || t == &PyLong_Type ||
           t == &PyFloat_Type || t == &PyUnicode_Type || t == &PyBytes_Type ||
           t == &PyComplex_Type || PyType_FastSubclass(t, Py_TPFLAGS_TYPE_SUBCLASS);
}

// Asks the classifier (once per type) whether instances of `t` are plain static data.
Walk Classify(PyObject* value) {
    PyTypeObject* t = Py_TYPE(value);
    AuxState& s = S();
    Ref classify;  // the hooks may be replaced while it runs: held for the call
    {
        TableLock::Hold hold(s.lock);
        auto it = s.verdicts.find(t);
        if (it != s.verdicts.end()) return it->second.plain ? Walk::kPlain : Walk::kReport;
        classify = Ref::FromBorrowed(s.classify.get());
    }
    if (!classify) return Walk::kReport;
    PyObject* args[2] = {reinterpret_cast<PyObject*>(t), value};
    Ref r(PyObject_Vectorcall(classify.get(), args, 2, nullptr));
    if (!r) return Walk::kError;
    int plain = PyObject_IsTrue(r.get());
    if (plain < 0) return Walk::kError;
    // `value` holds `t`, so the verdict's reference taken under the lock is never the last one.
    // Another thread may have judged `t` meanwhile: its verdict stays (try_emplace).
    Verdicts dropped;  // released after the lock
    TableLock::Hold hold(s.lock);
    if (s.verdicts.size() > 1024) ClearVerdictsLocked(s, dropped);
    s.verdicts.try_emplace(t, AuxState::Verdict{Ref::FromBorrowed(reinterpret_cast<PyObject*>(t)),
                                                plain != 0});
    return plain ? Walk::kPlain : Walk::kReport;
}

// *frozen is cleared when the walk meets a mutable container, whose contents may change later.
Walk Visit(PyObject* value, int depth, bool* frozen) {
    PyTypeObject* t = Py_TYPE(value);
    if (IsAtom(t)) return Walk::kPlain;
    if (depth > 16) return Walk::kReport;  // let the reporter look at pathological nesting
    const bool hashable_container = t == &PyTuple_Type || t == &PyFrozenSet_Type;
    const bool mutable_container = t == &PyList_Type || t == &PyDict_Type || t == &PySet_Type;
    if (mutable_container) *frozen = false;
    // Unhashable: strict rejects it.
    if (mutable_container && S().strict.load(std::memory_order_relaxed)) return Walk::kReport;
    // The classifier is Python code (fastree's own, judging by type: no user code), and any
    // allocation may run the GC and its finalizers, which may mutate or free what we are
    // walking: hold a reference to every item while it is visited, and re-read a list's size
    // each step. A list's item is taken inside the list's own lock (ListGetItemRef): another
    // thread may change the list meanwhile (docs/threads.md, borrowed references).
    if (t == &PyTuple_Type) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); ++i) {
            Ref item = Ref::FromBorrowed(PyTuple_GET_ITEM(value, i));
            Walk w = Visit(item.get(), depth + 1, frozen);
            if (w != Walk::kPlain) return w;
        }
        return Walk::kPlain;
    }
    if (t == &PyList_Type) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); ++i) {
            Ref item(ListGetItemRef(value, i));
            if (!item) {  // shrunk by another thread since the size was read: the walk ends
                PyErr_Clear();
                break;
            }
            Walk w = Visit(item.get(), depth + 1, frozen);
            if (w != Walk::kPlain) return w;
        }
        return Walk::kPlain;
    }
    if (t == &PyDict_Type) {
        Ref items(PyDict_Items(value));  // a snapshot the walk owns
        if (!items) return Walk::kError;
        Walk w = Walk::kPlain;
        for (Py_ssize_t i = 0; w == Walk::kPlain && i < PyList_GET_SIZE(items.get()); ++i) {
            PyObject* pair = PyList_GET_ITEM(items.get(), i);
            w = Visit(PyTuple_GET_ITEM(pair, 0), depth + 1, frozen);
            if (w == Walk::kPlain) w = Visit(PyTuple_GET_ITEM(pair, 1), depth + 1, frozen);
        }
        return w;
    }
    if (hashable_container || t == &PySet_Type) {  // frozenset/set (tuples were done above)
        Ref it(PyObject_GetIter(value));
        if (!it) return Walk::kError;
        Walk w = Walk::kPlain;
        while (w == Walk::kPlain) {
            Ref item(PyIter_Next(it.get()));
            if (!item) break;
            w = Visit(item.get(), depth + 1, frozen);
        }
        if (PyErr_Occurred()) return Walk::kError;
        return w;
    }
    return Classify(value);
}

// reporter(node_type, aux, root, [is_leaf=...], [key_path=...]). False with its error set.
bool Report(const AuxReports::PendingReport& report) {
    PyObject* args[5] = {report.node_type.get(), report.aux.get(), report.root.get()};
    Py_ssize_t nkw = 0;
    Ref kwnames(PyTuple_New(static_cast<bool>(report.is_leaf) + static_cast<bool>(report.key_path)));
    if (!kwnames) return false;
    if (report.is_leaf) {
        PyObject* name = PyUnicode_InternFromString("is_leaf");
        if (name == nullptr) return false;
        PyTuple_SET_ITEM(kwnames.get(), nkw, name);
        args[3 + nkw++] = report.is_leaf.get();
    }
    if (report.key_path) {
        PyObject* name = PyUnicode_InternFromString("key_path");
        if (name == nullptr) return false;
        PyTuple_SET_ITEM(kwnames.get(), nkw, name);
        args[3 + nkw++] = report.key_path.get();
    }
    // The hooks may be replaced (or cleared) while the walk or the reporter runs: held for the
    // call, taken under the lock.
    Ref reporter = Held(S().reporter);
    if (!reporter) return true;
    Ref r(PyObject_Vectorcall(reporter.get(), args, 3, nkw > 0 ? kwnames.get() : nullptr));
    return static_cast<bool>(r);
}

}  // namespace

void ReportScope::DropPending() {
    // Moved out first: releasing the references can run Python code.
    std::unique_ptr<AuxReports::Pending> dropped(std::exchange(R().pending, nullptr));
}

bool ReportScope::MakePending() {
    while (R().pending != nullptr) {
        // Taken out one at a time: the reporter may call fastree again (its own scope then
        // reports at once only if it is outermost, which it is not: depth stays 1 here).
        std::unique_ptr<AuxReports::Pending> batch(std::exchange(R().pending, nullptr));
        for (const auto& report : *batch) {
            if (!Report(report)) return false;  // strict mode's error; the rest dropped
        }
    }
    return true;
}

bool CheckSlow(PyObject* node_type, PyObject* aux, const Site& site) {
    uint64_t unused = 0;
    return CheckAndStamp(node_type, aux, site, &unused);
}

bool CheckAndStamp(PyObject* node_type, PyObject* aux, const Site& site, uint64_t* stamp) {
    // Before the walk: the classifier (or another thread) may move it on.
    const uint64_t epoch = S().epoch.load(std::memory_order_relaxed);
    bool frozen = true;
    Walk w = Visit(aux, 0, &frozen);
    if (w == Walk::kError) return false;
    if (w == Walk::kPlain) {
        if (frozen && S().epoch.load(std::memory_order_relaxed) == epoch) *stamp = epoch;
        return true;
    }
    Ref key_path(site.path != nullptr ? site.path->NewTuple() : nullptr);
    if (site.path != nullptr && !key_path) return false;
    AuxReports::PendingReport report{Ref::FromBorrowed(node_type), Ref::FromBorrowed(aux),
                                     Ref::FromBorrowed(site.root), Ref::FromBorrowed(site.is_leaf),
                                     std::move(key_path)};
    AuxReports& r = R();
    if (r.depth > 0) {  // made when the entry point's walk is over (ReportScope)
        if (r.pending == nullptr) r.pending = new AuxReports::Pending();
        r.pending->push_back(std::move(report));
        return true;
    }
    return Report(report);
}

void SetHooks(PyObject* classify, PyObject* reporter) {
    AuxState& s = S();
    // Swapped under the lock; the replaced hooks and verdicts are released after it (these
    // locals die after the Hold): a walk on another thread may be calling the old hooks, on its
    // own reference.
    Ref old_classify = OptionalRef(classify);
    Ref old_reporter = OptionalRef(reporter);
    Verdicts dropped;
    TableLock::Hold hold(s.lock);
    std::swap(s.classify, old_classify);
    std::swap(s.reporter, old_reporter);
    s.checking.store(static_cast<bool>(s.reporter), std::memory_order_relaxed);
    ClearVerdictsLocked(s, dropped);
}

void SetStrict(bool strict) {
    S().strict.store(strict, std::memory_order_relaxed);
    S().epoch.fetch_add(1, std::memory_order_relaxed);
}
bool Strict() { return S().strict.load(std::memory_order_relaxed); }

}  // namespace aux
}  // namespace fastree
