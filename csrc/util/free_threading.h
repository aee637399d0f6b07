// What free-threaded CPython needs from the walks and tables, spelled once for every build.
//
// docs/threads.md lists the state these guard and why. Three tools:
//
// * Critical sections: FASTREE_BEGIN_CRITICAL_SECTION(obj) ... FASTREE_END_CRITICAL_SECTION()
//   (and the two-object form) take CPython's own per-object lock, the one every dict and list
//   operation takes inside, so a walk's reads of a container another thread changes see it whole.
//   CPython 3.13+ defines Py_BEGIN_CRITICAL_SECTION on every build (a bare block where the GIL
//   is on); older Pythons get the bare block here. A section is released while its thread waits
//   (another lock, a stop-the-world GC), so what it read is re-checked after anything that can
//   block: never classify, allocate through Python or call Python inside one.
// * New references from containers: DictGetItemRef and ListGetItemRef, CPython 3.13's
//   PyDict_GetItemRef / PyList_GetItemRef, with the get-then-INCREF they replace on 3.10-3.12
//   (there the GIL makes the two steps one).
// * TableLock: a PyMutex on free-threaded builds, nothing on GIL builds (the GIL already makes
//   each table operation whole, because no Python code runs while one is held: see below).
//   PyMutex, not std::mutex: a thread waiting on a PyMutex detaches from the interpreter, so a
//   stop-the-world GC requested by the holder cannot deadlock against it.
//
// The rule for every TableLock: no Python code runs while one is held, no allocation of a
// Python object (the cyclic GC and its finalizers can run), no DECREF that can free one (move
// the reference out and release it after unlocking), no hash or comparison of a user's object.
// Compute under the lock, call Python after unlocking. Then a lock is never held while another
// is taken, except where a file that defines one says otherwise.
#pragma once

#include <Python.h>

#if PY_VERSION_HEX >= 0x030D0000
#define FASTREE_BEGIN_CRITICAL_SECTION(obj) Py_BEGIN_CRITICAL_SECTION(obj)
#define FASTREE_BEGIN_CRITICAL_SECTION2(a, b) Py_BEGIN_CRITICAL_SECTION2(a, b)
#define FASTREE_END_CRITICAL_SECTION() Py_END_CRITICAL_SECTION()
#define FASTREE_END_CRITICAL_SECTION2() Py_END_CRITICAL_SECTION2()
#else
#define FASTREE_BEGIN_CRITICAL_SECTION(obj) {
#define FASTREE_BEGIN_CRITICAL_SECTION2(a, b) {
#define FASTREE_END_CRITICAL_SECTION() }
#define FASTREE_END_CRITICAL_SECTION2() }
#endif

namespace fastree {

// `*result` a new reference to dict[key] (1), or null with no error when absent (0), or null
// with an error set (-1): PyDict_GetItemRef's contract.
inline int DictGetItemRef(PyObject* dict, PyObject* key, PyObject** result) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyDict_GetItemRef(dict, key, result);
#else
    PyObject* item = PyDict_GetItemWithError(dict, key);
    *result = Py_XNewRef(item);
    if (item != nullptr) return 1;
    return PyErr_Occurred() ? -1 : 0;
#endif
}

// A new list of `n` slots for the caller to fill with PyList_SET_ITEM, or null with an error set.
// On free-threaded builds CPython's own PyList_New(n > 0) crashes instead of raising MemoryError
// when the item array cannot be allocated: its failure path releases the list before setting its
// item pointer, so the release frees whatever that memory held (CPython issue gh-152125; 3.13.15
// and 3.14 have it; tests/test_hostile.py's out-of-memory sweeps met it). Repeating a one-item
// list allocates the array on CPython's other path, which starts from an empty list and fails
// cleanly. Its slots then hold None, not null: None is immortal on every free-threaded build,
// so PyList_SET_ITEM overwriting it without a DECREF is exact.
inline PyObject* NewList(Py_ssize_t n) {
#ifdef Py_GIL_DISABLED
    if (n <= 0) return PyList_New(0);
    PyObject* one = PyList_New(0);
    if (one == nullptr) return nullptr;
    if (PyList_Append(one, Py_None) < 0) {
        Py_DECREF(one);
        return nullptr;
    }
    PyObject* out = PySequence_Repeat(one, n);  // `one` is ours: no other thread contends
    Py_DECREF(one);
    return out;
#else
    return PyList_New(n);
#endif
}

