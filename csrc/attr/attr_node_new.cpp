// AttrNode(...): checks the constructor's arguments and works out a layout from them (interned
// names, slot offsets, rebuild order, the mapping layout's settings, keys, the shared regular aux).
#include "attr/attr_node_internal.h"

#include <vector>

#include "attr/attr_mapping.h"
#include "registry/keys.h"

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

namespace fastree {
namespace attr {
namespace {

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
        // A new reference (TypeLookupRef runs no Python code): under the GIL the borrowed one
        // was safe, used before anything else ran; without it another thread's setattr on the
        // class could free the descriptor while it is read here.
        Ref descr(TypeLookupRef(cls, name));
        if (!descr || Py_TYPE(descr.get()) != &PyMemberDescr_Type) continue;
        PyMemberDescrObject* member_descr = reinterpret_cast<PyMemberDescrObject*>(descr.get());
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

}  // namespace

PyObject* New(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    static const char* kwlist[] = {"cls",           "data_fields",  "meta_fields",
                                   "missing",       "extra_fields", "names_as_aux",
                                   "rebuild_order", "post_init",    "trusted_getattribute",
                                   "mapping",       "meta_items",   "key_names",
                                   "rebuild_with",  "trace_classes", "trace_field",
                                   "items_field",   nullptr};
    PyObject *cls, *data, *meta = nullptr, *missing = nullptr, *extra = Py_None,
                          *order = Py_None, *trusted = Py_None, *mapping = Py_None,
                          *key_names = Py_None, *rebuild_with = Py_None,
                          *trace_classes = Py_None, *trace_field = Py_None,
                          *items_field = Py_None;
    int names_as_aux = 0, post_init = 0, meta_items = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$OOpOpOOpOOOOO", const_cast<char**>(kwlist),
                                     &cls, &data, &meta, &missing, &extra, &names_as_aux, &order,
                                     &post_init, &trusted, &mapping, &meta_items, &key_names,
                                     &rebuild_with, &trace_classes, &trace_field, &items_field)) {
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
    if (trusted != Py_None && PyFunction_Check(trusted)) {
        n->trusted_code = Py_NewRef(PyFunction_GET_CODE(trusted));
    }
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
    if (items_field != Py_None) {
        // The items layout: one dict attribute, nothing else of the layouts above.
        if (!PyUnicode_CheckExact(items_field) || NumData(n) != 0 || NumMeta(n) != 0 ||
            n->extra_fields != nullptr || n->names_as_aux || n->mapping != nullptr ||
            n->rebuild_with != nullptr || n->trace_field != nullptr || n->post_init) {
            PyErr_SetString(PyExc_TypeError,
                            "attribute node: items_field is an attribute name, and takes no "
                            "fields, mapping, names_as_aux, rebuild_with, trace_field or "
                            "post_init");
            return nullptr;
        }
        n->items_field = Py_NewRef(items_field);
        PyUnicode_InternInPlace(&n->items_field);
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

}  // namespace attr
}  // namespace fastree
