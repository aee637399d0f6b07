// Thin CPython helpers shared by the core. Each exists for a reason stated beside it.
//
// The core's ownership rules, which these helpers exist to keep:
//
// 1. Any of these can run arbitrary Python code: allocating a GC-tracked object (PyList_New,
//    PyTuple_New, PyDict_New, ... can start the cyclic GC, whose finalizers, weakref callbacks
//    and gc.callbacks run on 3.10/3.11), hashing or comparing a user object, Py_DECREF (a
//    finalizer), attribute access, and any callback (is_leaf, flatten/unflatten functions, f).
//    That code can mutate or free any container reachable from the tree, and another thread can
//    run while it holds the GIL released.
// 2. So no borrowed pointer (a list or tuple item of a container someone else can change, a dict
//    entry, a cache slot, an element of a vector a callback can grow) is used after such a call.
//    Take a reference first (Ref, PushNewRef), or re-read after the call.
// 3. Owned references live in RAII holders (Ref, RefVector, RefSmallVector, Items, Scratch),
//    which release what they still hold when they die, so an error path, or a C++ exception
//    (std::bad_alloc from a growing vector) unwinding through a walker, leaks nothing. Raw owned
//    PyObject* is for measured hot loops, with a comment saying why it is safe there.
// 4. No C++ exception reaches CPython: entry points are wrapped by Guard<F> (MemoryError).
#pragma once

#include <Python.h>

#include <algorithm>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "util/free_threading.h"
#include "util/small_vector.h"

namespace fastree {

// Owned reference with RAII release. The hot paths use raw PyObject* with explicit
// ownership comments; this is for the cold paths (errors, repr, pickling) where clarity wins.
class Ref {
 public:
    Ref() = default;
    explicit Ref(PyObject* owned) : p_(owned) {}
    // A new reference to `borrowed` (which may be null), as Py_XNewRef.
    static Ref FromBorrowed(PyObject* borrowed) { return Ref(Py_XNewRef(borrowed)); }
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    Ref(Ref&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    // The new value is in place before the old one is released (as Py_XSETREF does): releasing
    // can run a finalizer, which must not find this holder pointing at a dying object.
    [[gnu::always_inline]] Ref& operator=(Ref&& o) noexcept {
        if (this != &o) {
            PyObject* old = p_;
            p_ = o.p_;
            o.p_ = nullptr;
            Py_XDECREF(old);
        }
        return *this;
    }
    // Forced inline: a test, a decrement and a rarely taken call. Left to GCC (with LTO, once
    // Refs were everywhere), it became an out-of-line call at ~470 sites, hot loops included.
    [[gnu::always_inline]] ~Ref() { Py_XDECREF(p_); }
    PyObject* get() const { return p_; }
    PyObject* release() {
        PyObject* p = p_;
        p_ = nullptr;
        return p;
    }
    explicit operator bool() const { return p_ != nullptr; }

 private:
    PyObject* p_ = nullptr;
};

// A walker's handle on the object it visits: borrowed (kOwned = false, the caller keeps it alive)
// or held (kOwned = true, a reference the caller gave up, dropped at scope exit). HandOver()
// gives the storer of get() one reference: a new one if borrowed, this one if held. One walker
// body then serves both, and a held reference moves into a leaf list without an INCREF/DECREF
// pair.
template <bool kOwned>
class MaybeOwned;

template <>
class MaybeOwned<false> {
 public:
    explicit MaybeOwned(PyObject* borrowed) : p_(borrowed) {}
    PyObject* get() const { return p_; }
    void HandOver() { Py_INCREF(p_); }

 private:
    PyObject* p_;
};

template <>
class MaybeOwned<true> {
 public:
    explicit MaybeOwned(PyObject* owned) : p_(owned) {}
    MaybeOwned(const MaybeOwned&) = delete;
    MaybeOwned& operator=(const MaybeOwned&) = delete;
    ~MaybeOwned() { Py_XDECREF(p_); }
    PyObject* get() const { return p_; }
    void HandOver() { p_ = nullptr; }

