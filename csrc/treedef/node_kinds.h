// The node kinds: for each NodeKind, the one place that knows how such a node is read from an
// object, built from its children, keyed, described and checked.
//
// Each kind is a struct of static functions (NoneKind, TupleKind, ..., CustomKind). The walkers
// (flatten, tree_map, flatten_up_to, unflatten, walk, repr, node_data, ...) know no kind by name:
// they ask Dispatch(kind, op) to call op with the kind's struct, or use one of the wrappers at the
// end of this file. Dispatch's switch is the only switch over the kind in the core; the compiler
// turns a Dispatch whose op is a generic lambda into that switch with each case inlined, so a hot
// walker pays what it paid for a switch of its own.
//
// What each kind struct offers (KindBase supplies the defaults):
//   Type(parts)                 the type the node rebuilds (new reference)
//   Data(parts)                 JAX's node_data()[1] for the node (new reference)
//   ChildKey(parts, k)          key entry of child k, as flatten_with_path makes it
//   Build(parts, children)      the object, from owned children (consumed, success or not)
//   Describe(parts, kids, out)  the node's text in a treedef repr, given its children's texts
//   CheckParts(parts, type)     whether node data given by a caller (from_node_data_and_children)
//                               can rebuild this kind; false with a Python error
//   Expect(walk, node, obj)     flatten_up_to: which check `obj` must pass at this node
//   Read(walk, obj, reg)        flatten and one-level: `obj` taken apart into the walk
//                               (kinds_read.h)
//   Map(walk, obj, reg)         tree_map's single pass: `obj` mapped and rebuilt
//   kDataIsType                 the payload is the node's class (compared by identity as shape)
#pragma once

#include <Python.h>

#include <string>

#include "registry/registry.h"
#include "treedef/treedef.h"

namespace fastree {

// What rebuilding or describing one node needs besides its children, wherever the node comes
// from: a treedef (PartsOf) or a walk that has just read an object (tree_map). All borrowed.
// How flatten_one_level gives a kind's children (JAX's shapes): the tree itself (a tuple), a
// tuple, or a list.
enum class OneLevelShape : uint8_t { kSelf, kTuple, kList };

struct NodeParts {
    NodeKind kind = NodeKind::kLeaf;
    Py_ssize_t arity = 0;
    PyObject* data = nullptr;              // the payload's data, for kinds that have one
    const Registration* custom = nullptr;  // the payload's registration, for kinds that have one
    PyObject* const* keys = nullptr;       // kDict: the `arity` sorted keys
};

// Forced inline, as are Build and DictKind::BuildDict below: left to the compiler, unflatten's
// loop made three calls per node (PartsOf, the Build switch, the kind's Build) and ran 3-4%
// slower than with one.
[[gnu::always_inline]] inline NodeParts PartsOf(const TreeDef& def, const Node& node) {
    NodeParts parts;
    parts.kind = node.kind;
    parts.arity = node.arity;
    if (HasPayload(node.kind)) {
        parts.data = def.payloads[node.payload].data;
        parts.custom = def.payloads[node.payload].custom;
    } else if (node.HasKeys() && node.arity > 0) {
        parts.keys = def.keys.data() + node.keys_begin;
    }
    return parts;
}

namespace kinds {

// Releases `n` owned children (a Build that fails before consuming them).
void DropChildren(PyObject** children, Py_ssize_t n);

// The defaults: a node with no children of its own kind to speak of (leaf, shared reference).
struct KindBase {
    static constexpr bool kDataIsType = false;
    // A custom node: flatten_one_level answers with its own callbacks' output.
    static constexpr bool kHasCallbacks = false;
    // None, tuple, list, dict: the kinds JAX's C++ registry handles natively.
    static constexpr bool kBuiltin = false;
    static constexpr OneLevelShape kOneLevelChildren = OneLevelShape::kList;
    // flatten_one_level's node data: the payload, or None.
    static PyObject* OneLevelData(const NodeParts& parts) {
        return Py_NewRef(parts.data != nullptr ? parts.data : Py_None);
    }
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // SystemError
    // tree_map's single pass (map_single_pass.cpp): by default a node is read as flatten reads
    // it and rebuilt as unflatten builds it; the hot built-in kinds have in-place paths.
    template <class Walk>
    static PyObject* Map(Walk& w, PyObject* obj, const Registration* reg) {
        return w.MapByReading(obj, reg);
    }
    // flatten_up_to (flatten_up_to.cpp): which of the walk's checks `obj` must pass to stand
    // where this node is. `obj` is owned; the check takes it over.
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectNothing(node, obj);
    }
    static PyObject* Type(const NodeParts&) { return Py_NewRef(Py_None); }
    static PyObject* Data(const NodeParts&) { return Py_NewRef(Py_None); }
    static PyObject* ChildKey(const NodeParts&, Py_ssize_t k);  // FlattenedIndexKey(k)
    static PyObject* Build(const NodeParts& parts, PyObject** children);  // SystemError
    static bool CheckParts(const NodeParts&, PyObject* type);  // RuntimeError: not a node type
    // A custom node's text: CustomNode(Type[data], [children]).
    static bool Describe(const NodeParts& parts, const std::string* kids, std::string* out);
};

struct LeafKind : KindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node&, Obj& obj) {
        return w.ExpectLeaf(obj);
    }
    static constexpr NodeKind kKind = NodeKind::kLeaf;
    static constexpr const char* kName = "leaf";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    static bool Describe(const NodeParts&, const std::string*, std::string* out) {
        *out += "*";
        return true;
    }
};

