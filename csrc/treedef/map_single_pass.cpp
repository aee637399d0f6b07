// tree_map(f, tree) without is_leaf or other trees: one recursive walk that calls f at each leaf
// and rebuilds each node as soon as its children are mapped.
//
// Why a second tree_map: the general one (map.cpp) flattens into a treedef, calls f, then replays
// the treedef. On parameter trees of 10^4 leaves the treedef's bookkeeping (node and key vectors,
// the replay's value stack) and the second walk over nodes that have left the cache were ~10% of
// tree_map (transformer-1000: 1.40 -> 1.26 ms). Here a dict is rebuilt while it is still hot.
//
// Each kind says how it is mapped (Kind::Map, node_kinds.h). Lists, tuples, namedtuples and
// dicts have in-place paths here; every other kind is read by flatten's own code (kinds::Read,
// with this mapper as the walk) and rebuilt by unflatten's (kinds::Build), so there is one
// definition of how a node is read and built, not one per engine.
//
// What differs from JAX's flatten-everything-first order, and what is kept the same:
//  - f may run on a leaf before the flatten functions of nodes after it. Only side effects shared
//    between f and flatten functions can tell; results never depend on it.
//  - Exceptions are JAX's: a flatten error beats an f error there, since flattening finishes
//    before f first runs. So once f raises, the walk goes on without calling f or rebuilding
//    anything (no unflatten function sees a half-mapped subtree), and a flatten error met later
//    replaces f's.
//  - A container is read when the walk reaches it, and a list's items as the walk gets to each
//    (as flatten reads them: ListKind::Read), so an f that replaces parts of the input it has not
//    reached yet is seen doing so (JAX would have read them before); an f that empties a list
//    the walk is in is not (its remaining items come from the copy taken on entry, as JAX's
//    flatten-first order has them; see MapSequence). A dict's later values are looked up again
//    once a flatten callback has run inside it (read::Values, as jaxlib reads them), so an f
//    that changed that dict before is seen then too. Never unsafe: every
//    child is held by a reference while it is mapped.
//  - f and rebuild functions (unflatten functions, namedtuple constructors) run inside the walk,
//    where JAX runs them from the top. Up to Python 3.11 their frames count against the same
//    recursion limit, so a tree nested to within a level or two of sys.getrecursionlimit() can
//    raise RecursionError here where JAX's tree_map would not.
//  - What f registers while the walk runs: JAX has read the whole tree before f first runs, so
//    a type f registers is a node only in later walks. A leaf type already met in this walk
//    stays a leaf here (registry::KnownPlainLeafType); a type first met after the
//    registration is read as registered.
//  - Identity-preserving nodes: each object is mapped once, at its first occurrence, and every
//    later occurrence gets that output, as the treedef's shared references do on the general path.
#include <optional>
#include <vector>

#include "diagnostics/aux_check.h"
#include "registry/dict_items.h"
#include "treedef/identity_seen.h"
#include "treedef/kinds_read.h"
#include "registry/registry_state.h"
#include "util/pyutils.h"
#include "util/small_vector.h"
#include "treedef/treedef.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

class SinglePassMapper {
 public:
    SinglePassMapper(PyObject* f, PyObject* root) : f_(f), root_(root) {}

    ~SinglePassMapper() {
        DecrefAll(identity_outputs_);  // identity_ releases its objects itself
    }

    PyObject* Run() {
        Ref out(Visit(root_));
        if (!out) return nullptr;  // a flatten error: it wins over f's, if any
        if (failed()) {
            out = Ref();  // placeholders only; released before f's error is set again
            f_error_.Restore();
            return nullptr;
        }
        return out.release();
    }

 private:
    // A new reference to the mapped `obj`, or null with a flatten error set. Once f has failed
    // (failed()), the result is a placeholder: the walk only looks for flatten errors.
    [[gnu::always_inline]] PyObject* Visit(PyObject* obj) {
        if (!leaf_type_.Holds(obj)) {
            const uint64_t epoch = UserCodeEpoch();
            const Registration* reg = registry::Classify(obj);
            if (!reg->IsLeaf()) return VisitNode(obj, reg);
            if (!registry::CheckLeaf(reg, obj)) return nullptr;
            leaf_type_.Remember(obj, reg, epoch);
        }
        return CallF(obj);  // one call site: inlined into every loop over children
    }

    bool failed() const { return !f_error_.empty(); }

    // What a node returns instead of being built: null for a flatten error (set), else, f having
    // failed, a placeholder.
    static PyObject* Stopped() { return PyErr_Occurred() ? nullptr : Py_NewRef(Py_None); }

