// Attribute nodes: reading, rebuilding, and the Python type that carries a layout (see
// registry/attr_node.h for the layout and why one object serves fastree's walkers and JAX alike).
#include "registry/attr_node.h"

#include "attr/attr_mapping.h"

#include <algorithm>
#include <string>
#include <vector>

#include "registry/dict_items.h"
#include "registry/keys.h"
#include "attr/nnx_shared.h"
#include "registry/registry.h"

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

namespace fastree {
namespace attr {
namespace {

PyTypeObject* g_type = nullptr;  // owned by the module (added to it at init); never freed
// Interned "__getattribute__", and object's own __getattribute__ (PlainAttributeAccess); made
// with the type, never freed (object's slot wrapper lives as long as the interpreter).
PyObject* g_getattribute_name = nullptr;
PyObject* g_object_getattribute = nullptr;

Py_ssize_t NumData(const AttrNode* n) { return PyTuple_GET_SIZE(n->data_fields); }
Py_ssize_t NumMeta(const AttrNode* n) { return PyTuple_GET_SIZE(n->meta_fields); }
Py_ssize_t AuxLength(const AttrNode* n) { return NumMeta(n) + (n->extra_fields ? 1 : 0); }

// An instance as the reads below see it.
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

// Whether instances of `t` find `__dict__` as object does: the generic lookup, object's own
// __getattribute__ (a class that adds only __getattr__: it runs for names the lookup misses,
// never for __dict__), or a __getattribute__ the integration vouched for
// (trusted_getattribute: the library's own, which passes __dict__ and the fields through
// unchanged; the checks on first instances compare the native read with the library's
// functions). _PyType_Lookup runs no Python code (the type's method cache).
bool PlainAttributeAccess(const AttrNode* node, PyTypeObject* t) {
    if (t->tp_getattro == PyObject_GenericGetAttr) return true;
    PyObject* getattribute = _PyType_Lookup(t, g_getattribute_name);  // borrowed, compared only
    return getattribute == g_object_getattribute ||
           (node->trusted_getattribute != nullptr && getattribute == node->trusted_getattribute);
}

// Reads `obj`'s __dict__ into *inst. False with an error set on failure. Asking for it makes
// the dict if the instance keeps its attributes inline (CPython 3.11+), as `obj.__dict__` in
// the library's own flatten does.
bool ReadInstance(const AttrNode* node, PyObject* obj, Instance* inst) {
    inst->obj = obj;
    inst->general = !PlainAttributeAccess(node, Py_TYPE(obj));
    if (inst->general) {
        // Whatever __dict__ the class serves (only its size is used: Regular below).
        inst->dict = Ref(PyObject_GetAttrString(obj, "__dict__"));
        if (!inst->dict && PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
        return !PyErr_Occurred();
    }
    // No __dict__ to read: the class has none, or every field is a slot and none is extra (its
    // dict is left alone: asking for it would make one on an instance that keeps none).
    if (Py_TYPE(obj)->tp_dictoffset == 0 || node->fields_all_slots) {
        inst->dict = Ref();
        return true;
    }
    inst->dict = Ref(PyObject_GenericGetDict(obj, nullptr));
    if (!inst->dict) return false;
    inst->general = !PyDict_CheckExact(inst->dict.get());
    return true;
}

// getattr(obj, name): a new reference; null and no error when it raised AttributeError (the
// field is absent, as `obj.__dict__.get(name, MISSING)` finds it absent); null with the error
// set for any other exception (a foreign slot descriptor's TypeError, ...).
PyObject* GetAttrIfPresent(PyObject* obj, PyObject* name) {
    PyObject* v = PyObject_GetAttr(obj, name);
    if (v == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
    return v;
}

// Field `i` (data fields first, then meta fields) of the instance as stored on it: a new
// reference, or null, absent (no error) or failed (error set).
PyObject* Stored(const AttrNode* node, const Instance& inst, Py_ssize_t i, PyObject* name) {
    const Py_ssize_t slot = node->slots != nullptr ? node->slots[i] : 0;
    if (inst.general || slot == kReadByGetAttr) return GetAttrIfPresent(inst.obj, name);
    if (slot != 0) {
        return Py_XNewRef(*reinterpret_cast<PyObject**>(reinterpret_cast<char*>(inst.obj) + slot));
    }
    if (!inst.dict) return nullptr;
    // Borrowed, and taken at once: the lookup itself can compare keys (Python code).
    return Py_XNewRef(PyDict_GetItemWithError(inst.dict.get(), name));
}

// An extra field's value as stored, or `missing`. A new reference, or null with an error set.
PyObject* Extra(const AttrNode* node, const Instance& inst, PyObject* name) {
    PyObject* v = nullptr;
    if (inst.general) {
        v = GetAttrIfPresent(inst.obj, name);
    } else if (inst.dict) {
        v = Py_XNewRef(PyDict_GetItemWithError(inst.dict.get(), name));
    }
    return v != nullptr || PyErr_Occurred() ? v : Py_NewRef(node->missing);
}

// An absent field's value: `missing`, or an AttributeError (null).
PyObject* Absent(const AttrNode* node, PyObject* name) {
    if (node->missing != nullptr) return Py_NewRef(node->missing);
    PyErr_Format(PyExc_AttributeError,
                 "%.200s instance has no attribute %R (a field of its fastree attribute node), "
                 "and the node has no value for missing fields",
                 reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, name);
    return nullptr;
}

// Field `i`'s value: stored, or `missing`, or an AttributeError. A new reference or null.
PyObject* Value(const AttrNode* node, const Instance& inst, Py_ssize_t i, PyObject* name) {
    PyObject* v = Stored(node, inst, i, name);
    return v != nullptr || PyErr_Occurred() ? v : Absent(node, name);
}

// Whether the instance's __dict__ holds exactly the fields kept there: the instances the
// library makes. Others (partly initialised, or carrying the extra fields) are checked apart.
// -1 with an error set if the size of a general instance's __dict__ could not be read.
int Regular(const AttrNode* node, const Instance& inst) {
    Py_ssize_t in_dict = NumData(node) + NumMeta(node);
    if (node->slots != nullptr) {
        for (Py_ssize_t i = 0; i < NumData(node) + NumMeta(node); ++i) {
            if (node->slots[i] != 0) --in_dict;
        }
    }
    if (!inst.dict) return in_dict == 0;
    const Py_ssize_t size = inst.general ? PyObject_Size(inst.dict.get())
                                         : PyDict_GET_SIZE(inst.dict.get());
    if (size < 0) return -1;
    return size == in_dict;
}

// Whether tuple `t` holds exactly the objects in `items` (identity: nothing runs).
template <class Vec>
bool SameItems(PyObject* t, const Vec& items) {
    if (PyTuple_GET_SIZE(t) != static_cast<Py_ssize_t>(items.size())) return false;
    for (size_t i = 0; i < items.size(); ++i) {
        if (PyTuple_GET_ITEM(t, static_cast<Py_ssize_t>(i)) != items[i]) return false;
    }
    return true;
}

// The aux data of an instance, as a new tuple (or the shared regular one).
// tuple(sorted(meta.items())) for a meta_items node: a new reference; null with no error when
// the value is not an exact dict of exact str keys (the library reads that instance), or with
// an error set. The pairs come from GatherDictItems, in the sorted-key order a dict flattens in
// (for exact str keys: no Python code runs).
// Whether `meta` is an exact dict of exact str keys (nothing runs).
bool StrKeyedDict(PyObject* meta) {
    if (!PyDict_CheckExact(meta)) return false;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(meta, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) return false;
    }
    return true;
}

PyObject* SortedItems(PyObject* meta) {
    if (!StrKeyedDict(meta)) return nullptr;
    Items items;  // owned (key, value) pairs
    if (!GatherDictItems(meta, items)) return nullptr;
    return NewSequenceOf<true>(static_cast<Py_ssize_t>(items.size()), [&](Py_ssize_t i) {
        const Item& item = items[static_cast<size_t>(i)];
        return PyTuple_Pack(2, item.key, item.value);
    });
}

// Whether `v` is an object Python never frees: None, a bool, a cached small int (all static
// in CPython). Keeping one alive costs nothing flax would have freed.
bool Immortal(PyObject* v) {
    if (v == Py_None || v == Py_True || v == Py_False) return true;
    if (!PyLong_CheckExact(v)) return false;
    int overflow = 0;
    const long x = PyLong_AsLongAndOverflow(v, &overflow);  // an exact int: nothing runs
    return overflow == 0 && x >= -5 && x <= 256;
}

// node->last_aux again (a new reference) when `meta`, an exact dict, holds the very keys and
// values it was made from, in any insertion order (a dict's keys are distinct: each found once
// is all of them); else null (no error). Nothing runs: PyDict_Next and pointer compares.
PyObject* KeptMetaItems(const AttrNode* node, PyObject* meta) {
    PyObject* last = node->last_aux;
    if (!node->meta_kept || last == nullptr || PyDict_GET_SIZE(meta) != PyTuple_GET_SIZE(last)) {
        return nullptr;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(last);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(meta, &pos, &key, &value)) {
        Py_ssize_t j = 0;
        while (j < n && PyTuple_GET_ITEM(PyTuple_GET_ITEM(last, j), 0) != key) ++j;
        if (j == n || PyTuple_GET_ITEM(PyTuple_GET_ITEM(last, j), 1) != value) return nullptr;
    }
    return Py_NewRef(last);
}

// Keeps `aux` (the sorted pairs just made from `meta`) as node->last_aux when its values are
// immortal (see AttrNode::meta_kept). The old tuple is released last (a release can run Python
// code).
void KeepMetaItems(AttrNode* node, PyObject* aux) {
    const Py_ssize_t n = PyTuple_GET_SIZE(aux);
    if (n == 0 || n > AttrNode::kMaxKeptMeta) return;
    for (Py_ssize_t j = 0; j < n; ++j) {
        if (!Immortal(PyTuple_GET_ITEM(PyTuple_GET_ITEM(aux, j), 1))) return;
    }
    PyObject* old = node->last_aux;
    node->last_aux = Py_NewRef(aux);
    node->meta_kept = true;
    node->aux_stamp = 0;  // the check's record was for the old tuple
    Py_XDECREF(old);
}

PyObject* Aux(AttrNode* node, const Instance& inst, bool regular) {
    if (node->names_as_aux) return Py_NewRef(node->data_fields);
    if (node->meta_items) {
        Ref meta(Value(node, inst, NumData(node), PyTuple_GET_ITEM(node->meta_fields, 0)));
        if (!meta) return nullptr;
        if (PyDict_CheckExact(meta.get())) {
            if (PyObject* kept = KeptMetaItems(node, meta.get())) return kept;
        }
        PyObject* aux = SortedItems(meta.get());
        if (aux == nullptr && !PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError,
                         "attribute node of %.200s: %R must be a dict of str keys, got %.200R",
                         reinterpret_cast<PyTypeObject*>(node->cls)->tp_name,
                         PyTuple_GET_ITEM(node->meta_fields, 0), meta.get());
        }
        if (aux != nullptr) KeepMetaItems(node, aux);
        return aux;
    }
    // Shared when it cannot differ: no meta fields, and no extra fields to report.
    if (node->regular_aux != nullptr && (regular || node->extra_fields == nullptr)) {
        return Py_NewRef(node->regular_aux);
    }
    RefSmallVector<8> items;  // every item made before the tuple (see NewSequenceOf)
    if (node->extra_fields != nullptr) {
        PyObject* extras;
        if (regular) {
            extras = Py_NewRef(node->missing);
        } else {
            extras = NewSequenceOf<true>(PyTuple_GET_SIZE(node->extra_fields), [&](Py_ssize_t j) {
                return Extra(node, inst, PyTuple_GET_ITEM(node->extra_fields, j));
            });
        }
        if (extras == nullptr) return nullptr;
        PushOwned(items, extras);
    }
    const Py_ssize_t nd = NumData(node);
    for (Py_ssize_t k = 0; k < NumMeta(node); ++k) {
        PyObject* v = Value(node, inst, nd + k, PyTuple_GET_ITEM(node->meta_fields, k));
        if (v == nullptr) return nullptr;
        PushOwned(items, v);
    }
    if (regular && node->last_aux != nullptr && SameItems(node->last_aux, items)) {
        return Py_NewRef(node->last_aux);  // `items` released on return
    }
    PyObject* aux = StealIntoSequence(items, /*as_tuple=*/true);
    if (aux != nullptr && regular) {
        PyObject* old = node->last_aux;
        node->last_aux = Py_NewRef(aux);
        node->aux_stamp = 0;  // the check's record was for the old tuple
        Py_XDECREF(old);  // after the new value is in place (a release can run Python code)
    }
    return aux;
}

// From now on the library's functions answer, here and (for the class) in fastree's registry.
bool SwitchToLibrary(AttrNode* node) {
    node->use_library = true;
    node->checks_left = 0;
    node->irregular_checks_left = 0;
    return registry::DelegateAttribute(reinterpret_cast<PyObject*>(node));
}

// Whether a check is still due for some instance.
bool CheckDue(const AttrNode* node) {
    return node->checker != nullptr && (node->checks_left > 0 || node->irregular_checks_left > 0);
}

// Whether every field kept in __dict__ is there (1), not (0), or an error (-1). A plain
// instance only (its __dict__ an exact dict).
int FieldsPresent(const AttrNode* node, const Instance& inst) {
    const Py_ssize_t n = NumData(node) + NumMeta(node);
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (node->slots != nullptr && node->slots[i] != 0) continue;
        if (!inst.dict || inst.general) return 0;
        PyObject* name = i < NumData(node) ? PyTuple_GET_ITEM(node->data_fields, i)
                                           : PyTuple_GET_ITEM(node->meta_fields, i - NumData(node));
        const int has = PyDict_Contains(inst.dict.get(), name);
        if (has <= 0) return has;
    }
    return 1;
}

// Runs the checker if one is due for this instance (the node is not delegating: the caller
// asked), and says so in *ran. kNative to go on reading.
Outcome CheckIfDue(AttrNode* node, PyObject* obj, bool regular, bool* ran) {
    *ran = false;
    if (node->checker == nullptr) return Outcome::kNative;
    if (node->checks_left > 0) {
        --node->checks_left;
    } else if (!regular && node->irregular_checks_left > 0) {
        --node->irregular_checks_left;
    } else {
        return Outcome::kNative;
    }
    *ran = true;
    // Held for the call: the checker may drop the node's own reference (check_with again).
    Ref checker = Ref::FromBorrowed(node->checker);
    Ref verdict(PyObject_CallOneArg(checker.get(), obj));
    if (!verdict) return Outcome::kError;
    const int same = PyObject_IsTrue(verdict.get());
    if (same < 0) return Outcome::kError;
    if (!same && !SwitchToLibrary(node)) return Outcome::kError;
    return node->use_library ? Outcome::kLibrary : Outcome::kNative;
}

Outcome ReadFields(AttrNode* node, PyObject* obj, bool want_aux, bool check, Fields* out) {
    Instance inst;
    if (!ReadInstance(node, obj, &inst)) return Outcome::kError;
    int regular = Regular(node, inst);
    if (regular < 0) return Outcome::kError;
    if (check) {
        if (node->use_library) return Outcome::kLibrary;
        // Not a plain instance: the library reads it as it reads every instance.
        if (inst.general && node->library_flatten != nullptr) return Outcome::kLibraryOnce;
        if (node->delegate_irregular && !regular) return Outcome::kLibraryOnce;
        // As many names as fields but not the fields (a field left out by __init__, another
        // name added): irregular too. Asked only before a check, which would otherwise judge
        // the class on an instance the library answers for; later reads find the field absent.
        if (node->delegate_irregular && CheckDue(node)) {
            const int present = FieldsPresent(node, inst);
            if (present < 0) return Outcome::kError;
            if (!present) return Outcome::kLibraryOnce;
        }
        bool checked;
        const Outcome outcome = CheckIfDue(node, obj, regular, &checked);
        if (outcome != Outcome::kNative) return outcome;
        if (checked) {
            // The checker ran Python code: read the instance as it is now.
            if (!ReadInstance(node, obj, &inst)) return Outcome::kError;
            regular = Regular(node, inst);
            if (regular < 0) return Outcome::kError;
            if (inst.general && node->library_flatten != nullptr) return Outcome::kLibraryOnce;
            if (node->delegate_irregular && !regular) return Outcome::kLibraryOnce;
        }
    }
    if (node->mapping != nullptr) {
        if (!inst.general && inst.dict) return ReadMapping(node, inst.dict.get(), want_aux, out);
        if (node->library_flatten != nullptr) return Outcome::kLibraryOnce;
        PyErr_Format(PyExc_TypeError,
                     "attribute node of %.200s: an instance whose attributes are not a plain "
                     "__dict__ cannot be read by its mapping layout",
                     reinterpret_cast<PyTypeObject*>(node->cls)->tp_name);
        return Outcome::kError;
    }
    // Every value is read before anything is visited, as the library's flatten reads them all
    // before JAX walks its output: a callback that changes the instance later is not seen.
    const Py_ssize_t nd = NumData(node);
    for (Py_ssize_t i = 0; i < nd; ++i) {
        out->children.push_back(nullptr);  // the slot first: a push that throws leaks nothing
        PyObject* name = PyTuple_GET_ITEM(node->data_fields, i);
        PyObject* v = Stored(node, inst, i, name);
        if (v == nullptr && !PyErr_Occurred()) {
            // As many names as fields, but not the fields: the library's instance.
            if (check && node->delegate_irregular) return Outcome::kLibraryOnce;
            v = Absent(node, name);
        }
        if (v == nullptr) return Outcome::kError;
        out->children[static_cast<size_t>(i)] = v;
    }
    if (!want_aux && node->meta_items) {
        // The library's flatten sorts the metadata's items whether or not the caller wants the
        // aux data (tree_leaves): metadata it might fail to sort (keys other than exact str) is
        // read by the library, so that its error (sorted()'s TypeError) surfaces as in JAX.
        Ref meta(Value(node, inst, nd, PyTuple_GET_ITEM(node->meta_fields, 0)));
        if (!meta) return Outcome::kError;
        if (!StrKeyedDict(meta.get())) {
            if (check && node->library_flatten != nullptr) return Outcome::kLibraryOnce;
            Ref aux(Aux(node, inst, regular != 0));  // the aux read's own TypeError
            if (!aux) return Outcome::kError;
        }
    }
    if (want_aux) {
        out->aux = Ref(Aux(node, inst, regular != 0));
        if (!out->aux) {
            // Metadata the layout cannot read (not an exact dict of str keys): the library's.
            if (check && node->meta_items && node->library_flatten != nullptr &&
                PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                return Outcome::kLibraryOnce;
            }
            return Outcome::kError;
        }
    }
    return Outcome::kNative;
}

// object.__new__(cls). Classes that leave __new__ to object's (every equinox Module and plain
// dataclass) get it directly; others go through object.__new__ itself, whose checks (a C base
// with its own __new__, an abstract class) raise as they would in Python.
PyObject* NewInstanceOf(PyObject* cls) {
    PyTypeObject* t = reinterpret_cast<PyTypeObject*>(cls);
    if (t->tp_new == PyBaseObject_Type.tp_new) {
        Ref no_args(PyTuple_New(0));
        return no_args ? t->tp_new(t, no_args.get(), nullptr) : nullptr;
    }
    Ref object_new(
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__new__"));
    return object_new ? PyObject_CallOneArg(object_new.get(), cls) : nullptr;
}

// Sets `value` unless it is the node's `missing` (a field the instance did not have).
bool SetField(const AttrNode* node, PyObject* obj, PyObject* name, PyObject* value) {
    if (node->missing != nullptr && value == node->missing) return true;
    // object.__setattr__: the class's own __setattr__ (frozen dataclasses, equinox) bypassed.
    return PyObject_GenericSetAttr(obj, name, value) == 0;
}

bool CheckInstance(const AttrNode* node, PyObject* obj) {
    if (PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(node->cls))) return true;
    PyErr_Format(PyExc_TypeError, "attribute node of %.200s: expected an instance of it, got %.200s",
                 reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, Py_TYPE(obj)->tp_name);
    return false;
}

PyObject* PairOf(PyObject* a, PyObject* b) { return PyTuple_Pack(2, a, b); }

PyObject* NoLibrary(const AttrNode* node) {
    PyErr_Format(PyExc_RuntimeError,
                 "attribute node of %.200s: the library's functions it delegates to are gone",
                 reinterpret_cast<PyTypeObject*>(node->cls)->tp_name);
    return nullptr;
}

// dict(aux) for aux data of (key, value) pairs. Exact tuples of exact pairs (what the node's
// flatten makes) are set directly; anything else goes through dict()'s own merge. A new
// reference, or null with an error set.
PyObject* MetadataDict(PyObject* aux) {
    Ref metadata(PyDict_New());
    if (!metadata) return nullptr;
    bool pairs = PyTuple_CheckExact(aux);
    for (Py_ssize_t i = 0; pairs && i < PyTuple_GET_SIZE(aux); ++i) {
        PyObject* pair = PyTuple_GET_ITEM(aux, i);
        pairs = PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2;
    }
    if (!pairs) {
        return PyDict_MergeFromSeq2(metadata.get(), aux, 1) < 0 ? nullptr : metadata.release();
    }
    // `aux` is the caller's and stays alive: a key's hash or == can run Python code, which
    // cannot change a tuple.
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(aux); ++i) {
        PyObject* pair = PyTuple_GET_ITEM(aux, i);
        if (PyDict_SetItem(metadata.get(), PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) <
            0) {
            return nullptr;
        }
    }
    return metadata.release();
}

// getattr(cls, rebuild_with)(*children, dict(aux)): a meta_items node's rebuild, the class's own
// (flax.nnx's Variable._new(value, metadata)).
PyObject* BuildWith(AttrNode* node, PyObject* aux, PyObject* const* children, Py_ssize_t n) {
    if (n != NumData(node)) {
        PyErr_Format(PyExc_ValueError, "attribute node of %.200s: expected %zd children, got %zd",
                     reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, NumData(node), n);
        return nullptr;
    }
    if (!CheckAux(node, aux, n)) return nullptr;
    Ref metadata(MetadataDict(aux));
    if (!metadata) return nullptr;
    if (node->trace_classes != nullptr) {
        // flax.nnx's Variable._new(value, metadata), natively (one data field: the value).
        nnx_graph::TraceStates states(node->trace_classes);
        return nnx_graph::NewVariable(node->cls, children[0], metadata.get(), &states);
    }
    Ref make(PyObject_GetAttr(node->cls, node->rebuild_with));
    if (!make) return nullptr;
    RefSmallVector<4> args;
    for (Py_ssize_t i = 0; i < n; ++i) PushOwned(args, Py_NewRef(children[i]));
    PushOwned(args, metadata.release());
    return PyObject_Vectorcall(make.get(), args.begin(), args.size(), nullptr);
}

// Whether `aux` is the node's own names (the regular aux data of a names_as_aux node).
int IsOwnNames(const AttrNode* node, PyObject* aux) {
    if (aux == node->data_fields) return 1;
    if (!PyTuple_CheckExact(aux)) return 0;
    return PyObject_RichCompareBool(aux, node->data_fields, Py_EQ);
}

// After the fields: obj.__post_init__() when the class has a truthy one (chex's rebuild, which
// asks `getattr(obj, "__post_init__", None)`).
bool RunPostInit(PyObject* obj) {
    Ref method(PyObject_GetAttrString(obj, "__post_init__"));
    if (!method) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return false;
        PyErr_Clear();  // getattr's default: no __post_init__
        return true;
    }
    const int truthy = PyObject_IsTrue(method.get());
    if (truthy <= 0) return truthy == 0;
    Ref done(PyObject_CallNoArgs(method.get()));
    return static_cast<bool>(done);
}