struct SharedRefKind : KindBase {
    static constexpr NodeKind kKind = NodeKind::kSharedRef;
    static constexpr const char* kName = "shared_ref";  // as PyTreeDef._nodes() reports it
};  // a treedef-only repeat: the walkers handle it themselves

struct NoneKind : KindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node&, Obj& obj) {
        return w.ExpectNone(obj);
    }
    static constexpr bool kBuiltin = true;
    static constexpr OneLevelShape kOneLevelChildren = OneLevelShape::kTuple;
    static constexpr NodeKind kKind = NodeKind::kNone;
    static constexpr const char* kName = "none";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    template <class Walk>
    static PyObject* Map(Walk&, PyObject*, const Registration*) { return Py_NewRef(Py_None); }
    static PyObject* Type(const NodeParts&);
    static PyObject* Build(const NodeParts&, PyObject**) { return Py_NewRef(Py_None); }
    static bool CheckParts(const NodeParts& parts, PyObject* type);
    static bool Describe(const NodeParts&, const std::string*, std::string* out) {
        *out += "None";
        return true;
    }
};

struct TupleKind : KindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectSequence(node, obj, /*is_list=*/false);
    }
    static constexpr bool kBuiltin = true;
    static constexpr OneLevelShape kOneLevelChildren = OneLevelShape::kSelf;
    // Tuples and namedtuples (kind says which) are read by the same code.
    template <class Walk>
    static bool ReadTuple(Walk& w, PyObject* obj, NodeKind kind);
    static constexpr NodeKind kKind = NodeKind::kTuple;
    static constexpr const char* kName = "tuple";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    template <class Walk>
    static PyObject* Map(Walk& w, PyObject* obj, const Registration*) {
        return w.MapSequence(obj, /*is_list=*/false);
    }
    static PyObject* Type(const NodeParts&);
    static PyObject* ChildKey(const NodeParts&, Py_ssize_t k);  // SequenceKey(k)
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts&, PyObject*) { return true; }
    static bool Describe(const NodeParts& parts, const std::string* kids, std::string* out);
};

struct ListKind : KindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectSequence(node, obj, /*is_list=*/true);
    }
    static constexpr bool kBuiltin = true;
    static constexpr OneLevelShape kOneLevelChildren = OneLevelShape::kList;
    static constexpr NodeKind kKind = NodeKind::kList;
    static constexpr const char* kName = "list";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    template <class Walk>
    static PyObject* Map(Walk& w, PyObject* obj, const Registration*) {
        return w.MapSequence(obj, /*is_list=*/true);
    }
    static PyObject* Type(const NodeParts&);
    static PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k) {
        return TupleKind::ChildKey(parts, k);
    }
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts&, PyObject*) { return true; }
    static bool Describe(const NodeParts& parts, const std::string* kids, std::string* out);
};