    PyObject* CallF(PyObject* leaf) {
        if (failed()) return Py_NewRef(Py_None);
        // Vectorcall with the spare slot in front that PY_VECTORCALL_ARGUMENTS_OFFSET allows.
        PyObject* args[2] = {nullptr, leaf};
        PyObject* r = PyObject_Vectorcall(f_, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
        if (r != nullptr) return r;
        return FFailed();
    }

    // f raised: its exception is set aside and the walk goes on with placeholders. Out of line,
    // so that CallF stays small enough to be inlined into every loop over leaves.
    [[gnu::noinline, gnu::cold]] PyObject* FFailed() {
        if (!PyErr_Occurred()) {  // f broke the C-API contract; failed() must hold from here
            PyErr_SetString(PyExc_SystemError, "tree_map: f returned NULL without an exception");
        }
        f_error_.Save();
        return Py_NewRef(Py_None);
    }

    // Each kind says how it is mapped (node_kinds.h, Map): lists, tuples, namedtuples and dicts
    // by the in-place paths below, every other kind by MapByReading.
    [[gnu::noinline]] PyObject* VisitNode(PyObject* obj, const Registration* reg) {
        if (reg->preserve_identity) return VisitShared(obj, reg);
        return kinds::Map(*this, obj, reg);
    }

 public:
    // ---- what the kinds' Map functions call

    // A namedtuple is a tuple: mapped as one, then rebuilt as type(*items), as unflatten does.
    PyObject* MapNamedTuple(PyObject* obj) {
        Ref items(MapSequence(obj, /*is_list=*/false));
        if (!items || failed()) return items.release();
        return PyObject_Call(reinterpret_cast<PyObject*>(Py_TYPE(obj)), items.get(), nullptr);
    }

    // Lists and tuples. The output container is the walk's private buffer until its last item
    // is mapped: made before f first runs, it is untracked by the cyclic GC at once and tracked
    // only when complete, and no reference to it leaves the walk before then. A half-built
    // container that Python could reach (gc.get_referrers finds every tracked container that
    // refers to the input's items) would let f resize it and free the slots the walk writes to
    // (tests/test_half_built_outputs.py). The same holds for every output container of every walker:
    // none is reachable before its last item is known. (The output itself is the buffer: no
    // second buffer to allocate and copy out of at the end.)
    //
    // A list is read as flatten reads it (ListKind::Read, kinds_read.h): its length when reached,
    // item i as it is when the walk gets there, so a custom flatten function that rewrites a list
    // the walk is in is seen as JAX sees it. One difference, since f runs inside the walk here
    // (JAX runs it after flattening): a list that shrank below the walk, which f may do to its
    // input (it is not walking it in JAX), has its remaining items taken from the copy made when
    // the walk reached it, as JAX's flatten-first order would have them.
    PyObject* MapSequence(PyObject* obj, bool is_list) {
        RecursionGuard guard(thread_, kFlattenRecursionWhere);
        if (!guard.ok()) return nullptr;
        Ref out;
        Py_ssize_t n;
        PyObject** slots;
        // Owned slots: item i as first read, then as reached, then mapped. A failure releases
        // them with `out` (every slot is filled before anything can fail).
        do {
            n = SharedSize(obj);
            if (n == 0) return is_list ? PyList_New(0) : PyTuple_New(0);  // nothing to map
            // Making it can run the cyclic GC, whose finalizers may change a list: the size is
            // read again where the items are copied (CopyItemsIfSize: one step, in a list's
            // critical section on free-threaded builds, where another thread may resize it
            // too), and nothing from then to the end of the copy runs Python code.
            out = Ref(is_list ? NewList(n) : PyTuple_New(n));
            if (!out) return nullptr;
            PyObject_GC_UnTrack(out.get());
            slots = is_list ? reinterpret_cast<PyListObject*>(out.get())->ob_item
                            : reinterpret_cast<PyTupleObject*>(out.get())->ob_item;
        } while (!CopyItemsIfSize(obj, n, slots));
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject*& slot = slots[i];  // `out` is ours alone and never resized: stays valid
            // Replaced since the walk reached the list: the item as it is now. The new one is
            // held before the old one is released (which can run a finalizer).
#ifdef Py_GIL_DISABLED
            // Taken with a reference (ListItemRef): another thread may replace it meanwhile.
            if (is_list) {
                if (PyObject* now = ListItemRef(obj, i)) {
                    if (now != slot) {
                        Py_SETREF(slot, now);
                    } else {
                        Py_DECREF(now);  // the slot holds it too: frees nothing
                    }
                }
            }
#else
            if (is_list && i < PyList_GET_SIZE(obj) && PyList_GET_ITEM(obj, i) != slot) {
                Py_SETREF(slot, Py_NewRef(PyList_GET_ITEM(obj, i)));
            }
#endif
            // Sibling dicts follow one another in parameter trees: overlap the next one's miss
            // (the copy's item: owned here, where the list's could be freed by another thread).
            if (i + 1 < n) PrefetchDictEntries(slots[i + 1]);
            PyObject* mapped = Visit(slot);
            if (mapped == nullptr) return nullptr;  // a flatten error; `out` releases the rest
            Py_SETREF(slot, mapped);
        }
        if (failed()) return Stopped();
        PyObject_GC_Track(out.get());  // complete: from here on an ordinary container
        return out.release();
    }