 private:
    PyObject* p_;
};

// A vector of owned references, released when it dies: after an error path that did not hand
// them on, and when a C++ exception (std::bad_alloc from a growing vector) unwinds through its
// owner. Code that hands the references on clears the vector.
class RefVector : public std::vector<PyObject*> {
 public:
    RefVector() = default;
    RefVector(RefVector&&) noexcept = default;
    RefVector(const RefVector&) = delete;
    RefVector& operator=(const RefVector&) = delete;
    ~RefVector() {
        for (PyObject* p : *this) Py_XDECREF(p);
    }
};

// Makes room for `n` more elements, grown geometrically as push_back would (reserving just `n`
// more per dict would copy the whole vector on every dict). May throw std::bad_alloc; the
// push_backs it made room for then cannot: a caller handing references over reserves first.
template <class Vec>
inline void ReserveMore(Vec& vec, size_t n) {
    if (vec.capacity() - vec.size() < n) vec.reserve(std::max(vec.size() + n, 2 * vec.capacity()));
}

// Appends `p` to `vec` with only the append itself inline: growing is a call of its own, after
// which the compiler knows that the push_back cannot reallocate. (Left to GCC, flatten's leaf
// append was an out-of-line emplace_back per leaf wherever the walk's frame grew large, as in
// the walk building a treedef.) May throw std::bad_alloc, before anything is appended.
template <class T>
[[gnu::noinline, gnu::cold]] void GrowForOneMore(std::vector<T>& vec) {
    ReserveMore(vec, 1);
}
template <class T>
[[gnu::always_inline]] inline void PushBackInline(std::vector<T>& vec, T p) {
    if (vec.size() == vec.capacity()) GrowForOneMore(vec);  // cold: the branch is laid out so
    if (vec.size() >= vec.capacity()) __builtin_unreachable();
    vec.push_back(p);
}

// Appends a new reference to `obj`. The reference is taken once the slot exists, so a
// push_back that throws (std::bad_alloc) leaves nothing leaked.
template <class Vec>
inline void PushNewRef(Vec& vec, PyObject* obj) {
    vec.push_back(obj);
    Py_INCREF(obj);
}

// Appends `obj`, an owned reference, to `vec`. If growing the vector throws (std::bad_alloc),
// the reference is released before the exception goes on: the caller never holds it unowned.
// (A try block costs nothing on the path that does not throw. Forced inline: left to GCC it was
// a call per child in tree_map's rebuild of custom nodes.)
template <class Vec>
[[gnu::always_inline]] inline void PushOwned(Vec& vec, PyObject* obj) {
    try {
        vec.push_back(obj);
    } catch (...) {
        Py_DECREF(obj);
        throw;
    }
}

// Leaves are scattered through the heap, and taking a reference writes to each one: on large
// trees that cache miss per leaf is most of unflatten's own time. Loops that know the leaves in
// advance ask for the one kPrefetchDistance positions ahead, so its miss overlaps the work in
// between. (A prefetch never faults, so a stale pointer is harmless.)
constexpr Py_ssize_t kPrefetchDistance = 8;
inline void PrefetchForWrite(const void* p) { __builtin_prefetch(p, 1, 3); }

// If `obj` is a dict, asks for the start of its key table (where a small dict's entries are),
// so that visiting it next does not stall on its first PyDict_Next. Flattening walks sibling
// dicts one after another; this overlaps each one's miss with the work on the one before.
inline void PrefetchDictEntries(PyObject* obj) {
    if (PyDict_CheckExact(obj)) {
        // A relaxed load: on free-threaded builds another thread's resize stores ma_keys
        // atomically, and a plain read beside it is a data race, if a harmless one here.
        const char* table = reinterpret_cast<const char*>(
            __atomic_load_n(&reinterpret_cast<PyDictObject*>(obj)->ma_keys, __ATOMIC_RELAXED));
        __builtin_prefetch(table, 0, 3);
        __builtin_prefetch(table + 64, 0, 3);
    }
}

// ---- Reading a list another thread can change (docs/threads.md, "Borrowed references that
// another thread can free"). Under the GIL a read of an item and its INCREF are one step, since
// nothing between them runs Python code. On a free-threaded build another thread can resize the
// list (its item array freed) or replace the item (the item freed) in between: each helper
// below takes its references either through PyList_GetItemRef or inside the list's critical
// section, and allocates nothing and runs no Python code there.

// dict[key] as an owned reference (DictGetItemRef: taken by the lookup itself, so another
// thread's replacement of the entry cannot free it first); empty when absent (no error set) or
// when the lookup failed (error set).
inline Ref DictItemRef(PyObject* dict, PyObject* key) {
    PyObject* value;
    DictGetItemRef(dict, key, &value);
    return Ref(value);
}

// Item `i` of the exact list `list` as a new reference, or null with no error set when `i` is
// past its end now. For loops that read each item when they reach it (as jaxlib does), so
// callbacks between items are seen. Free-threaded: PyList_GetItemRef (CPython's own lock-free
// read of a shared list; no critical section); GIL builds: the plain read, as before.
inline PyObject* ListItemRef(PyObject* list, Py_ssize_t i) {
#ifdef Py_GIL_DISABLED
    PyObject* item = PyList_GetItemRef(list, i);
    if (item == nullptr) PyErr_Clear();  // its IndexError: the caller says what it means
    return item;
#else
    return i < PyList_GET_SIZE(list) ? Py_NewRef(PyList_GET_ITEM(list, i)) : nullptr;
#endif
}

// Copies the items of a tuple (of any class) or an exact list `seq` into `dest` as new
// references, if it holds exactly `n` of them; false, nothing copied, if it holds another
// number. A list's size and
// items are read inside its critical section, so the copy is one snapshot even while another
// thread resizes it (a no-op block on GIL builds: the same loop as before).
inline bool CopyItemsIfSize(PyObject* seq, Py_ssize_t n, PyObject** dest) {
    if (PyTuple_Check(seq)) {  // immutable
        if (PyTuple_GET_SIZE(seq) != n) return false;
        PyObject* const* items = &PyTuple_GET_ITEM(seq, 0);
        for (Py_ssize_t i = 0; i < n; ++i) dest[i] = Py_NewRef(items[i]);
        return true;
    }
    bool same;
    FASTREE_BEGIN_CRITICAL_SECTION(seq);
    same = PyList_GET_SIZE(seq) == n;
    if (same) {
        PyObject* const* items = reinterpret_cast<PyListObject*>(seq)->ob_item;
        for (Py_ssize_t i = 0; i < n; ++i) dest[i] = Py_NewRef(items[i]);
    }
    FASTREE_END_CRITICAL_SECTION();
    return same;
}

// Py_EnterRecursiveCall/Py_LeaveRecursiveCall as a scope guard, so that deep or cyclic input
// raises RecursionError instead of overflowing the C stack.
//
// Up to 3.11 one counter per thread served both checks: sys.setrecursionlimit's, shared by
// Python frames and C recursion alike. From 3.12 Py_EnterRecursiveCall counts against a C-stack
// budget (3.12, 3.13: c_recursion_remaining; 3.14: the stack pointer) and ignores the limit,
// which CPython applies to Python frames only, through the thread state's py_recursion_remaining.
// On those versions the guard counts its level on that counter too: a walk's depth plus the
// Python frames under it is bounded by the limit, as on 3.11 (and as JAX is there). A lowered
// limit is honoured, sys.setrecursionlimit moves a running walk's budget as it moves Python's,
// and a raised one still cannot lift CPython's C budget (1,500 levels in 3.12.1, 10,000 in
// 3.13.0), which is what keeps the stack safe. (Before, the guard kept its own nesting count in
// a thread_local compared with Py_GetRecursionLimit(): a __tls_get_addr call and a function
// call per level, in a shared library's general-dynamic TLS model.)
//
// A walk passes the thread state it read once (PyThreadState_Get is a call). On 3.11 to 3.13
// the guard then does what CPython's own inline _Py_EnterRecursiveCallTstate does, on the
// public counter it reads (recursion_remaining, then c_recursion_remaining): while more than
// one level is left it counts one down and back up, with no call; at the last level it calls
// Py_EnterRecursiveCall itself, which raises (or lifts a raised limit) exactly as always. The two
// calls per level were a fifth of tree_leaves on parameter dicts (1000 two-leaf dicts: 39 to
// 32 us). Other versions (3.10's counter sits in the interpreter state, 3.14 checks the stack
// pointer) make the calls.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(USE_STACKCHECK) && \
    !defined(Py_LIMITED_API)
#define FASTREE_INLINE_RECURSION_COUNT 1
inline int& RecursionRemaining(PyThreadState* thread) {
#if PY_VERSION_HEX >= 0x030C0000
    return thread->c_recursion_remaining;
#else
    return thread->recursion_remaining;
#endif
}
#endif
#if PY_VERSION_HEX >= 0x030C0000 && !defined(Py_LIMITED_API)
#define FASTREE_COUNTS_PY_RECURSION 1
#endif

class RecursionGuard {
 public:
    explicit RecursionGuard(const char* where) : RecursionGuard(PyThreadState_Get(), where) {}
    // `thread`: the calling thread's state (PyThreadState_Get()).
    RecursionGuard(PyThreadState* thread, const char* where) : thread_(thread) {
#ifdef FASTREE_COUNTS_PY_RECURSION
        // As CPython's own check of a Python call (_Py_EnterRecursivePy): the level is refused
        // when no Python level is left.
        if (thread->py_recursion_remaining <= 0) {
            PyErr_Format(PyExc_RecursionError, "maximum recursion depth exceeded%s", where);
            ok_ = false;
            return;
        }
        --thread->py_recursion_remaining;
#endif
#ifdef FASTREE_INLINE_RECURSION_COUNT
        int& remaining = RecursionRemaining(thread);
        if (remaining > 1) {  // CPython's own check would pass: count the level as it does
            --remaining;
            ok_ = true;
        } else {
            ok_ = Py_EnterRecursiveCall(where) == 0;
        }
#else
        ok_ = Py_EnterRecursiveCall(where) == 0;
#endif
#ifdef FASTREE_COUNTS_PY_RECURSION
        if (!ok_) ++thread->py_recursion_remaining;
#endif
    }
    ~RecursionGuard() {
        if (!ok_) return;
#ifdef FASTREE_INLINE_RECURSION_COUNT
        ++RecursionRemaining(thread_);  // Py_LeaveRecursiveCall's whole work
#else
        Py_LeaveRecursiveCall();
#endif
#ifdef FASTREE_COUNTS_PY_RECURSION
        ++thread_->py_recursion_remaining;
#endif
    }
    RecursionGuard(const RecursionGuard&) = delete;
    RecursionGuard& operator=(const RecursionGuard&) = delete;
    bool ok() const { return ok_; }

