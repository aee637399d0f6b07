// flatten_up_to: cut `tree` at the leaves of this treedef (the treedef must be a prefix of it).
//
// Walks the post-order nodes from the root backwards with an agenda of owned objects; a node
// pushes its children in order so the last child, whose subtree precedes the node in the
// vector, is popped next. That order meets the leaves last to first: each goes straight to its
// slot, filled from the end of the output (no reversal afterwards). Error texts are JAX's, since
// libraries match on them.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "diagnostics/aux_check.h"
#include "registry/dict_items.h"
#include "registry/jax_texts.h"
#include "treedef/kinds_read.h"
#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "util/scratch.h"
#include "treedef/treedef.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

constexpr const char kNoneHint[] =
    "\n\nIn previous releases of JAX, flatten-up-to used to consider None to be a tree-prefix of "
    "non-None values. To obtain the previous behavior, you can usually write:\n"
    "  jax.tree.map(lambda x, y: None if x is None else f(x, y), a, b, is_leaf=lambda x: x is "
    "None)";

bool Fail(PyObject* type, const std::string& message) {
    PyErr_SetString(type, message.c_str());
    return false;
}


// str(list(keys)) for the dict-key mismatch message.
std::string KeyListStr(PyObject* const* keys, Py_ssize_t n) {
    Ref list(NewList(n));
    if (!list) {
        PyErr_Clear();
        return "[...]";
    }
    for (Py_ssize_t i = 0; i < n; ++i) PyList_SET_ITEM(list.get(), i, Py_NewRef(keys[i]));
    return Repr(list.get());
}

// "Custom dataclass" -> "custom dataclass".
std::string LowerFirst(const char* what) {
    std::string s(what);
    if (!s.empty()) s[0] = static_cast<char>(s[0] - 'A' + 'a');
    return s;
}

// One registered node's children and node data, read by the kind's own code (kinds::Read, with
// this as the walk) without a treedef: flatten_up_to compares the data and queues the children
// itself. (Through FlattenOneLevel, a throw-away treedef per node cost a dataclass tree's
// flatten_up_to 7%.)
class OneNodeReader {
 public:
    static constexpr bool kDef = true;  // the node data is read: it is compared
    static constexpr bool kPaths = false;
    static constexpr bool kLeafDicts = false;  // every child is visited (kinds_read.h)
    static constexpr bool kCountsLeaves = false;
    struct Mark {};

    explicit OneNodeReader(PyObject* obj) : obj_(obj) {}

    Mark Begin() const { return {}; }
    PyThreadState* Thread() const { return PyThreadState_Get(); }  // one read: one level
    template <bool kOwned = false>
    bool Child(PyObject* child, PyObject* /*key*/) {
        PushOwned(children, kOwned ? child : Py_NewRef(child));
        return true;
    }
    bool AddLeaf(PyObject* obj) { return Child(obj, nullptr); }
    bool Finish(NodeKind, Mark, Py_ssize_t /*arity*/, PyObject* node_data = nullptr,
                const Registration* = nullptr, Py_ssize_t = 0) {
        data = Ref(node_data);
        return true;
    }
    // Plain dicts, the one kind whose keys go to a treedef, are checked by ExpectDict instead.
    Py_ssize_t TakeDictKeys(Items&) { return 0; }
    // An aux_data report names the node itself, as a one-level flatten's does.
    aux::Site Site() const { return aux::Site{obj_}; }

    RefVector children;  // owned, in order
    Ref data;            // the node data

 private:
    PyObject* obj_;  // borrowed: the node being read
};

// Every child of `node` is a leaf: its subtree is the node plus `arity` one-node leaves.
bool AllChildrenAreLeaves(const Node& node) {
    return node.num_leaves == node.arity && node.num_nodes == node.arity + 1;
}

class PrefixWalker {
 public:
    PrefixWalker(const TreeDef& def, std::vector<PyObject*>* out) : def_(def), out_(out) {}
    ~PrefixWalker() {
        DecrefAll(agenda_);
        for (auto& entry : pending_refs_) Py_DECREF(entry.second);
        for (auto& entry : identity_) Py_DECREF(entry.first);
    }

