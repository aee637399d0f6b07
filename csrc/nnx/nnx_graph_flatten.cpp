// flax.nnx graphlib.flatten in graph mode (nnx_graph.h), natively.
//
// The walk mirrors flax 0.12's `_graph_flatten` step by step (flax/nnx/graphlib.py); the comments
// name the flax line each step reproduces. It writes nothing the caller can see until it
// returns: new reference-map entries go to `added`, which the Python side merges into the
// RefMap, so a walk that gives up (kUnserved, returns 0) leaves flax's own function a clean start.
// It also returns each node function it called with that call's result (`called`): where flax's
// function walks the same graph after it (a first walk's check, a walk not served), it is given
// those results instead of calling a user's flatten a second time
// (integrations/_flax_nnx_graph_replay.py).
#include "nnx/nnx_graph.h"

#include <vector>

#include "attr/attr_mapping.h"
#include "nnx/nnx_graph_walk.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {
namespace {

class Walk {
 public:
    Walk(bool with_paths, PyObject* ref_mapping, PyObject* outer_mapping, PyObject* context)
        : with_paths_(with_paths), ref_mapping_(ref_mapping), outer_mapping_(outer_mapping) {
        for (Py_ssize_t i = 0; i < kContextSize; ++i) ctx_[i] = PyTuple_GET_ITEM(context, i);
    }

    bool Start() {
        added_ = Ref(PyDict_New());
        return static_cast<bool>(added_);
    }

    // flax's `_graph_flatten(node, get_node_impl(node), ...)`.
    Step Node(PyObject* node) {
        Ref entry(Entry(Py_TYPE(node)));
        if (!entry) return kFailed;
        return NodeWith(node, entry.get());
    }

    PyObject* Result() {
        Ref nodes(StealIntoSequence(nodes_, false));
        if (!nodes) return nullptr;
        Ref attributes(StealIntoSequence(attributes_, false));
        if (!attributes) return nullptr;
        Ref leaves(StealIntoSequence(leaves_, false));
        if (!leaves) return nullptr;
        Ref paths(with_paths_ ? StealIntoSequence(paths_, false) : Py_NewRef(Py_None));
        if (!paths) return nullptr;
        Ref called(Called());
        if (!called) return nullptr;
        return PyTuple_Pack(6, nodes.get(), attributes.get(), leaves.get(), paths.get(),
                            added_.get(), called.get());
    }

    // [node, (values, metadata), node, ...]: each `node_impl.flatten(node)` the walk made, in
    // order, with its result.
    PyObject* Called() { return StealIntoSequence(called_, false); }

 private:
    // The table entry (kind, impl, impl.type) of `type`.
    Ref Entry(PyTypeObject* type) {
        return KindEntry(ctx_[kKinds], ctx_[kClassify], reinterpret_cast<PyObject*>(type));
    }

    static bool IsGraphKind(int kind) { return kind == kNnxPytree || kind == kGraphNode; }
    static bool IsPytreeKind(int kind) {
        return (kind >= kPytreeNode && kind <= kDict) || kind == kPytreeState;
    }
    static bool IsNodeKind(int kind) {
        return (kind >= kVariable && kind <= kDict) || kind == kPytreeState;
    }

    // RefMap lookup by id(obj) (`_mapping[id(key)][1]`), in the caller's map, then in the
    // entries this walk adds. A new reference to the index, or null (no error) if absent.
    Ref Lookup(PyObject* map, PyObject* obj) {
        Ref id(PyLong_FromVoidPtr(obj));
        if (!id) return Ref();
        Ref hit = DictItemRef(map, id.get());  // owned: another thread may change the map
        if (!hit) return Ref();
        if (!PyTuple_Check(hit.get()) || PyTuple_GET_SIZE(hit.get()) != 2) {
            PyErr_SetString(PyExc_SystemError, "nnx graph: a RefMap entry is not (object, index)");
            return Ref();
        }
        return Ref::FromBorrowed(PyTuple_GET_ITEM(hit.get(), 1));
    }