// flatten / flatten_with_keys: (children, aux) or (((key, child), ...), aux).
PyObject* FlattenImpl(AttrNode* node, PyObject* obj, bool with_keys, bool check) {
    if (!CheckInstance(node, obj)) return nullptr;
    Fields f;
    switch (ReadFields(node, obj, /*want_aux=*/true, check, &f)) {
        case Outcome::kError:
            return nullptr;
        case Outcome::kLibrary:
        case Outcome::kLibraryOnce: {
            Ref fn = Ref::FromBorrowed(with_keys ? node->library_flatten_with_keys
                                                 : node->library_flatten);
            if (!fn) return NoLibrary(node);
            return PyObject_CallOneArg(fn.get(), obj);
        }
        case Outcome::kNative:
            break;
    }
    if (with_keys) {
        for (size_t i = 0; i < f.children.size(); ++i) {
            Ref key(ChildKey(node, f.aux.get(), static_cast<Py_ssize_t>(i)));
            if (!key) return nullptr;
            Ref child(f.children[i]);  // replaced in place by its (key, child) pair
            f.children[i] = PairOf(key.get(), child.get());
            if (f.children[i] == nullptr) return nullptr;
        }
    }
    Ref children(StealIntoSequence(f.children, /*as_tuple=*/true));
    return children ? PairOf(children.get(), f.aux.get()) : nullptr;
}

