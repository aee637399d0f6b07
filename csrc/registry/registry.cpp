// Node registry: registrations, JAX fallback discovery and the per-type classification memo.
#include "registry/registry.h"

#include "registry/attr_node.h"

#include "registry/registry_state.h"
#include "util/pyutils.h"

#include <memory>
#include <utility>

namespace fastree {
namespace registry {

const Registration kLeaf{NodeKind::kLeaf};
const Registration kNone{NodeKind::kNone};
const Registration kTuple{NodeKind::kTuple};
const Registration kList{NodeKind::kList};
const Registration kDict{NodeKind::kDict};
const Registration kNamedTuple{NodeKind::kNamedTuple};
const Registration kTupleSubclass{NodeKind::kLeaf};
const Registration kIterableLeaf{NodeKind::kLeaf};

namespace {

// The registry's part of the module state (registry_state.h).
RegistryState& S() { return state::Registry(); }

constexpr size_t kMaxMemo = 8192;

void DropMemo() {
    RegistryState& s = S();
    // Moved out first, released when `old` dies: releasing may run arbitrary code (a type's
    // finalizer) that re-enters here.
    auto old = std::move(s.memo);
    s.memo.clear();
    s.memo_by_weakref.clear();
    ClearMemoSlots();
}

// Weakref callback: a memoised type died; forget it (and the one-entry memo if it was there).
PyObject* OnTypeDeath(PyObject*, PyObject* weakref) {
    RegistryState& s = S();
    auto found = s.memo_by_weakref.find(weakref);
    if (found != s.memo_by_weakref.end()) {
        PyTypeObject* dead = found->second;
        s.memo_by_weakref.erase(found);
        ForgetMemoSlot(dead);
        // The entry's reference to `weakref` is released after the entry is gone.
        Ref entry_ref;
        auto entry = s.memo.find(dead);
        if (entry != s.memo.end()) {
            entry_ref = std::move(entry->second.weakref);
            s.memo.erase(entry);
        }
    }
    Py_RETURN_NONE;
}

PyMethodDef kOnTypeDeathDef = {"_forget_type", OnTypeDeath, METH_O, nullptr};

// A weak reference to `t` that erases its memo entry on death; null (no error) if `t` does not
// support weak references (its answer is then not memoised).
Ref WatchType(PyTypeObject* t) {
    RegistryState& s = S();
    if (!s.on_type_death) {
        s.on_type_death = Ref(PyCFunction_New(&kOnTypeDeathDef, nullptr));
        if (!s.on_type_death) {
            PyErr_Clear();
            return Ref();
        }
    }
    Ref ref(PyWeakref_NewRef(reinterpret_cast<PyObject*>(t), s.on_type_death.get()));
    if (!ref) PyErr_Clear();
    return ref;
}

// For a tuple subclass: &kNamedTuple if every instance has `_fields` (the class has a plain,
// non-descriptor `_fields` and the default attribute lookup, as collections.namedtuple and
// typing.NamedTuple classes do), else &kTupleSubclass (decided per object). Null otherwise.
const Registration* NamedTupleKind(PyTypeObject* t) {
    if (!PyType_IsSubtype(t, &PyTuple_Type)) return nullptr;
    if (t->tp_getattro == PyObject_GenericGetAttr) {
        Ref name(PyUnicode_FromString("_fields"));
        if (!name) {
            PyErr_Clear();
            return &kTupleSubclass;
        }
        PyObject* fields = _PyType_Lookup(t, name.get());  // borrowed, used at once
        if (fields != nullptr && Py_TYPE(fields)->tp_descr_get == nullptr) return &kNamedTuple;
    }
    return &kTupleSubclass;
}

// A new permanent record for a type adopted from JAX with these callbacks. The record is owned by
// `all` before it takes its references, so a C++ exception (std::bad_alloc) leaks nothing.
// Registration's fields are raw owned pointers (registry.h), never released: the references
// that fill them, here and below, have no matching release by design.
const Registration* AddAdopted(PyTypeObject* t, PyObject* flatten, PyObject* unflatten) {
    RegistryState& s = S();
    s.all.push_back(std::make_unique<Registration>());
    Registration* reg = s.all.back().get();
    reg->kind = NodeKind::kCustom;
    reg->type = Py_NewRef(reinterpret_cast<PyObject*>(t));
    reg->flatten = Py_NewRef(flatten);
    reg->unflatten = Py_NewRef(unflatten);
    reg->from_jax = true;
    s.registered[t] = reg;
    return reg;
}

// A type JAX knows through its Python-side registry: adopt its callbacks as a custom node.
const Registration* AdoptFromJax(PyTypeObject* t) {
    RegistryState& s = S();
    if (!s.jax_registry) return nullptr;
    // The lookup can run Python code (a metaclass's __hash__ or __eq__), which could replace the
    // registry: both the dict and the entry found in it are held while they are used.
    Ref registry = Ref::FromBorrowed(s.jax_registry.get());
    PyObject* found = PyDict_GetItemWithError(registry.get(), reinterpret_cast<PyObject*>(t));
    if (found == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    Ref entry = Ref::FromBorrowed(found);
    // _RegistryEntry(to_iter, from_iter) is a namedtuple.
    if (!PyTuple_Check(entry.get()) || PyTuple_GET_SIZE(entry.get()) < 2) return nullptr;
    return AddAdopted(t, PyTuple_GET_ITEM(entry.get(), 0), PyTuple_GET_ITEM(entry.get(), 1));
}

// A type registered only in jaxlib's C++ registry (default_registry.register_node or
// register_dataclass_node, which leave JAX's Python-side dict alone): the adopter the Python
// layer installs answers (flatten, unflatten) built on jaxlib's own functions, or None.
const Registration* AdoptFromJaxlib(PyTypeObject* t) {
    RegistryState& s = S();
    if (!s.jaxlib_adopter) return nullptr;
    Ref adopter = Ref::FromBorrowed(s.jaxlib_adopter.get());  // may be replaced while it runs
    Ref answer(PyObject_CallOneArg(adopter.get(), reinterpret_cast<PyObject*>(t)));
    if (!answer || !PyTuple_Check(answer.get()) || PyTuple_GET_SIZE(answer.get()) != 2) {
        PyErr_Clear();  // classifying cannot fail: the type stays a leaf, as before
        return nullptr;
    }
    return AddAdopted(t, PyTuple_GET_ITEM(answer.get(), 0), PyTuple_GET_ITEM(answer.get(), 1));
}

// Whether the installed JAX warns about leaves of type `t` (a subclass of a type it names, as
// jaxlib checks). PyType_IsSubtype reads the MRO tuple only: no Python code runs.
bool IsWarnedIterable(PyTypeObject* t) {
    PyObject* types = S().iterable_leaf_types.get();
    if (types == nullptr) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); ++i) {
        if (PyType_IsSubtype(t, reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(types, i)))) {
            return true;
        }
    }
    return false;
}

const Registration* Resolve(PyTypeObject* t) {
    RegistryState& s = S();
    auto it = s.registered.find(t);
    if (it != s.registered.end()) return it->second;
    // Builtins are also in JAX's `_registry` (as Python lambdas); never adopt those.
    if (t != &PyTuple_Type && t != &PyList_Type && t != &PyDict_Type && t != Py_TYPE(Py_None)) {
        if (const Registration* r = AdoptFromJax(t)) return r;
    }
    // jaxlib counts namedtuple classes as nodes too: decide those first.
    const Registration* tuple_kind = NamedTupleKind(t);
    if (tuple_kind == &kNamedTuple) return tuple_kind;
    if (const Registration* r = AdoptFromJaxlib(t)) return r;
    if (tuple_kind != nullptr) return tuple_kind;
    return IsWarnedIterable(t) ? &kIterableLeaf : &kLeaf;
}

}  // namespace

