// Reading an object of each kind: how flatten (and flatten_one_level, and tree_map's walk) take
// a node apart. Each kind's Read<Walk> is declared in its struct (node_kinds.h) and defined here.
//
// A Read visits the node's children through the walk and then reports the node. What it asks of
// `Walk` (the Flattener in flatten.cpp):
//   Walk::kDef, Walk::kPaths   whether a treedef / key paths are being built (node data and key
//                              entries are made only when wanted)
//   w.Begin()                  a Mark: the walk's position before the node's children
//   w.Thread()                 the calling thread's state (PyThreadState_Get(), read once per walk),
//                              for the RecursionGuard each Read holds
//   w.Child<kOwned>(c, key)    visits child `c` (borrowed, or owned and given up if kOwned) under
//                              key entry `key` (a new reference; null in kPaths mode = error)
//   w.Finish(kind, mark, arity, node_data, custom, keys_begin)
//                              appends the node (node_data stolen; keys_begin for dicts);
//                              false with an error set if that fails (tree_map's rebuild can)
//   w.TakeDictKeys(items)      kDef: moves a dict's sorted keys into the treedef; their position
//   Walk::kLeafDicts, w.LeafDictsApply(), w.PlainLeafType(), w.AddLeafDict(items, mark)
//                              whether a dict of plain leaves may be taken in one step, and
//                              taking it (its leaves, keys and nodes)
//   Walk::kCountsLeaves, w.CountedPlainLeaf(item)
//                              whether leaves are only counted (tree_structure), and counting a
//                              list item that is a plain leaf without a reference to it
//   w.Site()                   where the node is, for aux_data reports
//   w.AddLeaf(obj)             the leaf kind
// Every Read holds a RecursionGuard while its children are visited: a tree too deep for the
// interpreter's limit fails with JAX's RecursionError text rather than overflowing the C stack.
#pragma once

#include <Python.h>

#include <algorithm>
#include <vector>

#include "registry/attr_node.h"
#include "diagnostics/aux_check.h"
#include "registry/custom_output.h"
#include "registry/dict_items.h"
#include "registry/jax_texts.h"
#include "registry/keys.h"
#include "registry/registry_state.h"
#include "util/pyutils.h"
#include "treedef/node_kinds.h"
#include "treedef/walkers.h"

namespace fastree {
namespace kinds {
namespace read {

// The keys of gathered (key, value) items, as a new tuple (an OrderedDict's or defaultdict's
// node data).
inline PyObject* KeysTuple(const fastree::Items& items) {
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
    if (t == nullptr) return nullptr;
    for (size_t i = 0; i < items.size(); ++i) {
        PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), Py_NewRef(items[i].key));
    }
    return t;
}

// The DictKey entries of a wide dict not cached yet, made in one block.
inline bool ReserveDictKeys(const fastree::Items& items) {
    if (items.size() < 8) return true;
    std::vector<PyObject*> names;  // borrowed from `items`, which owns them
    names.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) names.push_back(items[i].key);
    return keys::ReserveDict(names.data(), static_cast<Py_ssize_t>(names.size()));
}

// Visits gathered (key, value) items in order, consuming them. `items` itself is not touched by
// the visits (it is the caller's frame's), so its storage is read once. The pairs are handled
// raw, per item of every dict: `items` owns them, each is nulled as it is handed on or released,
// and on failure ReleaseItems drops the rest.
//
// `dict`: the dict the items were gathered from, or null. jaxlib reads a dict's value when it
// reaches its key (tests/test_dict_read_order.py): once code JAX also runs mid-walk has run since
// `epoch` (UserCodeEpoch() before the gathering: an is_leaf or custom flatten that pops or
// replaces a later key, a Python key sort), each later value is looked up again, a key gone
// raising JAX's KeyError. Until then the gathered values are the dict's. Registered mappings
// (defaultdict, OrderedDict) pass null: JAX flattens those in Python, reading every value
// before it recurses.
template <class Walk>
bool Values(Walk& w, fastree::Items& items, PyObject* dict = nullptr, uint64_t epoch = 0) {
    Item* const data = items.begin();
    const size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
        if (dict != nullptr && UserCodeEpoch() != epoch && !ReadValueAgain(dict, data[i])) {
            ReleaseItems(items, i);
            return false;
        }
        if (i + 1 < n) PrefetchDictEntries(data[i + 1].value);
        PyObject* key = nullptr;
        if constexpr (Walk::kPaths) key = keys::Dict(data[i].key);
        PyObject* value = data[i].value;  // the item's reference, handed to the visit
        data[i].value = nullptr;
        bool ok = w.template Child<true>(value, key);
        if (items.keys_owned()) Py_CLEAR(data[i].key);
        if (!ok) {
            ReleaseItems(items, i + 1);
            return false;
        }
    }
    items.clear();
    return true;
}

