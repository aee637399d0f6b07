// tree_map(f, tree) without is_leaf or other trees: one recursive walk that calls f at each leaf
// and rebuilds each node as soon as its children are mapped.
//
// Why a second tree_map: the general one (map.cpp) flattens into a treedef, calls f, then replays
// the treedef. On parameter trees of 10^4 leaves the treedef's bookkeeping (node and key vectors,
// the replay's value stack) and the second walk over nodes that have left the cache were ~10% of
// tree_map (transformer-1000: 1.40 -> 1.26 ms). Here a dict is rebuilt while it is still hot.
//
// Built-in containers are handled inline. Every other node (namedtuples, OrderedDict, defaultdict,
// registered classes, types JAX knows) goes through FlattenOneLevel and BuildNode, the very code
// flatten and unflatten use, so its children, aux_data checks, errors and rebuilt object are
// exactly theirs.
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

#include "dict_items.h"
#include "pointer_map.h"
#include "pyutils.h"
#include "scratch.h"
#include "treedef.h"
#include "unflatten_with.h"

namespace fastree {
namespace {

// The message of flatten's RecursionError (JAX's), since the walk is flatten's too.
constexpr const char kRecursionWhere[] = " in flatten; PyTree may have cyclical node references.";

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
                return reg->preserve_identity ? VisitShared(obj) : VisitRegistered(obj);
        }
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

    // Lists and tuples. The items are taken (with references) before any is mapped: f may change
    // the list meanwhile, and the new container is only created once it can be filled at once.
    PyObject* VisitSequence(PyObject* obj, bool is_list) {
        RecursionGuard guard(kRecursionWhere);
        if (!guard.ok()) return nullptr;
        const Py_ssize_t n = Py_SIZE(obj);
        PyObject* const* source = is_list ? reinterpret_cast<PyListObject*>(obj)->ob_item
                                          : reinterpret_cast<PyTupleObject*>(obj)->ob_item;
        SmallVector<PyObject*, 8> items;
        for (Py_ssize_t i = 0; i < n; ++i) items.push_back(Py_NewRef(source[i]));
        if (!MapEach(items.size(), [&](size_t i) -> PyObject*& { return items[i]; }) ||
            failed()) {
            for (PyObject* item : items) Py_DECREF(item);
            return Stopped();
        }
        PyObject* out = is_list ? PyList_New(n) : PyTuple_New(n);
        if (out == nullptr) {
            for (PyObject* item : items) Py_DECREF(item);
            return nullptr;
        }
        PyObject** target = is_list ? reinterpret_cast<PyListObject*>(out)->ob_item
                                    : reinterpret_cast<PyTupleObject*>(out)->ob_item;
        for (Py_ssize_t i = 0; i < n; ++i) target[i] = items[i];  // references move over
        return out;
    }

    PyObject* VisitDict(PyObject* obj) {
        RecursionGuard guard(kRecursionWhere);
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

    // Any other node: taken apart and rebuilt by flatten's and unflatten's own code.
    PyObject* VisitRegistered(PyObject* obj) {
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
            RecursionGuard guard(kRecursionWhere);
            ok = guard.ok() && MapEach(children.size(),
                                       [&](size_t i) -> PyObject*& { return children[i]; });
        }
        if (!ok || failed()) {  // no unflatten function sees a placeholder
            DecrefAll(children);
            return Stopped();
        }
        PyObject* out = BuildNode(one.def, one.def.nodes.back(), children.data());
        children.clear();  // BuildNode consumed them
        return out;
    }

    // Identity-preserving nodes: mapped once; every later occurrence gets that same output.
    PyObject* VisitShared(PyObject* obj) {
        if (!identity_) identity_ = std::make_unique<PointerMap>();
        bool inserted;
        PointerMap::Slot* slot = identity_->FindOrInsert(obj, kInProgress, &inserted);
        if (!inserted) {
            if (slot->value == kInProgress) return RaiseCycle();
            return Py_NewRef(identity_outputs_[static_cast<size_t>(slot->value)]);
        }
        Py_INCREF(obj);  // owned by the map from here on
        PyObject* out = VisitRegistered(obj);
        if (out == nullptr) return nullptr;
        identity_->Find(obj)->value = static_cast<Py_ssize_t>(identity_outputs_.size());
        identity_outputs_.push_back(Py_NewRef(out));
        return out;
    }

    // A cycle through an identity-preserving node. flatten names both key paths of the cycle;
    // rather than track paths on every walk for this error alone, let flatten raise it.
    PyObject* RaiseCycle() {
        std::vector<PyObject*> leaves;
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
    std::vector<PyObject*> identity_outputs_;  // owned
};

}  // namespace

PyObject* MapSinglePass(PyObject* f, PyObject* tree) {
    SinglePassMapper mapper(f, tree);
    return mapper.Run();
}

}  // namespace fastree
