// tree_map(f, tree) without is_leaf or other trees: one recursive walk that calls f at each leaf
// and rebuilds each node as soon as its children are mapped.
//
// Why a second tree_map: the general one (map.cpp) flattens into a treedef, calls f, then replays
// the treedef. On parameter trees of 10^4 leaves the treedef's bookkeeping (node and key vectors,
// the replay's value stack) and the second walk over nodes that have left the cache were ~10% of
// tree_map (transformer-1000: 1.40 -> 1.26 ms). Here a dict is rebuilt while it is still hot.
//
// Every common kind has a direct path here (dict, list, tuple, None, namedtuple, OrderedDict,
// defaultdict, register_dataclass, custom nodes with a flatten function) that reads and rebuilds
// a node by flatten's and unflatten's rules, with their shared pieces: custom_output.h's checks
// and texts, aux::Check, BuildDataclass. Anything else goes through FlattenOneLevel and BuildNode,
// the very code flatten and unflatten use, at the price of a throw-away treedef per node.
//
// What differs from JAX's flatten-everything-first order, and what is kept the same:
//  - f may run on a leaf before the flatten functions of nodes after it. Only side effects shared
//    between f and flatten functions can tell; results never depend on it.
//  - Exceptions are JAX's: a flatten error beats an f error there, since flattening finishes
//    before f first runs. So once f raises, the walk goes on without calling f or rebuilding
//    anything (no unflatten function sees a half-mapped subtree), and a flatten error met later
//    replaces f's.
//  - A container is read when the walk reaches it, so an f that mutates parts of the input it
//    has not reached yet is seen doing so (JAX would have read them before). Never unsafe: every
//    child is held by a reference while it is mapped.
//  - f and rebuild functions (unflatten functions, namedtuple constructors) run inside the walk,
//    where JAX runs them from the top. Up to Python 3.11 their frames count against the same
//    recursion limit, so a tree nested to within a level or two of sys.getrecursionlimit() can
//    raise RecursionError here where JAX's tree_map would not.
//  - Identity-preserving nodes: each object is mapped once, at its first occurrence, and every
//    later occurrence gets that output, as the treedef's shared references do on the general path.
#include <memory>
#include <vector>

#include "aux_check.h"
#include "custom_output.h"
#include "dict_items.h"
#include "pointer_map.h"
#include "node_kinds.h"
#include "pyutils.h"
#include "scratch.h"
#include "treedef.h"
#include "walkers.h"

namespace fastree {
namespace {

class SinglePassMapper {
 public:
    SinglePassMapper(PyObject* f, PyObject* root) : f_(f), root_(root) {}

    ~SinglePassMapper() {
        Py_XDECREF(f_error_type_);
        Py_XDECREF(f_error_value_);
        Py_XDECREF(f_error_tb_);
        // The identity map owns each object it holds and the output built for it.
        if (identity_) {
            identity_->ForEach([](PyObject* obj, Py_ssize_t) { Py_DECREF(obj); });
        }
        DecrefAll(identity_outputs_);
    }

    PyObject* Run() {
        PyObject* out = Visit(root_);
        if (out == nullptr) return nullptr;  // a flatten error: it wins over f's, if any
        if (f_error_type_ != nullptr) {
            Py_DECREF(out);  // placeholders only
            PyErr_Restore(f_error_type_, f_error_value_, f_error_tb_);
            f_error_type_ = f_error_value_ = f_error_tb_ = nullptr;
            return nullptr;
        }
        return out;
    }

 private:
    // A new reference to the mapped `obj`, or null with a flatten error set. Once f has failed
    // (failed()), the result is a placeholder: the walk only looks for flatten errors.
    [[gnu::always_inline]] PyObject* Visit(PyObject* obj) {
        const Registration* reg = registry::Classify(obj);
        if (reg->kind == NodeKind::kLeaf) return CallF(obj);
        return VisitNode(obj, reg);
    }

    bool failed() const { return f_error_type_ != nullptr; }

    // What a node returns instead of being built: null for a flatten error (set), else, f having
    // failed, a placeholder.
    static PyObject* Stopped() { return PyErr_Occurred() ? nullptr : Py_NewRef(Py_None); }