    Ref FindRef(PyObject* obj) {
        Ref index = Lookup(ref_mapping_, obj);
        if (index || PyErr_Occurred()) return index;
        return Lookup(added_.get(), obj);
    }

    // `index = len(ref_index); ref_index[node] = index`.
    Ref AddRef(PyObject* obj) {
        Ref index(PyLong_FromSsize_t(PyDict_Size(ref_mapping_) + PyDict_Size(added_.get())));
        Ref id(PyLong_FromVoidPtr(obj));
        if (!index || !id) return Ref();
        Ref pair(PyTuple_Pack(2, obj, index.get()));
        if (!pair || PyDict_SetItem(added_.get(), id.get(), pair.get()) < 0) return Ref();
        return index;
    }

    // `ref_outer_index.get(node, None) if ref_outer_index else None`.
    Ref OuterIndex(PyObject* obj) {
        if (outer_mapping_ == nullptr) return Ref::FromBorrowed(Py_None);
        Ref index = Lookup(outer_mapping_, obj);
        if (index || PyErr_Occurred()) return index;
        return Ref::FromBorrowed(Py_None);
    }

    bool PushLeaf(PyObject* leaf) {
        PushNewRef(leaves_, leaf);
        if (!with_paths_) return true;
        PyObject* path = PathTuple(path_);
        if (path == nullptr) return false;
        PushOwned(paths_, path);
        return true;
    }

    bool PushAttribute(PyObject* key, PyObject* attr) {
        PyObject* pair = PyTuple_Pack(2, key, attr);
        if (pair == nullptr) return false;
        PushOwned(attributes_, pair);
        return true;
    }

    // Every record is made anew, as flax's walk makes it: a result holds the only references to
    // its records and to the VariableDefs' metadata mappings (which a caller may change), so two
    // results share nothing flax would make twice, and nothing here outlives them.
    Ref Static(PyObject* value) {
        return Ref(NewRecord(ctx_[kStaticType], {{GetNames()->value, value}}));
    }

    bool PushStatic(PyObject* key, PyObject* value) {
        Ref stat = Static(value);
        return stat && PushAttribute(key, stat.get());
    }

    Ref NodeRef(PyObject* index) {
        return Ref(NewRecord(ctx_[kNodeRefType], {{GetNames()->index, index}}));
    }

    Ref NodeDef(PyObject* type, PyObject* index, PyObject* outer, PyObject* count,
                PyObject* metadata) {
        const Names* n = GetNames();
        return Ref(NewRecord(ctx_[kNodeDefType], {{n->type, type},
                                                   {n->index, index},
                                                   {n->outer_index, outer},
                                                   {n->num_attributes, count},
                                                   {n->metadata, metadata}}));
    }

    Ref VariableDef(PyObject* type, PyObject* index, PyObject* outer, PyObject* items) {
        const Names* n = GetNames();
        // HashableMapping(node.get_metadata()): a copy of the copy; one fresh dict is the same.
        Ref copy(PyDict_Copy(items));
        if (!copy) return Ref();
        Ref metadata(NewRecord(ctx_[kHashableMapping], {{n->mapping, copy.get()}}));
        if (!metadata) return Ref();
        return Ref(NewRecord(ctx_[kVariableDefType], {{n->type, type},
                                                       {n->index, index},
                                                       {n->outer_index, outer},
                                                       {n->metadata, metadata.get()},
                                                       {n->array_refdef, Py_None}}));
    }