 private:
    [[maybe_unused]] PyThreadState* thread_;
    bool ok_;
};

// repr(obj) appended to *out. Returns false with the Python error set (PyTreeDef.__repr__
// lets a raising repr surface); Repr below is the never-failing variant for error messages.
inline bool ReprInto(PyObject* obj, std::string* out) {
    PyObject* s = PyObject_Repr(obj);
    if (s == nullptr) return false;
    Py_ssize_t n;
    const char* utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == nullptr) {
        Py_DECREF(s);
        return false;
    }
    out->append(utf8, static_cast<size_t>(n));
    Py_DECREF(s);
    return true;
}

// repr(obj) as a std::string for error messages (JAX's messages show values by repr); never
// fails, like Str.
inline std::string Repr(PyObject* obj) {
    std::string out;
    if (!ReprInto(obj, &out)) {
        PyErr_Clear();
        return "<unprintable object>";
    }
    return out;
}

// str(obj) appended to *out; false with the Python error set on failure.
inline bool StrInto(PyObject* obj, std::string* out) {
    PyObject* s = PyObject_Str(obj);
    if (s == nullptr) return false;
    Py_ssize_t n;
    const char* utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == nullptr) {
        Py_DECREF(s);
        return false;
    }
    out->append(utf8, static_cast<size_t>(n));
    Py_DECREF(s);
    return true;
}