    PyObject* CallF(PyObject* leaf) {
        if (failed()) return Py_NewRef(Py_None);
        // Vectorcall with the spare slot in front that PY_VECTORCALL_ARGUMENTS_OFFSET allows.
        PyObject* args[2] = {nullptr, leaf};
        PyObject* r = PyObject_Vectorcall(f_, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
        if (r != nullptr) return r;
        PyErr_Fetch(&f_error_type_, &f_error_value_, &f_error_tb_);
        if (f_error_type_ == nullptr) f_error_type_ = Py_NewRef(PyExc_SystemError);  // defensive
        return Py_NewRef(Py_None);
    }

    // Containers hold a RecursionGuard while their children are mapped, as in flatten, so a
    // tree too deep for flatten is too deep here at the same depth.
    [[gnu::noinline]] PyObject* VisitNode(PyObject* obj, const Registration* reg) {
        switch (reg->kind) {
            case NodeKind::kNone:
                return Py_NewRef(Py_None);
            case NodeKind::kTuple:
                return VisitSequence(obj, /*is_list=*/false);
            case NodeKind::kList:
                return VisitSequence(obj, /*is_list=*/true);
            case NodeKind::kDict:
                return VisitDict(obj);
            default:
                return reg->preserve_identity ? VisitShared(obj, reg) : VisitRegistered(obj, reg);
        }
    }

    // The common registered kinds have paths of their own here; the rest go through
    // VisitOneLevel, which costs a throw-away one-node treedef per node.
    PyObject* VisitRegistered(PyObject* obj, const Registration* reg) {
        switch (reg->kind) {
            case NodeKind::kNamedTuple:
                return VisitNamedTuple(obj);
            case NodeKind::kDataclass:
                return VisitDataclass(obj, reg);
            case NodeKind::kOrderedDict:
            case NodeKind::kDefaultDict:
                return VisitMapping(obj, reg);
            case NodeKind::kCustom:
                if (reg->flatten != nullptr) return VisitCustom(obj, reg);
                break;
            default:
                break;
        }
        return VisitOneLevel(obj);
    }

    // A namedtuple is a tuple: mapped as one, then rebuilt as type(*items), as unflatten does.
    PyObject* VisitNamedTuple(PyObject* obj) {
        PyObject* items = VisitSequence(obj, /*is_list=*/false);
        if (items == nullptr || failed()) return items;
        PyObject* out = PyObject_Call(reinterpret_cast<PyObject*>(Py_TYPE(obj)), items, nullptr);
        Py_DECREF(items);
        return out;
    }

    // register_dataclass: fields read and the instance rebuilt by flatten's and unflatten's rules
    // (meta fields as aux_data, checked; data fields as children; the class called by keyword).
    PyObject* VisitDataclass(PyObject* obj, const Registration* reg) {
        RefSmallVector<8> children;  // owned
        Ref meta;
        {
            RecursionGuard guard(kFlattenRecursionWhere);
            if (!guard.ok()) return nullptr;
            meta = Ref(GetAttrs(obj, reg->meta_fields));
            if (!meta || !aux::Check(reg->type, meta.get(), aux::Site{root_})) return nullptr;
            Ref data(GetAttrs(obj, reg->data_fields));
            if (!data) return nullptr;
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(data.get()); ++i) {
                PushNewRef(children, PyTuple_GET_ITEM(data.get(), i));
            }
            if (!MapEach(children.size(), [&](size_t i) -> PyObject*& { return children[i]; }) ||
                failed()) {
                return Stopped();  // `children` releases what it holds
            }
        }
        NodeParts parts;
        parts.kind = reg->kind;
        parts.arity = static_cast<Py_ssize_t>(children.size());
        parts.data = meta.get();
        parts.custom = reg;
        PyObject* out = kinds::Build(parts, children.begin());
        children.clear();  // consumed
        return out;
    }

    // OrderedDict (its own iteration order) and defaultdict (sorted keys, as a dict), rebuilt as
    // unflatten does: a new instance (with the same default_factory), filled through __setitem__.
    PyObject* VisitMapping(PyObject* obj, const Registration* reg) {
        const bool ordered = reg->kind == NodeKind::kOrderedDict;
        Items items;  // owned (key, child) pairs
        Ref factory;
        {
            RecursionGuard guard(kFlattenRecursionWhere);
            if (!guard.ok()) return nullptr;
            if (ordered ? !GatherOrderedItems(obj, items)
                        : !GatherDictItems(obj, items, /*wrap_error=*/false)) {
                return nullptr;
            }
            if (!ordered) {
                factory = Ref(PyObject_GetAttrString(obj, "default_factory"));
                if (!factory) {
                    ReleaseItems(items, 0);
                    return nullptr;
                }
            }
            if (!MapEach(items.size(), [&](size_t i) -> PyObject*& { return items[i].value; }) ||
                failed()) {
                ReleaseItems(items, 0);
                return Stopped();
            }
        }
        PyObject* out = ordered ? PyObject_CallNoArgs(reg->type)
                                : PyObject_CallOneArg(reg->type, factory.get());
        for (size_t i = 0; out != nullptr && i < items.size(); ++i) {
            if (PyObject_SetItem(out, items[i].key, items[i].value) < 0) Py_CLEAR(out);
        }
        ReleaseItems(items, 0);
        return out;
    }

