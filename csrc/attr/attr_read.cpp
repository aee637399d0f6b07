// Reading an instance natively: its fields (from __dict__, a slot, or getattr), its aux data
// (meta items kept while unchanged), and each child's key. The layout is registry/attr_node.h's.
#include "attr/attr_node_internal.h"

#include "attr/attr_items.h"
#include "attr/attr_mapping.h"
#include "registry/dict_items.h"
#include "registry/keys.h"

namespace fastree {
namespace attr {
namespace {

// Interned "__getattribute__", and object's own __getattribute__ (PlainAttributeAccess); made
// with the type, never freed (object's slot wrapper lives as long as the interpreter).
PyObject* g_getattribute_name = nullptr;
PyObject* g_object_getattribute = nullptr;

// Reads `obj`'s __dict__ into *inst (`plain`: PlainAttributeAccess of its type). False with an
// error set on failure. Asking for it makes the dict if the instance keeps its attributes inline
// (CPython 3.11+), as `obj.__dict__` in the library's own flatten does.
bool ReadInstance(const AttrNode* node, PyObject* obj, bool plain, Instance* inst) {
    inst->obj = obj;
    inst->general = !plain;
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
        PyObject* const* where =
            reinterpret_cast<PyObject* const*>(reinterpret_cast<char*>(inst.obj) + slot);
        PyObject* v;
        // CPython's member descriptor replaces a slot's value in the instance's critical section
        // and releases the old one after it (Python/structmember.c, PyMember_SetOne): a read and
        // its INCREF in that section never take a value being freed (a bare block under the GIL).
        FASTREE_BEGIN_CRITICAL_SECTION(inst.obj);
        v = Py_XNewRef(*where);
        FASTREE_END_CRITICAL_SECTION();
        return v;
    }
    if (!inst.dict) return nullptr;
    // A new reference from the lookup itself: another thread may replace the entry at once.
    PyObject* v;
    DictGetItemRef(inst.dict.get(), name, &v);  // null: absent (no error) or failed (error set)
    return v;
}

// An extra field's value as stored, or `missing`. A new reference, or null with an error set.
PyObject* Extra(const AttrNode* node, const Instance& inst, PyObject* name) {
    PyObject* v = nullptr;
    if (inst.general) {
        v = GetAttrIfPresent(inst.obj, name);
    } else if (inst.dict) {
        DictGetItemRef(inst.dict.get(), name, &v);  // a new reference (see Stored)
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

// Whether `meta` is an exact dict of exact str keys (nothing runs).
bool StrKeyedDict(PyObject* meta) {
    if (!PyDict_CheckExact(meta)) return false;
    bool all_str = true;
    // In the dict's critical section: another thread's change frees no key being looked at.
    FASTREE_BEGIN_CRITICAL_SECTION(meta);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (all_str && PyDict_Next(meta, &pos, &key, &value)) {
        all_str = PyUnicode_CheckExact(key);
    }
    FASTREE_END_CRITICAL_SECTION();
    return all_str;
}

// tuple(sorted(meta.items())) for a meta_items node: a new reference; null with no error when
// the value is not an exact dict of exact str keys (the library reads that instance), or with
// an error set. The pairs come from GatherDictItems, in the sorted-key order a dict flattens in
// (for exact str keys: no Python code runs).
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
// is all of them); else null (no error). Nothing runs: PyDict_Next and pointer compares, in the
// critical sections of the node (last_aux, meta_kept: another thread's KeepMetaItems replaces
// them) and of `meta` (another thread may change the instance's metadata), taken together.
PyObject* KeptMetaItems(AttrNode* node, PyObject* meta) {
    PyObject* kept = nullptr;
    FASTREE_BEGIN_CRITICAL_SECTION2(reinterpret_cast<PyObject*>(node), meta);
    PyObject* last = node->last_aux;
    if (node->meta_kept && last != nullptr && PyDict_GET_SIZE(meta) == PyTuple_GET_SIZE(last)) {
        const Py_ssize_t n = PyTuple_GET_SIZE(last);
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        bool same = true;
        while (same && PyDict_Next(meta, &pos, &key, &value)) {
            Py_ssize_t j = 0;
            while (j < n && PyTuple_GET_ITEM(PyTuple_GET_ITEM(last, j), 0) != key) ++j;
            same = j < n && PyTuple_GET_ITEM(PyTuple_GET_ITEM(last, j), 1) == value;
        }
        if (same) kept = Py_NewRef(last);
    }
    FASTREE_END_CRITICAL_SECTION2();
    return kept;
}

// Keeps `aux` (the sorted pairs just made from `meta`) as node->last_aux when its values are
// immortal (see AttrNode::meta_kept), in the node's critical section. The old tuple is released
// last, after the section (a release can run Python code).
void KeepMetaItems(AttrNode* node, PyObject* aux) {
    const Py_ssize_t n = PyTuple_GET_SIZE(aux);
    if (n == 0 || n > AttrNode::kMaxKeptMeta) return;
    for (Py_ssize_t j = 0; j < n; ++j) {
        if (!Immortal(PyTuple_GET_ITEM(PyTuple_GET_ITEM(aux, j), 1))) return;
    }
    PyObject* old;
    FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(node));
    old = node->last_aux;
    node->last_aux = Py_NewRef(aux);
    node->meta_kept = true;
    node->aux_stamp = 0;  // the check's record was for the old tuple
    FASTREE_END_CRITICAL_SECTION();
    Py_XDECREF(old);
}

// Replaces node->last_aux by `aux` (a regular instance's, just made), in the node's critical
// section; the old tuple released after it (a release can run Python code).
void KeepRegularAux(AttrNode* node, PyObject* aux) {
    PyObject* old;
    FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(node));
    old = node->last_aux;
    node->last_aux = Py_NewRef(aux);
    node->aux_stamp = 0;  // the check's record was for the old tuple
    FASTREE_END_CRITICAL_SECTION();
    Py_XDECREF(old);
}

// node->last_aux again (a new reference) when it holds exactly `items` (identity compares, in
// the node's critical section); else null.
template <class Vec>
PyObject* SameAsLastAux(AttrNode* node, const Vec& items) {
    PyObject* kept = nullptr;
    FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(node));
    if (node->last_aux != nullptr && SameItems(node->last_aux, items)) {
        kept = Py_NewRef(node->last_aux);
    }
    FASTREE_END_CRITICAL_SECTION();
    return kept;
}

// The aux data of an instance, as a new tuple (or the shared regular one).
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
    if (regular) {
        if (PyObject* kept = SameAsLastAux(node, items)) return kept;  // `items` released on return
    }
    PyObject* aux = StealIntoSequence(items, /*as_tuple=*/true);
    if (aux != nullptr && regular) KeepRegularAux(node, aux);
    return aux;
}

}  // namespace