// Whether every gathered value is a leaf whose visit runs no Python code (a type already
// classified as a plain leaf: no registration to look up, no warning to give). `known`: the
// walk's plain leaf type, asked first and kept up to date (sibling dicts of leaves hold leaves
// of one type: a memo lookup per dict was a sixth of tree_leaves' own work on transformer48).
[[gnu::always_inline]] inline bool AllPlainLeaves(fastree::Items& items,
                                              registry::KnownPlainLeafType& known) {
    for (const Item& item : items) {
        if (known.Holds(item.value)) continue;
        const Registration* reg = registry::ClassifyCached(item.value);  // runs no Python code
        if (reg != &registry::kLeaf) return false;
        known.Remember(item.value, reg, UserCodeEpoch());
    }
    return true;
}

// Whether a dict still has the `n` keys it had when the walk reached it; a RuntimeError if not,
// where the installed JAX rejects such a dict (JaxTexts::dict_grown_mid_walk_raises). jaxlib up
// to 0.10 records a dict's size after walking its values, so a callback that added keys to it
// meanwhile leaves a treedef whose arity exceeds its children (tree_structure and unflatten
// then raise RuntimeError "Too few elements ..."); fastree raises when it happens, naming why,
// rather than build that treedef. Later jaxlib builds the dict as the walk reached it, and so
// does fastree then (the keys and values it gathered). Only walks that build a treedef or an
// output ask.
[[gnu::cold, gnu::noinline]] inline bool DictSizeChanged(Py_ssize_t was, Py_ssize_t now) {
    PyErr_Format(PyExc_RuntimeError,
                 "a dict in the pytree changed size while it was being flattened (%zd keys when "
                 "the walk reached it, %zd now): a callback (is_leaf, a custom node's flatten "
                 "function, a key's __hash__ or __eq__) must not add or remove keys of a dict "
                 "being walked",
                 was, now);
    return false;
}
// `epoch`: UserCodeEpoch() when the dict was reached; no such callback since, no check (a
// single-pass tree_map's f may change the dict: JAX runs f after flattening, unseen).
inline bool DictSizeKept(PyObject* dict, size_t n, uint64_t epoch) {
    if (UserCodeEpoch() == epoch || !Texts().dict_grown_mid_walk_raises) return true;
    const Py_ssize_t now = PyDict_GET_SIZE(dict);
    return now == static_cast<Py_ssize_t>(n) || DictSizeChanged(static_cast<Py_ssize_t>(n), now);
}

// A registered mapping (defaultdict, OrderedDict): its (key, value) items as `gather` collects
// them, in that order; its node data as `node_data_of(obj, items)` makes it (a new reference, or
// null with an error set), only where a treedef is built.
template <NodeKind kKind, class Walk, class Gather, class NodeDataOf>
bool Mapping(Walk& w, PyObject* obj, const Registration* reg, Gather gather,
             NodeDataOf node_data_of) {
    RecursionGuard guard(w.Thread(), kFlattenRecursionWhere);
    if (!guard.ok()) return false;
    const auto mark = w.Begin();
    fastree::Items items;
    if (!gather(obj, items)) return false;
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    Ref node_data;
    if constexpr (Walk::kDef) {
        node_data = Ref(node_data_of(obj, items));
        if (!node_data) return false;
    }
    if (!Values(w, items)) return false;
    if constexpr (Walk::kDef) return w.Finish(kKind, mark, n, node_data.release(), reg);
    return true;
}