    // Replaces the owned reference slot(i), for i < n, by its mapped value. On a flatten error
    // returns false; every slot then still holds one owned reference (the old or the new value).
    template <class Slot>
    bool MapEach(size_t n, Slot&& slot) {
        for (size_t i = 0; i < n; ++i) {
            // Sibling dicts follow one another in parameter trees: overlap the next one's miss.
            if (i + 1 < n) PrefetchDictEntries(slot(i + 1));
            PyObject* mapped = Visit(slot(i));
            if (mapped == nullptr) return false;
            Py_SETREF(slot(i), mapped);
        }
        return true;
    }

    // Lists and tuples. The output container is made first and filled with new references to
    // the input's items, before anything can run Python code (f may change the input list);
    // each is then replaced in place by its mapped value. No copy of the items goes through a
    // buffer, which on small trees was a visible share of the call. The new container is ours
    // alone until it is returned, so filling a tuple in place is safe.
    PyObject* VisitSequence(PyObject* obj, bool is_list) {
        RecursionGuard guard(kFlattenRecursionWhere);
        if (!guard.ok()) return nullptr;
        Py_ssize_t n;
        Ref out;
        // The allocation can run the cyclic GC, and with it finalizers that resize a list: the
        // size is checked again after it (a list resized meanwhile is mapped as it is now).
        // Dropping an unfilled container runs no Python code.
        do {
            n = Py_SIZE(obj);
            out = Ref(is_list ? PyList_New(n) : PyTuple_New(n));
            if (!out) return nullptr;
        } while (Py_SIZE(obj) != n);
        // Nothing from here to the end of the copy runs Python code.
        PyObject* const* source = is_list ? reinterpret_cast<PyListObject*>(obj)->ob_item
                                          : reinterpret_cast<PyTupleObject*>(obj)->ob_item;
        PyObject** target = is_list ? reinterpret_cast<PyListObject*>(out.get())->ob_item
                                    : reinterpret_cast<PyTupleObject*>(out.get())->ob_item;
        for (Py_ssize_t i = 0; i < n; ++i) target[i] = Py_NewRef(source[i]);
        if (!MapEach(static_cast<size_t>(n), [&](size_t i) -> PyObject*& { return target[i]; }) ||
            failed()) {
            return Stopped();  // `out` releases what it holds
        }
        return out.release();
    }

    PyObject* VisitDict(PyObject* obj) {
        RecursionGuard guard(kFlattenRecursionWhere);
        if (!guard.ok()) return nullptr;
        Items items;  // owned (key, value) pairs, in sorted-key order
        if (!GatherDictItems(obj, items)) return nullptr;
        const size_t n = items.size();
        if (!MapEach(n, [&](size_t i) -> PyObject*& { return items[i].value; }) || failed()) {
            ReleaseItems(items, 0);
            return Stopped();
        }
        // Insertion in sorted-key order, as JAX's unflatten does.
        PyObject* out = _PyDict_NewPresized(static_cast<Py_ssize_t>(n));
        for (size_t i = 0; out != nullptr && i < n; ++i) {
            if (PyDict_SetItem(out, items[i].key, items[i].value) < 0) Py_CLEAR(out);
        }
        ReleaseItems(items, 0);
        return out;
    }

    // A custom node with a flatten function (nearly every registered class, and JAX's own
    // registrations): its functions called directly, with flatten's checks and errors, rather
    // than through a one-level treedef built and dropped per node.
    PyObject* VisitCustom(PyObject* obj, const Registration* reg) {
        RefSmallVector<8> children;  // owned
        Ref result;
        PyObject* aux = nullptr;  // borrowed from `result`
        {
            // Held while flatten runs and the children are mapped, as in flatten.
            RecursionGuard guard(kFlattenRecursionWhere);
            if (!guard.ok()) return nullptr;
            result = Ref(PyObject_CallOneArg(reg->flatten, obj));
            if (!result) return nullptr;
            PyObject* kids;
            if (!SplitFlattenResult(result.get(), /*with_keys=*/false, &kids, &aux) ||
                !aux::Check(reg->type, aux, aux::Site{root_}) || !TakeChildren(kids, result.get(), children)) {
                return nullptr;
            }
            if (!MapEach(children.size(), [&](size_t i) -> PyObject*& { return children[i]; }) ||
                failed()) {
                return Stopped();  // `children` releases what it holds
            }
        }
        // unflatten(aux_data, children_tuple), as unflatten calls it.
        const Py_ssize_t n = static_cast<Py_ssize_t>(children.size());
        PyObject* tuple = PyTuple_New(n);
        if (tuple == nullptr) return nullptr;
        for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(tuple, i, children[i]);
        children.clear();  // moved into the tuple
        PyObject* args[2] = {aux, tuple};
        PyObject* out = PyObject_Vectorcall(reg->unflatten, args, 2, nullptr);
        Py_DECREF(tuple);
        return out;
    }

