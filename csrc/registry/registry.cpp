// Node registry: registrations, JAX fallback discovery and the per-type classification memo.
#include "registry/registry.h"

#include "registry/attr_node.h"

#include "registry/registry_state.h"
#include "util/free_threading.h"
#include "util/pyutils.h"

#include <csignal>
#include <initializer_list>
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

// The registry's part of the module state (registry_state.h). Its lock guards the tables; the
// rule of util/free_threading.h holds throughout: no Python code, no Python allocation and no
// release of a reference while it is held. Whatever is released is moved out into a local that
// outlives the TableLock::Hold.
RegistryState& S() { return state::Registry(); }

constexpr size_t kMaxMemo = 8192;

using MemoTable = RegistryState::MemoTable;

// Empties the memo, under the lock; its entries (their weak references) move to `dropped`, for
// the caller to release after unlocking: releasing may run arbitrary code (a type's finalizer)
// that re-enters here.
void DropMemoLocked(RegistryState& s, MemoTable& dropped) {
    dropped = std::move(s.memo);
    s.memo.clear();
    s.memo_by_weakref.clear();
    ++s.memo_drops;
    ClearMemoSlots();
}

// A new reference to `field`, read under the lock: a replacement swaps it under the lock and
// releases the old one after, so the object read here stays alive while the caller uses it.
Ref Held(const Ref& field) {
    TableLock::Hold hold(S().lock);
    return Ref::FromBorrowed(field.get());
}

// Weakref callback: a memoised type died; forget it (and the per-leaf memo slots that may hold
// it). Run by the GC or a DECREF on any thread.
PyObject* OnTypeDeath(PyObject*, PyObject* weakref) {
    RegistryState& s = S();
    Ref entry_ref;  // the entry's reference to `weakref`, released after the lock
    {
        TableLock::Hold hold(s.lock);
        auto found = s.memo_by_weakref.find(weakref);
        if (found != s.memo_by_weakref.end()) {
            PyTypeObject* dead = found->second;
            s.memo_by_weakref.erase(found);
            ForgetMemoSlot(dead);
            auto entry = s.memo.find(dead);
            if (entry != s.memo.end()) {
                entry_ref = std::move(entry->second.weakref);
                s.memo.erase(entry);
            }
        }
    }
    Py_RETURN_NONE;
}

PyMethodDef kOnTypeDeathDef = {"_forget_type", OnTypeDeath, METH_O, nullptr};

// A weak reference to `t` that erases its memo entry on death; null (no error) if `t` does not
// support weak references (its answer is then not memoised). Allocates: never under the lock.
Ref WatchType(PyTypeObject* t) {
    // Made at module init and never replaced (Init): read without the lock.
    PyObject* callback = S().on_type_death.get();
    if (callback == nullptr) return Ref();
    Ref ref(PyWeakref_NewRef(reinterpret_cast<PyObject*>(t), callback));
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
        // A new reference where CPython has one (3.13+: another thread may replace the class
        // attribute and free what a borrowed lookup gave); before, borrowed and used at once.
#if PY_VERSION_HEX >= 0x030D0000
        Ref fields(_PyType_LookupRef(t, name.get()));
        PyObject* found = fields.get();
#else
        PyObject* found = _PyType_Lookup(t, name.get());
#endif
        if (found != nullptr && Py_TYPE(found)->tp_descr_get == nullptr) return &kNamedTuple;
    }
    return &kTupleSubclass;
}

// Releases the references a record took, for one that was never published. Registration's
// fields are raw owned pointers (registry.h), never released once published: the references
// that fill them, here and below, have no other matching release by design.
void Discard(std::unique_ptr<Registration> rec) {
    if (!rec) return;
    for (PyObject* field : {rec->type, rec->flatten, rec->unflatten, rec->flatten_with_keys,
                            rec->data_fields, rec->meta_fields, rec->attr_node}) {
        Py_XDECREF(field);
    }
}

// A record of `kind` for `type`, not yet published: the caller fills the rest, then publishes it.
std::unique_ptr<Registration> NewRecord(PyObject* type, NodeKind kind) {
    auto rec = std::make_unique<Registration>();
    rec->kind = kind;
    rec->type = Py_NewRef(type);
    return rec;
}