PyObject* UnflattenImpl(AttrNode* node, PyObject* const* args, Py_ssize_t nargs, bool library) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "unflatten expects (aux_data, children), got %zd arguments",
                     nargs);
        return nullptr;
    }
    if (library && node->use_library) {
        Ref fn = Ref::FromBorrowed(node->library_unflatten);
        if (!fn) return NoLibrary(node);
        return PyObject_Vectorcall(fn.get(), args, 2, nullptr);
    }
    // A tuple (JAX passes one: no copy): a list's items would be borrowed across the setattrs,
    // which can run Python code that changes the list.
    if (!PyTuple_Check(args[1]) && !PySequence_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "unflatten: children must be a sequence, got %.200s",
                     Py_TYPE(args[1])->tp_name);
        return nullptr;
    }
    Ref children(PySequence_Tuple(args[1]));
    if (!children) return nullptr;
    return Build(node, args[0], &PyTuple_GET_ITEM(children.get(), 0),
                 PyTuple_GET_SIZE(children.get()));
}

// ---- the Python type

AttrNode* Self(PyObject* self) { return AsNode(self); }

PyObject* MethodFlatten(PyObject* self, PyObject* obj) {
    return FlattenImpl(Self(self), obj, false, true);
}
PyObject* MethodFlattenWithKeys(PyObject* self, PyObject* obj) {
    return FlattenImpl(Self(self), obj, true, true);
}
PyObject* MethodUnflatten(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    return UnflattenImpl(Self(self), args, nargs, true);
}
PyObject* MethodNativeFlatten(PyObject* self, PyObject* obj) {
    return FlattenImpl(Self(self), obj, false, false);
}
PyObject* MethodNativeFlattenWithKeys(PyObject* self, PyObject* obj) {
    return FlattenImpl(Self(self), obj, true, false);
}
PyObject* MethodNativeUnflatten(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    return UnflattenImpl(Self(self), args, nargs, false);
}