    // Appends owned references to the children half of a flatten result; JAX's error if it is not
    // iterable.
    static bool TakeChildren(PyObject* kids, PyObject* result, RefSmallVector<8>& out) {
        if (PyTuple_CheckExact(kids)) {
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kids); ++i) {
                PushNewRef(out, PyTuple_GET_ITEM(kids, i));
            }
            return true;
        }
        Ref it(IterChildren(kids, result, /*with_keys=*/false));
        if (!it) return false;
        while (Ref child{PyIter_Next(it.get())}) {
            out.push_back(child.get());  // may throw: the Ref still owns the child then
            child.release();
        }
        if (!PyErr_Occurred()) return true;
        for (PyObject* child : out) Py_DECREF(child);
        out.clear();
        return false;
    }

    // Any other node: taken apart and rebuilt by flatten's and unflatten's own code.
    PyObject* VisitOneLevel(PyObject* obj) {
        ScratchTreeDef one;  // this node alone, its children as leaves
        ScratchVector children_buf;
        std::vector<PyObject*>& children = children_buf.get();
        // FlattenOneLevel takes its own RecursionGuard for the node; ours follows it, for the
        // children, so the depth counted at any moment is flatten's.
        if (!FlattenOneLevel(obj, &one.def, &children, nullptr, root_)) {
            DecrefAll(children);
            return nullptr;
        }
        bool ok;
        {
            RecursionGuard guard(kFlattenRecursionWhere);
            ok = guard.ok() && MapEach(children.size(),
                                       [&](size_t i) -> PyObject*& { return children[i]; });
        }
        if (!ok || failed()) {  // no unflatten function sees a placeholder
            DecrefAll(children);
            return Stopped();
        }
        PyObject* out = kinds::Build(PartsOf(one.def, one.def.nodes.back()), children.data());
        children.clear();  // consumed
        return out;
    }

    // Identity-preserving nodes: mapped once; every later occurrence gets that same output.
    PyObject* VisitShared(PyObject* obj, const Registration* reg) {
        if (!identity_) identity_ = std::make_unique<PointerMap>();
        bool inserted;
        PointerMap::Slot* slot = identity_->FindOrInsert(obj, kInProgress, &inserted);
        if (!inserted) {
            if (slot->value == kInProgress) return RaiseCycle();
            return Py_NewRef(identity_outputs_[static_cast<size_t>(slot->value)]);
        }
        Py_INCREF(obj);  // owned by the map from here on
        PyObject* out = VisitRegistered(obj, reg);
        if (out == nullptr) return nullptr;
        identity_->Find(obj)->value = static_cast<Py_ssize_t>(identity_outputs_.size());
        PushNewRef(identity_outputs_, out);
        return out;
    }

    // A cycle through an identity-preserving node. flatten names both key paths of the cycle;
    // rather than track paths on every walk for this error alone, let flatten raise it.
    PyObject* RaiseCycle() {
        RefVector leaves;
        bool ok = Flatten(root_, nullptr, false, static_cast<TreeDef*>(nullptr), &leaves, nullptr);
        DecrefAll(leaves);
        if (ok) {  // the tree changed under us (a callback mutated it): say what we saw
            PyErr_SetString(PyExc_ValueError,
                            "Reference cycle through an identity-preserving node.");
        }
        return nullptr;
    }

    static constexpr Py_ssize_t kInProgress = -2;

    PyObject* f_;     // borrowed
    PyObject* root_;  // borrowed: the tree being mapped
    // f's exception, held while the walk looks for a flatten error that would win over it.
    PyObject* f_error_type_ = nullptr;
    PyObject* f_error_value_ = nullptr;
    PyObject* f_error_tb_ = nullptr;
    // Identity-preserving objects met so far -> index in identity_outputs_ (kInProgress while
    // their subtree is mapped). Allocated on first use only.
    std::unique_ptr<PointerMap> identity_;
    RefVector identity_outputs_;  // owned
};

}  // namespace

PyObject* MapSinglePass(PyObject* f, PyObject* tree) {
    SinglePassMapper mapper(f, tree);
    return mapper.Run();
}

}  // namespace fastree