// Publishes a filled record under the held lock: in `all` and as its type's registration,
// superseding what is there (a type adopted from JAX earlier, or registered before: the old
// record stays alive in `all`); drops the memo into `dropped`.
const Registration* PublishLocked(RegistryState& s, std::unique_ptr<Registration>& rec,
                                  MemoTable& dropped) {
    Registration* out = rec.get();
    s.all.push_back(std::move(rec));
    s.registered[reinterpret_cast<PyTypeObject*>(out->type)] = out;
    DropMemoLocked(s, dropped);
    return out;
}

// Publishes a registration made through fastree (the caller filled every field).
void Publish(std::unique_ptr<Registration> rec) {
    RegistryState& s = S();
    MemoTable dropped;  // released after the lock
    TableLock::Hold hold(s.lock);
    PublishLocked(s, rec, dropped);
}

// A new permanent record for a type adopted from JAX with these callbacks, filled before it is
// published. Adopting runs unlocked after Python code (JAX's registry lookup, the adopter), so
// the insert re-checks: a registration of `t` made meanwhile, on any thread, stays, and so does
// another thread's adoption of it; this record is then discarded.
const Registration* AddAdopted(PyTypeObject* t, PyObject* flatten, PyObject* unflatten) {
    std::unique_ptr<Registration> rec =
        NewRecord(reinterpret_cast<PyObject*>(t), NodeKind::kCustom);
    rec->flatten = Py_NewRef(flatten);
    rec->unflatten = Py_NewRef(unflatten);
    rec->from_jax = true;
    RegistryState& s = S();
    const Registration* out;
    {
        TableLock::Hold hold(s.lock);
        auto it = s.registered.find(t);
        if (it != s.registered.end()) {
            out = it->second;
        } else {
            out = rec.get();
            s.all.push_back(std::move(rec));
            s.registered.emplace(t, out);
        }
    }
    Discard(std::move(rec));  // a record that lost, after unlocking (null if published)
    return out;
}

// The registration of `t` if it has one (registered here, or adopted).
const Registration* Registered(PyTypeObject* t) {
    RegistryState& s = S();
    TableLock::Hold hold(s.lock);
    auto it = s.registered.find(t);
    return it != s.registered.end() ? it->second : nullptr;
}

// Classifying cannot fail (Classify has no error return), so an exception raised by the Python
// code an adoption calls is not propagated from here. A KeyboardInterrupt is not lost: the
// signal is raised again, and Python raises it at its next check (when the walk returns, or runs
// a callback). Anything else is reported through sys.unraisablehook, naming the hook that
// raised, and the type is read as if the hook had declined it.
void SetAsideAdoptionError(PyObject* hook) {
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        PyErr_Clear();
        PyErr_SetInterruptEx(SIGINT);
        return;
    }
    PyErr_WriteUnraisable(hook);
}

// Offers `t`, found in JAX's Python-side registry with these callbacks, to the library
// integrations: a class that equinox, chex or flax registered with JAX while fastree was not
// installed (flax's Variables, say) is then read natively by fastree's own functions too, as
// `fastree.integrations.accelerate()` would make it. The hook registers the attribute node
// itself; its registration, or null if it declined. Asked once per type (the adoption is
// memoised).
const Registration* AdoptThroughIntegrations(PyTypeObject* t, PyObject* flatten,
                                             PyObject* unflatten) {
    Ref adopter = Held(S().library_adopter);  // may be replaced while it runs
    if (!adopter) return nullptr;
    PyObject* args[3] = {reinterpret_cast<PyObject*>(t), flatten, unflatten};
    Ref answer(PyObject_Vectorcall(adopter.get(), args, 3, nullptr));
    if (!answer) {
        SetAsideAdoptionError(adopter.get());
        return nullptr;
    }
    return answer.get() == Py_True ? Registered(t) : nullptr;
}

// A type JAX knows through its Python-side registry: adopt its callbacks as a custom node.
const Registration* AdoptFromJax(PyTypeObject* t) {
    // The lookup can run Python code (a metaclass's __hash__ or __eq__), which could replace the
    // registry: both the dict and the entry found in it are held while they are used, and the
    // entry is taken inside the dict's own lock (DictGetItemRef): JAX's dict can change on
    // another thread at any time.
    Ref registry = Held(S().jax_registry);
    if (!registry) return nullptr;
    PyObject* found = nullptr;
    if (DictGetItemRef(registry.get(), reinterpret_cast<PyObject*>(t), &found) <= 0) {
        PyErr_Clear();
        return nullptr;
    }
    Ref entry(found);
    // _RegistryEntry(to_iter, from_iter) is a namedtuple. Its items are borrowed while `entry`
    // is held: a tuple's items never change.
    if (!PyTuple_Check(entry.get()) || PyTuple_GET_SIZE(entry.get()) < 2) return nullptr;
    PyObject* flatten = PyTuple_GET_ITEM(entry.get(), 0);
    PyObject* unflatten = PyTuple_GET_ITEM(entry.get(), 1);
    if (const Registration* r = AdoptThroughIntegrations(t, flatten, unflatten)) return r;
    return AddAdopted(t, flatten, unflatten);
}