    bool mismatch() const { return mismatch_; }

    bool Run(PyObject* tree) {
        // One slot per leaf, null until filled (DecrefAll skips nulls on an error).
        begin_ = out_->size();
        out_->resize(begin_ + static_cast<size_t>(def_.num_leaves()), nullptr);
        cursor_ = out_->size();
        PushNewRef(agenda_, tree);
        for (Py_ssize_t i = def_.num_nodes() - 1; i >= 0; --i) {
            // Owned from here on: released on every exit, a C++ exception's included.
            Ref obj(agenda_.back());
            agenda_.pop_back();
            const Node& node = def_.nodes[i];  // the treedef is immutable
            if (node.IsSharedRef()) {  // checked once its target has been seen
                pending_refs_.push_back({i, obj.get()});
                obj.release();  // now owned by pending_refs_
                continue;
            }
            const Registration* custom = def_.Custom(node);
            if (custom != nullptr && custom->preserve_identity && !RecordIdentity(i, obj.get())) {
                return false;
            }
            if (!Step(node, obj.release())) return false;
            if (leaf_children_done_) {
                // Step emitted the children straight into the output: skip their leaf nodes.
                leaf_children_done_ = false;
                i -= node.arity;
            }
        }
        if (!CheckRefs()) return false;
        if (cursor_ != begin_) {  // the treedef's leaf count and its leaf nodes disagree
            PyErr_SetString(PyExc_SystemError, "fastree: flatten_up_to filled too few leaves");
            return false;
        }
        return true;
    }

 private:
    // Consumes `obj`. Each kind says which check applies to it (node_kinds.h, Expect).
    bool Step(const Node& node, PyObject* obj) {
        Ref owned(obj);
        return kinds::Dispatch(node.kind, [&](auto kind) {
            return decltype(kind)::Expect(*this, node, owned);
        });
    }

 public:
    // ---- the checks the kinds' Expect functions choose from; each takes over `obj`

    bool ExpectLeaf(Ref& obj) {
        if (!HasSlots(1)) return false;
        (*out_)[--cursor_] = obj.release();
        return true;
    }

    bool ExpectNone(Ref& obj) {
        if (obj.get() == Py_None) return true;
        return Mismatch(PyExc_ValueError, "Expected None, got " + Repr(obj.get()) + "." + kNoneHint);
    }

    bool ExpectSequence(const Node& node, Ref& obj, bool is_list) {
        PyObject* o = obj.get();
        const Py_ssize_t n = node.arity;
        const char* name = is_list ? "list" : "tuple";
        if (is_list ? !PyList_CheckExact(o) : !PyTuple_CheckExact(o)) {
            return Mismatch(PyExc_ValueError, std::string("Expected ") + name + ", got " + Repr(o) + ".");
        }
        // The size is read again where the items are copied (PushSequence): another thread
        // may resize a list in between (free-threaded builds), and the copy then declines.
        Py_ssize_t size = SharedSize(o);
        if (size == n) {
            if (PushSequence(node, o, n)) return true;
            if (PyErr_Occurred()) return false;
            size = SharedSize(o);
        }
        return Mismatch(PyExc_ValueError,
                        std::string(is_list ? "List" : "Tuple") + " arity mismatch: " +
                            std::to_string(size) + " != " + std::to_string(n) + "; " + name +
                            ": " + Repr(o) + ".");
    }

    bool ExpectNothing(const Node&, Ref&) {  // a shared reference: Run checks it
        return Mismatch(PyExc_SystemError, "fastree: unexpected node kind in flatten_up_to");
    }