// str(obj) as a std::string for error messages; never fails (a failing __str__ must not
// replace the error we are about to raise).
inline std::string Str(PyObject* obj) {
    std::string out;
    if (!StrInto(obj, &out)) {
        PyErr_Clear();
        return "<unprintable object>";
    }
    return out;
}

// An exception set aside while other code runs (a retry that may raise its own, a walk that goes
// on looking for an error that would win) and made current again by Restore(); released with
// this holder if never restored. (PyErr_GetRaisedException is 3.12+; Fetch/Restore works on
// every supported Python.)
class SavedError {
 public:
    SavedError() = default;
    SavedError(const SavedError&) = delete;
    SavedError& operator=(const SavedError&) = delete;
    // Takes the current exception, clearing it (with none set, the holder is left empty).
    // `normalize`: as an exception instance carrying its traceback, fit to be another
    // exception's __cause__ or __context__ (value()).
    void Save(bool normalize = false) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (normalize) {
            PyErr_NormalizeException(&type, &value, &tb);
            if (value != nullptr && tb != nullptr) PyException_SetTraceback(value, tb);
        }
        type_ = Ref(type);
        value_ = Ref(value);
        tb_ = Ref(tb);
    }
    bool empty() const { return !type_; }
    PyObject* value() const { return value_.get(); }  // borrowed; null if empty
    // Sets the saved exception as the current one, replacing whatever is set now.
    void Restore() { PyErr_Restore(type_.release(), value_.release(), tb_.release()); }

 private:
    Ref type_, value_, tb_;
};