const Registration* ClassifyTupleSubclass(PyObject* obj) {
    // JAX's test, per object: hasattr(obj, "_fields"). Any exception from the lookup means "no
    // such attribute", as in jaxlib (whose hasattr swallows them all): classifying cannot fail.
    Ref fields(PyObject_GetAttrString(obj, "_fields"));
    if (!fields) {
        PyErr_Clear();
        return &kLeaf;
    }
    return &kNamedTuple;
}

const Registration* ClassifySlow(PyTypeObject* t) {
    RegistryState& s = S();
    // JAX only ever adds to its registry (it has no unregister), so a change in the registry's
    // size is exactly "a type may have become a node".
    Py_ssize_t jax_size = JaxRegistrySize();
    if (s.memo_jax_size != jax_size || s.memo.size() > kMaxMemo) {
        DropMemo();
        s.memo_jax_size = jax_size;
    }
    // Read before the answer (registry.h, Memo): a drop while Resolve runs outdates the slot.
    const uint64_t generation = MemoGeneration();
    const Registration* reg;
    // Released last, after the memo is written (see below).
    Ref keep_type;
    auto it = s.memo.find(t);
    if (it != s.memo.end()) {
        reg = it->second.reg;
    } else {
        // Resolve can run Python code (JAX's registry lookup, the jaxlib adopter), which may
        // reassign the object's __class__ and so drop the last reference to `t`: held until
        // the memo is written. (If `t` then dies, its weakref callback forgets it again.)
        keep_type = Ref::FromBorrowed(reinterpret_cast<PyObject*>(t));
        reg = Resolve(t);
        Ref weakref = WatchType(t);
        if (!weakref) {
            // Not weakly referenceable: answer without memoising (rare; e.g. exotic metaclasses).
            MemoSlot(t) = Memo{};  // (a previous type of the same address may be there)
            return reg;
        }
        // The Python code above may have memoised `t` itself (re-entrant classification): the
        // entry already there stays, with its own weak reference, and ours is dropped.
        auto [pos, inserted] = s.memo.emplace(t, RegistryState::MemoEntry{reg, Ref()});
        if (inserted) {
            try {
                s.memo_by_weakref.emplace(weakref.get(), t);
            } catch (...) {
                s.memo.erase(pos);  // no entry without its death callback (a stale answer)
                throw;
            }
            pos->second.weakref = std::move(weakref);
        }
    }
    MemoSlot(t) = NewMemo(t, reg, jax_size, generation);
    return reg;
}

