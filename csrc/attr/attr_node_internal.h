// What the attribute node's files in attr/ share, and nothing outside them uses: the layout's
// field counts, an instance as a read sees it, and the functions one file defines for another
// (each group names its file). Their interface is registry/attr_node.h.
#pragma once

#include <Python.h>

#include "registry/attr_node.h"
#include "util/pyutils.h"

namespace fastree {
namespace attr {

inline Py_ssize_t NumData(const AttrNode* n) { return PyTuple_GET_SIZE(n->data_fields); }
inline Py_ssize_t NumMeta(const AttrNode* n) { return PyTuple_GET_SIZE(n->meta_fields); }
inline Py_ssize_t AuxLength(const AttrNode* n) { return NumMeta(n) + (n->extra_fields ? 1 : 0); }

// The node an AttrNode method or slot is called on.
inline AttrNode* Self(PyObject* self) { return AsNode(self); }

// An instance as the reads (attr/attr_read.cpp) see it.
//
// The native read trusts two things only a plain instance gives: the class's attribute lookup
// is object's (so `obj.__dict__` and a slot are what Python itself would read), and __dict__ is
// an exact dict (so a lookup is PyDict's, as `obj.__dict__.get` would be). An instance whose
// class overrides __getattribute__ (PlainAttributeAccess), or whose __dict__ was replaced by a
// dict subclass with its own `get`, is read through Python's attribute protocol instead
// (`general`), or, where an integration attached the library's functions, by the library.
struct Instance {
    PyObject* obj;   // borrowed: the caller's
    Ref dict;        // the __dict__ (null when the class has none)
    bool general;    // read every field through getattr (see above)
};

// ---- reading (attr/attr_read.cpp)

// Interns "__getattribute__" and takes object's own, which PlainAttributeAccess compares a
// class's with; once, when the type is made. False with an error set.
bool InitPlainAttributeAccess();

// Whether instances of `t` find `__dict__` as object does: the generic lookup, object's own
// __getattribute__ (a class that adds only __getattr__: it runs for names the lookup misses,
// never for __dict__), or a __getattribute__ the integration vouched for
// (trusted_getattribute: the library's own, which passes __dict__ and the fields through
// unchanged; the checks on first instances compare the native read with the library's
// functions), still with the code object it had then. _PyType_Lookup runs no Python code (the
// type's method cache).
bool PlainAttributeAccess(const AttrNode* node, PyTypeObject* t);

// Read (registry/attr_node.h) is ReadFields with check=true. The native_* methods read with
// check=false: no checker runs, and use_library and delegate_irregular are not consulted.
Outcome ReadFields(AttrNode* node, PyObject* obj, bool want_aux, bool check, Fields* out);

// ---- checks on first instances (attr/attr_check.cpp)

// From now on the library's functions answer, here and (for the class) in fastree's registry.
bool SwitchToLibrary(AttrNode* node);

// Whether a check is still due for some instance.
bool CheckDue(const AttrNode* node);

// Whether every field kept in __dict__ is there (1), not (0), or an error (-1). A plain
// instance only (its __dict__ an exact dict).
int FieldsPresent(const AttrNode* node, const Instance& inst);

// Runs the checker if one is due for this instance (the node is not delegating: the caller
// asked), and says so in *ran. kNative to go on reading.
Outcome CheckIfDue(AttrNode* node, PyObject* obj, bool regular, bool* ran);

// ---- rebuilding (attr/attr_rebuild.cpp)

// The library's unflatten(aux, children) for an instance the node leaves to it (the items
// layout's odd aux data, a names_as_aux node's instance the library flattened). Null with an
// error set, a RuntimeError where the node has no library functions (any more).
PyObject* LibraryRebuild(AttrNode* node, PyObject* aux, PyObject* const* children, Py_ssize_t n);

// ---- the type's constructor (attr/attr_node_new.cpp)

// AttrNode(...), the type's tp_new: checks the arguments and works out the layout from them.
PyObject* New(PyTypeObject* type, PyObject* args, PyObject* kwargs);

}  // namespace attr
}  // namespace fastree
