// The mapping layout of attribute nodes (see attr_mapping.h for the layout).
#include "attr/attr_mapping.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "registry/keys.h"
#include "binding/module_state.h"
#include "util/pyutils.h"

namespace fastree {
namespace attr {

namespace {

// One field of the instance being read: all owned.
struct Field {
    Ref key;    // the name as the layout reports it: the str, or the int it reads as
    Ref value;
    bool data;
};

// `name` as Python finds it on a plain instance whose __dict__ is `dict`: the instance dict,
// else a plain class attribute. A new reference; null without an error when absent or not plain
// (a data descriptor on the class would win over the instance dict: no guessing). Runs no Python
// code: exact str keys, _PyType_Lookup.
PyObject* PlainAttribute(PyObject* cls, PyObject* dict, PyObject* name) {
    PyObject* on_class = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(cls), name);  // borrowed
    if (on_class != nullptr && Py_TYPE(on_class)->tp_descr_set != nullptr) return nullptr;
    PyObject* found = PyDict_GetItemWithError(dict, name);  // borrowed: taken at once
    if (found != nullptr) return Py_NewRef(found);
    if (PyErr_Occurred() || on_class == nullptr) return nullptr;
    if (Py_TYPE(on_class)->tp_descr_get != nullptr) return nullptr;  // a method, a property
    return Py_NewRef(on_class);
}

// The exact dict of name -> is-data flags, or null (not plain; an error set only on failure).
PyObject* DataFlags(const AttrNode* node, PyObject* dict) {
    const MappingLayout& m = *node->mapping;
    Ref flags(PlainAttribute(node->cls, dict, m.flags_attr));
    if (!flags || Py_TYPE(flags.get()) != reinterpret_cast<PyTypeObject*>(m.flags_type)) {
        return nullptr;
    }
    // The class was checked when the node was made: object's attribute lookup, no descriptor
    // for flags_inner, so this reads the mapping's own __dict__ and runs no Python code.
    PyObject* inner = PyObject_GenericGetAttr(flags.get(), m.flags_inner);
    if (inner == nullptr) return nullptr;
    if (!PyDict_CheckExact(inner)) {
        Py_DECREF(inner);
        return nullptr;
    }
    return inner;
}

// -1: not plain (or an error, set); 0/1: whether names may read as ints.
int IntKeys(const AttrNode* node, PyObject* dict) {
    Ref flag(PlainAttribute(node->cls, dict, node->mapping->int_keys_attr));
    if (!flag) return -1;
    if (flag.get() == Py_True) return 1;
    if (flag.get() == Py_False) return 0;
    return -1;
}

bool SameKey(PyObject* a, PyObject* b) {
    if (PyLong_CheckExact(a) != PyLong_CheckExact(b)) return false;
    return PyLong_CheckExact(a) ? PyObject_RichCompareBool(a, b, Py_EQ) == 1
                                : PyUnicode_Compare(a, b) == 0;
}

PyObject* KeyName(PyObject* key) {
    return PyLong_CheckExact(key) ? PyObject_Str(key) : Py_NewRef(key);
}

}  // namespace

// `name` as int() reads it, or `name` itself (a new reference); null with an error set on a
// failure other than the ValueError of a name that is no integer.
PyObject* MaybeInt(PyObject* name) {
    PyObject* as_int = PyLong_FromUnicodeObject(name, 10);
    if (as_int != nullptr) return as_int;
    if (!PyErr_ExceptionMatches(PyExc_ValueError)) return nullptr;
    PyErr_Clear();
    return Py_NewRef(name);
}

// Ints before strs; ints by value, strs by code point (sorted()'s order for such keys).
// Exact int and str only: no Python code runs.
bool KeyLess(PyObject* a, PyObject* b) {
    const bool a_int = PyLong_CheckExact(a), b_int = PyLong_CheckExact(b);
    if (a_int != b_int) return a_int;
    if (a_int) return PyObject_RichCompareBool(a, b, Py_LT) == 1;
    return PyUnicode_Compare(a, b) < 0;
}

Outcome ReadMapping(const AttrNode* node, PyObject* dict, bool want_aux, Fields* out) {
    Ref flags(DataFlags(node, dict));
    if (!flags) return PyErr_Occurred() ? Outcome::kError : Outcome::kLibraryOnce;
    const int int_keys = IntKeys(node, dict);
    if (int_keys < 0) return PyErr_Occurred() ? Outcome::kError : Outcome::kLibraryOnce;
    // The entries, owned before anything else is allocated: an allocation can run the cyclic
    // GC, whose finalizers could change the dict.
    std::vector<Field> fields;
    fields.reserve(static_cast<size_t>(PyDict_GET_SIZE(dict)));
    {
        PyObject *name, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(dict, &pos, &name, &value)) {
            fields.push_back(Field{Ref::FromBorrowed(name), Ref::FromBorrowed(value), false});
        }
    }
    for (Field& f : fields) {
        if (!PyUnicode_CheckExact(f.key.get())) return Outcome::kLibraryOnce;
        if (int_keys) {
            f.key = Ref(MaybeInt(f.key.get()));
            if (!f.key) return Outcome::kError;
            if (PyLong_CheckExact(f.key.get())) {
                // Names that read as negative or huge ints: the library's (rare; uncached keys).
                const Py_ssize_t index = PyLong_AsSsize_t(f.key.get());
                if (index < 0) {
                    PyErr_Clear();
                    return Outcome::kLibraryOnce;
                }
            }
        }
        Ref name(KeyName(f.key.get()));
        if (!name) return Outcome::kError;
        PyObject* flag = PyDict_GetItemWithError(flags.get(), name.get());  // exact str key
        if (flag == nullptr && PyErr_Occurred()) return Outcome::kError;
        if (flag != nullptr && flag != Py_True && flag != Py_False) return Outcome::kLibraryOnce;
        f.data = flag == Py_True;
    }
    std::vector<size_t> order(fields.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return KeyLess(fields[a].key.get(), fields[b].key.get());
    });
    for (size_t i = 1; i < order.size(); ++i) {  // two names reading as one int
        if (SameKey(fields[order[i - 1]].key.get(), fields[order[i]].key.get())) {
            return Outcome::kLibraryOnce;
        }
    }
    for (size_t i : order) {
        if (!fields[i].data) continue;
        out->children.push_back(nullptr);  // the slot first: a push that throws leaks nothing
        out->children[out->children.size() - 1] = fields[i].value.release();
    }
    if (!want_aux) return Outcome::kNative;
    RefSmallVector<16> data_keys, static_keys, static_values;
    for (size_t i : order) {
        Field& f = fields[i];
        if (f.data) {
            PushOwned(data_keys, f.key.release());
        } else {
            PushOwned(static_keys, f.key.release());
            PushOwned(static_values, f.value.release());
        }
    }
    Ref a(StealIntoSequence(data_keys, /*as_tuple=*/true));
    if (!a) return Outcome::kError;
    Ref b(StealIntoSequence(static_keys, /*as_tuple=*/true));
    if (!b) return Outcome::kError;
    Ref c(StealIntoSequence(static_values, /*as_tuple=*/true));
    if (!c) return Outcome::kError;
    out->aux = Ref(PyTuple_Pack(3, a.get(), b.get(), c.get()));
    return out->aux ? Outcome::kNative : Outcome::kError;
}

