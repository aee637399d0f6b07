// The mapping layout of attribute nodes (see attr_mapping.h for the layout).
#include "attr/attr_mapping.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "registry/keys.h"
#include "registry/registry_state.h"
#include "util/free_threading.h"
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

// PlainAttribute (attr_mapping.h). Runs no Python code: exact str keys, the type's attribute
// lookup. Both lookups give new references: another thread may set the class attribute or the
// instance's entry meanwhile (docs/threads.md).
PyObject* PlainAttribute(PyObject* cls, PyObject* dict, PyObject* name) {
    Ref on_class(TypeLookupRef(reinterpret_cast<PyTypeObject*>(cls), name));
    if (on_class && Py_TYPE(on_class.get())->tp_descr_set != nullptr) return nullptr;
    PyObject* found;
    if (DictGetItemRef(dict, name, &found) != 0) return found;  // found, or failed (error set)
    if (!on_class) return nullptr;
    if (Py_TYPE(on_class.get())->tp_descr_get != nullptr) return nullptr;  // a method, a property
    return on_class.release();
}

// Ints before strs; ints by value, strs by code point (sorted()'s order for such keys).
// Exact int and str only: no Python code runs.
bool KeyLess(PyObject* a, PyObject* b) {
    const bool a_int = PyLong_CheckExact(a), b_int = PyLong_CheckExact(b);
    if (a_int != b_int) return a_int;
    if (a_int) return PyObject_RichCompareBool(a, b, Py_LT) == 1;
    return PyUnicode_Compare(a, b) < 0;
}

namespace {

// The children and aux data of the fields in `order` (sorted positions -> field indices), the
// aux's name tuples given (the memo's, held by the caller) or made here from the fields' keys.
Outcome Emit(std::vector<Field>& fields, const std::vector<size_t>& order, bool want_aux,
             PyObject* data_keys, PyObject* static_keys, Fields* out) {
    for (size_t i : order) {
        if (!fields[i].data) continue;
        out->children.push_back(nullptr);  // the slot first: a push that throws leaks nothing
        out->children[out->children.size() - 1] = Py_NewRef(fields[i].value.get());
    }
    if (!want_aux) return Outcome::kNative;
    RefSmallVector<16> static_values;
    for (size_t i : order) {
        if (!fields[i].data) PushOwned(static_values, Py_NewRef(fields[i].value.get()));
    }
    Ref a, b;
    if (data_keys != nullptr) {
        a = Ref::FromBorrowed(data_keys);
        b = Ref::FromBorrowed(static_keys);
    } else {
        RefSmallVector<16> d, st;
        for (size_t i : order) PushOwned(fields[i].data ? d : st, Py_NewRef(fields[i].key.get()));
        a = Ref(StealIntoSequence(d, /*as_tuple=*/true));
        if (!a) return Outcome::kError;
        b = Ref(StealIntoSequence(st, /*as_tuple=*/true));
        if (!b) return Outcome::kError;
    }
    Ref c(StealIntoSequence(static_values, /*as_tuple=*/true));
    if (!c) return Outcome::kError;
    out->aux = Ref(PyTuple_Pack(3, a.get(), b.get(), c.get()));
    return out->aux ? Outcome::kNative : Outcome::kError;
}

// Whether the fields are the memo's layout: the same name objects in the same order, each with
// the same flag (read now). If so, fills `order` and the fields' flags, and takes the memo's two
// name tuples into *data_keys / *static_keys.
//
// The memo is the node's, shared by every thread reading instances of the class (A7 in
// docs/threads.md): another thread's Remember replaces its tuples and frees its arrays. So the
// flags are looked up first, outside any section (a lookup can run Python code: a str subclass
// key in the flags dict), and then the names, flags and order are compared and copied in the
// node's critical section, in one go: pointer and bool compares into buffers sized before it, the
// tuples taken with a reference. A memo replaced before the section is simply a miss.
bool MemoFits(const AttrNode* node, std::vector<Field>& fields, PyObject* flags,
              std::vector<size_t>* order, Ref* data_keys, Ref* static_keys) {
    const MappingLayout& m = *node->mapping;
    for (Field& f : fields) {
        // Exact str names only (as the memo holds): their lookups run no Python code. Others
        // go to the full read, which gives them to the library.
        if (!PyUnicode_CheckExact(f.key.get())) return false;
        PyObject* flag = PyDict_GetItemWithError(flags, f.key.get());  // compared only
        if (flag == nullptr && PyErr_Occurred()) {
            PyErr_Clear();  // the full read looks it up again and reports it
            return false;
        }
        if (flag != nullptr && flag != Py_True && flag != Py_False) return false;
        f.data = flag == Py_True;
    }
    const size_t n = fields.size();
    order->resize(n);  // may throw: before the section
    bool fits = false;
    PyObject* a = nullptr;
    PyObject* b = nullptr;
    FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(const_cast<AttrNode*>(node)));
    PyObject* names = m.last_names;
    fits = names != nullptr && PyTuple_GET_SIZE(names) == static_cast<Py_ssize_t>(n);
    for (size_t i = 0; fits && i < n; ++i) {
        fits = fields[i].key.get() == PyTuple_GET_ITEM(names, static_cast<Py_ssize_t>(i)) &&
               fields[i].data == m.last_data[i];
    }
    if (fits) {
        for (size_t i = 0; i < n; ++i) (*order)[i] = static_cast<size_t>(m.last_order[i]);
        a = Py_NewRef(m.last_data_keys);
        b = Py_NewRef(m.last_static_keys);
    }
    FASTREE_END_CRITICAL_SECTION();
    *data_keys = Ref(a);
    *static_keys = Ref(b);
    return fits;
}