struct DictKind : KindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectDict(node, obj);
    }
    static constexpr bool kBuiltin = true;
    static constexpr OneLevelShape kOneLevelChildren = OneLevelShape::kTuple;
    static PyObject* OneLevelData(const NodeParts& parts);  // the sorted keys, as a tuple
    static constexpr NodeKind kKind = NodeKind::kDict;
    static constexpr const char* kName = "dict";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    template <class Walk>
    static PyObject* Map(Walk& w, PyObject* obj, const Registration*) { return w.MapDict(obj); }
    static PyObject* Type(const NodeParts&);
    static PyObject* Data(const NodeParts& parts);  // the sorted keys, as a list (JAX's)
    static PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k);  // DictKey(keys[k])
    // The most common container of parameter trees: inline, for unflatten's loop.
    static PyObject* Build(const NodeParts& parts, PyObject** children) {
        return BuildDict(parts.keys, children, parts.arity);
    }
    // Builds a plain dict from `n` sorted keys and `n` owned children (consumed), inserted in
    // sorted-key order as JAX does: the rebuilt dict iterates sorted. Raw references, released
    // by hand: this is inlined into unflatten's per-node loop. Each child is released once the
    // dict holds it, the rest (and `dict`) on the one failing path.
    [[gnu::always_inline]] static PyObject* BuildDict(PyObject* const* keys, PyObject** children,
                                                      Py_ssize_t n) {
        PyObject* dict = _PyDict_NewPresized(n);
        Py_ssize_t i = 0;
        if (dict != nullptr) {
            for (; i < n; ++i) {
                if (PyDict_SetItem(dict, keys[i], children[i]) < 0) break;
                Py_DECREF(children[i]);
            }
            if (i == n) return dict;
            Py_CLEAR(dict);
        }
        for (; i < n; ++i) Py_DECREF(children[i]);
        return nullptr;
    }
    // (The keys of a dict given as node data are checked and stored by MakeRootNode.)
    static bool CheckParts(const NodeParts&, PyObject*) { return true; }
    static bool Describe(const NodeParts& parts, const std::string* kids, std::string* out);
};

struct NamedTupleKind : KindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectNamedTuple(node, obj);
    }
    static constexpr NodeKind kKind = NodeKind::kNamedTuple;
    static constexpr const char* kName = "namedtuple";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    template <class Walk>
    static PyObject* Map(Walk& w, PyObject* obj, const Registration*) {
        return w.MapNamedTuple(obj);
    }
    // The payload is the class itself: part of the shape, like a custom node's registration.
    static constexpr bool kDataIsType = true;
    static PyObject* Type(const NodeParts& parts) { return Py_NewRef(parts.data); }
    // JAX reports no data for a namedtuple: the type says it all.
    static PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k);  // GetAttrKey(_fields[k])
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts&, PyObject*) { return true; }
    static bool Describe(const NodeParts& parts, const std::string* kids, std::string* out);
};

// The kinds registered as "custom" to JAX: their node data is the payload.
struct RegisteredKindBase : KindBase {
    static PyObject* Type(const NodeParts& parts) { return Py_NewRef(parts.custom->type); }
    static PyObject* Data(const NodeParts& parts) { return Py_NewRef(parts.data); }
};

struct OrderedDictKind : RegisteredKindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectRegistered(node, obj, "Custom", /*callbacks=*/false);
    }
    static constexpr NodeKind kKind = NodeKind::kOrderedDict;
    static constexpr const char* kName = "ordered_dict";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    // Payload: the keys in insertion order (a tuple).
    static PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k);
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts& parts, PyObject* type);
};

struct DefaultDictKind : RegisteredKindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectRegistered(node, obj, "Custom", /*callbacks=*/false);
    }
    static constexpr NodeKind kKind = NodeKind::kDefaultDict;
    static constexpr const char* kName = "default_dict";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    // Payload: (default_factory, the sorted keys).
    static PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k);
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts& parts, PyObject* type);
};

struct DataclassKind : RegisteredKindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectRegistered(node, obj, "Custom dataclass", /*callbacks=*/false);
    }
    static constexpr NodeKind kKind = NodeKind::kDataclass;
    static constexpr const char* kName = "dataclass";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    // Payload: the meta-field values (a tuple); children: the data fields, in order.
    static PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k);  // GetAttrKey(field k)
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts& parts, PyObject* type);
};

// An attribute node (attr_node.h): read and rebuilt by its AttrNode, in C++. To JAX it is a
// custom node whose callbacks are the AttrNode's methods, so flatten_one_level answers with them.
struct AttributeKind : RegisteredKindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectRegistered(node, obj, "Custom", /*callbacks=*/false);
    }
    static constexpr bool kHasCallbacks = true;
    static constexpr NodeKind kKind = NodeKind::kAttribute;
    static constexpr const char* kName = "attribute";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    // Payload: the aux data; children keyed by GetAttrKey(data field k).
    static PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k);
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts& parts, PyObject* type);
};