PyObject* MethodCheckWith(PyObject* self, PyObject* args, PyObject* kwargs) {
    static const char* kwlist[] = {"checker", "flatten",          "flatten_with_keys",
                                   "unflatten", "checks", "irregular_checks",
                                   "delegate_irregular", nullptr};
    PyObject *checker, *flatten, *flatten_with_keys, *unflatten;
    int checks = 2, irregular = 8, delegate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|$iip", const_cast<char**>(kwlist),
                                     &checker, &flatten, &flatten_with_keys, &unflatten, &checks,
                                     &irregular, &delegate)) {
        return nullptr;
    }
    if (delegate && !Self(self)->names_as_aux) {
        // Only there does the aux data say what the children are (their names), so that a
        // treedef node made by the library's flatten can be keyed and rebuilt.
        PyErr_SetString(PyExc_ValueError, "check_with: delegate_irregular needs names_as_aux");
        return nullptr;
    }
    for (PyObject* fn : {checker, flatten, flatten_with_keys, unflatten}) {
        if (!PyCallable_Check(fn)) {
            PyErr_Format(PyExc_TypeError, "check_with: expected a callable, got %R", fn);
            return nullptr;
        }
    }
    AttrNode* node = Self(self);
    // New values in place before the old ones are released (a release can run Python code).
    PyObject* old[4] = {node->checker, node->library_flatten, node->library_flatten_with_keys,
                        node->library_unflatten};
    node->checker = Py_NewRef(checker);
    node->library_flatten = Py_NewRef(flatten);
    node->library_flatten_with_keys = Py_NewRef(flatten_with_keys);
    node->library_unflatten = Py_NewRef(unflatten);
    node->checks_left = checks < 0 ? 0 : checks;
    node->irregular_checks_left = irregular < 0 ? 0 : irregular;
    node->use_library = false;
    node->delegate_irregular = delegate != 0;
    for (PyObject* o : old) Py_XDECREF(o);
    Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"flatten", MethodFlatten, METH_O,
     "flatten($self, obj, /)\n--\n\n(children, aux_data): what JAX is given as the flatten function."},
    {"flatten_with_keys", MethodFlattenWithKeys, METH_O,
     "flatten_with_keys($self, obj, /)\n--\n\n(((GetAttrKey, child), ...), aux_data)."},
    {"unflatten", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(MethodUnflatten)),
     METH_FASTCALL, "unflatten($self, aux_data, children, /)\n--\n\nA new instance, built without __init__."},
    {"native_flatten", MethodNativeFlatten, METH_O,
     "native_flatten($self, obj, /)\n--\n\nflatten, never checked and never delegated to the library."},
    {"native_flatten_with_keys", MethodNativeFlattenWithKeys, METH_O,
     "native_flatten_with_keys($self, obj, /)\n--\n\nflatten_with_keys, never checked and never delegated."},
    {"native_unflatten",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(MethodNativeUnflatten)),
     METH_FASTCALL, "native_unflatten($self, aux_data, children, /)\n--\n\nunflatten, never delegated."},
    {"check_with", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(MethodCheckWith)),
     METH_VARARGS | METH_KEYWORDS,
     "check_with(checker, flatten, flatten_with_keys, unflatten, *, checks=2, "
     "irregular_checks=8, delegate_irregular=False): checker(obj) -> bool runs on the first "
     "`checks` instances and on `irregular_checks` instances whose __dict__ holds other than "
     "the fields; on False the node delegates to the given library functions from then on. "
     "delegate_irregular (names_as_aux nodes): such instances are the library's, always."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* GetCls(PyObject* self, void*) { return Py_NewRef(Self(self)->cls); }
