// Flatten: tree -> leaves (+ treedef, + key paths), in one recursive pass.
//
// One template serves every entry point; kDef/kPaths/kLeaves switch off what a caller does not
// need, so tree_leaves builds no treedef, tree_flatten creates no key objects and tree_structure
// keeps no leaves.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "diagnostics/aux_check.h"
#include "registry/dict_items.h"
#include "registry/keys.h"
#include "treedef/identity_seen.h"
#include "treedef/kinds_read.h"
#include "registry/registry_state.h"
#include "util/path_stack.h"
#include "util/pyutils.h"
#include "util/scratch.h"
#include "treedef/treedef.h"
#include "treedef/walkers.h"

namespace fastree {
namespace {

// keystr(path): JAX's key entries print as their path segment.
std::string KeyStr(const std::vector<PyObject*>& path) {
    std::string out;
    for (PyObject* key : path) {
        if (!StrInto(key, &out)) {
            PyErr_Clear();
            out += "<?>";
        }
    }
    return out;
}

// kLeavesMode false: the leaves are counted, not kept (tree_structure). Collecting them only to
// release them after the walk cost a reference count update per leaf on the way in and a second,
// cache-cold pass over every leaf on the way out.
template <bool kDefMode, bool kPathsMode, bool kLeavesMode = true>
class Flattener {
    static_assert(kLeavesMode || (kDefMode && !kPathsMode), "only the structure is walked bare");

 public:
    Flattener(PyObject* is_leaf, bool is_leaf_takes_path, TreeDef* def,
              std::vector<PyObject*>* leaves, std::vector<PyObject*>* paths,
              bool one_level = false)
        : one_level_(one_level),
          is_leaf_(is_leaf),
          is_leaf_takes_path_(is_leaf_takes_path),
          def_(def),
          leaves_(leaves),
          paths_(paths) {}

    // `report_root`: the whole tree, when `root` is only part of it (aux-data reports locate
    // the offending node from there).
    bool Run(PyObject* root, PyObject* report_root = nullptr) {
        root_ = report_root != nullptr ? report_root : root;
        return Visit(root);
    }

    // A cycle through identity-preserving nodes was found without key paths to name it.
    bool cycle_wants_path() const { return cycle_wants_path_; }

    // Visits one object. kOwned: `obj` is a reference the caller gives up (a list item or dict
    // value the walk took): a leaf keeps it, which saves a second INCREF and the caller's DECREF
    // on every leaf; a node drops it after its visit. The reference travels by value, never by
    // address: a held reference whose address is taken must live in the caller's frame, and on
    // a 500-deep tree every byte of frame is written once per level.
    template <bool kOwned = false>
    [[gnu::always_inline]] bool Visit(PyObject* obj) {
        MaybeOwned<kOwned> held(obj);
        if (is_leaf_ != nullptr) {
            int leaf = CallIsLeaf(obj);
            if (leaf < 0) return false;
            if (leaf) return AddLeaf(held);
        }
        const Registration* reg = registry::Classify(obj);
        // Leaves (most of any tree) are handled here, inline in the parent's loop; everything
        // else goes through VisitNode, whose large frame only containers pay for.
        if (reg->IsLeaf()) return registry::CheckLeaf(reg, obj) && AddLeaf(held);
        return VisitNode(obj, reg);
    }

 private:
    // Every node kind is read by its own code (kinds_read.h), which calls back into the hooks
    // below. Out of line: leaves, handled in Visit, never pay for a node's frame.
    [[gnu::noinline]] bool VisitNode(PyObject* obj, const Registration* reg) {
        if (reg->preserve_identity) return VisitShared(obj, reg);
        return kinds::Read(*this, obj, reg);
    }

 public:
    // ---- the hooks the kinds' Read functions call (see kinds_read.h)

    static constexpr bool kDef = kDefMode;
    static constexpr bool kPaths = kPathsMode;

    // The calling thread's state, read once: each level's RecursionGuard uses it.
    PyThreadState* Thread() const { return thread_; }

    // Where a node's children start: leaves and nodes so far.
    struct Mark {
        size_t leaves;
        size_t nodes;
    };
    Mark Begin() const { return Mark{LeafCount(), kDef ? def_->nodes.size() : 0}; }