// The memo's layout read with no lookup per name and no buffer on the heap: where the flags dict
// holds the memo's flag names, in its order, with its flags (pointer compares), and the instance
// dict the memo's names in its order, each name's flag is the memo's. Then the values are taken
// (new references) into `values` in the instance dict's order, and `order`, `data` and the two
// name tuples copied from the memo. kNative when it fits; kLibraryOnce when it does not (nothing
// taken: the caller reads the full way). For up to kMemoFields names.
//
// Threads (docs/threads.md, A7): the flags dict is compared in the section of the node and that
// dict, the instance dict in the section of the node and it; the memo's version, read in both,
// says the memo was not replaced in between. Neither section allocates or runs Python code: both
// only compare pointers and take references into the caller's stack arrays.
constexpr Py_ssize_t kMemoFields = 32;

Outcome ReadMemo(const AttrNode* node, PyObject* dict, PyObject* flags, PyObject** values,
                 Py_ssize_t* order, bool* data, Py_ssize_t* n_out, Ref* data_keys,
                 Ref* static_keys) {
    const MappingLayout& m = *node->mapping;
    [[maybe_unused]] PyObject* self = reinterpret_cast<PyObject*>(const_cast<AttrNode*>(node));
    bool fits = false;
    uint64_t version = 0;
    FASTREE_BEGIN_CRITICAL_SECTION2(self, flags);
    PyObject* names = m.last_flag_names;
    fits = names != nullptr && PyDict_GET_SIZE(flags) == PyTuple_GET_SIZE(names);
    PyObject *key, *value;
    Py_ssize_t pos = 0, i = 0;
    while (fits && PyDict_Next(flags, &pos, &key, &value)) {
        fits = key == PyTuple_GET_ITEM(names, i) &&
               value == (m.last_flag_data[i] ? Py_True : Py_False);
        ++i;
    }
    version = m.version;
    FASTREE_END_CRITICAL_SECTION2();
    if (!fits) return Outcome::kLibraryOnce;
    PyObject* a = nullptr;
    PyObject* b = nullptr;
    Py_ssize_t n = 0;
    FASTREE_BEGIN_CRITICAL_SECTION2(self, dict);
    PyObject* names = m.last_names;
    n = names != nullptr ? PyTuple_GET_SIZE(names) : 0;
    fits = m.version == version && names != nullptr && n <= kMemoFields &&
           PyDict_GET_SIZE(dict) == n;
    PyObject *key, *value;
    Py_ssize_t pos = 0, i = 0;
    while (fits && PyDict_Next(dict, &pos, &key, &value)) {
        fits = key == PyTuple_GET_ITEM(names, i);
        values[i++] = value;  // borrowed until the references are taken below, in this section
    }
    if (fits) {
        for (Py_ssize_t j = 0; j < n; ++j) {
            Py_INCREF(values[j]);
            order[j] = m.last_order[j];
            data[j] = m.last_data[j];
        }
        a = Py_NewRef(m.last_data_keys);
        b = Py_NewRef(m.last_static_keys);
    }
    FASTREE_END_CRITICAL_SECTION2();
    if (!fits) return Outcome::kLibraryOnce;
    *n_out = n;
    *data_keys = Ref(a);
    *static_keys = Ref(b);
    return Outcome::kNative;
}