static Registration* NewRegistration(PyObject* type, NodeKind kind) {
    RegistryState& s = S();
    // Owned by `all` before it takes a reference: a C++ exception leaks nothing.
    s.all.push_back(std::make_unique<Registration>());
    Registration* out = s.all.back().get();
    out->kind = kind;
    out->type = Py_NewRef(type);
    // A type adopted from JAX earlier is superseded; the old record stays alive in `all`.
    s.registered[reinterpret_cast<PyTypeObject*>(type)] = out;
    DropMemo();
    return out;
}

bool RegisterCustom(PyObject* type, PyObject* flatten, PyObject* unflatten,
                    PyObject* flatten_with_keys, bool preserve_identity) {
    if (!PyType_Check(type)) {
        PyErr_Format(PyExc_TypeError, "Expected a type to register, got %R.", type);
        return false;
    }
    if (flatten == Py_None) flatten = nullptr;
    if (flatten_with_keys == Py_None) flatten_with_keys = nullptr;
    if (flatten == nullptr && flatten_with_keys == nullptr) {
        PyErr_SetString(PyExc_TypeError, "A flatten function is required.");
        return false;
    }
    Registration* reg = NewRegistration(type, NodeKind::kCustom);
    reg->flatten = Py_XNewRef(flatten);
    reg->unflatten = Py_NewRef(unflatten);
    reg->flatten_with_keys = Py_XNewRef(flatten_with_keys);
    reg->preserve_identity = preserve_identity;
    return true;
}

bool RegisterDataclass(PyObject* type, PyObject* data_fields, PyObject* meta_fields,
                       bool preserve_identity) {
    if (!PyType_Check(type) || !PyTuple_Check(data_fields) || !PyTuple_Check(meta_fields)) {
        PyErr_SetString(PyExc_TypeError,
                        "register_dataclass_node expects (type, tuple[str], tuple[str]).");
        return false;
    }
    Registration* reg = NewRegistration(type, NodeKind::kDataclass);
    reg->data_fields = Py_NewRef(data_fields);
    reg->meta_fields = Py_NewRef(meta_fields);
    reg->preserve_identity = preserve_identity;
    return true;
}