// A custom node's children, from the keyless flatten function's output.
template <class Walk>
bool Children(Walk& w, PyObject* children, PyObject* result, Py_ssize_t* arity) {
    if (PyTuple_CheckExact(children)) {  // the common case: no iterator object needed
        const Py_ssize_t n = PyTuple_GET_SIZE(children);
        if constexpr (Walk::kPaths) {
            if (!keys::ReserveFlattenedIndex(n)) return false;
        }
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* key = nullptr;
            if constexpr (Walk::kPaths) key = keys::FlattenedIndex(i);
            if (!w.Child(PyTuple_GET_ITEM(children, i), key)) return false;
        }
        *arity = n;
        return true;
    }
    Ref it(IterChildren(children, result, /*with_keys=*/false));
    if (!it) return false;
    Py_ssize_t i = 0;
    while (Ref child{PyIter_Next(it.get())}) {
        PyObject* key = nullptr;
        if constexpr (Walk::kPaths) key = keys::FlattenedIndex(i);
        if (!w.Child(child.get(), key)) return false;
        ++i;
    }
    if (PyErr_Occurred()) return false;
    *arity = i;
    return true;
}

// A custom node's children, from a with-keys flatten function's ((key, child), ...) output.
template <class Walk>
bool KeyedChildren(Walk& w, PyObject* pairs, PyObject* result, Py_ssize_t* arity) {
    Ref it(IterChildren(pairs, result, /*with_keys=*/true));
    if (!it) return false;
    Py_ssize_t i = 0;
    while (Ref pair{PyIter_Next(it.get())}) {
        if (!CheckKeyChildPair(pair.get())) return false;  // a 2-tuple from here on
        PyObject* key = nullptr;
        if constexpr (Walk::kPaths) key = Py_NewRef(PyTuple_GET_ITEM(pair.get(), 0));
        if (!w.Child(PyTuple_GET_ITEM(pair.get(), 1), key)) return false;
        ++i;
    }
    if (PyErr_Occurred()) return false;
    *arity = i;
    return true;
}


// A node taken apart by a flatten callback `fn` (with_keys: it gives (key, child) pairs), and
// reported as a node of `kind` holding the callback's aux data.
template <class Walk>
bool ViaCallback(Walk& w, PyObject* obj, const Registration* reg, PyObject* fn, bool with_keys,
                 NodeKind kind) {
    const auto mark = w.Begin();
    // Held for the call: JAX's functions are module globals that re-installing the bridge
    // (Python code, which the call itself can run) would release.
    Ref held_fn(Py_NewRef(fn));
    NoteUserCode();
    Ref result(PyObject_CallOneArg(held_fn.get(), obj));
    if (!result) return false;
    PyObject* children;  // both borrowed from `result`, which is immutable (a tuple)
    PyObject* aux;
    if (!SplitFlattenResult(result.get(), with_keys, &children, &aux)) return false;
    if constexpr (Walk::kDef) {  // aux only matters where it enters a treedef
        if (!aux::Check(reg->type, aux, w.Site())) return false;
    }
    Py_ssize_t arity = 0;
    bool ok = with_keys ? KeyedChildren(w, children, result.get(), &arity)
                        : Children(w, children, result.get(), &arity);
    if (!ok) return false;
    if constexpr (Walk::kDef) return w.Finish(kind, mark, arity, Py_NewRef(aux), reg);
    return true;
}

}  // namespace read

// ---- defaults: the leaf, and the treedef-only shared reference

template <class Walk>
bool KindBase::Read(Walk&, PyObject*, const Registration*) {
    PyErr_SetString(PyExc_SystemError, "fastree: this node kind is never read from an object");
    return false;
}

template <class Walk>
bool LeafKind::Read(Walk& w, PyObject* obj, const Registration*) {
    return w.AddLeaf(obj);
}