// The children and aux data of a read that fit the memo (ReadMemo's outputs; `values` owned,
// each reference handed on or released here).
Outcome EmitMemo(PyObject** values, const Py_ssize_t* order, const bool* data, Py_ssize_t n,
                 bool want_aux, PyObject* data_keys, PyObject* static_keys, Fields* out) {
    // Each reference moves to where it is released on any failure (children, statics); one
    // not moved yet is released by `held` (a push may throw).
    struct Held {
        PyObject** v;
        Py_ssize_t n;
        ~Held() {
            for (Py_ssize_t i = 0; i < n; ++i) Py_XDECREF(v[i]);
        }
    } held{values, n};
    RefSmallVector<16> static_values;
    for (Py_ssize_t k = 0; k < n; ++k) {
        const Py_ssize_t i = order[k];
        if (!data[i] && !want_aux) continue;  // released by `held`
        auto& into = data[i] ? out->children : static_values;
        into.push_back(nullptr);  // the slot first: a push that throws leaks nothing
        into[into.size() - 1] = values[i];
        values[i] = nullptr;
    }
    if (!want_aux) return Outcome::kNative;
    Ref c(StealIntoSequence(static_values, /*as_tuple=*/true));
    if (!c) return Outcome::kError;
    out->aux = Ref(PyTuple_Pack(3, data_keys, static_keys, c.get()));
    return out->aux ? Outcome::kNative : Outcome::kError;
}

// The flags dict's names in its order (a new tuple) and whether each is True, into *names and
// *data, when every name is an exact str and every flag a bool; else both null (and no error:
// the memo is then never fitted by ReadMemo). The names are taken in the dict's section, into
// room made before it; the tuple is made after it.
void FlagsOf(PyObject* flags, PyObject** names, bool** data) {
    *names = nullptr;
    *data = nullptr;
    const Py_ssize_t room = PyDict_GET_SIZE(flags);
    if (room > kMemoFields) return;
    PyObject* keys[kMemoFields];
    bool flag[kMemoFields];
    Py_ssize_t n = 0;
    bool plain = true;
    FASTREE_BEGIN_CRITICAL_SECTION(flags);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    plain = PyDict_GET_SIZE(flags) == room;
    while (plain && PyDict_Next(flags, &pos, &key, &value)) {
        plain = PyUnicode_CheckExact(key) && (value == Py_True || value == Py_False);
        if (plain) {
            keys[n] = Py_NewRef(key);
            flag[n++] = value == Py_True;
        }
    }
    FASTREE_END_CRITICAL_SECTION();
    PyObject* t = plain ? PyTuple_New(n) : nullptr;
    auto* d = t != nullptr ? static_cast<bool*>(PyMem_Malloc(sizeof(bool) * (n + 1))) : nullptr;
    if (d == nullptr) {
        for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(keys[i]);
        Py_XDECREF(t);
        PyErr_Clear();  // optional, as the memo is
        return;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyTuple_SET_ITEM(t, i, keys[i]);
        d[i] = flag[i];
    }
    *names = t;
    *data = d;
}

// Keeps the layout just read (str names: int_keys false) as the memo. Everything new is made
// first; the swap is in the node's critical section (MemoFits reads there); the old arrays and
// tuples are released after it (a release can run Python code).
void Remember(const AttrNode* node, const std::vector<Field>& fields,
              const std::vector<size_t>& order, PyObject* aux, PyObject* flags) {
    MappingLayout* m = node->mapping;
    const size_t n = fields.size();
    auto* new_order = static_cast<Py_ssize_t*>(PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1)));
    auto* new_data = static_cast<bool*>(PyMem_Malloc(sizeof(bool) * (n + 1)));
    PyObject* names = PyTuple_New(static_cast<Py_ssize_t>(n));
    PyObject* flag_names = nullptr;
    bool* flag_data = nullptr;
    if (new_order != nullptr && new_data != nullptr && names != nullptr) {
        FlagsOf(flags, &flag_names, &flag_data);
        // The flags were looked up before the snapshot: kept only where each field's flag is
        // what the snapshot says of its very name object (absent: static), so that a later
        // instance matching the snapshot splits as these fields did. An allocation between the
        // two (a finalizer) or another thread could have changed the dict.
        for (size_t i = 0; flag_names != nullptr && i < n; ++i) {
            bool flag = false;
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(flag_names); ++j) {
                if (PyTuple_GET_ITEM(flag_names, j) == fields[i].key.get()) flag = flag_data[j];
            }
            if (flag != fields[i].data) {
                Py_CLEAR(flag_names);
                PyMem_Free(flag_data);
                flag_data = nullptr;
            }
        }
    }
    if (new_order == nullptr || new_data == nullptr || names == nullptr) {
        PyMem_Free(new_order);
        PyMem_Free(new_data);
        Py_XDECREF(names);
        PyErr_Clear();  // a memo is optional: the read itself succeeded
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        PyTuple_SET_ITEM(names, static_cast<Py_ssize_t>(i), Py_NewRef(fields[i].key.get()));
        new_data[i] = fields[i].data;
        new_order[i] = static_cast<Py_ssize_t>(order[i]);
    }
    PyObject* data_keys = Py_NewRef(PyTuple_GET_ITEM(aux, 0));
    PyObject* static_keys = Py_NewRef(PyTuple_GET_ITEM(aux, 1));
    PyObject* old[4];
    Py_ssize_t* old_order;
    bool* old_data;
    bool* old_flag_data;
    FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(const_cast<AttrNode*>(node)));
    old[0] = m->last_names;
    old[1] = m->last_data_keys;
    old[2] = m->last_static_keys;
    old[3] = m->last_flag_names;
    old_order = m->last_order;
    old_data = m->last_data;
    old_flag_data = m->last_flag_data;
    m->last_names = names;
    m->last_data_keys = data_keys;
    m->last_static_keys = static_keys;
    m->last_order = new_order;
    m->last_data = new_data;
    m->last_flag_names = flag_names;
    m->last_flag_data = flag_data;
    ++m->version;
    FASTREE_END_CRITICAL_SECTION();
    PyMem_Free(old_order);
    PyMem_Free(old_data);
    PyMem_Free(old_flag_data);
    for (PyObject* o : old) Py_XDECREF(o);
}

}  // namespace