// A type registered only in jaxlib's C++ registry (default_registry.register_node or
// register_dataclass_node, which leave JAX's Python-side dict alone): the adopter the Python
// layer installs answers (flatten, unflatten) built on jaxlib's own functions, or None.
const Registration* AdoptFromJaxlib(PyTypeObject* t) {
    Ref adopter = Held(S().jaxlib_adopter);  // may be replaced while it runs
    if (!adopter) return nullptr;
    Ref answer(PyObject_CallOneArg(adopter.get(), reinterpret_cast<PyObject*>(t)));
    if (!answer && PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        SetAsideAdoptionError(adopter.get());  // raised again, not lost
        return nullptr;
    }
    if (!answer || !PyTuple_Check(answer.get()) || PyTuple_GET_SIZE(answer.get()) != 2) {
        PyErr_Clear();  // classifying cannot fail: the type stays a leaf, as before
        return nullptr;
    }
    return AddAdopted(t, PyTuple_GET_ITEM(answer.get(), 0), PyTuple_GET_ITEM(answer.get(), 1));
}

// Whether the installed JAX warns about leaves of type `t` (a subclass of a type it names, as
// jaxlib checks). PyType_IsSubtype reads the MRO tuple only: no Python code runs.
bool IsWarnedIterable(PyTypeObject* t) {
    Ref types = Held(S().iterable_leaf_types);  // a re-install may replace it meanwhile
    if (!types) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types.get()); ++i) {
        auto* warned = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(types.get(), i));
        if (PyType_IsSubtype(t, warned)) return true;
    }
    return false;
}

// The answer for `t`, looked up without the memo. Takes the lock only for its table reads and
// inserts: its Python calls run unlocked.
const Registration* Resolve(PyTypeObject* t) {
    if (const Registration* r = Registered(t)) return r;
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
    const Py_ssize_t jax_size = JaxRegistrySize();
    MemoTable dropped;  // released after the lock (declared before every Hold below)
    uint64_t generation;
    uint64_t drops;
    const Registration* reg = nullptr;
    {
        TableLock::Hold hold(s.lock);
        if (s.memo_jax_size != jax_size || s.memo.size() > kMaxMemo) {
            DropMemoLocked(s, dropped);
            s.memo_jax_size = jax_size;
        }
        // Read before the answer (registry.h, Memo): a drop while Resolve runs outdates the slot.
        generation = MemoGeneration();
        drops = s.memo_drops;
        auto it = s.memo.find(t);
        if (it != s.memo.end()) reg = it->second.reg;
    }
    if (reg != nullptr) {
        StoreMemo(NewMemo(t, reg, jax_size, generation));
        return reg;
    }
    // Resolve can run Python code (JAX's registry lookup, the jaxlib adopter), which may
    // reassign the object's __class__ and so drop the last reference to `t`: held until the memo
    // is written, released last. (If `t` then dies, its weakref callback forgets it again.)
    Ref keep_type = Ref::FromBorrowed(reinterpret_cast<PyObject*>(t));
    reg = Resolve(t);
    Ref weakref = WatchType(t);
    if (!weakref) {
        // Not weakly referenceable: answer without memoising (rare; e.g. exotic metaclasses).
        ForgetMemo(t);  // (a previous type of the same address may be there)
        return reg;
    }
    bool memoised = false;
    {
        TableLock::Hold hold(s.lock);
        // A drop while Resolve ran (a registration on any thread, or in its Python code) may
        // have changed the answer: memoise nothing, the next classification asks again. Else
        // the Python code above, or another thread, may have memoised `t` meanwhile: the entry
        // already there stays, with its own weak reference, and ours is released after the lock.
        if (s.memo_drops == drops) {
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
            reg = pos->second.reg;
            memoised = true;
        }
    }
    if (memoised) StoreMemo(NewMemo(t, reg, jax_size, generation));
    return reg;
}