template <class Walk>
bool NoneKind::Read(Walk& w, PyObject*, const Registration*) {
    if constexpr (Walk::kDef) return w.Finish(kKind, w.Begin(), 0);
    return true;
}

// ---- tuple, namedtuple, list

// Tuples and namedtuples share it (a namedtuple's node data is its class; its children are keyed
// by field name). Out of line: its frame is paid only by tuple levels of a deep tree.
template <class Walk>
[[gnu::noinline]] bool TupleKind::ReadTuple(Walk& w, PyObject* obj, NodeKind kind) {
    RecursionGuard guard(w.Thread(), kFlattenRecursionWhere);
    if (!guard.ok()) return false;
    const auto mark = w.Begin();
    const Py_ssize_t n = PyTuple_GET_SIZE(obj);
    const bool named = kind == NamedTupleKind::kKind;
    Ref fields;
    if constexpr (Walk::kPaths) {
        if (named) {
            // Read from the object, as JAX does (a tuple is a namedtuple by its own `_fields`,
            // see registry.h).
            fields = Ref(PyObject_GetAttrString(obj, "_fields"));
            if (!fields) return false;
            // A hand-made "namedtuple" may carry any _fields: JAX's check and text.
            if (PyObject_Length(fields.get()) != n) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError,
                                "A namedtuple's _fields attribute should have the same size "
                                "as the tuple.");
                return false;
            }
        }
        if (!fields && !keys::ReserveSequence(n)) return false;
    }
    // Tuples are immutable and `obj` is kept alive by the caller: items can be borrowed.
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (i + kPrefetchDistance < n) {  // see ListKind::Read
            PrefetchForWrite(PyTuple_GET_ITEM(obj, i + kPrefetchDistance));
        }
        PyObject* key = nullptr;
        if constexpr (Walk::kPaths) {
            if (fields) {
                Ref item(PySequence_GetItem(fields.get(), i));
                // JAX keys a field by str(name), whatever the name is.
                Ref name(item && !PyUnicode_CheckExact(item.get()) ? PyObject_Str(item.get())
                                                                  : Py_XNewRef(item.get()));
                key = name ? keys::GetAttr(name.get()) : nullptr;
            } else {
                key = keys::Sequence(i);
            }
        }
        if (!w.Child(PyTuple_GET_ITEM(obj, i), key)) return false;
    }
    if constexpr (Walk::kDef) {
        PyObject* node_data =
            named ? Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(obj))) : nullptr;
        return w.Finish(kind, mark, n, node_data);
    }
    return true;
}

template <class Walk>
bool TupleKind::Read(Walk& w, PyObject* obj, const Registration*) {
    return ReadTuple(w, obj, kKind);
}

template <class Walk>
bool NamedTupleKind::Read(Walk& w, PyObject* obj, const Registration*) {
    return TupleKind::ReadTuple(w, obj, kKind);
}