    Step NodeWith(PyObject* node, PyObject* entry) {
        if (depth_ >= kMaxNativeDepth) return kNotServed;
        RecursionGuard guard(" in nnx graph flatten");
        if (!guard.ok()) return kFailed;
        DepthScope scope(&depth_);
        const int kind = KindOf(entry);
        if (kind == kUnserved || kind < kLeaf || kind > kPytreeState) return kNotServed;
        // `if not is_pytree_node_ and node in ref_index: nodes.append(NodeRef(...))`
        if (!IsPytreeKind(kind)) {
            Ref seen = FindRef(node);
            if (seen) {
                Ref ref = NodeRef(seen.get());
                if (!ref) return kFailed;
                PushOwned(nodes_, ref.release());
                return kServed;
            }
            if (PyErr_Occurred()) return kFailed;
        }
        if (kind == kVariable) return VariableNode(node, entry);
        if (kind == kLeaf || kind == kArrayLeaf) return PushLeaf(node) ? kServed : kFailed;
        return GraphOrPytreeNode(node, entry, kind);
    }

    // The `is_variable` branch (no array ref: its type would be kUnserved).
    Step VariableNode(PyObject* node, PyObject* entry) {
        const Names* n = GetNames();
        Ref index = AddRef(node);
        if (!index) return kFailed;
        Ref raw(PyObject_GetAttr(node, n->raw_value));  // node.get_raw_value()
        if (!raw) return kFailed;
        Ref raw_entry(Entry(Py_TYPE(raw.get())));
        if (!raw_entry) return kFailed;
        if (KindOf(raw_entry.get()) == kUnserved) return kNotServed;  // maybe an array ref
        Ref metadata_dict(PyObject_GetAttr(node, n->var_metadata));
        if (!metadata_dict) return kFailed;
        if (!PyDict_CheckExact(metadata_dict.get())) return kNotServed;
        Ref outer = OuterIndex(node);
        if (!outer) return kFailed;
        Ref def = VariableDef(PyTuple_GET_ITEM(entry, 2), index.get(), outer.get(),
                              metadata_dict.get());
        if (!def) return kFailed;
        if (!PushLeaf(with_paths_ ? node : raw.get())) return kFailed;
        PushOwned(nodes_, def.release());
        return kServed;
    }

    // `values, metadata = node_impl.flatten(node)` for any other impl; DataElem and StaticElem
    // unwrapped. Served for the shapes flax's own impls return (a list or tuple of pairs).
    Step CalledChildren(PyObject* node, PyObject* impl, std::vector<Child>* children,
                        Ref* metadata) {
        const Names* n = GetNames();
        Ref flatten(PyObject_GetAttr(impl, n->flatten));
        if (!flatten) return kFailed;
        Ref result(PyObject_CallOneArg(flatten.get(), node));
        if (!result) return kFailed;
        PushNewRef(called_, node);
        PushNewRef(called_, result.get());
        if (!PyTuple_CheckExact(result.get()) || PyTuple_GET_SIZE(result.get()) != 2) {
            return kNotServed;
        }
        PyObject* values = PyTuple_GET_ITEM(result.get(), 0);
        *metadata = Ref::FromBorrowed(PyTuple_GET_ITEM(result.get(), 1));
        if (!PyList_CheckExact(values) && !PyTuple_CheckExact(values)) return kNotServed;
        Ref held = Ref::FromBorrowed(values);
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(values); ++i) {
            // A list's item with a reference taken by the read (ListItemRef): another thread
            // may change the list; a tuple's is immutable.
            Ref pair = PyList_CheckExact(values)
                           ? Ref(ListItemRef(values, i))
                           : Ref::FromBorrowed(PySequence_Fast_GET_ITEM(values, i));
            if (!pair) break;  // a list that shrank meanwhile: its end
            if (!PyTuple_CheckExact(pair.get()) || PyTuple_GET_SIZE(pair.get()) != 2) {
                return kNotServed;
            }
            Child child{Ref::FromBorrowed(PyTuple_GET_ITEM(pair.get(), 0)),
                        Ref::FromBorrowed(PyTuple_GET_ITEM(pair.get(), 1)), -1};
            for (int data : {1, 0}) {
                PyObject* wrapper = ctx_[data ? kDataElem : kStaticElem];
                const int is = PyObject_IsInstance(child.value.get(), wrapper);
                if (is < 0) return kFailed;
                if (!is) continue;
                child.value = Ref(PyObject_GetAttr(child.value.get(), n->value));
                if (!child.value) return kFailed;
                child.is_data = data;
                break;
            }
            children->push_back(std::move(child));
        }
        return kServed;
    }