PyObject* GetDataFields(PyObject* self, void*) { return Py_NewRef(Self(self)->data_fields); }
PyObject* GetMetaFields(PyObject* self, void*) { return Py_NewRef(Self(self)->meta_fields); }
PyObject* GetExtraFields(PyObject* self, void*) {
    PyObject* e = Self(self)->extra_fields;
    return Py_NewRef(e != nullptr ? e : Py_None);
}
PyObject* GetMissing(PyObject* self, void*) {
    PyObject* m = Self(self)->missing;
    if (m == nullptr) {
        PyErr_SetString(PyExc_AttributeError, "this attribute node has no value for missing fields");
        return nullptr;
    }
    return Py_NewRef(m);
}
PyObject* GetUseLibrary(PyObject* self, void*) { return PyBool_FromLong(Self(self)->use_library); }
int SetUseLibrary(PyObject* self, PyObject* value, void*) {
    const int on = value ? PyObject_IsTrue(value) : -1;
    if (on < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "use_library cannot be deleted");
        return -1;
    }
    AttrNode* node = Self(self);
    if (on && node->library_unflatten == nullptr) {
        PyErr_SetString(PyExc_ValueError, "use_library: no library functions (see check_with)");
        return -1;
    }
    if (on) {
        if (!SwitchToLibrary(node)) return -1;
    } else {
        node->use_library = false;
    }
    return 0;
}
PyObject* GetChecksLeft(PyObject* self, void*) {
    return PyLong_FromLong(Self(self)->checks_left);
}

PyGetSetDef kGetSet[] = {
    {"cls", GetCls, nullptr, "The class this node takes apart.", nullptr},
    {"data_fields", GetDataFields, nullptr, "Names of the children, in order.", nullptr},
    {"meta_fields", GetMetaFields, nullptr, "Names of the aux data values, in order.", nullptr},
    {"extra_fields", GetExtraFields, nullptr, "Names kept as one aux item, or None.", nullptr},
    {"missing", GetMissing, nullptr, "What an absent field reads as.", nullptr},
    {"use_library", GetUseLibrary, SetUseLibrary,
     "Whether the library's own functions answer (a check found a difference).", nullptr},
    {"checks_left", GetChecksLeft, nullptr, "First instances still to be checked.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// A tuple of interned exact str from a sequence of names; null with an error set.
PyObject* NameTuple(PyObject* names, const char* what) {
    Ref seq(PySequence_Tuple(names));
    if (!seq) return nullptr;
    return NewSequenceOf<true>(PyTuple_GET_SIZE(seq.get()), [&](Py_ssize_t i) -> PyObject* {
        PyObject* name = PyTuple_GET_ITEM(seq.get(), i);
        if (!PyUnicode_CheckExact(name)) {
            PyErr_Format(PyExc_TypeError, "attribute node: %s must be str, got %R", what, name);
            return nullptr;
        }
        PyObject* interned = Py_NewRef(name);
        PyUnicode_InternInPlace(&interned);
        return interned;
    });
}

// The slot offset of each data and meta field that the class keeps in a writable object slot
// (__slots__) of its own or of a base; 0 for the others. A member descriptor found on the class
// that belongs to no class in its MRO (one copied from an unrelated class) is no slot of these
// instances: Python's getattr rejects it with a TypeError, and so does the read
// (kReadByGetAttr), rather than reading the instance at a foreign offset. `slots` stays null
// (no error) when no field needs either.
bool FindSlots(AttrNode* node) {
    PyTypeObject* cls = reinterpret_cast<PyTypeObject*>(node->cls);
    const Py_ssize_t nd = NumData(node), n = nd + NumMeta(node);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* name = i < nd ? PyTuple_GET_ITEM(node->data_fields, i)
                                : PyTuple_GET_ITEM(node->meta_fields, i - nd);
        // Borrowed, used before anything else runs; _PyType_Lookup runs no Python code.
        PyObject* descr = _PyType_Lookup(cls, name);
        if (descr == nullptr || Py_TYPE(descr) != &PyMemberDescr_Type) continue;
        PyMemberDescrObject* member_descr = reinterpret_cast<PyMemberDescrObject*>(descr);
        Py_ssize_t offset;
        if (!PyType_IsSubtype(cls, PyDescr_TYPE(member_descr))) {
            offset = kReadByGetAttr;
        } else {
            PyMemberDef* member = member_descr->d_member;
            if (member->type != Py_T_OBJECT_EX || (member->flags & Py_READONLY)) continue;
            offset = member->offset;
        }
        if (node->slots == nullptr) {
            node->slots = static_cast<Py_ssize_t*>(PyMem_Calloc(static_cast<size_t>(n),
                                                                sizeof(Py_ssize_t)));
            if (node->slots == nullptr) {
                PyErr_NoMemory();
                return false;
            }
        }
        node->slots[i] = offset;
    }
    bool all = node->slots != nullptr && node->extra_fields == nullptr && n > 0;
    for (Py_ssize_t i = 0; all && i < n; ++i) all = node->slots[i] > 0;
    node->fields_all_slots = all;
    return true;
}

// mapping=(flags_attr, flags_type, flags_inner, int_keys_attr): the mapping layout
// (attr_mapping.h). Its reads trust the mapping's class to look attributes up as object does
// and to keep flags_inner in the instance dict: both checked here, once.
bool SetMappingLayout(AttrNode* node, PyObject* spec) {
    PyObject *flags_attr, *flags_type, *flags_inner, *int_keys_attr;
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "UOUU", &flags_attr, &flags_type, &flags_inner, &int_keys_attr)) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "attribute node: mapping must be (flags_attr, flags_type, flags_inner, "
                         "int_keys_attr), got %R", spec);
        }
        return false;
    }
    if (!PyType_Check(flags_type) ||
        reinterpret_cast<PyTypeObject*>(flags_type)->tp_getattro != PyObject_GenericGetAttr ||
        _PyType_Lookup(reinterpret_cast<PyTypeObject*>(flags_type), flags_inner) != nullptr) {
        PyErr_Format(PyExc_TypeError,
                     "attribute node: the mapping class %R must look attributes up as object "
                     "does and keep %R in its instances' __dict__", flags_type, flags_inner);
        return false;
    }
    if (NumData(node) != 0 || NumMeta(node) != 0 || node->extra_fields != nullptr ||
        node->names_as_aux) {
        PyErr_SetString(PyExc_ValueError,
                        "attribute node: the mapping layout takes no fields of its own");
        return false;
    }
    auto* m = static_cast<MappingLayout*>(PyMem_Calloc(1, sizeof(MappingLayout)));
    if (m == nullptr) {
        PyErr_NoMemory();
        return false;
    }
    auto interned = [](PyObject* s) {
        PyObject* r = Py_NewRef(s);
        PyUnicode_InternInPlace(&r);
        return r;
    };
    m->flags_attr = interned(flags_attr);
    m->flags_type = Py_NewRef(flags_type);
    m->flags_inner = interned(flags_inner);
    m->int_keys_attr = interned(int_keys_attr);
    node->mapping = m;
    return true;
}

