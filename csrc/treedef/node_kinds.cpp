// The node kinds' cold operations: types, node data, keys, building, repr text, checks of node
// data given by a caller. (Reading objects: kinds_read.h; flatten_up_to's checks:
// kinds_expect.h. The kind structs themselves: node_kinds.h.)
#include "treedef/node_kinds.h"

#include "registry/attr_node.h"

#include "registry/keys.h"
#include "util/pyutils.h"

namespace fastree {
namespace kinds {
namespace {

// Moves `n` owned references into a new tuple (consumed, success or not).
PyObject* StealTuple(PyObject** items, Py_ssize_t n) {
    PyObject* t = PyTuple_New(n);
    if (t == nullptr) {
        DropChildren(items, n);
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

// Fills a new `mapping` (owned, consumed; null if making it failed) with keys_tuple[i] ->
// children[i] through __setitem__ (children consumed).
PyObject* FillMapping(PyObject* mapping, PyObject* keys_tuple, PyObject** children, Py_ssize_t n) {
    if (mapping == nullptr) {
        DropChildren(children, n);
        return nullptr;
    }
    Ref out(mapping);
    if (!PyTuple_Check(keys_tuple) || PyTuple_GET_SIZE(keys_tuple) != n) {
        PyErr_SetString(PyExc_ValueError, "fastree: corrupt mapping node data");
        DropChildren(children, n);
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        // Each child is released right after it is stored, so none is left unowned if the
        // store (user code: __setitem__, a key's __hash__) fails.
        int err = PyObject_SetItem(out.get(), PyTuple_GET_ITEM(keys_tuple, i), children[i]);
        Py_DECREF(children[i]);
        if (err < 0) {
            DropChildren(children + i + 1, n - i - 1);
            return nullptr;
        }
    }
    return out.release();
}

bool TypeName(PyObject* type, std::string* out) {
    Ref name(PyObject_GetAttrString(type, "__name__"));
    return name && StrInto(name.get(), out);
}

void Join(const std::string* kids, Py_ssize_t n, std::string* out) {
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (i > 0) out->append(", ");
        out->append(kids[i]);
    }
}

bool DataTupleOf(PyObject* data, Py_ssize_t n) {
    return PyTuple_Check(data) && PyTuple_GET_SIZE(data) == n;
}

}  // namespace

// The children arrays are raw owned references (a walker's value stack, the hot per-node path):
// this is their release wherever a Build does not consume them.
void DropChildren(PyObject** children, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(children[i]);
}

// ---- defaults

PyObject* KindBase::ChildKey(const NodeParts&, Py_ssize_t k) { return keys::FlattenedIndex(k); }

PyObject* KindBase::Build(const NodeParts& parts, PyObject** children) {
    DropChildren(children, parts.arity);
    PyErr_SetString(PyExc_SystemError, "fastree: a leaf or reference node cannot be built");
    return nullptr;
}

bool KindBase::CheckParts(const NodeParts&, PyObject* type) {
    PyErr_Format(PyExc_RuntimeError, "Could not find type: %R.", type);
    return false;
}

bool KindBase::Describe(const NodeParts& parts, const std::string* kids, std::string* out) {
    *out += "CustomNode(";
    if (!TypeName(parts.custom->type, out)) return false;
    *out += "[";
    if (!StrInto(parts.data, out)) return false;
    *out += "], [";
    Join(kids, parts.arity, out);
    *out += "])";
    return true;
}

// ---- None

PyObject* NoneKind::Type(const NodeParts&) {
    return Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(Py_None)));
}

bool NoneKind::CheckParts(const NodeParts& parts, PyObject*) {
    if (parts.arity == 0) return true;
    PyErr_SetString(PyExc_ValueError, "None nodes have no children.");
    return false;
}

// ---- tuple and list

PyObject* TupleKind::Type(const NodeParts&) {
    return Py_NewRef(reinterpret_cast<PyObject*>(&PyTuple_Type));
}

PyObject* TupleKind::ChildKey(const NodeParts&, Py_ssize_t k) { return keys::Sequence(k); }

PyObject* TupleKind::Build(const NodeParts& parts, PyObject** children) {
    return StealTuple(children, parts.arity);
}

bool TupleKind::Describe(const NodeParts& parts, const std::string* kids, std::string* out) {
    *out += "(";
    Join(kids, parts.arity, out);
    *out += parts.arity == 1 ? ",)" : ")";
    return true;
}

PyObject* ListKind::Type(const NodeParts&) {
    return Py_NewRef(reinterpret_cast<PyObject*>(&PyList_Type));
}

PyObject* ListKind::Build(const NodeParts& parts, PyObject** children) {
    PyObject* list = NewList(parts.arity);
    if (list == nullptr) {
        DropChildren(children, parts.arity);
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < parts.arity; ++i) PyList_SET_ITEM(list, i, children[i]);
    return list;
}

bool ListKind::Describe(const NodeParts& parts, const std::string* kids, std::string* out) {
    *out += "[";
    Join(kids, parts.arity, out);
    *out += "]";
    return true;
}

// ---- dict

PyObject* DictKind::Type(const NodeParts&) {
    return Py_NewRef(reinterpret_cast<PyObject*>(&PyDict_Type));
}

PyObject* DictKind::Data(const NodeParts& parts) {
    PyObject* list = NewList(parts.arity);
    if (list == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < parts.arity; ++i) {
        PyList_SET_ITEM(list, i, Py_NewRef(parts.keys[i]));
    }
    return list;
}

PyObject* DictKind::OneLevelData(const NodeParts& parts) {
    PyObject* t = PyTuple_New(parts.arity);
    if (t == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < parts.arity; ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(parts.keys[i]));
    return t;
}

PyObject* DictKind::ChildKey(const NodeParts& parts, Py_ssize_t k) {
    return keys::Dict(parts.keys[k]);
}

bool DictKind::Describe(const NodeParts& parts, const std::string* kids, std::string* out) {
    *out += "{";
    for (Py_ssize_t i = 0; i < parts.arity; ++i) {
        if (i > 0) *out += ", ";
        if (!ReprInto(parts.keys[i], out)) return false;
        *out += ": ";
        *out += kids[i];
    }
    *out += "}";
    return true;
}

// ---- namedtuple

PyObject* NamedTupleKind::ChildKey(const NodeParts& parts, Py_ssize_t k) {
    Ref fields(PyObject_GetAttrString(parts.data, "_fields"));
    Ref name(fields ? PySequence_GetItem(fields.get(), k) : nullptr);
    return name ? keys::GetAttr(name.get()) : nullptr;
}

PyObject* NamedTupleKind::Build(const NodeParts& parts, PyObject** children) {
    Ref args(StealTuple(children, parts.arity));
    if (!args) return nullptr;
    return PyObject_Call(parts.data, args.get(), nullptr);
}

bool NamedTupleKind::Describe(const NodeParts& parts, const std::string* kids, std::string* out) {
    *out += "CustomNode(namedtuple[";
    if (!TypeName(parts.data, out)) return false;
    *out += "], [";
    Join(kids, parts.arity, out);
    *out += "])";
    return true;
}

// ---- OrderedDict and defaultdict

PyObject* OrderedDictKind::ChildKey(const NodeParts& parts, Py_ssize_t k) {
    return keys::Dict(PyTuple_GET_ITEM(parts.data, k));
}

PyObject* OrderedDictKind::Build(const NodeParts& parts, PyObject** children) {
    return FillMapping(PyObject_CallNoArgs(parts.custom->type), parts.data, children, parts.arity);
}

bool OrderedDictKind::CheckParts(const NodeParts& parts, PyObject*) {
    if (DataTupleOf(parts.data, parts.arity)) return true;
    PyErr_SetString(PyExc_ValueError,
                    "OrderedDict node data must be a tuple with one key per child.");
    return false;
}

PyObject* DefaultDictKind::ChildKey(const NodeParts& parts, Py_ssize_t k) {
    return keys::Dict(PyTuple_GET_ITEM(PyTuple_GET_ITEM(parts.data, 1), k));
}

PyObject* DefaultDictKind::Build(const NodeParts& parts, PyObject** children) {
    PyObject* factory = PyTuple_GET_ITEM(parts.data, 0);
    return FillMapping(PyObject_CallOneArg(parts.custom->type, factory),
                       PyTuple_GET_ITEM(parts.data, 1), children, parts.arity);
}

bool DefaultDictKind::CheckParts(const NodeParts& parts, PyObject*) {
    if (DataTupleOf(parts.data, 2) && DataTupleOf(PyTuple_GET_ITEM(parts.data, 1), parts.arity)) {
        return true;
    }
    PyErr_SetString(PyExc_ValueError,
                    "defaultdict node data must be (default_factory, keys) with one key per "
                    "child.");
    return false;
}

// ---- register_dataclass

PyObject* DataclassKind::ChildKey(const NodeParts& parts, Py_ssize_t k) {
    return keys::GetAttr(PyTuple_GET_ITEM(parts.custom->data_fields, k));
}

// The class called with every field by keyword: the meta values from the payload, the data
// fields from the children (one per field: every way of making a node checks that count).
PyObject* DataclassKind::Build(const NodeParts& parts, PyObject** children) {
    const Registration* reg = parts.custom;
    const Py_ssize_t n = PyTuple_GET_SIZE(reg->data_fields);
    Ref kwargs(PyDict_New());
    bool ok = static_cast<bool>(kwargs);
    const Py_ssize_t m = PyTuple_GET_SIZE(reg->meta_fields);
    for (Py_ssize_t i = 0; ok && i < m; ++i) {
        ok = PyDict_SetItem(kwargs.get(), PyTuple_GET_ITEM(reg->meta_fields, i),
                            PyTuple_GET_ITEM(parts.data, i)) == 0;
    }
    for (Py_ssize_t i = 0; ok && i < n; ++i) {
        ok = PyDict_SetItem(kwargs.get(), PyTuple_GET_ITEM(reg->data_fields, i), children[i]) == 0;
    }
    DropChildren(children, n);
    if (!ok) return nullptr;
    Ref empty(PyTuple_New(0));
    return empty ? PyObject_Call(reg->type, empty.get(), kwargs.get()) : nullptr;
}

bool DataclassKind::CheckParts(const NodeParts& parts, PyObject* type) {
    const Registration* reg = parts.custom;
    if (DataTupleOf(parts.data, PyTuple_GET_SIZE(reg->meta_fields)) &&
        parts.arity == PyTuple_GET_SIZE(reg->data_fields)) {
        return true;
    }
    PyErr_Format(PyExc_ValueError, "Dataclass node %R expects %zd meta values and %zd children.",
                 type, PyTuple_GET_SIZE(reg->meta_fields), PyTuple_GET_SIZE(reg->data_fields));
    return false;
}

// ---- attribute nodes

PyObject* AttributeKind::ChildKey(const NodeParts& parts, Py_ssize_t k) {
    return attr::ChildKey(attr::AsNode(parts.custom->attr_node), parts.data, k);
}

PyObject* AttributeKind::Build(const NodeParts& parts, PyObject** children) {
    PyObject* out =
        attr::Build(attr::AsNode(parts.custom->attr_node), parts.data, children, parts.arity);
    DropChildren(children, parts.arity);
    return out;
}

bool AttributeKind::CheckParts(const NodeParts& parts, PyObject*) {
    attr::AttrNode* node = attr::AsNode(parts.custom->attr_node);
    if (!node->names_as_aux && node->mapping == nullptr && node->items_field == nullptr &&
        parts.arity != attr::NumChildren(node)) {
        PyErr_Format(PyExc_ValueError, "attribute node of %R expects %zd children, got %zd.",
                     node->cls, attr::NumChildren(node), parts.arity);
        return false;
    }
    return attr::CheckAux(node, parts.data, parts.arity);
}

// ---- custom

PyObject* CustomKind::Build(const NodeParts& parts, PyObject** children) {
    Ref tuple(StealTuple(children, parts.arity));
    if (!tuple) return nullptr;
    PyObject* args[2] = {parts.data, tuple.get()};
    return PyObject_Vectorcall(parts.custom->unflatten, args, 2, nullptr);
}

// ---- node_data()

PyObject* NodeData(const NodeParts& parts) {
    if (parts.kind == NodeKind::kLeaf || parts.kind == NodeKind::kSharedRef) {
        return Py_NewRef(Py_None);
    }
    Ref type(Type(parts));
    if (!type) return nullptr;
    Ref data(Data(parts));
    if (!data) return nullptr;
    return PyTuple_Pack(2, type.get(), data.get());
}

}  // namespace kinds
}  // namespace fastree