    // `_flatten_pytree(state)` for a PytreeState: no children, and IndexesPytreeDef(an empty
    // HashableMapping, the treedef of its aux data), which depends on the aux data only: the one
    // flax made for the first state with that aux data serves all.
    Step PytreeStateMetadata(PyObject* node, PyObject* entry, std::vector<Child>* children,
                             Ref* metadata) {
        const Names* n = GetNames();
        Ref initializing(PyObject_GetAttr(node, n->initializing));
        if (!initializing) return kFailed;
        Ref is_setup(PyObject_GetAttr(node, n->is_setup));
        if (!is_setup) return kFailed;
        Ref aux(PyTuple_Pack(2, initializing.get(), is_setup.get()));
        if (!aux) return kFailed;
        PyObject* cache = ctx_[kStateTreedefs];
        Ref cached = DictItemRef(cache, aux.get());  // owned: the table is shared
        if (!cached) {
            if (PyErr_Occurred()) return kFailed;
            Step got = CalledChildren(node, PyTuple_GET_ITEM(entry, 1), children, metadata);
            if (got != kServed) return got;
            PyObject* made = metadata->get();
            if (!children->empty() || Py_TYPE(made) != reinterpret_cast<PyTypeObject*>(
                                                           ctx_[kIndexesPytreeDef]) ||
                PyTuple_GET_SIZE(made) != 2) {
                return kNotServed;
            }
            if (PyDict_SetItem(cache, aux.get(), made) < 0) return kFailed;
            return kServed;
        }
        // IndexesPytreeDef(HashableMapping({}, copy=False), treedef) with the treedef flax made
        // for the first state with this aux data (immutable): the NamedTuple and its mapping
        // anew, as flax makes them, so that no two results share a mapping a caller can change.
        if (Py_TYPE(cached.get()) != reinterpret_cast<PyTypeObject*>(ctx_[kIndexesPytreeDef]) ||
            PyTuple_GET_SIZE(cached.get()) != 2) {
            return kNotServed;
        }
        Ref key_index_dict(PyDict_New());
        if (!key_index_dict) return kFailed;
        Ref key_index(NewRecord(ctx_[kHashableMapping], {{n->mapping, key_index_dict.get()}}));
        if (!key_index) return kFailed;
        Ref fields(PyTuple_Pack(2, key_index.get(), PyTuple_GET_ITEM(cached.get(), 1)));
        Ref args(fields ? PyTuple_Pack(1, fields.get()) : nullptr);
        if (!args) return kFailed;
        // tuple.__new__(IndexesPytreeDef, fields): what the NamedTuple's own __new__ calls.
        *metadata = Ref(PyTuple_Type.tp_new(
            reinterpret_cast<PyTypeObject*>(ctx_[kIndexesPytreeDef]), args.get(), nullptr));
        return *metadata ? kServed : kFailed;
    }

    Step GraphOrPytreeNode(PyObject* node, PyObject* entry, int kind) {
        const bool is_graph = IsGraphKind(kind);
        Ref index = is_graph ? AddRef(node) : Ref::FromBorrowed(Py_None);
        if (!index) return kFailed;

        std::vector<Child> children;
        Ref metadata;
        Step got;
        if (kind == kNnxPytree) {
            got = PytreeChildren(node, ctx_[kHashableMapping], &children);
            metadata = Ref::FromBorrowed(reinterpret_cast<PyObject*>(Py_TYPE(node)));
        } else if (kind >= kList && kind <= kDict) {
            got = BuiltinChildren(node, kind, &children);
            metadata = Ref::FromBorrowed(Py_None);
            if (got == kNotServed && kind == kDict) {  // keys other than str: flax's lambda
                children.clear();
                got = CalledChildren(node, PyTuple_GET_ITEM(entry, 1), &children, &metadata);
            }
        } else if (kind == kPytreeState) {
            got = PytreeStateMetadata(node, entry, &children, &metadata);
        } else {
            got = CalledChildren(node, PyTuple_GET_ITEM(entry, 1), &children, &metadata);
        }
        if (got != kServed) return got;

        Ref outer = is_graph ? OuterIndex(node) : Ref::FromBorrowed(Py_None);
        if (!outer) return kFailed;
        Ref count(PyLong_FromSize_t(children.size()));
        if (!count) return kFailed;
        Ref def = NodeDef(PyTuple_GET_ITEM(entry, 2), index.get(), outer.get(), count.get(),
                          metadata.get());
        if (!def) return kFailed;
        PushOwned(nodes_, def.release());

        for (Child& child : children) {
            Step step = ChildAttribute(child);
            if (step != kServed) return step;
        }
        return kServed;
    }