namespace {
// A custom node's record, not yet published (flatten or flatten_with_keys may be null).
std::unique_ptr<Registration> NewCustomRecord(PyObject* type, PyObject* flatten,
                                              PyObject* unflatten, PyObject* flatten_with_keys,
                                              bool preserve_identity) {
    std::unique_ptr<Registration> rec = NewRecord(type, NodeKind::kCustom);
    rec->flatten = Py_XNewRef(flatten);
    rec->unflatten = Py_NewRef(unflatten);
    rec->flatten_with_keys = Py_XNewRef(flatten_with_keys);
    rec->preserve_identity = preserve_identity;
    return rec;
}
}  // namespace

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
    Publish(NewCustomRecord(type, flatten, unflatten, flatten_with_keys, preserve_identity));
    return true;
}

bool RegisterDataclass(PyObject* type, PyObject* data_fields, PyObject* meta_fields,
                       bool preserve_identity) {
    if (!PyType_Check(type) || !PyTuple_Check(data_fields) || !PyTuple_Check(meta_fields)) {
        PyErr_SetString(PyExc_TypeError,
                        "register_dataclass_node expects (type, tuple[str], tuple[str]).");
        return false;
    }
    std::unique_ptr<Registration> reg = NewRecord(type, NodeKind::kDataclass);
    reg->data_fields = Py_NewRef(data_fields);
    reg->meta_fields = Py_NewRef(meta_fields);
    reg->preserve_identity = preserve_identity;
    Publish(std::move(reg));
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
    std::unique_ptr<Registration> reg = NewRecord(attr::AsNode(node)->cls, NodeKind::kAttribute);
    reg->attr_node = Py_NewRef(node);
    reg->flatten = flatten.release();
    reg->unflatten = unflatten.release();
    reg->flatten_with_keys = flatten_with_keys.release();
    reg->preserve_identity = preserve_identity;
    Publish(std::move(reg));
    return true;
}

bool DelegateAttribute(PyObject* node) {
    attr::AttrNode* n = attr::AsNode(node);
    // A published record is immutable: read after the lookup, without the lock.
    const Registration* current = Registered(reinterpret_cast<PyTypeObject*>(n->cls));
    if (current == nullptr || current->attr_node != node) return true;
    // Held, not borrowed: registering allocates, and another thread's check_with may replace
    // (and release) the node's functions meanwhile.
    const Ref flatten = attr::NodeFunction(n, &attr::AttrNode::library_flatten);
    const Ref unflatten = attr::NodeFunction(n, &attr::AttrNode::library_unflatten);
    const Ref flatten_with_keys = attr::NodeFunction(n, &attr::AttrNode::library_flatten_with_keys);
    if (!flatten || !unflatten || !flatten_with_keys) {  // cleared (the node's tp_clear)
        PyErr_SetString(PyExc_RuntimeError,
                        "fastree: an attribute node's library functions are gone");
        return false;
    }
    std::unique_ptr<Registration> rec =
        NewCustomRecord(n->cls, flatten.get(), unflatten.get(), flatten_with_keys.get(),
                        current->preserve_identity);
    // Published only if the node is still its class's registration: threads whose checks fail
    // together switch the class once, so every treedef made after the switch holds one record.
    RegistryState& s = S();
    {
        MemoTable dropped;  // released after the lock
        TableLock::Hold hold(s.lock);
        auto it = s.registered.find(reinterpret_cast<PyTypeObject*>(n->cls));
        if (it != s.registered.end() && it->second == current) PublishLocked(s, rec, dropped);
    }
    Discard(std::move(rec));  // null if published
    return true;
}

bool Init() {
    RegistryState& s = S();
    if (s.on_type_death) return true;
    s.on_type_death = Ref(PyCFunction_New(&kOnTypeDeathDef, nullptr));
    return static_cast<bool>(s.on_type_death);
}

void KeepForProcess(Ref old) {
#ifdef Py_GIL_DISABLED
    if (!old) return;
    RegistryState& s = S();
    TableLock::Hold hold(s.lock);
    s.retired.push_back(old.get());  // may throw (std::bad_alloc): `old` still owns it then
    old.release();
#else
    (void)old;  // released here
#endif
}