// rebuild_order: the data fields again, in the order a rebuild sets them.
bool FindRebuildOrder(AttrNode* node, PyObject* order) {
    Ref names(NameTuple(order, "rebuild_order"));
    if (!names) return false;
    const Py_ssize_t n = NumData(node);
    bool ok = PyTuple_GET_SIZE(names.get()) == n;
    if (ok) {
        node->rebuild_order =
            static_cast<Py_ssize_t*>(PyMem_Calloc(static_cast<size_t>(n) + 1, sizeof(Py_ssize_t)));
        if (node->rebuild_order == nullptr) {
            PyErr_NoMemory();
            return false;
        }
    }
    std::vector<bool> taken(static_cast<size_t>(n), false);
    for (Py_ssize_t j = 0; ok && j < n; ++j) {
        // Interned names: identity is equality.
        Py_ssize_t i = 0;
        while (i < n && PyTuple_GET_ITEM(node->data_fields, i) != PyTuple_GET_ITEM(names.get(), j)) {
            ++i;
        }
        ok = i < n && !taken[static_cast<size_t>(i)];
        if (ok) {
            taken[static_cast<size_t>(i)] = true;
            node->rebuild_order[j] = i;
        }
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError,
                     "attribute node: rebuild_order %R must name each data field once", order);
    }
    return ok;
}

bool CheckDistinct(AttrNode* node) {
    Ref seen(PySet_New(nullptr));
    if (!seen) return false;
    for (PyObject* group : {node->data_fields, node->meta_fields, node->extra_fields}) {
        if (group == nullptr) continue;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(group); ++i) {
            PyObject* name = PyTuple_GET_ITEM(group, i);
            const int has = PySet_Contains(seen.get(), name);
            if (has < 0) return false;
            if (has) {
                PyErr_Format(PyExc_ValueError, "attribute node: field %R is named twice", name);
                return false;
            }
            if (PySet_Add(seen.get(), name) < 0) return false;
        }
    }
    return true;
}