 private:
    // Takes the `n` items of `seq`, a tuple (of any class) or an exact list, into their leaf slots or onto the
    // agenda; false with no error set if it no longer holds `n` (another thread resized a list
    // since the caller's check), false with an error set on a failure. The room is made first
    // (what may throw throws there); CopyItemsIfSize then reads the size and copies the items in
    // one step, in a list's critical section on free-threaded builds, running no Python code.
    bool PushSequence(const Node& node, PyObject* seq, Py_ssize_t n) {
        if (AllChildrenAreLeaves(node)) {
            // Fast path (parameter lists, flat lists): the children go to their slots without
            // a round trip through the agenda.
            if (!HasSlots(n)) return false;
            if (!CopyItemsIfSize(seq, n, out_->data() + cursor_ - static_cast<size_t>(n))) {
                return false;
            }
            cursor_ -= static_cast<size_t>(n);
            leaf_children_done_ = true;
            return true;
        }
#ifdef Py_GIL_DISABLED
        if (PyList_Check(seq)) {
            const size_t begin = agenda_.size();
            agenda_.resize(begin + static_cast<size_t>(n), nullptr);  // may throw; nulls skipped
            if (!CopyItemsIfSize(seq, n, agenda_.data() + begin)) {
                agenda_.resize(begin);  // nothing was copied: only nulls
                return false;
            }
            return true;
        }
#endif
        // A tuple's items never change, and under the GIL nothing from the caller's size check
        // to here runs Python code: pushed one by one, as the agenda's own growth goes (a
        // resize-then-copy is out of line: deep-500's flatten_up_to read 1.14-1.21x slower
        // with it on a GIL build, scripts/ab_builds.py).
        if (SharedSize(seq) != n) return false;
        PyObject* const* items = PyTuple_Check(seq) ? &PyTuple_GET_ITEM(seq, 0)
                                                    : reinterpret_cast<PyListObject*>(seq)->ob_item;
        for (Py_ssize_t i = 0; i < n; ++i) PushNewRef(agenda_, items[i]);
        return true;
    }

    // Whether `n` more leaves fit before the first slot: always, for a well-formed treedef.
    bool HasSlots(Py_ssize_t n) {
        if (static_cast<size_t>(n) <= cursor_ - begin_) return true;
        PyErr_SetString(PyExc_SystemError, "fastree: flatten_up_to met more leaves than its treedef has");
        return false;
    }

 public:
    bool ExpectDict(const Node& node, Ref& owned) {
        PyObject* obj = owned.get();
        if (!PyDict_CheckExact(obj)) {
            return Mismatch(PyExc_ValueError, "Expected dict, got " + Repr(obj) + ".");
        }
        // Fast path: same size and every expected key present means the same key set, found by
        // lookups, with no sort of the tree's keys. The sorting path below builds the message.
        if (PyDict_GET_SIZE(obj) == node.arity) {
            // Each value goes straight to where it is consumed (its output slot for leaf
            // children, else the agenda), owned from the moment it is found: the next lookup
            // hashes and compares keys, user code that may change `obj`. A key not found rolls
            // them back.
            const bool leaves = AllChildrenAreLeaves(node);
            if (leaves && !HasSlots(node.arity)) return false;
            const size_t first = cursor_ - (leaves ? static_cast<size_t>(node.arity) : 0);
            const size_t begin = agenda_.size();
            PyObject* const* expected = def_.keys.data() + node.keys_begin;
            Count i = 0;
            for (; i < node.arity; ++i) {
                // A new reference from the lookup itself: another thread may replace the entry.
                PyObject* value;
                if (DictGetItemRef(obj, expected[i], &value) <= 0) break;
                if (leaves) {
                    (*out_)[first + static_cast<size_t>(i)] = value;
                } else {
                    PushOwned(agenda_, value);
                }
            }
            // The size is checked again: a key's __eq__ may have added keys during the lookups.
            if (i == node.arity && PyDict_GET_SIZE(obj) == node.arity) {
                if (leaves) {
                    cursor_ = first;
                    leaf_children_done_ = true;
                }
                return true;
            }
            // Each value leaves its slot before it is released (a release can run Python code).
            if (leaves) {
                for (size_t k = first + static_cast<size_t>(i); k-- > first;) {
                    Ref value((*out_)[k]);
                    (*out_)[k] = nullptr;
                }
            }
            while (agenda_.size() > begin) {
                Ref value(agenda_.back());
                agenda_.pop_back();
            }
            if (PyErr_Occurred()) return false;
        }
        Items items;
        if (!GatherDictItems(obj, items)) return false;
        const Py_ssize_t n = node.arity;
        PyObject* const* expected = def_.keys.data() + node.keys_begin;  // may be empty
        bool equal = static_cast<Py_ssize_t>(items.size()) == n;
        for (Py_ssize_t i = 0; equal && i < n; ++i) {
            PyObject* got = items[static_cast<size_t>(i)].key;
            if (got == expected[i]) continue;  // same (usually interned) key object
            int eq = PyObject_RichCompareBool(expected[i], got, Py_EQ);
            if (eq < 0) {
                ReleaseItems(items, 0);
                return false;
            }
            equal = eq != 0;
        }
        if (!equal) {
            std::string message = "Dict key mismatch; expected keys: " + KeyListStr(expected, n);
            if (Texts().dict_mismatch_shows_dict) {
                message += "; dict: " + Repr(obj) + ".";
            } else {
                std::vector<PyObject*> present;
                for (size_t i = 0; i < items.size(); ++i) present.push_back(items[i].key);
                message += "; present keys: " +
                           KeyListStr(present.data(), static_cast<Py_ssize_t>(present.size())) +
                           ".";
            }
            ReleaseItems(items, 0);
            return Mismatch(PyExc_ValueError, message);
        }
        return MoveValues(node, items);
    }