void ClearMappingMemo(MappingLayout* m) {
    PyObject* old[4] = {m->last_names, m->last_data_keys, m->last_static_keys,
                        m->last_flag_names};
    m->last_names = m->last_data_keys = m->last_static_keys = m->last_flag_names = nullptr;
    PyMem_Free(m->last_order);
    PyMem_Free(m->last_data);
    PyMem_Free(m->last_flag_data);
    m->last_order = nullptr;
    m->last_data = nullptr;
    m->last_flag_data = nullptr;
    ++m->version;
    for (PyObject* o : old) Py_XDECREF(o);
}

Outcome ReadMapping(const AttrNode* node, PyObject* dict, bool want_aux, Fields* out) {
    Ref flags(DataFlags(node, dict));
    if (!flags) return PyErr_Occurred() ? Outcome::kError : Outcome::kLibraryOnce;
    const int int_keys = IntKeys(node, dict);
    if (int_keys < 0) return PyErr_Occurred() ? Outcome::kError : Outcome::kLibraryOnce;
    if (!int_keys) {
        // Most instances of a class are laid out alike (one __init__): the memo's layout.
        PyObject* values[kMemoFields];
        Py_ssize_t order[kMemoFields];
        bool data[kMemoFields];
        Py_ssize_t n = 0;
        Ref data_keys, static_keys;
        if (ReadMemo(node, dict, flags.get(), values, order, data, &n, &data_keys,
                     &static_keys) == Outcome::kNative) {
            return EmitMemo(values, order, data, n, want_aux, data_keys.get(), static_keys.get(),
                            out);
        }
    }
    // The entries, owned before anything else is allocated: an allocation can run the cyclic
    // GC, whose finalizers could change the dict.
    // The instance's dict is read in its critical section (another thread may set attributes
    // meanwhile), into room made before it: no allocation there, nothing thrown through it.
    std::vector<Field> fields;
    for (;;) {
        const size_t room = static_cast<size_t>(PyDict_GET_SIZE(dict));
        fields.reserve(room);  // may throw: outside the section
        bool fit;
        FASTREE_BEGIN_CRITICAL_SECTION(dict);
        fit = static_cast<size_t>(PyDict_GET_SIZE(dict)) <= fields.capacity();
        if (fit) {
            PyObject *name, *value;
            Py_ssize_t pos = 0;
            while (PyDict_Next(dict, &pos, &name, &value)) {
                fields.push_back(Field{Ref::FromBorrowed(name), Ref::FromBorrowed(value), false});
            }
        }
        FASTREE_END_CRITICAL_SECTION();
        if (fit) break;  // else grown meanwhile (free-threaded only): make more room
    }
    std::vector<size_t> order;
    Ref data_keys, static_keys;
    if (!int_keys && MemoFits(node, fields, flags.get(), &order, &data_keys, &static_keys)) {
        return Emit(fields, order, want_aux, data_keys.get(), static_keys.get(), out);
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
    order.resize(fields.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return KeyLess(fields[a].key.get(), fields[b].key.get());
    });
    for (size_t i = 1; i < order.size(); ++i) {  // two names reading as one int
        if (SameKey(fields[order[i - 1]].key.get(), fields[order[i]].key.get())) {
            return Outcome::kLibraryOnce;
        }
    }
    const Outcome outcome = Emit(fields, order, want_aux, nullptr, nullptr, out);
    if (outcome == Outcome::kNative && want_aux && !int_keys) {
        Remember(node, fields, order, out->aux.get(), flags.get());
    }
    return outcome;
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
    Ref cls = Ref::FromBorrowed(state::Keys().sequence.cls.get());
    if (!cls) {
        PyErr_SetString(PyExc_RuntimeError, "fastree: the key classes are not installed");
        return nullptr;
    }
    return PyObject_CallOneArg(cls.get(), key);
}

}  // namespace attr
}  // namespace fastree