// A list is read as jaxlib reads one: its length when the walk reaches it is its number of
// children, and child i is the item at position i when the walk gets there (a callback that
// replaces items ahead of the walk is seen doing so, one that appends is not). jaxlib reads past
// the end of a list that shrank meanwhile; here that is a RuntimeError (ListShrank). Every walker
// reads lists this way (flatten and its variants, tree_map's single pass), so a list mutated
// during a walk gives one answer, JAX's (tests/test_mutation_during_walk.py; README, "Reliability").
template <class Walk>
bool ListKind::Read(Walk& w, PyObject* obj, const Registration*) {
    RecursionGuard guard(w.Thread(), kFlattenRecursionWhere);
    if (!guard.ok()) return false;
    const auto mark = w.Begin();
    const Py_ssize_t n = PyList_GET_SIZE(obj);
    if constexpr (Walk::kPaths) {
        if (!keys::ReserveSequence(n)) return false;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        // Size and item are read afresh per step: a callback may have changed the list. A
        // reference is held to the item we descend into.
#ifdef Py_GIL_DISABLED
        // Another thread may resize the list or replace its items at any moment: each item is
        // taken with PyList_GetItemRef (ListItemRef), CPython's lock-free read of a shared list,
        // rather than inside one critical section around the loop, which would hide from the
        // walk the changes its own callbacks make (jaxlib's reading, above) and would have to
        // be left around every visit anyway (a visit classifies and runs Python code). No
        // prefetch: reading ahead in the item array outside the list's lock is a data race.
        PyObject* item = ListItemRef(obj, i);
        if (item == nullptr) return ListShrank(n, PyList_GET_SIZE(obj));
#else
        // The hottest loop of the library: on GIL builds the plain reads, as they always were
        // (the GIL makes each read and its INCREF one step).
        if (i >= PyList_GET_SIZE(obj)) return ListShrank(n, PyList_GET_SIZE(obj));
        // The reference taken below misses the cache on every leaf of a big list: ask for the
        // one kPrefetchDistance ahead so the misses overlap (a prefetch never faults).
        if (i + kPrefetchDistance < PyList_GET_SIZE(obj)) {
            PrefetchForWrite(PyList_GET_ITEM(obj, i + kPrefetchDistance));
        }
        // A walk that only counts plain leaves needs no reference to one (runs no Python code).
        if constexpr (Walk::kCountsLeaves) {
            if (w.CountedPlainLeaf(PyList_GET_ITEM(obj, i))) continue;
        }
        PyObject* item = Py_NewRef(PyList_GET_ITEM(obj, i));
#endif
        PyObject* key = nullptr;
        if constexpr (Walk::kPaths) key = keys::Sequence(i);
        if (!w.template Child<true>(item, key)) return false;
    }
    if constexpr (Walk::kDef) return w.Finish(kKind, mark, n);
    return true;
}

// ---- dict, defaultdict, OrderedDict
//
// The three are kept out of line, with their item buffers (~160 bytes): inlined, those buffers
// sat in the walk's node frame at every level of a deep tree, and on a 500-deep tree the extra
// stack written per call was most of a 6-9% slowdown.

template <class Walk>
[[gnu::noinline]] bool DictKind::Read(Walk& w, PyObject* obj, const Registration*) {
    const auto mark = w.Begin();
    fastree::Items items;
    const uint64_t epoch = UserCodeEpoch();  // before a Python key sort can move it
    bool sorted;
    // Borrowed pairs on GIL builds, owned on free-threaded ones (GatherItems, dict_items.h):
    // either way nothing below reads the dict's own entries again, but through ReadValueAgain.
    if (!GatherItems(obj, items, &sorted)) return false;
    if constexpr (Walk::kLeafDicts) {
        // A dict whose values are all plain leaves (a layer's kernel and bias) is taken in one
        // step (Walk::AddLeafDict): visiting a plain leaf with no is_leaf runs no Python code,
        // so nothing can change the dict before the last value is taken. tree_leaves then never
        // touches the keys' reference counts: two updates per key were most of its distance
        // from a minimal C walk on a transformer's parameters (docs/performance-history.md).
        // (Free-threaded: the pairs are owned, so the classification here reads no object
        // another thread can free.)
        if (sorted && w.LeafDictsApply() && read::AllPlainLeaves(items, w.PlainLeafType())) {
            return w.AddLeafDict(items, mark);
        }
    }
    // A level of the walk from here, whose values are visited (a dict of leaves taken in one
    // step above visits nothing, as a leaf is not a level: 14 instructions of each such dict).
    // Refused, the gathered pairs are dropped as gathered (borrowed on GIL builds: the items'
    // own release would take references the walk never had).
    RecursionGuard guard(w.Thread(), kFlattenRecursionWhere);
    if (!guard.ok()) {
        DropGathered(items);
        return false;
    }
    // Anything else: owned pairs, read one by one below.
    if (!OwnGatheredItems(obj, items, sorted, /*wrap_error=*/true, /*read_again=*/false)) {
        return false;
    }
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    if constexpr (Walk::kPaths) {
        if (!read::ReserveDictKeys(items)) return false;
    }
    // This dict's key slots come first: its children's keys are appended after them.
    Py_ssize_t keys_begin = 0;
    if constexpr (Walk::kDef) keys_begin = w.TakeDictKeys(items);
    if (!read::Values(w, items, obj, epoch)) return false;
    if constexpr (Walk::kDef) {
        if (!read::DictSizeKept(obj, static_cast<size_t>(n), epoch)) return false;
        return w.Finish(kKind, mark, n, nullptr, nullptr, keys_begin);
    }
    return true;
}