int Traverse(PyObject* self, visitproc visit, void* arg) {
    AttrNode* n = Self(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(n->cls);
    Py_VISIT(n->data_fields);
    Py_VISIT(n->meta_fields);
    Py_VISIT(n->extra_fields);
    Py_VISIT(n->missing);
    Py_VISIT(n->keys);
    Py_VISIT(n->regular_aux);
    Py_VISIT(n->last_aux);
    Py_VISIT(n->checker);
    Py_VISIT(n->library_flatten);
    Py_VISIT(n->library_flatten_with_keys);
    Py_VISIT(n->library_unflatten);
    Py_VISIT(n->trusted_getattribute);
    Py_VISIT(n->rebuild_with);
    Py_VISIT(n->trace_classes);
    Py_VISIT(n->trace_field);
    if (n->mapping != nullptr) {
        Py_VISIT(n->mapping->flags_attr);
        Py_VISIT(n->mapping->flags_type);
        Py_VISIT(n->mapping->flags_inner);
        Py_VISIT(n->mapping->int_keys_attr);
        Py_VISIT(n->mapping->last_names);
        Py_VISIT(n->mapping->last_data_keys);
        Py_VISIT(n->mapping->last_static_keys);
    }
    return 0;
}

int Clear(PyObject* self) {
    AttrNode* n = Self(self);
    // The layout stays readable until the node dies (a walk may be using it); only the links a
    // cycle can run through are cut here: the checker and the library functions.
    Py_CLEAR(n->checker);
    Py_CLEAR(n->library_flatten);
    Py_CLEAR(n->library_flatten_with_keys);
    Py_CLEAR(n->library_unflatten);
    Py_CLEAR(n->last_aux);  // static values may hold anything, the node itself included
    n->meta_kept = false;
    n->use_library = false;
    n->delegate_irregular = false;
    n->checks_left = n->irregular_checks_left = 0;
    return 0;
}

void Dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Clear(self);
    AttrNode* n = Self(self);
    Py_CLEAR(n->cls);
    Py_CLEAR(n->data_fields);
    Py_CLEAR(n->meta_fields);
    Py_CLEAR(n->extra_fields);
    Py_CLEAR(n->missing);
    Py_CLEAR(n->keys);
    Py_CLEAR(n->regular_aux);
    Py_CLEAR(n->trusted_getattribute);
    Py_CLEAR(n->rebuild_with);
    Py_CLEAR(n->trace_classes);
    Py_CLEAR(n->trace_field);
    if (n->mapping != nullptr) {
        Py_CLEAR(n->mapping->flags_attr);
        Py_CLEAR(n->mapping->flags_type);
        Py_CLEAR(n->mapping->flags_inner);
        Py_CLEAR(n->mapping->int_keys_attr);
        ClearMappingMemo(n->mapping);  // attribute names only: no cycle runs through it
        PyMem_Free(n->mapping);
        n->mapping = nullptr;
    }
    PyMem_Free(n->slots);
    n->slots = nullptr;
    PyMem_Free(n->rebuild_order);
    n->rebuild_order = nullptr;
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyObject* New(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    static const char* kwlist[] = {"cls",           "data_fields",  "meta_fields",
                                   "missing",       "extra_fields", "names_as_aux",
                                   "rebuild_order", "post_init",    "trusted_getattribute",
                                   "mapping",       "meta_items",   "key_names",
                                   "rebuild_with",  "trace_classes", "trace_field",
                                   nullptr};
    PyObject *cls, *data, *meta = nullptr, *missing = nullptr, *extra = Py_None,
                          *order = Py_None, *trusted = Py_None, *mapping = Py_None,
                          *key_names = Py_None, *rebuild_with = Py_None,
                          *trace_classes = Py_None, *trace_field = Py_None;
    int names_as_aux = 0, post_init = 0, meta_items = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$OOpOpOOpOOOO", const_cast<char**>(kwlist),
                                     &cls, &data, &meta, &missing, &extra, &names_as_aux, &order,
                                     &post_init, &trusted, &mapping, &meta_items, &key_names,
                                     &rebuild_with, &trace_classes, &trace_field)) {
        return nullptr;
    }
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "attribute node: expected a class, got %R", cls);
        return nullptr;
    }
    if (extra != Py_None && missing == nullptr) {
        PyErr_SetString(PyExc_TypeError, "attribute node: extra_fields needs a `missing` value");
        return nullptr;
    }
    Ref self(type->tp_alloc(type, 0));  // zeroed: every field null
    if (!self) return nullptr;
    AttrNode* n = Self(self.get());
    n->cls = Py_NewRef(cls);
    n->missing = Py_XNewRef(missing);
    n->trusted_getattribute = OptionalRef(trusted).release();
    n->data_fields = NameTuple(data, "data_fields");
    if (n->data_fields == nullptr) return nullptr;
    n->meta_fields = meta ? NameTuple(meta, "meta_fields") : PyTuple_New(0);
    if (n->meta_fields == nullptr) return nullptr;
    if (extra != Py_None) {
        n->extra_fields = NameTuple(extra, "extra_fields");
        if (n->extra_fields == nullptr) return nullptr;
    }
    if (!CheckDistinct(n) || !FindSlots(n)) return nullptr;
    n->names_as_aux = names_as_aux != 0;
    n->post_init = post_init != 0;
    if (n->names_as_aux && (NumMeta(n) != 0 || n->extra_fields != nullptr)) {
        PyErr_SetString(PyExc_ValueError,
                        "attribute node: names_as_aux takes no meta_fields or extra_fields");
        return nullptr;
    }
    if (order != Py_None && !FindRebuildOrder(n, order)) return nullptr;
    if (mapping != Py_None && !SetMappingLayout(n, mapping)) return nullptr;
    n->meta_items = meta_items != 0;
    if (n->meta_items && (NumMeta(n) != 1 || n->extra_fields != nullptr || n->names_as_aux)) {
        PyErr_SetString(PyExc_ValueError,
                        "attribute node: meta_items takes exactly one meta field (a dict)");
        return nullptr;
    }
    if (rebuild_with != Py_None) {
        if (!n->meta_items || !PyUnicode_CheckExact(rebuild_with)) {
            PyErr_SetString(PyExc_TypeError,
                            "attribute node: rebuild_with is a method name, for meta_items nodes");
            return nullptr;
        }
        n->rebuild_with = Py_NewRef(rebuild_with);
    }
    if (trace_field != Py_None) {
        // A rebuild that starts as flax.nnx's PytreeState.__init__ does: a new TraceState first.
        if (!PyUnicode_CheckExact(trace_field) || trace_classes == Py_None ||
            n->rebuild_with != nullptr || n->mapping != nullptr || n->names_as_aux) {
            PyErr_SetString(PyExc_TypeError,
                            "attribute node: trace_field is an attribute name, with trace_classes "
                            "and the fields layout (no rebuild_with, mapping or names_as_aux)");
            return nullptr;
        }
        n->trace_field = Py_NewRef(trace_field);
        PyUnicode_InternInPlace(&n->trace_field);
    }
    if (trace_classes != Py_None) {
        const bool variable = n->rebuild_with != nullptr && NumData(n) == 1;
        if (!(variable || n->trace_field != nullptr) || !PyTuple_CheckExact(trace_classes) ||
            PyTuple_GET_SIZE(trace_classes) != 4 ||
            !PyType_Check(PyTuple_GET_ITEM(trace_classes, 0)) ||
            !PyType_Check(PyTuple_GET_ITEM(trace_classes, 1)) ||
            !(PyTuple_GET_ITEM(trace_classes, 3) == Py_None ||
              (PyTuple_CheckExact(PyTuple_GET_ITEM(trace_classes, 3)) &&
               PyTuple_GET_SIZE(PyTuple_GET_ITEM(trace_classes, 3)) == 2 &&
               PyUnicode_Check(PyTuple_GET_ITEM(PyTuple_GET_ITEM(trace_classes, 3), 1))))) {
            PyErr_SetString(PyExc_TypeError,
                            "attribute node: trace_classes is (TraceState, OpaqueTraceState, "
                            "current_jax_trace, (holder, attribute name) of the current trace or "
                            "None), with rebuild_with and one data field, or with trace_field");
            return nullptr;
        }
        n->trace_classes = Py_NewRef(trace_classes);
    }
    Ref key_source(key_names == Py_None ? Py_NewRef(n->data_fields)
                                        : NameTuple(key_names, "key_names"));
    if (!key_source) return nullptr;
    if (PyTuple_GET_SIZE(key_source.get()) != NumData(n)) {
        PyErr_SetString(PyExc_ValueError, "attribute node: key_names must name each data field");
        return nullptr;
    }
    n->keys = NewSequenceOf<true>(NumData(n), [&](Py_ssize_t i) {
        return keys::GetAttr(PyTuple_GET_ITEM(key_source.get(), i));
    });
    if (n->keys == nullptr) return nullptr;
    if (n->names_as_aux) {
        n->regular_aux = Py_NewRef(n->data_fields);
    } else if (NumMeta(n) == 0) {
        n->regular_aux = n->extra_fields ? PyTuple_Pack(1, n->missing) : PyTuple_New(0);
        if (n->regular_aux == nullptr) return nullptr;
    }
    return self.release();
}

PyObject* Repr(PyObject* self) {
    AttrNode* n = Self(self);
    return PyUnicode_FromFormat("AttrNode(%.200s, data_fields=%R, meta_fields=%R)",
                                reinterpret_cast<PyTypeObject*>(n->cls)->tp_name, n->data_fields,
                                n->meta_fields);
}

}  // namespace

Outcome Read(AttrNode* node, PyObject* obj, bool want_aux, Fields* out) {
    return ReadFields(node, obj, want_aux, /*check=*/true, out);
}