// Makes `earlier` (an exception instance, or null: nothing done) the current exception's
// __context__, and also its __cause__ if `as_cause`: what `raise new from earlier` (as_cause) or
// a raise inside `except earlier:` would leave.
inline void ChainToCurrent(PyObject* earlier, bool as_cause) {
    if (earlier == nullptr) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != nullptr) {
        if (as_cause) PyException_SetCause(value, Py_NewRef(earlier));  // steals
        PyException_SetContext(value, Py_NewRef(earlier));              // steals
    }
    PyErr_Restore(type, value, tb);
}

// Raise `type(message)` with the currently set exception as its __cause__ (like
// `raise type(message) from exc` in Python). JAX does this for dict-key sorting failures.
inline void RaiseFromCurrent(PyObject* type, const char* message) {
    SavedError cause;
    cause.Save(/*normalize=*/true);
    PyErr_SetString(type, message);
    ChainToCurrent(cause.value(), /*as_cause=*/true);
}

// Argument parsing for the METH_FASTCALL | METH_KEYWORDS entry points. PyArg_ParseTupleAndKeywords
// would need a tuple and dict per call; this walks the vectorcall arrays directly.
// `names` lists every parameter; the first `required` are mandatory. `out` receives borrowed
// references (null for absent optional parameters). `rest`, if given, receives the positional
// arguments beyond names (a `*rest` parameter placed after the first `rest_after` names).
struct ArgSpec {
    const char* func;
    const char* const* names;
    int num_names;
    int required;
    int rest_after = -1;  // >= 0: positional args at [rest_after, nargs - trailing) go to *rest
};

inline bool ParseArgs(const ArgSpec& spec, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames, PyObject** out, PyObject* const** rest = nullptr,
                      Py_ssize_t* num_rest = nullptr) {
    for (int i = 0; i < spec.num_names; ++i) out[i] = nullptr;
    Py_ssize_t positional = nargs;
    if (spec.rest_after >= 0) {
        Py_ssize_t fixed = spec.rest_after < nargs ? spec.rest_after : nargs;
        for (Py_ssize_t i = 0; i < fixed; ++i) out[i] = args[i];
        *rest = args + fixed;
        *num_rest = nargs - fixed;
        positional = fixed;
    } else {
        if (nargs > spec.num_names) {
            PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)",
                         spec.func, spec.num_names, nargs);
            return false;
        }
        for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
    }
    if (kwnames != nullptr) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; ++k) {
            PyObject* name = PyTuple_GET_ITEM(kwnames, k);
            int found = -1;
            for (int i = 0; i < spec.num_names; ++i) {
                if (PyUnicode_CompareWithASCIIString(name, spec.names[i]) == 0) {
                    found = i;
                    break;
                }
            }
            if (found < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                             spec.func, name);
                return false;
            }
            if (out[found] != nullptr || found < positional) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                             spec.func, spec.names[found]);
                return false;
            }
            out[found] = args[nargs + k];
        }
    }
    for (int i = 0; i < spec.required; ++i) {
        if (out[i] == nullptr) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", spec.func,
                         spec.names[i]);
            return false;
        }
    }
    return true;
}

// An optional callable argument: absent and None both mean "not given".
inline PyObject* OptionalArg(PyObject* arg) { return (arg == nullptr || arg == Py_None) ? nullptr : arg; }

// A bool-ish keyword such as is_leaf_takes_path. Returns -1 on error.
inline int TruthArg(PyObject* arg) { return arg == nullptr ? 0 : PyObject_IsTrue(arg); }

// Raw C entry points must not let a C++ exception reach CPython (that is std::terminate): a
// vector or map growing out of memory becomes MemoryError, anything else RuntimeError.
// Guard<F> is F wrapped accordingly, with F's exact signature (usable in PyMethodDef tables).
template <auto F>
struct Guarded;

