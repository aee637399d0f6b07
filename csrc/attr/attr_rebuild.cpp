// Rebuilding an instance from aux data and children, for each layout: fields set without
// __init__, the class's own constructor method (rebuild_with), or flax.nnx's Variable._new in C;
// and whether aux data fits the layout (CheckAux).
#include "attr/attr_node_internal.h"

#include "attr/attr_items.h"
#include "attr/attr_mapping.h"
#include "attr/nnx_shared.h"

namespace fastree {
namespace attr {
namespace {

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

}  // namespace

bool CheckAux(AttrNode* node, PyObject* aux, Py_ssize_t arity) {
    if (node->mapping != nullptr) return CheckMappingAux(node, aux, arity);
    if (node->items_field != nullptr) return CheckItemsAux(node, aux, arity);
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

PyObject* LibraryRebuild(AttrNode* node, PyObject* aux, PyObject* const* children,
                         Py_ssize_t n) {
    Ref fn = NodeFunction(node, &AttrNode::library_unflatten);
    if (!fn) {  // none attached, or cleared since the caller looked (the node's tp_clear)
        PyErr_SetString(PyExc_RuntimeError,
                        "fastree: an attribute node's library functions are gone");
        return nullptr;
    }
    Ref kids(NewSequenceOf<true>(n, [&](Py_ssize_t i) { return Py_NewRef(children[i]); }));
    if (!kids) return nullptr;
    PyObject* args[2] = {aux, kids.get()};
    return PyObject_Vectorcall(fn.get(), args, 2, nullptr);
}

PyObject* Build(AttrNode* node, PyObject* aux, PyObject* const* children, Py_ssize_t n) {
    if (node->mapping != nullptr) return BuildMapping(node, aux, children, n);
    if (node->items_field != nullptr) return BuildItems(node, aux, children, n);
    if (node->rebuild_with != nullptr) return BuildWith(node, aux, children, n);
    if (node->names_as_aux) {
        const int own = IsOwnNames(node, aux);
        if (own < 0) return nullptr;
        if (!own && HasFunction(node, &AttrNode::library_unflatten) && CheckAux(node, aux, n)) {
            // An instance the library flattened (delegate_irregular): the library rebuilds it.
            return LibraryRebuild(node, aux, children, n);
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

PyObject* NewInstance(PyObject* cls) { return NewInstanceOf(cls); }

}  // namespace attr
}  // namespace fastree