template <class Walk>
[[gnu::noinline]] bool DefaultDictKind::Read(Walk& w, PyObject* obj, const Registration* reg) {
    auto gather = [](PyObject* dict, Items& items) {
        return GatherDictItems(dict, items, /*wrap_error=*/false);
    };
    auto node_data = [](PyObject* dict, const Items& items) -> PyObject* {
        Ref factory(PyObject_GetAttrString(dict, "default_factory"));
        Ref keys(factory ? read::KeysTuple(items) : nullptr);
        return keys ? PyTuple_Pack(2, factory.get(), keys.get()) : nullptr;
    };
    return read::Mapping<kKind>(w, obj, reg, gather, node_data);
}

template <class Walk>
[[gnu::noinline]] bool OrderedDictKind::Read(Walk& w, PyObject* obj, const Registration* reg) {
    auto node_data = [](PyObject*, const Items& items) {
        return read::KeysTuple(items);  // the keys in the OrderedDict's order
    };
    return read::Mapping<kKind>(w, obj, reg, GatherOrderedItems, node_data);
}

// ---- registered nodes

template <class Walk>
bool DataclassKind::Read(Walk& w, PyObject* obj, const Registration* reg) {
    RecursionGuard guard(w.Thread(), kFlattenRecursionWhere);
    if (!guard.ok()) return false;
    const auto mark = w.Begin();
    Ref node_data;
    if constexpr (Walk::kDef) {
        node_data = Ref(GetAttrs(obj, reg->meta_fields));
        if (!node_data) return false;
        if (!aux::Check(reg->type, node_data.get(), w.Site())) return false;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(reg->data_fields);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* name = PyTuple_GET_ITEM(reg->data_fields, i);  // the registration's
        Ref child(PyObject_GetAttr(obj, name));
        if (!child) return false;
        PyObject* key = nullptr;
        if constexpr (Walk::kPaths) key = keys::GetAttr(name);
        if (!w.Child(child.get(), key)) return false;
    }
    if constexpr (Walk::kDef) return w.Finish(kKind, mark, n, node_data.release(), reg);
    return true;
}