template <class... A, PyObject* (*F)(A...)>
struct Guarded<F> {
    static PyObject* Call(A... args) noexcept {
        try {
            return F(args...);
        } catch (const std::bad_alloc&) {
            return PyErr_NoMemory();
        } catch (const std::exception& e) {
            PyErr_SetString(PyExc_RuntimeError, e.what());
            return nullptr;
        }
    }
};

template <auto F>
constexpr auto Guard = &Guarded<F>::Call;

// An installed hook or function that may be given as None: None is held as null.
inline Ref OptionalRef(PyObject* borrowed) {
    return Ref::FromBorrowed(borrowed == Py_None ? nullptr : borrowed);
}

// A new tuple or list of the `n` owned references at `owned`, which it steals (no INCREF), or
// null with an error set and nothing stolen. The allocation can run the cyclic GC, which cannot
// reach `owned` (a C++ buffer); filling the new container runs no Python code, so it is never
// seen half-built. On free-threaded builds NewList's slots hold None, which is immortal there
// (3.13+): it is overwritten without a release.
inline PyObject* StealIntoNewSequence(PyObject* const* owned, Py_ssize_t n, bool as_tuple) {
    PyObject* out = as_tuple ? PyTuple_New(n) : NewList(n);
    if (out == nullptr) return nullptr;
    PyObject** slots = as_tuple ? reinterpret_cast<PyTupleObject*>(out)->ob_item
                                : reinterpret_cast<PyListObject*>(out)->ob_item;
    for (Py_ssize_t i = 0; i < n; ++i) slots[i] = owned[i];
    return out;
}

// The same from a vector of owned references: `items` is left empty, or still owns them if the
// container cannot be made.
template <class Vec>
inline PyObject* StealIntoSequence(Vec& items, bool as_tuple) {
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    PyObject* out = StealIntoNewSequence(n > 0 ? &items[0] : nullptr, n, as_tuple);
    if (out != nullptr) items.clear();
    return out;
}

// A new tuple (kTuple) or list of `n` items, make(i) giving each as a new reference or null
// with an error set; null with the error set if any fails. Every item is made first, into a
// buffer of ours, and the container is allocated and filled only once all exist, with no Python
// code in between. Making an item can run Python code (a callback, or any allocation of a
// GC-tracked object: the cyclic GC and its finalizers), and a container allocated first is
// GC-tracked with empty slots meanwhile: reachable half-built (gc.get_objects,
// gc.get_referrers), where reading an empty slot crashes (tests/test_half_built_outputs.py). Use it
// wherever building an output's items can run Python code.
template <bool kTuple, class Make>
PyObject* NewSequenceOf(Py_ssize_t n, Make&& make) {
    RefSmallVector<8> items;  // owned; released if a make fails
    for (Py_ssize_t i = 0; i < n; ++i) {
        items.push_back(nullptr);  // the slot first: a push_back that throws leaks nothing
        PyObject* item = make(i);
        if (item == nullptr) return nullptr;
        items[static_cast<size_t>(i)] = item;
    }
    return StealIntoSequence(items, kTuple);
}

// A list that a callback shrank while a walk read it (kinds_read.h, ListKind::Read): where
// jaxlib reads past its end, fastree stops with this error. Always false.
[[gnu::cold, gnu::noinline]] inline bool ListShrank(Py_ssize_t was, Py_ssize_t now) {
    PyErr_Format(PyExc_RuntimeError,
                 "a list in the pytree changed size while it was being flattened (%zd items when "
                 "the walk reached it, %zd now): a callback (is_leaf, a custom node's flatten "
                 "function, tree_map's f) must not remove items from a list being walked",
                 was, now);
    return false;
}

// A new tuple of getattr(obj, name) for each name in the tuple `names`; null with an error set.
// (getattr runs Python code: a property, __getattr__.)
inline PyObject* GetAttrs(PyObject* obj, PyObject* names) {
    return NewSequenceOf<true>(PyTuple_GET_SIZE(names), [&](Py_ssize_t i) {
        return PyObject_GetAttr(obj, PyTuple_GET_ITEM(names, i));
    });
}

// Transfer a vector of owned references into a new list (no INCREF: ownership moves).
template <class Vec>
inline PyObject* StealIntoList(Vec& items) {
    return StealIntoSequence(items, /*as_tuple=*/false);
}

template <class Vec>
inline void DecrefAll(Vec& items) {
    for (PyObject* p : items) Py_XDECREF(p);
    items.clear();
}

}  // namespace fastree