bool InstallJax(PyObject* jax_registry_dict, PyObject* jax_flatten_one_level,
                PyObject* jax_flatten_one_level_with_keys) {
    if (!PyDict_Check(jax_registry_dict)) {
        PyErr_SetString(PyExc_TypeError, "JAX's registry must be a dict.");
        return false;
    }
    // OrderedDict and defaultdict are "custom" nodes to JAX; fastree flattens them natively.
    // Their records are made (Python calls) before the lock.
    Ref collections(PyImport_ImportModule("collections"));
    if (!collections) return false;
    Ref od(PyObject_GetAttrString(collections.get(), "OrderedDict"));
    if (!od) return false;
    Ref dd(PyObject_GetAttrString(collections.get(), "defaultdict"));
    if (!dd) return false;
    std::unique_ptr<Registration> od_reg = NewRecord(od.get(), NodeKind::kOrderedDict);
    std::unique_ptr<Registration> dd_reg = NewRecord(dd.get(), NodeKind::kDefaultDict);
    // Either may be None: jaxlib before 0.6 has no flatten_one_level_with_keys.
    Ref with_keys = OptionalRef(jax_flatten_one_level_with_keys);
    Ref one_level = OptionalRef(jax_flatten_one_level);
    RegistryState& s = S();
    // The replaced values are released after the lock, once the new ones are in place:
    // releasing runs finalizers (the old dict's entries), which may flatten and so read
    // g_jax_registry. On free-threaded builds they are kept for the process instead: walks on
    // other threads read them borrowed, through the mirrors.
    Ref old_registry, old_with_keys, old_one_level;
    MemoTable dropped, dropped_too;
    {
        TableLock::Hold hold(s.lock);
#ifdef Py_GIL_DISABLED
        s.retired.reserve(s.retired.size() + 3);  // the pushes below cannot throw
#endif
        old_registry = s.SetJaxRegistry(Ref::FromBorrowed(jax_registry_dict));
        old_with_keys = std::move(s.jax_flatten_with_keys);
        old_one_level = std::move(s.jax_flatten_one_level);
        s.jax_flatten_with_keys = std::move(with_keys);
        s.jax_flatten_one_level = std::move(one_level);
        s.jax_flatten_with_keys_now.store(s.jax_flatten_with_keys.get(),
                                          std::memory_order_release);
        s.jax_flatten_one_level_now.store(s.jax_flatten_one_level.get(),
                                          std::memory_order_release);
#ifdef Py_GIL_DISABLED
        // (One installed again, as the bridge's install does, stays alive as the current one.)
        const PyObject* now[] = {s.jax_registry.get(), s.jax_flatten_with_keys.get(),
                                 s.jax_flatten_one_level.get()};
        Ref* olds[] = {&old_registry, &old_with_keys, &old_one_level};
        for (int i = 0; i < 3; ++i) {
            if (*olds[i] && olds[i]->get() != now[i]) s.retired.push_back(olds[i]->release());
        }
#endif
        PublishLocked(s, od_reg, dropped);
        PublishLocked(s, dd_reg, dropped_too);
    }
    return true;
}

namespace {

// Installs `adopter` (null or None: none) as the registry's hook `field`, and drops the memo: a
// type classified without it may now be answered otherwise.
void InstallAdopter(Ref RegistryState::*field, PyObject* adopter) {
    RegistryState& s = S();
    Ref replaced = OptionalRef(adopter);  // the old one after the swap, released after the lock
    MemoTable dropped;
    TableLock::Hold hold(s.lock);
    std::swap(s.*field, replaced);
    DropMemoLocked(s, dropped);
}

}  // namespace

void InstallLibraryAdopter(PyObject* adopter) {
    InstallAdopter(&RegistryState::library_adopter, adopter);
}

void InstallJaxlibAdopter(PyObject* adopter) {
    InstallAdopter(&RegistryState::jaxlib_adopter, adopter);
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
    // Swapped: the old values are released after the new ones are in place, the memo dropped
    // and the lock released (these locals die after the Hold).
    Ref old_types = OptionalRef(types);
    Ref old_warn = OptionalRef(warn);
    MemoTable dropped;
    TableLock::Hold hold(s.lock);
    std::swap(s.iterable_leaf_types, old_types);
    std::swap(s.iterable_leaf_warn, old_warn);
    DropMemoLocked(s, dropped);
    return true;
}

bool WarnIterableLeaf(PyObject* leaf) {
    // Held for the call: warn() runs Python code, which may install another.
    Ref warn = Held(S().iterable_leaf_warn);
    if (!warn) return true;
    Ref done(PyObject_CallOneArg(warn.get(), leaf));
    return static_cast<bool>(done);
}

PyObject* JaxFlattenWithKeys() {
    return S().jax_flatten_with_keys_now.load(std::memory_order_acquire);
}
PyObject* JaxFlattenOneLevel() {
    return S().jax_flatten_one_level_now.load(std::memory_order_acquire);
}

}  // namespace registry
}  // namespace fastree