bool UsesObjectGetattribute(PyTypeObject* t) {
    return t->tp_getattro == PyObject_GenericGetAttr ||
           _PyType_Lookup(t, g_getattribute_name) == g_object_getattribute;  // compared only
}

bool PlainAttributeAccess(const AttrNode* node, PyTypeObject* t) {
    if (UsesObjectGetattribute(t)) return true;
    if (node->trusted_getattribute == nullptr) return false;
    // The same function (compared only: the lookup's result is borrowed), with the code it was
    // vouched for: `f.__code__ = ...` (a hot reloader, a patch in place) makes it code the
    // integration never read. The function read is the node's own reference.
    return _PyType_Lookup(t, g_getattribute_name) == node->trusted_getattribute &&
           (node->trusted_code == nullptr ||
            PyFunction_GET_CODE(node->trusted_getattribute) == node->trusted_code);
}


bool InitPlainAttributeAccess() {
    if (g_getattribute_name == nullptr) {
        g_getattribute_name = PyUnicode_InternFromString("__getattribute__");
        if (g_getattribute_name == nullptr) return false;
        g_object_getattribute = _PyType_Lookup(&PyBaseObject_Type, g_getattribute_name);
        if (g_object_getattribute == nullptr) {
            PyErr_SetString(PyExc_SystemError, "fastree: object has no __getattribute__");
            return false;
        }
        Py_INCREF(g_object_getattribute);
    }
    return true;
}