    // Appends the node for a container whose children have just been visited (kDef only).
    // `node_data` is stolen.
    // Inlined into each caller, with everything it calls inlined into it: as calls, the
    // vector's emplace_back and then this itself were a tenth of the walk's instructions.
    // (Out of line it cost a big sorted dict 8% and gained a 500-deep tree nothing measurable.)
    [[gnu::always_inline, gnu::flatten]] bool Finish(NodeKind kind, Mark mark, Py_ssize_t arity,
                                                     PyObject* node_data = nullptr,
                                                     const Registration* custom = nullptr,
                                                     Py_ssize_t keys_begin = 0) {
        // Filled in place: a Node assembled on the stack from narrow stores and then copied with
        // wide loads stalls on store forwarding, once per node.
        Ref data(node_data);  // owned until the payload table holds it
        Node& node = def_->AppendNode();
        node.kind = kind;
        node.arity = static_cast<Count>(arity);
        node.num_leaves = static_cast<Count>(LeafCount() - mark.leaves);
        node.num_nodes = static_cast<Count>(def_->nodes.size() - mark.nodes);  // incl. this one
        if (HasPayload(kind)) {
            node.payload = def_->AddPayload(data.get(), custom);
            data.release();
        } else {
            node.keys_begin = static_cast<Count>(keys_begin);
        }
        return true;
    }

    // Whether visiting a plain leaf does nothing but append it (and, building a treedef, its
    // leaf node): no is_leaf to call, no key path to extend, no one-level cut. Read by dicts
    // (DictKind::Read, kinds_read.h) to take a dict of plain leaves in one step.
    static constexpr bool kLeafDicts = !kPaths;
    bool LeafDictsApply() const { return is_leaf_ == nullptr && !one_level_; }
    // The walk's plain leaf type, for the dicts' check that every value is one.
    registry::KnownPlainLeafType& PlainLeafType() { return plain_leaf_type_; }

    // A dict whose gathered values, in sorted-key order, are all plain leaves: appends them as
    // leaves and empties `items`; building a treedef, also the dict's keys, a leaf node per value
    // and the dict's node, exactly the nodes its visit would have made. Visiting a plain leaf
    // runs no Python code, so nothing can change the dict meanwhile: the borrowed pairs of a GIL
    // build are referenced here (keys only where a treedef keeps them), the owned pairs of a
    // free-threaded build (kGatheredOwned) handed on (keys released where none is kept).
    // The space is made first: what may throw (std::bad_alloc) throws before any reference is
    // taken or handed on. For a transformer's parameters, most dicts ({"bias", "kernel"}, a
    // layer norm's) take this path; visiting each value as a child cost flatten a fifth of its
    // time there.
    // (Flattened: as calls, the vectors' push_backs and reserves were a tenth of flattening a
    // list of such dicts.)
    [[gnu::flatten]] bool AddLeafDict(Items& items, Mark mark) {
        const size_t n = items.size();
        try {
            if constexpr (kLeavesMode) ReserveMore(*leaves_, n);
            if constexpr (kDef) {
                ReserveMore(def_->keys, n);
                ReserveMore(def_->nodes, n + 1);
            }
        } catch (...) {
            DropGathered(items);
            throw;
        }
        const size_t keys_begin = kDef ? def_->keys.size() : 0;
        for (Item& item : items) {
            if constexpr (kLeavesMode) {
                leaves_->push_back(kGatheredOwned ? item.value : Py_NewRef(item.value));
            } else if constexpr (kGatheredOwned) {
                // Only counted. The dict holds it too, unless another thread dropped it: the
                // release may then run a finalizer, which can reach nothing of this walk's.
                Py_DECREF(item.value);
            }
            item.value = nullptr;
            if constexpr (kDef) {
                def_->keys.push_back(kGatheredOwned ? item.key : Py_NewRef(item.key));
                item.key = nullptr;
                def_->AppendLeaf();
            }
        }
        if constexpr (kGatheredOwned && !kDef) items.Release(0);  // the keys
        items.Forget();
        if constexpr (!kLeavesMode) num_leaves_ += n;
        if constexpr (kDef) {
            return Finish(kinds::DictKind::kKind, mark, static_cast<Py_ssize_t>(n), nullptr,
                          nullptr, static_cast<Py_ssize_t>(keys_begin));
        }
        return true;
    }