    // Moves the values of a dict node's gathered items (owned) to the output (leaf children)
    // or the agenda. Each is nulled once moved, so a push that throws (std::bad_alloc) leaves
    // every reference owned exactly once; `items` releases the rest (the keys) when it dies.
    bool MoveValues(const Node& node, Items& items) {
        if (AllChildrenAreLeaves(node)) {
            if (!HasSlots(static_cast<Py_ssize_t>(items.size()))) return false;
            for (size_t i = items.size(); i-- > 0;) {
                (*out_)[--cursor_] = items[i].value;
                items[i].value = nullptr;
            }
            leaf_children_done_ = true;
        } else {
            for (size_t i = 0; i < items.size(); ++i) {
                agenda_.push_back(items[i].value);
                items[i].value = nullptr;
            }
        }
        items.Release(0);  // the keys
        return true;
    }

    bool ExpectNamedTuple(const Node& node, Ref& owned) {
        PyObject* obj = owned.get();
        // JAX's test, per object and whatever the registry says of its type: a tuple with a
        // `_fields` attribute (ClassifyTupleSubclass asks it). A namedtuple class registered as
        // a custom node is still a namedtuple here, and gets the type-mismatch message below,
        // as in JAX. The lookup can run Python code; `owned` holds the object.
        const bool named =
            PyTuple_Check(obj) && registry::ClassifyTupleSubclass(obj) == &registry::kNamedTuple;
        if (!named) {
            return Mismatch(PyExc_ValueError, "Expected named tuple, got " + Repr(obj) + ".");
        }
        if (PyTuple_GET_SIZE(obj) != node.arity) {
            return Mismatch(PyExc_ValueError,
                        "Named tuple arity mismatch: " + std::to_string(PyTuple_GET_SIZE(obj)) +
                            " != " + std::to_string(node.arity) + "; tuple: " + Repr(obj) + ".");
        }
        if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) != def_.Data(node)) {
            return Mismatch(PyExc_ValueError, "Named tuple type mismatch: expected type: " +
                                              Repr(def_.Data(node)) + ", tuple: " + Repr(obj) + ".");
        }
        return PushSequence(node, obj, node.arity);  // a tuple: always its size
    }

    // Custom-like nodes are compared the way JAX does: same registration, aux data not `!=`,
    // same number of children. The children come from flattening one level (leaves only).
    // `what`: "Custom" or "Custom dataclass", as JAX's messages name the kind;
    // `callbacks`: the node has flatten functions that can be called directly.
    bool ExpectRegistered(const Node& node, Ref& owned, const char* what, bool callbacks) {
        PyObject* obj = owned.get();
        const Registration* reg = registry::Classify(obj);
        if (reg != def_.Custom(node)) {
            return Mismatch(PyExc_ValueError,
                        std::string(what) + " node type mismatch" +
                            ": expected type: " + Repr(def_.Custom(node)->type) +
                            ", value: " + Repr(obj) + ".");
        }
        if (callbacks && reg->flatten != nullptr) {
            return StepCustomCallback(node, obj, reg);
        }
        // The reader is ours: the user code below (a comparison, a repr) cannot touch it.
        OneNodeReader got(obj);  // owns the children until they move to the agenda
        if (!kinds::Read(got, obj, reg)) return false;
        int ne = PyObject_RichCompareBool(def_.Data(node), got.data.get(), Py_NE);
        if (ne < 0) return false;
        if (ne) {
            return Mismatch(PyExc_ValueError,
                        "Mismatch " + LowerFirst(what) + " node data: " +
                            Repr(def_.Data(node)) + " != " + Repr(got.data.get()) +
                            "; value: " + Repr(obj) + ".");
        }
        const Py_ssize_t arity = static_cast<Py_ssize_t>(got.children.size());
        if (arity != node.arity) {
            return Mismatch(PyExc_ValueError, "Custom type arity mismatch: " +
                                              std::to_string(arity) + " != " +
                                              std::to_string(node.arity) + "; value: " +
                                              Repr(obj) + ".");
        }
        for (PyObject*& child : got.children) {  // ownership moves, one by one (see MoveValues)
            agenda_.push_back(child);
            child = nullptr;
        }
        got.children.clear();
        return true;
    }

 private:
    // A custom node with a flatten callback: call it directly (as JAX does) rather than through a
    // one-level flatten, which would build a throw-away treedef for every node.
    bool StepCustomCallback(const Node& node, PyObject* obj, const Registration* reg) {
        Ref result(PyObject_CallOneArg(reg->flatten, obj));
        if (!result) return false;
        if (!PyTuple_Check(result.get()) || PyTuple_GET_SIZE(result.get()) != 2) {
            return Mismatch(PyExc_ValueError,
                        "The to_iterable function for a custom PyTree node should return a "
                        "(children, aux_data) tuple, got " + Repr(result.get()));
        }
        PyObject* aux = PyTuple_GET_ITEM(result.get(), 1);
        int ne = PyObject_RichCompareBool(def_.Data(node), aux, Py_NE);
        if (ne < 0) return false;
        if (ne) {
            return Mismatch(PyExc_ValueError, "Mismatch custom node data: " + Repr(def_.Data(node)) +
                                              " != " + Repr(aux) + "; value: " + Repr(obj) + ".");
        }
        Ref children(PySequence_Tuple(PyTuple_GET_ITEM(result.get(), 0)));
        if (!children) {
            PyErr_Clear();
            return Mismatch(PyExc_ValueError,
                        "The to_iterable function for a custom PyTree node should return a "
                        "(children, aux_data) tuple where 'children' is iterable, got " +
                            Repr(result.get()));
        }
        const Py_ssize_t n = PyTuple_GET_SIZE(children.get());
        if (n != node.arity) {
            return Mismatch(PyExc_ValueError, "Custom type arity mismatch: " + std::to_string(n) +
                                              " != " + std::to_string(node.arity) +
                                              "; value: " + Repr(obj) + ".");
        }
        for (Py_ssize_t i = 0; i < n; ++i) {
            PushNewRef(agenda_, PyTuple_GET_ITEM(children.get(), i));
        }
        return true;
    }

    // ---- sharing pattern (identity-preserving nodes)

    // `obj` sits at identity node `index`; the same object at another such node means the tree
    // shares where this treedef does not.
    bool RecordIdentity(Py_ssize_t index, PyObject* obj) {
        auto [it, inserted] = identity_.try_emplace(obj, index);
        if (inserted) {
            // Owned by identity_ (released by ~PrefixWalker): keeps the address from being
            // reused during this walk.
            Py_INCREF(obj);
            if (def_.nodes[index].shared_target) target_objects_[index] = obj;
            return true;
        }
        return Mismatch(PyExc_ValueError,
                    "Sharing pattern mismatch: the same " + Repr(reinterpret_cast<PyObject*>(Py_TYPE(obj))) +
                        " object is at key paths " + PathOf(index) + " and " + PathOf(it->second) +
                        ", where the treedef has two distinct objects.");
    }

    // Every shared reference must hold the very object found at the node it repeats.
    bool CheckRefs() {
        for (auto& [index, obj] : pending_refs_) {
            const Py_ssize_t target = def_.nodes[index].ref;
            auto found = target_objects_.find(target);
            if (found == target_objects_.end() || obj != found->second) {
                return Mismatch(PyExc_ValueError,
                            "Sharing pattern mismatch: the object at key path " + PathOf(index) +
                                " must be the one at key path " + PathOf(target) +
                                " (the treedef shares it), got " + Repr(obj) + ".");
            }
        }
        return true;
    }

    std::string PathOf(Py_ssize_t index) const {
        std::string path = KeyPathString(def_, index);
        return path.empty() ? "()" : path;
    }

    // A structural mismatch, raised here with JAX's text (callers may explain it further; an
    // error from a callback or a comparison is passed on as it is).
    bool Mismatch(PyObject* type, const std::string& message) {
        mismatch_ = true;
        return Fail(type, message);
    }

    const TreeDef& def_;
    std::vector<PyObject*>* out_;
    std::vector<std::pair<Py_ssize_t, PyObject*>> pending_refs_;  // (ref node, owned object)
    std::unordered_map<PyObject*, Py_ssize_t> identity_;            // owned object -> node
    std::unordered_map<Py_ssize_t, PyObject*> target_objects_;      // shared node -> its object
    // Objects still to visit, owned. Pooled: on small trees a fresh vector's allocation would be
    // a visible share of the call.
    ScratchVector agenda_buf_;
    std::vector<PyObject*>& agenda_ = agenda_buf_.get();
    size_t begin_ = 0;   // the first slot of this walk's leaves in *out_
    size_t cursor_ = 0;  // one past the next slot to fill (leaves are met last to first)
    bool leaf_children_done_ = false;  // set by a Step that emitted its leaf children itself
    bool mismatch_ = false;            // the error set is one of ours (see Mismatch)
};

}  // namespace