Outcome ReadFields(AttrNode* node, PyObject* obj, bool want_aux, bool check, Fields* out) {
    if (check && UsesLibrary(node)) return Outcome::kLibrary;
    const bool plain = PlainAttributeAccess(node, Py_TYPE(obj));
    // An instance whose class reads attributes through a __getattribute__ no integration vouched
    // for: the library reads it as it reads every instance, and nothing is read here first
    // (asking for its __dict__ would run that function once more than the library does).
    if (check && !plain && HasFunction(node, &AttrNode::library_flatten)) {
        return Outcome::kLibraryOnce;
    }
    Instance inst;
    if (!ReadInstance(node, obj, plain, &inst)) return Outcome::kError;
    int regular = Regular(node, inst);
    if (regular < 0) return Outcome::kError;
    if (check) {
        // Not a plain instance (a __dict__ that is not an exact dict): the library reads it.
        if (inst.general && HasFunction(node, &AttrNode::library_flatten)) return Outcome::kLibraryOnce;
        if (DelegatesIrregular(node) && !regular) return Outcome::kLibraryOnce;
        // As many names as fields but not the fields (a field left out by __init__, another
        // name added): irregular too. Asked only before a check, which would otherwise judge
        // the class on an instance the library answers for; later reads find the field absent.
        if (DelegatesIrregular(node) && CheckDue(node)) {
            const int present = FieldsPresent(node, inst);
            if (present < 0) return Outcome::kError;
            if (!present) return Outcome::kLibraryOnce;
        }
        bool checked;
        const Outcome outcome = CheckIfDue(node, obj, regular, &checked);
        if (outcome != Outcome::kNative) return outcome;
        if (checked) {
            // The checker ran Python code: read the instance as it is now.
            if (!ReadInstance(node, obj, PlainAttributeAccess(node, Py_TYPE(obj)), &inst)) {
                return Outcome::kError;
            }
            regular = Regular(node, inst);
            if (regular < 0) return Outcome::kError;
            if (inst.general && HasFunction(node, &AttrNode::library_flatten)) return Outcome::kLibraryOnce;
            if (DelegatesIrregular(node) && !regular) return Outcome::kLibraryOnce;
        }
    }
    if (node->items_field != nullptr || node->mapping != nullptr) {
        // The two layouts whose fields are the instance __dict__'s: read only from a plain one.
        const bool items = node->items_field != nullptr;
        if (!inst.general && inst.dict) {
            return items ? ReadItems(node, inst.dict.get(), want_aux, out)
                         : ReadMapping(node, inst.dict.get(), want_aux, out);
        }
        if (HasFunction(node, &AttrNode::library_flatten)) return Outcome::kLibraryOnce;
        PyErr_Format(PyExc_TypeError,
                     "attribute node of %.200s: an instance whose attributes are not a plain "
                     "__dict__ cannot be read by its %s layout",
                     reinterpret_cast<PyTypeObject*>(node->cls)->tp_name,
                     items ? "items" : "mapping");
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
            if (check && DelegatesIrregular(node)) return Outcome::kLibraryOnce;
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
            if (check && HasFunction(node, &AttrNode::library_flatten)) return Outcome::kLibraryOnce;
            Ref aux(Aux(node, inst, regular != 0));  // the aux read's own TypeError
            if (!aux) return Outcome::kError;
        }
    }
    if (want_aux) {
        out->aux = Ref(Aux(node, inst, regular != 0));
        if (!out->aux) {
            // Metadata the layout cannot read (not an exact dict of str keys): the library's.
            if (check && node->meta_items && HasFunction(node, &AttrNode::library_flatten) &&
                PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                return Outcome::kLibraryOnce;
            }
            return Outcome::kError;
        }
    }
    return Outcome::kNative;
}

Outcome Read(AttrNode* node, PyObject* obj, bool want_aux, Fields* out) {
    return ReadFields(node, obj, want_aux, /*check=*/true, out);
}

PyObject* ChildKey(AttrNode* node, PyObject* aux, Py_ssize_t k) {
    if (node->mapping != nullptr) return MappingChildKey(aux, k);
    if (node->items_field != nullptr) return ItemsChildKey(aux, k);
    // A names_as_aux node made by the library's flatten has its own names.
    if (node->names_as_aux && aux != node->data_fields && PyTuple_Check(aux) &&
        k < PyTuple_GET_SIZE(aux)) {
        return keys::GetAttr(PyTuple_GET_ITEM(aux, k));
    }
    return Py_NewRef(PyTuple_GET_ITEM(node->keys, k));
}

}  // namespace attr
}  // namespace fastree