    static constexpr bool kCountsLeaves = !kLeavesMode;
    // A list item the walk only counts: with leaves not kept, no is_leaf and no one-level cut, a
    // plain leaf (its type memoised so: nothing runs) is counted and its leaf node appended here,
    // with no reference taken. Otherwise false: the item is visited as usual. (A list's reader
    // takes a reference around each item's visit; counted and released at once, on 3.12+ the
    // Py_DECREF's 64-bit load of the count cannot be forwarded from the Py_INCREF's 32-bit store
    // just before it: tree_structure of 1,000 lists of 10 floats read slower than tree_flatten.)
    [[gnu::always_inline]] bool CountedPlainLeaf(PyObject* item) {
        if constexpr (kLeavesMode) {
            return false;
        } else {
            if (is_leaf_ != nullptr || one_level_) return false;
            if (registry::ClassifyCached(item) != &registry::kLeaf) return false;
            return AddLeaf(item);  // borrowed: counted, its leaf node appended
        }
    }

    // Moves a dict's sorted keys into the treedef (kDef only); returns where they start. The
    // items keep them as borrowed pointers (Items::HandKeysTo): Values makes each one's key
    // entry, or reads its value again, while the treedef holds them.
    Py_ssize_t TakeDictKeys(Items& items) {
        return static_cast<Py_ssize_t>(items.HandKeysTo(def_->keys));
    }

 private:
    [[gnu::noinline]] int CallIsLeaf(PyObject* obj) {
        NoteUserCode();
        Ref r;
        if (is_leaf_takes_path_) {
            Ref path(PathTuple());
            if (!path) return -1;
            PyObject* args[2] = {path.get(), obj};
            r = Ref(PyObject_Vectorcall(is_leaf_, args, 2, nullptr));
        } else {
            r = Ref(PyObject_CallOneArg(is_leaf_, obj));
        }
        if (!r) return -1;
        // JAX accepts exactly True, False and None (as False).
        PyObject* v = r.get();
        int truth = v == Py_True ? 1 : (v == Py_False || v == Py_None) ? 0 : -1;
        if (truth < 0) {
            PyErr_Format(PyExc_ValueError,
                         "is_leaf predicate returned a non-boolean value %R; expected a boolean", v);
        }
        return truth;
    }

 public:
    // Appends a leaf. A borrowed one gets a new reference; a held one moves into the leaf list.
    template <bool kOwned>
    [[gnu::always_inline]] bool AddLeaf(MaybeOwned<kOwned>& obj) {
        if constexpr (kPaths) {
            Ref path(PathTuple());
            if (!path) return false;
            Ref pair(PyTuple_Pack(2, path.get(), obj.get()));
            if (!pair) return false;
            paths_->push_back(pair.get());  // may throw: the Ref still owns the pair then
            pair.release();
        }
        // The slot exists before the reference is handed over, so a throwing push_back leaks
        // nothing. Only counted, a held leaf is released by `obj` when its visit ends.
        if constexpr (kLeavesMode) {
            PushBackInline(*leaves_, obj.get());
            obj.HandOver();
        } else {
            ++num_leaves_;
        }
        if constexpr (kDef) def_->AppendLeaf();
        return true;
    }
    bool AddLeaf(PyObject* obj) {
        MaybeOwned<false> borrowed(obj);
        return AddLeaf(borrowed);
    }

    // Visits one child; `key` is a new reference to its path entry (only in kPaths mode).
    // kOwned: as for Visit, `child` is a reference given up by the caller.
    // Inlined into each kind's Read, in every mode. With key paths, as a call, the path push/pop
    // around every child cost flatten_with_path 10-15% on parameter trees. Without, GCC kept the
    // borrowed-child instance (tuples, custom nodes) as a call, one more frame per tuple level:
    // inlined, a 500-deep tree's flatten and structure run 4% faster, a custom-node model's 3%
    // (scripts/ab_builds.py against the build before).
    template <bool kOwned = false>
    [[gnu::always_inline]] bool Child(PyObject* child, PyObject* key) {
        if constexpr (kPaths) {
            if (key == nullptr) {
                if constexpr (kOwned) Py_DECREF(child);
                return false;
            }
            path_.Push(key);
        } else {
            (void)key;
        }
        bool ok;
        if (one_level_) {
            MaybeOwned<kOwned> held(child);
            ok = AddLeaf(held);
        } else {
            ok = Visit<kOwned>(child);
        }
        if constexpr (kPaths) path_.Pop();
        return ok;
    }