bool CheckMappingAux(const AttrNode* node, PyObject* aux, Py_ssize_t arity) {
    if (PyTuple_Check(aux) && PyTuple_GET_SIZE(aux) == 3 && PyTuple_Check(PyTuple_GET_ITEM(aux, 0)) &&
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(aux, 0)) == arity &&
        PyTuple_Check(PyTuple_GET_ITEM(aux, 1)) && PyTuple_Check(PyTuple_GET_ITEM(aux, 2)) &&
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(aux, 1)) == PyTuple_GET_SIZE(PyTuple_GET_ITEM(aux, 2))) {
        return true;
    }
    PyErr_Format(PyExc_ValueError,
                 "attribute node of %.200s: expected aux data (data names, static names, static "
                 "values) with %zd data names, got %.200R",
                 reinterpret_cast<PyTypeObject*>(node->cls)->tp_name, arity, aux);
    return false;
}

PyObject* BuildMapping(const AttrNode* node, PyObject* aux, PyObject* const* children,
                       Py_ssize_t n) {
    if (!CheckMappingAux(node, aux, n)) return nullptr;
    // `aux` and `children` are the caller's and stay alive; setattr can run Python code.
    Ref obj(NewInstance(node->cls));
    if (!obj) return nullptr;
    PyObject* data_keys = PyTuple_GET_ITEM(aux, 0);
    PyObject* static_keys = PyTuple_GET_ITEM(aux, 1);
    PyObject* static_values = PyTuple_GET_ITEM(aux, 2);
    for (Py_ssize_t i = 0; i < n; ++i) {
        Ref name(KeyName(PyTuple_GET_ITEM(data_keys, i)));
        if (!name || PyObject_GenericSetAttr(obj.get(), name.get(), children[i]) < 0) {
            return nullptr;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(static_keys); ++i) {
        Ref name(KeyName(PyTuple_GET_ITEM(static_keys, i)));
        if (!name ||
            PyObject_GenericSetAttr(obj.get(), name.get(), PyTuple_GET_ITEM(static_values, i)) < 0) {
            return nullptr;
        }
    }
    return obj.release();
}

PyObject* MappingChildKey(PyObject* aux, Py_ssize_t k) {
    PyObject* key = PyTuple_GET_ITEM(PyTuple_GET_ITEM(aux, 0), k);
    if (!PyLong_CheckExact(key)) return keys::GetAttr(key);
    const Py_ssize_t index = PyLong_AsSsize_t(key);
    if (index >= 0) return keys::Sequence(index);
    if (PyErr_Occurred()) return nullptr;
    // A negative name ("-1", read by the library's flatten): SequenceKey(-1), made as JAX's
    // class makes it, uncached.
    Ref cls = Ref::FromBorrowed(ModState().keys.sequence.cls.get());
    if (!cls) {
        PyErr_SetString(PyExc_RuntimeError, "fastree: the key classes are not installed");
        return nullptr;
    }
    return PyObject_CallOneArg(cls.get(), key);
}

}  // namespace attr
}  // namespace fastree