    // One attribute of a graph or pytree node: static, a node, a leaf, or static by its kind.
    Step ChildAttribute(const Child& child) {
        PyObject* key = child.key.get();
        PyObject* value = child.value.get();
        if (child.is_data == 0) return PushStatic(key, value) ? kServed : kFailed;
        Ref entry(Entry(Py_TYPE(value)));
        if (!entry) return kFailed;
        const int kind = KindOf(entry.get());
        if (kind == kUnserved) return kNotServed;
        path_.push_back(key);  // borrowed: `child` owns it for the whole step
        Step step = kServed;
        if (IsNodeKind(kind)) {
            if (!PushAttribute(key, ctx_[kNodeAttr])) {
                step = kFailed;
            } else {
                step = NodeWith(value, entry.get());
            }
        } else if (kind == kArrayLeaf || child.is_data == 1) {
            step = PushAttribute(key, ctx_[kLeafAttr]) && PushLeaf(value) ? kServed : kFailed;
        } else {
            step = PushStatic(key, value) ? kServed : kFailed;
        }
        path_.pop_back();
        return step;
    }

    struct DepthScope {
        explicit DepthScope(int* depth) : depth(depth) { ++*depth; }
        ~DepthScope() { --*depth; }
        int* depth;
    };

 public:
    // On an error, flax's map keeps what its walk added before the error: so does the caller's.
    void KeepAddedAfterError() {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (added_ && PyDict_Update(ref_mapping_, added_.get()) < 0) PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }

 private:
    PyObject* ctx_[kContextSize];
    int depth_ = 0;
    const bool with_paths_;
    PyObject* const ref_mapping_;    // borrowed: the caller's argument, read only
    PyObject* const outer_mapping_;  // borrowed, or null
    Ref added_;
    RefVector nodes_, attributes_, leaves_, paths_;
    RefVector called_;  // node, result, node, result...: see Called()
    std::vector<PyObject*> path_;  // borrowed keys, each owned by a Child on the C++ stack
};

}  // namespace

PyObject* Flatten(PyObject* node, bool with_paths, PyObject* ref_mapping, PyObject* outer_mapping,
                  PyObject* context) {
    if (!PyDict_CheckExact(ref_mapping) ||
        (outer_mapping != Py_None && !PyDict_CheckExact(outer_mapping)) ||
        !PyTuple_CheckExact(context) || PyTuple_GET_SIZE(context) != kContextSize ||
        !PyDict_Check(PyTuple_GET_ITEM(context, kKinds))) {
        PyErr_SetString(PyExc_TypeError,
                        "nnx_graph_flatten(node, with_paths, ref_mapping: dict, outer_mapping: "
                        "dict | None, context: tuple)");
        return nullptr;
    }
    Walk walk(with_paths, ref_mapping, outer_mapping == Py_None ? nullptr : outer_mapping, context);
    if (!walk.Start()) return nullptr;
    switch (walk.Node(node)) {
        case kFailed:
            walk.KeepAddedAfterError();
            return nullptr;
        case kNotServed:
            return walk.Called();
        case kServed:
            break;
    }
    return walk.Result();
}

}  // namespace fastree::nnx_graph