template <class Walk>
bool AttributeKind::Read(Walk& w, PyObject* obj, const Registration* reg) {
    RecursionGuard guard(w.Thread(), kFlattenRecursionWhere);
    if (!guard.ok()) return false;
    attr::AttrNode* node = attr::AsNode(reg->attr_node);
    attr::Fields fields;  // every child read (owned) before any is visited: see attr/attr_read.cpp
    // A mapping- or items-layout node's keys come from its aux data (they differ per instance).
    const bool per_instance_keys = node->mapping != nullptr || node->items_field != nullptr;
    switch (attr::Read(node, obj, Walk::kDef || (Walk::kPaths && per_instance_keys), &fields)) {
        case attr::Outcome::kError:
            return false;
        case attr::Outcome::kLibrary: {
            // A check found a difference: the class is now a custom node with the library's
            // functions (registry::DelegateAttribute), for this node and every later one. The
            // record is published before the switch is set; if publishing failed there, it is
            // tried again here.
            const Registration* now = registry::ClassifyType(Py_TYPE(obj));
            if (now == reg) {
                if (!registry::DelegateAttribute(reg->attr_node)) return false;
                now = registry::ClassifyType(Py_TYPE(obj));
            }
            if (now->kind != NodeKind::kCustom) {
                PyErr_Format(PyExc_SystemError, "fastree: %R delegates to its library but is "
                             "not registered with its functions", reinterpret_cast<PyObject*>(
                                 Py_TYPE(obj)));
                return false;
            }
            return CustomKind::Read(w, obj, now);
        }
        case attr::Outcome::kLibraryOnce: {
            // An instance the library answers for (its aux data names its children). Taken with
            // a reference (attr::NodeFunction): another thread's check_with may replace it.
            Ref fn = attr::NodeFunction(node, Walk::kPaths
                                                  ? &attr::AttrNode::library_flatten_with_keys
                                                  : &attr::AttrNode::library_flatten);
            if (!fn) {
                PyErr_SetString(PyExc_RuntimeError, "fastree: an attribute node's library "
                                "functions are gone");
                return false;
            }
            return read::ViaCallback(w, obj, reg, fn.get(), Walk::kPaths, kKind);
        }
        case attr::Outcome::kNative:
            break;
    }
    if constexpr (Walk::kDef) {
        // The shared aux tuples are checked once per epoch (aux_check.h). The node's stamp is
        // for whichever tuple last_aux is: it is read with the comparison, and written back
        // only while `aux` is still that tuple, both in the node's critical section (another
        // thread's Aux may replace last_aux and reset the stamp meanwhile; `aux` is held, so
        // its address cannot come back as another tuple's). The check itself runs outside it.
        PyObject* aux = fields.aux.get();
        bool ok;
        uint64_t stamp = 0;
        bool shared;
        FASTREE_BEGIN_CRITICAL_SECTION(reinterpret_cast<PyObject*>(node));
        shared = aux == node->last_aux || aux == node->regular_aux;
        if (shared) stamp = node->aux_stamp;
        FASTREE_END_CRITICAL_SECTION();
        if (shared) {
            const uint64_t was = stamp;
            ok = aux::CheckStamped(reg->type, aux, w.Site(), &stamp);
            if (ok && stamp != was) attr::StampIfShared(node, aux, stamp);
        } else {
            ok = aux::Check(reg->type, aux, w.Site());
        }
        if (!ok) return false;
    }
    const auto mark = w.Begin();
    const Py_ssize_t n = static_cast<Py_ssize_t>(fields.children.size());
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* key = nullptr;
        if constexpr (Walk::kPaths) {
            key = per_instance_keys ? attr::ChildKey(node, fields.aux.get(), i)
                                    : Py_NewRef(PyTuple_GET_ITEM(node->keys, i));
            if (key == nullptr) return false;
        }
        PyObject* child = fields.children[static_cast<size_t>(i)];  // handed to the visit
        fields.children[static_cast<size_t>(i)] = nullptr;
        if (!w.template Child<true>(child, key)) return false;
    }
    if constexpr (Walk::kDef) return w.Finish(kKind, mark, n, fields.aux.release(), reg);
    return true;
}

template <class Walk>
bool CustomKind::Read(Walk& w, PyObject* obj, const Registration* reg) {
    RecursionGuard guard(w.Thread(), kFlattenRecursionWhere);
    if (!guard.ok()) return false;
    // Which callback: key paths want keys (the registered with-keys function, or JAX's own for
    // JAX-only types); plain flattening prefers the cheaper keyless function.
    PyObject* fn;
    bool with_keys;
    if (Walk::kPaths && reg->flatten_with_keys != nullptr) {
        fn = reg->flatten_with_keys;
        with_keys = true;
    } else if (Walk::kPaths && reg->from_jax && registry::JaxFlattenWithKeys() != nullptr) {
        fn = registry::JaxFlattenWithKeys();
        with_keys = true;
    } else if (reg->flatten != nullptr) {
        fn = reg->flatten;
        with_keys = false;
    } else {
        fn = reg->flatten_with_keys;
        with_keys = true;
    }
    return read::ViaCallback(w, obj, reg, fn, with_keys, kKind);
}

// Reads `obj`, of registration `reg`, into the walk.
template <class Walk>
[[gnu::always_inline]] inline bool Read(Walk& w, PyObject* obj, const Registration* reg) {
    return Dispatch(reg->kind, [&](auto kind) { return decltype(kind)::Read(w, obj, reg); });
}

}  // namespace kinds
}  // namespace fastree