bool RegisterAttribute(PyObject* node, bool preserve_identity) {
    if (!attr::IsNode(node)) {
        PyErr_Format(PyExc_TypeError, "register_attribute_node expects an AttrNode, got %R.", node);
        return false;
    }
    Ref flatten(PyObject_GetAttrString(node, "flatten"));
    Ref unflatten(flatten ? PyObject_GetAttrString(node, "unflatten") : nullptr);
    Ref flatten_with_keys(unflatten ? PyObject_GetAttrString(node, "flatten_with_keys") : nullptr);
    if (!flatten_with_keys) return false;
    Registration* reg = NewRegistration(attr::AsNode(node)->cls, NodeKind::kAttribute);
    reg->attr_node = Py_NewRef(node);
    reg->flatten = flatten.release();
    reg->unflatten = unflatten.release();
    reg->flatten_with_keys = flatten_with_keys.release();
    reg->preserve_identity = preserve_identity;
    return true;
}

bool DelegateAttribute(PyObject* node) {
    attr::AttrNode* n = attr::AsNode(node);
    auto it = S().registered.find(reinterpret_cast<PyTypeObject*>(n->cls));
    if (it == S().registered.end() || it->second->attr_node != node) return true;
    return RegisterCustom(n->cls, n->library_flatten, n->library_unflatten,
                          n->library_flatten_with_keys, it->second->preserve_identity);
}

bool InstallJax(PyObject* jax_registry_dict, PyObject* jax_flatten_one_level,
                PyObject* jax_flatten_one_level_with_keys) {
    if (!PyDict_Check(jax_registry_dict)) {
        PyErr_SetString(PyExc_TypeError, "JAX's registry must be a dict.");
        return false;
    }
    RegistryState& s = S();
    // The new values are in place before the old ones are released (at the end): releasing runs
    // finalizers (the old dict's entries), which may flatten and so read g_jax_registry.
    Ref old_registry = s.SetJaxRegistry(Ref::FromBorrowed(jax_registry_dict));
    // Either may be None: jaxlib before 0.6 has no flatten_one_level_with_keys.
    s.jax_flatten_with_keys = OptionalRef(jax_flatten_one_level_with_keys);
    s.jax_flatten_one_level = OptionalRef(jax_flatten_one_level);
    // OrderedDict and defaultdict are "custom" nodes to JAX; fastree flattens them natively.
    Ref collections(PyImport_ImportModule("collections"));
    if (!collections) return false;
    Ref od(PyObject_GetAttrString(collections.get(), "OrderedDict"));
    if (!od) return false;
    Ref dd(PyObject_GetAttrString(collections.get(), "defaultdict"));
    if (!dd) return false;
    NewRegistration(od.get(), NodeKind::kOrderedDict);
    NewRegistration(dd.get(), NodeKind::kDefaultDict);
    DropMemo();
    return true;
}

void InstallJaxlibAdopter(PyObject* adopter) {
    S().jaxlib_adopter = OptionalRef(adopter);
    DropMemo();
}

bool InstallIterableLeafWarning(PyObject* types, PyObject* warn) {
    if (types != Py_None) {
        bool ok = PyTuple_Check(types);
        for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(types); ++i) {
            ok = PyType_Check(PyTuple_GET_ITEM(types, i));
        }
        if (!ok) {
            PyErr_SetString(PyExc_TypeError, "fastree: iterable leaf types must be a tuple of types");
            return false;
        }
    }
    RegistryState& s = S();
    // The old values are released after the new ones are in place and the memo is dropped.
    Ref old_types = std::move(s.iterable_leaf_types);
    Ref old_warn = std::move(s.iterable_leaf_warn);
    s.iterable_leaf_types = OptionalRef(types);
    s.iterable_leaf_warn = OptionalRef(warn);
    DropMemo();
    return true;
}

bool WarnIterableLeaf(PyObject* leaf) {
    // Held for the call: warn() runs Python code, which may install another.
    Ref warn = Ref::FromBorrowed(S().iterable_leaf_warn.get());
    if (!warn) return true;
    Ref done(PyObject_CallOneArg(warn.get(), leaf));
    return static_cast<bool>(done);
}

PyObject* JaxFlattenWithKeys() { return S().jax_flatten_with_keys.get(); }
PyObject* JaxFlattenOneLevel() { return S().jax_flatten_one_level.get(); }

}  // namespace registry
}  // namespace fastree
