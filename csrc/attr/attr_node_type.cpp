// fastree._core.AttrNode, the Python type: the flatten / unflatten methods JAX is given,
// check_with, the getters, the GC slots, and the type object (its tp_new: attr/attr_node_new.cpp).
#include "attr/attr_node_internal.h"

#include "attr/attr_mapping.h"

namespace fastree {
namespace attr {
namespace {

PyTypeObject* g_type = nullptr;  // owned by the module (added to it at init); never freed

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

// flatten / flatten_with_keys: (children, aux) or (((key, child), ...), aux).
PyObject* FlattenImpl(AttrNode* node, PyObject* obj, bool with_keys, bool check) {
    if (!CheckInstance(node, obj)) return nullptr;
    Fields f;
    switch (ReadFields(node, obj, /*want_aux=*/true, check, &f)) {
        case Outcome::kError:
            return nullptr;
        case Outcome::kLibrary:
        case Outcome::kLibraryOnce: {
            Ref fn = NodeFunction(node, with_keys ? &AttrNode::library_flatten_with_keys
                                                  : &AttrNode::library_flatten);
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
    if (library && UsesLibrary(node)) {
        Ref fn = NodeFunction(node, &AttrNode::library_unflatten);
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

// ---- the methods, getters and setters, GC slots and repr

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
    // New values in place before the old ones are released (a release can run Python code),
    // swapped in the node's critical section, where every other thread takes its reference to
    // one of them (NodeFunction); the old ones released after it.
    PyObject* old[4];
    FASTREE_BEGIN_CRITICAL_SECTION(self);
    old[0] = node->checker;
    old[1] = node->library_flatten;
    old[2] = node->library_flatten_with_keys;
    old[3] = node->library_unflatten;
    // Relaxed stores: HasFunction and DelegatesIrregular read these outside the section.
    __atomic_store_n(&node->checker, Py_NewRef(checker), __ATOMIC_RELAXED);
    __atomic_store_n(&node->library_flatten, Py_NewRef(flatten), __ATOMIC_RELAXED);
    __atomic_store_n(&node->library_flatten_with_keys, Py_NewRef(flatten_with_keys),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&node->library_unflatten, Py_NewRef(unflatten), __ATOMIC_RELAXED);
    __atomic_store_n(&node->delegate_irregular, delegate != 0, __ATOMIC_RELAXED);
    FASTREE_END_CRITICAL_SECTION();
    SetCounter(node->checks_left, checks < 0 ? 0 : checks);
    SetCounter(node->irregular_checks_left, irregular < 0 ? 0 : irregular);
    SetUseLibrary(node, false);
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
PyObject* GetUseLibrary(PyObject* self, void*) { return PyBool_FromLong(UsesLibrary(Self(self))); }
int SetUseLibrary(PyObject* self, PyObject* value, void*) {
    const int on = value ? PyObject_IsTrue(value) : -1;
    if (on < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "use_library cannot be deleted");
        return -1;
    }
    AttrNode* node = Self(self);
    if (on && !HasFunction(node, &AttrNode::library_unflatten)) {
        PyErr_SetString(PyExc_ValueError, "use_library: no library functions (see check_with)");
        return -1;
    }
    if (on) {
        if (!SwitchToLibrary(node)) return -1;
    } else {
        SetUseLibrary(node, false);
    }
    return 0;
}
PyObject* GetPlainAttributeAccess(PyObject* self, void*) {
    AttrNode* node = Self(self);
    return PyBool_FromLong(
        PlainAttributeAccess(node, reinterpret_cast<PyTypeObject*>(node->cls)));
}
PyObject* GetChecksLeft(PyObject* self, void*) {
    return PyLong_FromLong(Counter(Self(self)->checks_left));
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
    {"plain_attribute_access", GetPlainAttributeAccess, nullptr,
     "Whether the class's instances can be read natively: its attribute lookup is object's (or\n"
     "the __getattribute__ the integration vouched for). Else the library reads each one.",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

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
    Py_VISIT(n->trusted_code);
    Py_VISIT(n->items_field);
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
        Py_VISIT(n->mapping->last_flag_names);
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
    Py_CLEAR(n->trusted_code);
    Py_CLEAR(n->items_field);
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

PyObject* Repr(PyObject* self) {
    AttrNode* n = Self(self);
    return PyUnicode_FromFormat("AttrNode(%.200s, data_fields=%R, meta_fields=%R)",
                                reinterpret_cast<PyTypeObject*>(n->cls)->tp_name, n->data_fields,
                                n->meta_fields);
}

}  // namespace

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
             "rebuild_with=None, trace_classes=None, trace_field=None, items_field=None)\n"
             "--\n\nThe layout of an attribute node (see "
             "fastree.tree_util.register_attribute_node).")},
        {0, nullptr},
    };
    static PyType_Spec spec = {"fastree._core.AttrNode", sizeof(AttrNode), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots};
    if (!InitPlainAttributeAccess()) return nullptr;
    g_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
    return g_type;
}

bool IsNode(PyObject* obj) { return g_type != nullptr && Py_TYPE(obj) == g_type; }

}  // namespace attr
}  // namespace fastree