    // Plain dicts: the gathered items' values replaced in place, the dict rebuilt from them.
    PyObject* MapDict(PyObject* obj) {
        RecursionGuard guard(thread_, kFlattenRecursionWhere);
        if (!guard.ok()) return nullptr;
        Items items;  // owned (key, value) pairs, in sorted-key order
        // Each value as jaxlib reads it: looked up again once a flatten callback (or a Python
        // key sort) has run inside this dict (read::Values says why); f's own calls do not count
        // (JAX runs it later).
        const uint64_t epoch = UserCodeEpoch();
        if (!GatherDictItems(obj, items, /*wrap_error=*/true, /*read_again=*/false)) return nullptr;
        const size_t n = items.size();
        Item* const pairs = items.begin();  // `items` is ours alone and never resized below
        for (size_t i = 0; i < n; ++i) {
            if (UserCodeEpoch() != epoch && !ReadValueAgain(obj, pairs[i])) {
                ReleaseItems(items, 0);
                return nullptr;
            }
            // Sibling dicts follow one another in parameter trees: overlap the next one's miss.
            if (i + 1 < n) PrefetchDictEntries(pairs[i + 1].value);
            PyObject* mapped = Visit(pairs[i].value);
            if (mapped == nullptr) {
                ReleaseItems(items, 0);
                return nullptr;
            }
            Py_SETREF(pairs[i].value, mapped);
        }
        if (!kinds::read::DictSizeKept(obj, n, epoch) || failed()) {
            ReleaseItems(items, 0);
            return failed() && !PyErr_Occurred() ? Stopped() : nullptr;
        }
        // Insertion in sorted-key order, as JAX's unflatten does. `out` is raw, released by hand
        // on the one failing path: this runs for every dict of the tree, and a Ref live across
        // the insertions added unwinding code to the per-node visit (nothing here throws).
        PyObject* out = _PyDict_NewPresized(static_cast<Py_ssize_t>(n));
        if (out == nullptr) {
            ReleaseItems(items, 0);
            return nullptr;
        }
        for (size_t i = 0; i < n; ++i) {
            if (PyDict_SetItem(out, pairs[i].key, pairs[i].value) < 0) {
                DropKeys(pairs, i);      // the inserted pairs' (their values are out's)
                ReleaseItems(items, i);  // the rest; `pairs` is not read after this
                Py_DECREF(out);
                return nullptr;
            }
            // `out` holds the mapped value now, so this drop frees nothing and runs no Python
            // code while `out` is incomplete. (A key may not be held: a key whose __eq__ changed
            // can meet an equal one in `out`. The keys are dropped once `out` is complete.)
            Py_DECREF(pairs[i].value);
        }
        DropKeys(pairs, n);
        items.Forget();  // every pair handed on or dropped
        return out;
    }

    // Drops the first `n` pairs' keys (their values handed on already). Inline, one loop per
    // dict: the pairs' general release (Items::Release) was a call per dict and a branch per key.
    static void DropKeys(const Item* pairs, size_t n) {
        for (size_t i = 0; i < n; ++i) Py_DECREF(pairs[i].key);
    }

    // Any other kind: read by flatten's own code (kinds::Read, with this mapper as the walk:
    // each child is mapped as it is reached) and rebuilt by unflatten's (kinds::Build, in
    // Finish). A new reference, or null with a flatten error set.
    PyObject* MapByReading(PyObject* obj, const Registration* reg) {
        const Mark mark = Begin();
        if (!kinds::Read(*this, obj, reg)) {
            Unwind(mark);
            return nullptr;
        }
        PyObject* out = outputs_.back();  // what Finish pushed
        outputs_.pop_back();
        return out;
    }

    // ---- the walk's hooks for kinds::Read (see kinds_read.h): a treedef-less flatten whose
    // nodes are rebuilt from their mapped children as soon as they are read.

    static constexpr bool kDef = true;  // node data is read: the rebuild needs it
    static constexpr bool kPaths = false;
    static constexpr bool kLeafDicts = false;  // every child is visited (kinds_read.h)
    static constexpr bool kCountsLeaves = false;

    struct Mark {
        size_t outputs;
        size_t keys;
    };
    Mark Begin() const { return Mark{outputs_.size(), keys_.size()}; }
    PyThreadState* Thread() const { return thread_; }