// The size of a list or tuple another thread may resize (a list), read as CPython's own
// PyList_GET_SIZE reads it on free-threaded builds: a relaxed atomic load, which the relaxed
// store of a resize pairs with (a plain Py_SIZE there is a data race: ThreadSanitizer reported
// it). The value may be stale at once; callers read it again where they copy. GIL builds: Py_SIZE.
inline Py_ssize_t SharedSize(PyObject* sequence) {
#ifdef Py_GIL_DISABLED
    return _Py_atomic_load_ssize_relaxed(&reinterpret_cast<PyVarObject*>(sequence)->ob_size);
#else
    return Py_SIZE(sequence);
#endif
}

// A new reference to list[index], or null with IndexError set: PyList_GetItemRef's contract.
inline PyObject* ListGetItemRef(PyObject* list, Py_ssize_t index) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyList_GetItemRef(list, index);
#else
    return Py_XNewRef(PyList_GetItem(list, index));
#endif
}

// Inserts `dict[key] = default_value` unless `key` is there already, in one step under the
// dict's own lock: PyDict_SetDefaultRef's contract (3.13+), with the shim's PyDict_SetDefault
// before (there the GIL makes the test and the insert one step). 0 if inserted, 1 if present,
// -1 with an error set; `*result` (if `result` is not null) a new reference to the value now
// there. An entry already present is never replaced, so no reference another thread took to it
// is released by this insert.
inline int DictSetDefaultRef(PyObject* dict, PyObject* key, PyObject* default_value,
                             PyObject** result) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyDict_SetDefaultRef(dict, key, default_value, result);
#else
    const Py_ssize_t before = PyDict_GET_SIZE(dict);
    PyObject* value = PyDict_SetDefault(dict, key, default_value);  // borrowed
    if (result != nullptr) *result = Py_XNewRef(value);
    if (value == nullptr) return -1;
    return PyDict_GET_SIZE(dict) == before ? 1 : 0;
#endif
}

// A process-wide table's lock (the rule above). Lock with TableLock::Hold.
class TableLock {
public:
    class Hold {
    public:
        explicit Hold(TableLock& lock) : lock_(lock) { lock_.Lock(); }
        ~Hold() { lock_.Unlock(); }
        Hold(const Hold&) = delete;
        Hold& operator=(const Hold&) = delete;

    private:
        TableLock& lock_;
    };

#ifdef Py_GIL_DISABLED
    void Lock() { PyMutex_Lock(&mutex_); }
    void Unlock() { PyMutex_Unlock(&mutex_); }

private:
    PyMutex mutex_ = {0};
#else
    void Lock() {}
    void Unlock() {}
#endif
};

}  // namespace fastree

// ---- Borrowed references (issue 45, step 4: docs/threads.md, "Borrowed references that
// another thread can free"). Kept in one block apart from the tools above.

namespace fastree {

// `type`'s attribute `name` through its MRO, as a new reference, or null (no error) where no
// class on the MRO has it. CPython 3.13's _PyType_LookupRef; 3.10-3.12: _PyType_Lookup plus an
// INCREF (the GIL makes the two one step). Runs no Python code (the type's attribute cache and
// the MRO's dicts). Where the result is dereferenced, a borrowed one could be freed by another
// thread's setattr on the class on a free-threaded build.
inline PyObject* TypeLookupRef(PyTypeObject* type, PyObject* name) {
#if PY_VERSION_HEX >= 0x030D0000
    return _PyType_LookupRef(type, name);
#else
    return Py_XNewRef(_PyType_Lookup(type, name));
#endif
}

}  // namespace fastree