    // Where the node being visited sits, for an aux_data report: its key path when this walk
    // keeps one, else the is_leaf that shaped the walk (a path-taking one cannot be replayed).
    aux::Site Site() const {
        aux::Site site{root_};
        // A one-level walk's path starts at its node, not at the tree being reported on.
        if (one_level_) return site;
        if constexpr (kPaths) {
            site.path = &path_;
        } else {
            if (!is_leaf_takes_path_) site.is_leaf = is_leaf_;
        }
        return site;
    }

 private:
    PyObject* PathTuple() { return path_.NewTuple(); }

    size_t LeafCount() const {
        if constexpr (kLeavesMode) return leaves_->size();
        return num_leaves_;
    }

    // ---- identity-preserving nodes

    // The first occurrence of an identity-preserving object is flattened as usual; later ones
    // become kSharedRef nodes (and contribute no leaves).
    bool VisitShared(PyObject* obj, const Registration* reg) {
        if (!seen_) seen_.emplace();
        size_t entry;
        Py_ssize_t first = 0;
        switch (seen_->Enter(obj, &entry, &first)) {
            case IdentitySeen::Met::kInProgress:
                return RaiseCycle(obj);
            case IdentitySeen::Met::kBefore:
                if constexpr (kDef) def_->AppendSharedRef(first);
                return true;
            case IdentitySeen::Met::kFirst:
                break;
        }
        if constexpr (kPaths) EntryDepth()[obj] = path_.size();
        if (!kinds::Read(*this, obj, reg)) return false;
        seen_->Finish(entry, kDef ? def_->num_nodes() - 1 : 0);
        return true;
    }

    bool RaiseCycle(PyObject* obj) {
        if constexpr (kPaths) {
            std::vector<PyObject*> outer(path_.entries().begin(),
                                        path_.entries().begin() + EntryDepth()[obj]);
            std::string outer_path = KeyStr(outer);
            std::string inner_path = KeyStr(path_.entries());
            PyErr_Format(PyExc_ValueError,
                         "Reference cycle through an identity-preserving node: the %R at key "
                         "path %s contains itself (again at key path %s).",
                         reinterpret_cast<PyObject*>(Py_TYPE(obj)),
                         outer_path.empty() ? "()" : outer_path.c_str(), inner_path.c_str());
        } else {
            cycle_wants_path_ = true;
            PyErr_Format(PyExc_ValueError,
                         "Reference cycle through an identity-preserving node: a %R contains "
                         "itself.",
                         reinterpret_cast<PyObject*>(Py_TYPE(obj)));
        }
        return false;
    }