struct CustomKind : RegisteredKindBase {
    template <class Walk, class Obj>
    static bool Expect(Walk& w, const Node& node, Obj& obj) {
        return w.ExpectRegistered(node, obj, "Custom", /*callbacks=*/true);
    }
    static constexpr bool kHasCallbacks = true;
    static constexpr NodeKind kKind = NodeKind::kCustom;
    static constexpr const char* kName = "custom";  // as PyTreeDef._nodes() reports it
    template <class Walk>
    static bool Read(Walk& w, PyObject* obj, const Registration* reg);  // kinds_read.h
    // Payload: the aux_data; children keyed by flattened index (KindBase::ChildKey).
    static PyObject* Build(const NodeParts& parts, PyObject** children);
    static bool CheckParts(const NodeParts&, PyObject*) { return true; }
};

// Calls op(KindStruct{}) for `kind` and returns its result: the core's one switch over the kind.
template <class Op>
[[gnu::always_inline]] inline decltype(auto) Dispatch(NodeKind kind, Op&& op) {
    switch (kind) {
        case NodeKind::kLeaf:
            return op(LeafKind{});
        case NodeKind::kNone:
            return op(NoneKind{});
        case NodeKind::kTuple:
            return op(TupleKind{});
        case NodeKind::kList:
            return op(ListKind{});
        case NodeKind::kDict:
            return op(DictKind{});
        case NodeKind::kNamedTuple:
            return op(NamedTupleKind{});
        case NodeKind::kOrderedDict:
            return op(OrderedDictKind{});
        case NodeKind::kDefaultDict:
            return op(DefaultDictKind{});
        case NodeKind::kCustom:
            return op(CustomKind{});
        case NodeKind::kDataclass:
            return op(DataclassKind{});
        case NodeKind::kAttribute:
            return op(AttributeKind{});
        case NodeKind::kSharedRef:
            break;
    }
    return op(SharedRefKind{});
}

// ---- The operations by kind, for walkers that do not need a kind's struct themselves.

inline PyObject* Type(const NodeParts& parts) {
    return Dispatch(parts.kind, [&](auto kind) { return decltype(kind)::Type(parts); });
}
inline PyObject* Data(const NodeParts& parts) {
    return Dispatch(parts.kind, [&](auto kind) { return decltype(kind)::Data(parts); });
}
inline PyObject* ChildKey(const NodeParts& parts, Py_ssize_t k) {
    return Dispatch(parts.kind, [&](auto kind) { return decltype(kind)::ChildKey(parts, k); });
}
// Consumes `children` (parts.arity of them), success or not.
[[gnu::always_inline]] inline PyObject* Build(const NodeParts& parts, PyObject** children) {
    return Dispatch(parts.kind, [&](auto kind) { return decltype(kind)::Build(parts, children); });
}
inline bool Describe(const NodeParts& parts, const std::string* kids, std::string* out) {
    return Dispatch(parts.kind,
                    [&](auto kind) { return decltype(kind)::Describe(parts, kids, out); });
}
inline bool CheckParts(const NodeParts& parts, PyObject* type) {
    return Dispatch(parts.kind, [&](auto kind) { return decltype(kind)::CheckParts(parts, type); });
}
inline const char* Name(NodeKind k) {
    return Dispatch(k, [](auto kind) { return decltype(kind)::kName; });
}
inline constexpr size_t kNumKinds = static_cast<size_t>(NodeKind::kSharedRef) + 1;
inline bool IsBuiltin(NodeKind k) {
    return Dispatch(k, [](auto kind) { return decltype(kind)::kBuiltin; });
}
inline bool HasCallbacks(NodeKind k) {
    return Dispatch(k, [](auto kind) { return decltype(kind)::kHasCallbacks; });
}
inline OneLevelShape OneLevelChildren(NodeKind k) {
    return Dispatch(k, [](auto kind) { return decltype(kind)::kOneLevelChildren; });
}
inline PyObject* OneLevelData(const NodeParts& parts) {
    return Dispatch(parts.kind, [&](auto kind) { return decltype(kind)::OneLevelData(parts); });
}
inline bool DataIsType(NodeKind k) {
    return Dispatch(k, [](auto kind) { return decltype(kind)::kDataIsType; });
}

// tree_map's single pass over `obj` (a new reference; see map_single_pass.cpp).
template <class Walk>
[[gnu::always_inline]] inline PyObject* Map(Walk& w, PyObject* obj, const Registration* reg) {
    return Dispatch(reg->kind, [&](auto kind) { return decltype(kind)::Map(w, obj, reg); });
}

// node_data() as JAX returns it for one node: None for a leaf, else (type, data).
PyObject* NodeData(const NodeParts& parts);

}  // namespace kinds
}  // namespace fastree