    // Inlined into each kind's Read, as the Flattener's Child is: as a call (GCC's choice for the
    // borrowed-child case of tuples and custom nodes), a custom-node model's tree_map ran 1.7%
    // more instructions than before the kinds layer.
    template <bool kOwned = false>
    [[gnu::always_inline]] bool Child(PyObject* child, PyObject* /*key*/) {
        MaybeOwned<kOwned> held(child);
        PyObject* mapped = Visit(child);
        if (mapped == nullptr) return false;
        PushOwned(outputs_, mapped);
        return true;
    }

    bool AddLeaf(PyObject* obj) { return Child(obj, nullptr); }

    // Rebuilds the node from the mapped children on top of the output stack (or, f having
    // failed, leaves a placeholder: no unflatten function sees a half-mapped subtree).
    bool Finish(NodeKind kind, Mark mark, Py_ssize_t arity, PyObject* node_data = nullptr,
                const Registration* custom = nullptr, Py_ssize_t keys_begin = 0) {
        Ref data(node_data);
        NodeParts parts;
        parts.kind = kind;
        parts.arity = arity;
        parts.data = data.get();
        parts.custom = custom;
        if (keys_.size() > mark.keys) parts.keys = keys_.data() + keys_begin;  // a dict's
        // Only this function touches `outputs_` until the children are consumed (a mapper is
        // never re-entered: a nested tree_map has its own), so the pointer stays valid across
        // the rebuild's Python code.
        PyObject** children = outputs_.data() + mark.outputs;
        PyObject* built;
        if (failed()) {
            kinds::DropChildren(children, arity);
            built = Py_NewRef(Py_None);
        } else {
            built = kinds::Build(parts, children);  // consumes the children
        }
        outputs_.erase(outputs_.begin() + static_cast<std::ptrdiff_t>(mark.outputs),
                       outputs_.end());
        ReleaseKeys(mark.keys);
        if (built == nullptr) return false;
        PushOwned(outputs_, built);
        return true;
    }

    // Moves a dict's sorted keys onto the key stack, where they are held until its Finish;
    // their position. The items keep them as borrowed pointers (Items::HandKeysTo), for
    // read::Values, which is done with them before that Finish.
    Py_ssize_t TakeDictKeys(Items& items) {
        return static_cast<Py_ssize_t>(items.HandKeysTo(keys_));
    }

    aux::Site Site() const { return aux::Site{root_}; }

 private:
    // Drops what a failed read left on the stacks above `mark`.
    void Unwind(Mark mark) {
        while (outputs_.size() > mark.outputs) {  // each leaves the stack before its release
            Ref out(outputs_.back());
            outputs_.pop_back();
        }
        ReleaseKeys(mark.keys);
    }
    void ReleaseKeys(size_t from) {
        while (keys_.size() > from) {  // each leaves the stack before its release
            Ref key(keys_.back());
            keys_.pop_back();
        }
    }

    // Identity-preserving nodes: mapped once; every later occurrence gets that same output.
    PyObject* VisitShared(PyObject* obj, const Registration* reg) {
        if (!identity_) identity_.emplace();
        size_t entry;
        Py_ssize_t output = 0;
        switch (identity_->Enter(obj, &entry, &output)) {
            case IdentitySeen::Met::kInProgress:
                return RaiseCycle();
            case IdentitySeen::Met::kBefore:
                return Py_NewRef(identity_outputs_[static_cast<size_t>(output)]);
            case IdentitySeen::Met::kFirst:
                break;
        }
        PyObject* out = MapByReading(obj, reg);
        if (out == nullptr) return nullptr;
        identity_->Finish(entry, static_cast<Py_ssize_t>(identity_outputs_.size()));
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

    PyObject* f_;     // borrowed
    PyObject* root_;  // borrowed: the tree being mapped
    // The type of the leaves f was last called on: a parameter tree's leaves are mostly of one
    // type.
    registry::KnownPlainLeafType leaf_type_;
    PyThreadState* const thread_ = PyThreadState_Get();  // for the recursion guards
    // f's exception, held while the walk looks for a flatten error that would win over it; Run
    // makes it current again.
    SavedError f_error_;
    // Identity-preserving objects met so far, each with the index of its output in
    // identity_outputs_. Made on first use only.
    std::optional<IdentitySeen> identity_;
    RefVector identity_outputs_;  // owned
    // MapByReading's stacks: the mapped children of the nodes being read (owned, popped by
    // Finish) and the sorted keys of the dicts among them (owned).
    RefVector outputs_;
    RefVector keys_;
};

}  // namespace

PyObject* MapSinglePass(PyObject* f, PyObject* tree) {
    SinglePassMapper mapper(f, tree);
    return mapper.Run();
}

}  // namespace fastree