PyObject* FlattenUpToSequence(const TreeDef& def, PyObject* tree) {
    if (def.nodes.empty()) return nullptr;
    const Node& root = def.nodes.back();
    if (!AllChildrenAreLeaves(root)) return nullptr;
    const bool want_tuple = root.kind == kinds::TupleKind::kKind;
    if (!want_tuple && root.kind != kinds::ListKind::kKind) return nullptr;
    // The result is allocated before the items are read: allocating can run the cyclic GC,
    // whose finalizers may change `tree` (a list). Nothing between the size check and the copy
    // below runs Python code.
    Ref out(NewList(root.arity));
    if (!out) return nullptr;
    // The size check and the copy are one step (CopyItemsIfSize: in a list's critical section
    // on free-threaded builds, where another thread may resize it).
    if (!(want_tuple ? PyTuple_CheckExact(tree) : PyList_CheckExact(tree)) ||
        !CopyItemsIfSize(tree, root.arity, reinterpret_cast<PyListObject*>(out.get())->ob_item)) {
        return nullptr;  // not this case (dropping the empty list runs no Python code)
    }
    return out.release();
}

bool FlattenUpTo(const TreeDef& def, PyObject* tree, std::vector<PyObject*>* out,
                 bool* mismatch) {
    PrefixWalker walker(def, out);
    const bool ok = walker.Run(tree);
    if (mismatch != nullptr) *mismatch = !ok && walker.mismatch();
    return ok;
}

}  // namespace fastree