bool CheckAux(AttrNode* node, PyObject* aux, Py_ssize_t arity) {
    if (node->mapping != nullptr) return CheckMappingAux(node, aux, arity);
    if (node->meta_items) {
        if (PyTuple_Check(aux)) return true;
        PyErr_Format(PyExc_ValueError,
                     "attribute node of %.200s: expected aux data a tuple of (name, value) "
                     "pairs, got %.200R",
                     reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, aux);
        return false;
    }
    if (node->names_as_aux) {
        if (PyTuple_Check(aux) && PyTuple_GET_SIZE(aux) == arity) return true;
        PyErr_Format(PyExc_ValueError,
                     "attribute node of %.200s: expected aux data a tuple of %zd names, got "
                     "%.200R",
                     reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, arity, aux);
        return false;
    }
    if (PyTuple_Check(aux) && PyTuple_GET_SIZE(aux) == AuxLength(node)) return true;
    PyErr_Format(PyExc_ValueError,
                 "attribute node of %.200s: expected aux data a tuple of %zd items, got %.200R",
                 reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, AuxLength(node), aux);
    return false;
}

PyObject* Build(AttrNode* node, PyObject* aux, PyObject* const* children, Py_ssize_t n) {
    if (node->mapping != nullptr) return BuildMapping(node, aux, children, n);
    if (node->rebuild_with != nullptr) return BuildWith(node, aux, children, n);
    if (node->names_as_aux) {
        const int own = IsOwnNames(node, aux);
        if (own < 0) return nullptr;
        if (!own && node->library_unflatten != nullptr && CheckAux(node, aux, n)) {
            // An instance the library flattened (delegate_irregular): the library rebuilds it.
            Ref fn = Ref::FromBorrowed(node->library_unflatten);
            Ref kids(NewSequenceOf<true>(n, [&](Py_ssize_t i) { return Py_NewRef(children[i]); }));
            if (!kids) return nullptr;
            PyObject* args[2] = {aux, kids.get()};
            return PyObject_Vectorcall(fn.get(), args, 2, nullptr);
        }
        if (!own) {
            if (PyErr_Occurred()) return nullptr;
            PyErr_Format(PyExc_ValueError,
                         "attribute node of %.200s: expected aux data %R (its field names), got "
                         "%.200R",
                         reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, node->data_fields,
                         aux);
            return nullptr;
        }
    }
    if (n != NumData(node)) {
        PyErr_Format(PyExc_ValueError,
                     "attribute node of %.200s: expected %zd children, got %zd",
                     reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, NumData(node), n);
        return nullptr;
    }
    if (!CheckAux(node, aux, n)) return nullptr;
    // `aux`, its items and `children` are the caller's and stay alive throughout; setattr can
    // run Python code (a descriptor's __set__), so nothing of the new object is borrowed.
    Ref obj(NewInstanceOf(node->cls));
    if (!obj) return nullptr;
    if (node->trace_field != nullptr) {
        // flax.nnx's PytreeState(initializing, is_setup): a new TraceState of the current
        // trace, set first, as its __init__ sets it.
        nnx_graph::TraceStates states(node->trace_classes);
        Ref trace_state = states.New();
        if (!trace_state || !SetField(node, obj.get(), node->trace_field, trace_state.get())) {
            return nullptr;
        }
    }
    for (Py_ssize_t j = 0; j < n; ++j) {
        const Py_ssize_t i = node->rebuild_order ? node->rebuild_order[j] : j;
        if (!SetField(node, obj.get(), PyTuple_GET_ITEM(node->data_fields, i), children[i])) {
            return nullptr;
        }
    }
    Py_ssize_t at = 0;
    if (node->extra_fields != nullptr) {
        PyObject* extras = PyTuple_GET_ITEM(aux, at++);
        if (extras != node->missing) {
            const Py_ssize_t ne = PyTuple_GET_SIZE(node->extra_fields);
            if (!PyTuple_Check(extras) || PyTuple_GET_SIZE(extras) != ne) {
                PyErr_Format(PyExc_ValueError,
                             "attribute node of %.200s: the extra fields' aux item must be "
                             "the missing value or a tuple of %zd items, got %.200R",
                             reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, ne, extras);
                return nullptr;
            }
            Ref dict(PyObject_GenericGetDict(obj.get(), nullptr));
            if (!dict) return nullptr;
            for (Py_ssize_t j = 0; j < ne; ++j) {
                if (PyDict_SetItem(dict.get(), PyTuple_GET_ITEM(node->extra_fields, j),
                                   PyTuple_GET_ITEM(extras, j)) < 0) {
                    return nullptr;
                }
            }
        }
    }
    for (Py_ssize_t k = 0; k < NumMeta(node); ++k) {
        if (!SetField(node, obj.get(), PyTuple_GET_ITEM(node->meta_fields, k),
                      PyTuple_GET_ITEM(aux, at + k))) {
            return nullptr;
        }
    }
    if (node->post_init && !RunPostInit(obj.get())) return nullptr;
    return obj.release();
}

PyObject* ChildKey(AttrNode* node, PyObject* aux, Py_ssize_t k) {
    if (node->mapping != nullptr) return MappingChildKey(aux, k);
    // A names_as_aux node made by the library's flatten has its own names.
    if (node->names_as_aux && aux != node->data_fields && PyTuple_Check(aux) &&
        k < PyTuple_GET_SIZE(aux)) {
        return keys::GetAttr(PyTuple_GET_ITEM(aux, k));
    }
    return Py_NewRef(PyTuple_GET_ITEM(node->keys, k));
}

PyTypeObject* CreateType() {
    static PyType_Slot slots[] = {
        {Py_tp_new, reinterpret_cast<void*>(New)},
        {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
        {Py_tp_traverse, reinterpret_cast<void*>(Traverse)},
        {Py_tp_clear, reinterpret_cast<void*>(Clear)},
        {Py_tp_methods, kMethods},
        {Py_tp_getset, kGetSet},
        {Py_tp_repr, reinterpret_cast<void*>(Repr)},
        {Py_tp_doc,
         const_cast<char*>(
             "AttrNode(cls, data_fields, meta_fields=(), *, missing=<none>, extra_fields=None, "
             "names_as_aux=False, rebuild_order=None, post_init=False, "
             "trusted_getattribute=None, mapping=None, meta_items=False, key_names=None, "
             "rebuild_with=None, trace_classes=None, trace_field=None)\n"
             "--\n\nThe layout of an attribute node (see "
             "fastree.tree_util.register_attribute_node).")},
        {0, nullptr},
    };
    static PyType_Spec spec = {"fastree._core.AttrNode", sizeof(AttrNode), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots};
    if (g_getattribute_name == nullptr) {
        g_getattribute_name = PyUnicode_InternFromString("__getattribute__");
        if (g_getattribute_name == nullptr) return nullptr;
        g_object_getattribute = _PyType_Lookup(&PyBaseObject_Type, g_getattribute_name);
        if (g_object_getattribute == nullptr) {
            PyErr_SetString(PyExc_SystemError, "fastree: object has no __getattribute__");
            return nullptr;
        }
        Py_INCREF(g_object_getattribute);
    }
    g_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
    return g_type;
}

bool IsNode(PyObject* obj) { return g_type != nullptr && Py_TYPE(obj) == g_type; }

PyObject* NewInstance(PyObject* cls) { return NewInstanceOf(cls); }

}  // namespace attr
}  // namespace fastree