    bool one_level_;  // flatten_one_level: every child of the root is taken as a leaf
    PyObject* root_ = nullptr;  // borrowed: the tree being flattened (for aux-data reports)
    bool cycle_wants_path_ = false;
    PyObject* is_leaf_;
    bool is_leaf_takes_path_;
    TreeDef* def_;
    std::vector<PyObject*>* leaves_;  // null when !kLeavesMode
    size_t num_leaves_ = 0;           // the leaves met, when !kLeavesMode
    std::vector<PyObject*>* paths_;
    PyThreadState* const thread_ = PyThreadState_Get();  // for the recursion guards
    registry::KnownPlainLeafType plain_leaf_type_;  // PlainLeafType()
    PathStack path_;  // key entries from the root to the current node
    // Key entries past the index cache live as long as some key-path walk does (keys.h).
    struct NoScope {};
    std::conditional_t<kPaths, keys::WalkScope, NoScope> key_scope_;
    // Identity-preserving objects met so far, each with the index of its node. Made on first
    // use only: a flatten with no such node never takes a table.
    std::optional<IdentitySeen> seen_;
    // kPaths only: depth of path_ at which each identity-preserving object was entered, so a
    // cycle error can name both the object's key path and where it reappears.
    // Allocated on first use, like seen_: a flatten with no such node never pays for a map.
    std::unique_ptr<std::unordered_map<PyObject*, size_t>> entry_depth_;
    std::unordered_map<PyObject*, size_t>& EntryDepth() {
        if (!entry_depth_) entry_depth_ = std::make_unique<std::unordered_map<PyObject*, size_t>>();
        return *entry_depth_;
    }
};

template <bool kDef, bool kPaths, bool kLeaves = true>
bool Run(PyObject* tree, PyObject* is_leaf, bool takes_path, TreeDef* def,
         std::vector<PyObject*>* leaves, std::vector<PyObject*>* paths,
         bool* cycle_wants_path) {
    Flattener<kDef, kPaths, kLeaves> f(is_leaf, takes_path, def, leaves, paths);
    bool ok = f.Run(tree);
    *cycle_wants_path = f.cycle_wants_path();
    return ok;
}

}  // namespace

bool FlattenOneLevel(PyObject* node, TreeDef* def, std::vector<PyObject*>* children,
                     std::vector<PyObject*>* paths, PyObject* report_root) {
    if (paths != nullptr) {
        Flattener<true, true> f(nullptr, false, def, children, paths, /*one_level=*/true);
        return f.Run(node, report_root);
    }
    Flattener<true, false> f(nullptr, false, def, children, nullptr, /*one_level=*/true);
    return f.Run(node, report_root);
}

namespace {

// Flattens into `def` as it is (null: no treedef), then redoes a failed walk that hit a cycle with
// key paths, so that the error can say where the cycle closes.
bool FlattenInto(PyObject* tree, PyObject* is_leaf, bool is_leaf_takes_path, TreeDef* def,
                 std::vector<PyObject*>* leaves, std::vector<PyObject*>* paths) {
    bool ok;
    bool cycle = false;  // a cycle error that a walk with key paths can describe better
    if (def != nullptr) {
        ok = paths    ? Run<true, true>(tree, is_leaf, is_leaf_takes_path, def, leaves, paths, &cycle)
             : leaves ? Run<true, false>(tree, is_leaf, is_leaf_takes_path, def, leaves, paths, &cycle)
                      : Run<true, false, false>(tree, is_leaf, is_leaf_takes_path, def, nullptr,
                                                nullptr, &cycle);
        if (ok && (def->nodes.size() > INT32_MAX || def->keys.size() > INT32_MAX)) {
            PyErr_SetString(PyExc_OverflowError, "pytree has more than 2**31 - 1 nodes");
            ok = false;
        }
    } else {
        ok = paths ? Run<false, true>(tree, is_leaf, is_leaf_takes_path, def, leaves, paths, &cycle)
                   : Run<false, false>(tree, is_leaf, is_leaf_takes_path, def, leaves, paths, &cycle);
    }
    if (!ok && cycle) {
        SavedError first;  // kept if the walk with key paths unexpectedly succeeds
        first.Save();
        RefVector scratch_leaves, scratch_paths;
        bool again = Run<false, true>(tree, is_leaf, is_leaf_takes_path, nullptr, &scratch_leaves,
                                      &scratch_paths, &cycle);
        if (again) first.Restore();  // else its own error (the cycle, with paths) stands
    }
    return ok;
}

}  // namespace

bool Flatten(PyObject* tree, PyObject* is_leaf, bool is_leaf_takes_path, TreeDef* def,
             std::vector<PyObject*>* leaves, std::vector<PyObject*>* paths) {
    if (def == nullptr) return FlattenInto(tree, is_leaf, is_leaf_takes_path, nullptr, leaves, paths);
    // Nodes are collected in a warm, pooled buffer; the treedef then gets an exactly sized copy
    // (no slack kept alive, no growth copies, no per-call page faults).
    NodeScratch node_buf;
    def->nodes.swap(node_buf.get());
    bool ok = FlattenInto(tree, is_leaf, is_leaf_takes_path, def, leaves, paths);
    NodeVector exact(def->nodes.begin(), def->nodes.end());
    def->nodes.swap(exact);
    node_buf.get().swap(exact);  // the pooled buffer goes back to the pool
    return ok;
}

bool Flatten(PyObject* tree, PyObject* is_leaf, bool is_leaf_takes_path, ScratchTreeDef* def,
             std::vector<PyObject*>* leaves, std::vector<PyObject*>* paths) {
    return FlattenInto(tree, is_leaf, is_leaf_takes_path, &def->def, leaves, paths);
}

}  // namespace fastree
