// flax.nnx graphlib.unflatten in graph mode (nnx_graph.h), natively.
//
// The walk mirrors flax 0.12's `unflatten` / `_graph_unflatten` (flax/nnx/graphlib.py) step by
// step. Unlike the flatten, it changes the caller's objects as it goes (the outer index map's
// nodes are cleared and refilled, its Variables updated in place), so it cannot give up half-way:
// everything it does not serve is found by a first look (Check) before anything is changed, and
// past that point every case it does not reproduce itself calls flax's own function for that one
// step (a node impl's create_empty/init/unflatten, a Variable's update_from_state).
//
// Python code runs all along the walk (a node impl's functions, a classifier, a finalizer when
// anything is allocated) and may change the GraphDef's lists as it goes, as it may under flax's
// iterators. So nothing the first look saw is trusted later unless it is still there: each
// attribute pair is unpacked as Python unpacks it when it is taken, a record that is not the one
// the first look judged in its place is judged when it is met, and every item is owned from the
// moment it is read.
#include <vector>

#include "attr/attr_mapping.h"
#include "nnx/nnx_graph.h"
#include "nnx/nnx_graph_walk.h"
#include "nnx/nnx_graph_variables.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {
namespace {

class Walk {
 public:
    Walk(PyObject* nodes, PyObject* attributes, PyObject* leaves, PyObject* index_ref,
         PyObject* outer_ref, bool recreate_variables, PyObject* context)
        : nodes_(Ref::FromBorrowed(nodes)),
          attributes_(Ref::FromBorrowed(attributes)),
          leaves_(Ref::FromBorrowed(leaves)),
          index_ref_(index_ref),
          outer_ref_(outer_ref),
          recreate_variables_(recreate_variables),
          vars_(context) {
        for (Py_ssize_t i = 0; i < kUnflattenSize; ++i) ctx_[i] = PyTuple_GET_ITEM(context, i);
    }

    // The first look: every record, attribute and leaf of a kind this walk serves.
    Step Check() {
        // The GraphDef's lists are flax's: each item read with a reference taken by the read
        // (ListItemRef), a list another thread shortened meanwhile ending the loop.
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes_.get()); ++i) {
            Ref record(ListItemRef(nodes_.get(), i));
            if (!record) break;
            const Step step = Served(record.get());
            if (step != kServed) return step;
            PushOwned(judged_, record.release());
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(attributes_.get()); ++i) {
            // Nothing runs between reading the pair and its value's type; the pair is held.
            Ref pair(ListItemRef(attributes_.get(), i));
            if (!pair) break;
            PyObject* attr = PairValue(pair.get());
            if (attr == nullptr || !KnownAttr(Py_TYPE(attr))) return kNotServed;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(leaves_.get()); ++i) {
            Ref leaf(ListItemRef(leaves_.get(), i));
            if (!leaf) break;
            Ref entry = vars_.LeafEntry(Py_TYPE(leaf.get()));
            if (!entry) return kFailed;
            if (KindOf(entry.get()) == kUnserved) return kNotServed;
        }
        return Depth();
    }

    // Whether this walk rebuilds `record` as flax's would: a NodeRef, a NodeDef of a served node
    // type, or a VariableDef of a plain Variable class with no array ref and hijax False.
    Step Served(PyObject* record) {
        const Names* n = GetNames();
        PyTypeObject* type = Py_TYPE(record);
        if (type == Cls(kUNodeRef)) return kServed;
        if (type != Cls(kUNodeDef) && type != Cls(kUVariableDef)) return kNotServed;
        Ref node_type(PyObject_GetAttr(record, n->type));
        if (!node_type) return kFailed;
        Ref entry = NodeEntry(node_type.get());
        if (!entry) return kFailed;
        const int kind = KindOf(entry.get());
        if (type == Cls(kUNodeDef)) {
            return kind == kUnserved || kind == kVariable ? kNotServed : kServed;
        }
        if (kind != kVariable) return kNotServed;
        Ref refdef(PyObject_GetAttr(record, n->array_refdef));
        if (!refdef) return kFailed;
        if (refdef.get() != Py_None) return kNotServed;
        // from_metadata's `if attributes['hijax']`: served where it is False.
        Ref metadata(PyObject_GetAttr(record, n->metadata));
        if (!metadata) return kFailed;
        if (Py_TYPE(metadata.get()) != Cls(kUHashableMapping)) return kNotServed;
        Ref items(PyObject_GetAttr(metadata.get(), n->mapping));
        if (!items) return kFailed;
        if (!PyDict_CheckExact(items.get())) return kNotServed;
        PyObject* hijax = PyDict_GetItemWithError(items.get(), n->hijax);
        if (hijax != Py_False) return PyErr_Occurred() ? kFailed : kNotServed;
        return kServed;
    }

    // The attribute value of a pair of the shape flax's graphdefs hold (an exact 2-tuple),
    // borrowed from `pair`: for use before anything else runs. Null (no error) for any other.
    static PyObject* PairValue(PyObject* pair) {
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) return nullptr;
        return PyTuple_GET_ITEM(pair, 1);
    }

    bool KnownAttr(PyTypeObject* type) const {
        return type == Cls(kUStatic) || type == Cls(kUNodeAttr) || type == Cls(kULeafAttr) ||
               type == Cls(kUNodeRef);
    }

    // How deep the walk will nest, from the records and attributes alone (each NodeDef takes its
    // num_attributes attributes; a NodeAttr takes the next record): past kMaxNativeDepth, not
    // served. A graphdef that runs out early is left to the walk, which raises as flax's does.
    Step Depth() {
        const Names* n = GetNames();
        std::vector<Py_ssize_t> open;  // attributes left, per NodeDef being filled
        Py_ssize_t next_node = 0, next_attribute = 0;
        auto take = [&](PyObject* record) -> Step {
            if (Py_TYPE(record) != Cls(kUNodeDef)) return kServed;
            Ref count(PyObject_GetAttr(record, n->num_attributes));
            if (!count) return kFailed;
            const Py_ssize_t left = PyLong_AsSsize_t(count.get());
            if (left == -1 && PyErr_Occurred()) return kFailed;
            open.push_back(left);
            return static_cast<Py_ssize_t>(open.size()) > kMaxNativeDepth ? kNotServed : kServed;
        };
        PyObject* nodes = nodes_.get();
        Ref first(ListItemRef(nodes, next_node++));
        if (!first) return kServed;  // empty
        Step step = take(first.get());
        while (step == kServed && !open.empty()) {
            if (open.back() <= 0) {
                open.pop_back();
                continue;
            }
            --open.back();
            if (next_attribute >= PyList_GET_SIZE(attributes_.get())) break;
            // Judged again: `take` reads attributes, and the leaves' classifier ran before.
            Ref pair(ListItemRef(attributes_.get(), next_attribute++));
            PyObject* attr = pair ? PairValue(pair.get()) : nullptr;  // borrowed from `pair`
            if (attr == nullptr) return kNotServed;
            if (Py_TYPE(attr) != Cls(kUNodeAttr)) continue;
            Ref record(ListItemRef(nodes, next_node++));
            if (!record) break;
            step = take(record.get());
        }
        return step;
    }

    // `_graph_unflatten(nodes[0], ...)` and the check that every leaf was taken.
    PyObject* Run() {
        Ref out = NextRecord();
        if (!out) return nullptr;
        if (next_leaf_ < PyList_GET_SIZE(leaves_.get())) {
            PyErr_SetString(PyExc_ValueError, "Incorrect number of leaves in state.");
            return nullptr;
        }
        return out.release();
    }

 private:
    PyTypeObject* Cls(Py_ssize_t item) const { return reinterpret_cast<PyTypeObject*>(ctx_[item]); }

    Ref NodeEntry(PyObject* type) {
        return KindEntry(ctx_[kNodeKinds], ctx_[kClassifyNodeType], type);
    }

    // next(iterator) over one of the lists; StopIteration at the end, as flax's next() raises.
    static Ref Next(Py_ssize_t* position, PyObject* list) {
        Ref item(ListItemRef(list, *position));  // another thread may change the list
        if (!item) {
            PyErr_SetNone(PyExc_StopIteration);
            return Ref();
        }
        ++*position;
        return item;
    }

    // `mapping[key]` for an index map (a dict, or a dict subclass: KeyError as flax gets it).
    static Ref GetIndexed(PyObject* map, PyObject* key) { return Ref(PyObject_GetItem(map, key)); }

    // `outer_index is not None and outer_index in outer_index_outer_ref`: the outer object, or
    // null (no error) if there is none.
    Ref OuterObject(PyObject* outer_index) {
        if (outer_ref_ == nullptr || outer_index == Py_None) return Ref();
        const int has = PySequence_Contains(outer_ref_, outer_index);
        if (has <= 0) return Ref();
        return GetIndexed(outer_ref_, outer_index);
    }

    // The VariableDef branch of _graph_unflatten (no array ref, copy_variables False: Check).
    Ref VariableRecord(PyObject* def) {
        const Names* n = GetNames();
        Ref value = Next(&next_leaf_, leaves_.get());
        if (!value) return Ref();
        const int value_is_variable = vars_.IsPlainVariable(value.get());
        if (value_is_variable < 0) return Ref();
        Ref outer_index(PyObject_GetAttr(def, n->outer_index));
        if (!outer_index) return Ref();
        Ref variable = OuterObject(outer_index.get());
        if (PyErr_Occurred()) return Ref();
        if (variable) {
            // isinstance(variable, Variable): a plain Variable class is one (no metaclass hook).
            const int plain = vars_.IsPlainVariable(variable.get());
            if (plain < 0) return Ref();
            const int is = plain ? 1 : PyObject_IsInstance(variable.get(), ctx_[kUVariableBase]);
            if (is < 0) return Ref();
            if (!is) {
                Ref name(PyObject_Repr(reinterpret_cast<PyObject*>(Py_TYPE(variable.get()))));
                if (name) PyErr_Format(PyExc_ValueError, "Expected a Variable type but got %U.",
                                       name.get());
                return Ref();
            }
            if (!vars_.Update(variable.get(), value.get(), value_is_variable)) return Ref();
        } else if (value_is_variable || !recreate_variables_) {
            variable = std::move(value);
        } else {
            variable = NewVariable(def, value.get());
            if (!variable) return Ref();
        }
        Ref index(PyObject_GetAttr(def, n->index));
        if (!index || PyObject_SetItem(index_ref_, index.get(), variable.get()) < 0) return Ref();
        return variable;
    }

    // variabledef.type.from_metadata(value, dict(metadata)) for a non-hijax plain Variable class:
    // cls._new(value, dict(attributes)), i.e. object.__new__(cls), then _trace_state, the
    // metadata dict and the raw value, set as object.__setattr__ sets them.
    Ref NewVariable(PyObject* def, PyObject* value) {
        const Names* n = GetNames();
        Ref cls(PyObject_GetAttr(def, n->type));
        Ref metadata(PyObject_GetAttr(def, n->metadata));
        if (!cls || !metadata) return Ref();
        Ref items(PyObject_GetAttr(metadata.get(), n->mapping));
        if (!items) return Ref();
        Ref copy(PyDict_Copy(items.get()));
        if (!copy) return Ref();
        return Ref(nnx_graph::NewVariable(cls.get(), value, copy.get(), vars_.States()));
    }

    // _get_children(): the (key, value) pairs of a NodeDef's attributes.
    bool Children(Py_ssize_t count, std::vector<std::pair<Ref, Ref>>* children) {
        const Names* n = GetNames();
        for (Py_ssize_t i = 0; i < count; ++i) {
            Ref pair = Next(&next_attribute_, attributes_.get());
            if (!pair) return false;
            // `key, value = next(attribute_iter)`: whatever the list holds now, unpacked as
            // Python unpacks it (the pair the first look saw may have been replaced).
            Ref key, attr;
            if (!UnpackPair(pair.get(), &key, &attr)) return false;
            PyTypeObject* type = Py_TYPE(attr.get());
            Ref value;
            if (type == Cls(kUStatic)) {
                value = Ref(PyObject_GetAttr(attr.get(), n->value));
            } else if (type == Cls(kULeafAttr)) {
                value = Next(&next_leaf_, leaves_.get());
            } else if (type == Cls(kUNodeAttr)) {
                value = NextRecord();
            } else if (type == Cls(kUNodeRef)) {
                Ref index(PyObject_GetAttr(attr.get(), n->index));
                if (index) value = GetIndexed(index_ref_, index.get());
            } else {
                PyErr_Format(PyExc_RuntimeError, "Unknown static field: %R", key.get());
            }
            if (!value) return false;
            children->emplace_back(std::move(key), std::move(value));
        }
        return true;
    }

    static Ref ChildrenList(const std::vector<std::pair<Ref, Ref>>& children) {
        RefVector pairs;
        for (const auto& [key, value] : children) {
            PyObject* pair = PyTuple_Pack(2, key.get(), value.get());
            if (pair == nullptr) return Ref();
            PushOwned(pairs, pair);
        }
        return Ref(StealIntoSequence(pairs, false));
    }

    // next(node_iter), rebuilt: a NodeRef, VariableDef or NodeDef.
    Ref NextRecord() {
        const Py_ssize_t at = next_node_;
        Ref def = Next(&next_node_, nodes_.get());
        if (!def) return Ref();
        // The record the first look judged in this place (held since, so no other object can
        // have its address), or one judged now.
        if (at >= static_cast<Py_ssize_t>(judged_.size()) || judged_[at] != def.get()) {
            const Step served = Served(def.get());
            if (served == kFailed) return Ref();
            if (served == kNotServed) return Unfollowed(def.get());
        }
        return Record(def.get());
    }

    Ref Record(PyObject* def) {
        RecursionGuard guard(" in nnx graph unflatten");
        if (!guard.ok()) return Ref();
        const Names* n = GetNames();
        PyTypeObject* type = Py_TYPE(def);
        if (type == Cls(kUNodeRef)) {
            Ref index(PyObject_GetAttr(def, n->index));
            return index ? GetIndexed(index_ref_, index.get()) : Ref();
        }
        if (type == Cls(kUVariableDef)) return VariableRecord(def);
        return NodeRecord(def);
    }

    // A record put in the nodes list during the walk that this walk does not rebuild (it has
    // changed the caller's objects already, so it cannot hand the call to flax's function).
    static Ref Unfollowed(PyObject* def) {
        PyErr_Format(PyExc_RuntimeError,
                     "nnx graph unflatten: the GraphDef's nodes were changed during the walk to "
                     "hold %R, which the native walk does not rebuild",
                     def);
        return Ref();
    }

    Ref NodeRecord(PyObject* def) {
        const Names* n = GetNames();
        Ref node_type(PyObject_GetAttr(def, n->type));
        Ref index(PyObject_GetAttr(def, n->index));
        Ref metadata(PyObject_GetAttr(def, n->metadata));
        Ref count_obj(PyObject_GetAttr(def, n->num_attributes));
        if (!node_type || !index || !metadata || !count_obj) return Ref();
        const Py_ssize_t count = PyLong_AsSsize_t(count_obj.get());
        if (count == -1 && PyErr_Occurred()) return Ref();
        Ref entry = NodeEntry(node_type.get());
        if (!entry) return Ref();
        const int kind = KindOf(entry.get());
        PyObject* impl = PyTuple_GET_ITEM(entry.get(), 1);
        if (index.get() != Py_None) {
            const int used = PySequence_Contains(index_ref_, index.get());
            if (used < 0) return Ref();
            if (used) {
                PyErr_Format(PyExc_RuntimeError, "GraphDef index %S already used.", index.get());
                return Ref();
            }
        }
        std::vector<std::pair<Ref, Ref>> children;
        if (kind != kNnxPytree && kind != kGraphNode) {
            // A pytree node: its children first (it cannot refer to itself), then unflatten.
            if (!Children(count, &children)) return Ref();
            return PytreeNode(kind, impl, metadata.get(), children);
        }
        // A graph node: made empty (or the outer one cleared) and indexed before its children,
        // which may refer back to it.
        Ref outer_index(PyObject_GetAttr(def, n->outer_index));
        if (!outer_index) return Ref();
        Ref node = OuterObject(outer_index.get());
        if (PyErr_Occurred()) return Ref();
        if (node) {
            if (reinterpret_cast<PyObject*>(Py_TYPE(node.get())) != node_type.get()) {
                PyErr_Format(PyExc_ValueError,
                             "Expected a node of type %R for index %R, but got a node of type %R.",
                             node_type.get(), index.get(), Py_TYPE(node.get()));
                return Ref();
            }
            if (!ClearNode(kind, impl, node.get())) return Ref();
        } else {
            node = CreateEmpty(kind, impl, metadata.get());
            if (!node) return Ref();
        }
        if (PyObject_SetItem(index_ref_, index.get(), node.get()) < 0) return Ref();
        if (!Children(count, &children)) return Ref();
        if (!InitNode(kind, impl, node.get(), children)) return Ref();
        return node;
    }

    // Pytree._graph_node_clear: vars(self).clear().
    bool ClearNode(int kind, PyObject* impl, PyObject* node) {
        const Names* n = GetNames();
        if (kind == kNnxPytree) {
            Ref dict(PyObject_GetAttr(node, n->dict));
            if (dict && PyDict_CheckExact(dict.get())) {
                PyDict_Clear(dict.get());
                return true;
            }
            if (!dict) return false;
        }
        Ref clear(PyObject_GetAttr(impl, n->clear));
        Ref done(clear ? PyObject_CallOneArg(clear.get(), node) : nullptr);
        return static_cast<bool>(done);
    }

    // Pytree._graph_node_create_empty(node_type): object.__new__(node_type).
    Ref CreateEmpty(int kind, PyObject* impl, PyObject* metadata) {
        if (kind == kNnxPytree && PyType_Check(metadata)) return Ref(attr::NewInstance(metadata));
        Ref create(PyObject_GetAttr(impl, GetNames()->create_empty));
        return create ? Ref(PyObject_CallOneArg(create.get(), metadata)) : Ref();
    }

    // Pytree._graph_node_init: object.__setattr__(self, _get_str(name), value) per child.
    bool InitNode(int kind, PyObject* impl, PyObject* node,
                  const std::vector<std::pair<Ref, Ref>>& children) {
        if (kind == kNnxPytree) {
            for (const auto& [key, value] : children) {
                Ref name = PyUnicode_Check(key.get()) ? Ref::FromBorrowed(key.get())
                                                      : Ref(PyObject_Str(key.get()));
                if (!name || PyObject_GenericSetAttr(node, name.get(), value.get()) < 0) {
                    return false;
                }
            }
            return true;
        }
        Ref list = ChildrenList(children);
        Ref init(list ? PyObject_GetAttr(impl, GetNames()->init) : nullptr);
        Ref done(init ? PyObject_CallFunctionObjArgs(init.get(), node, list.get(), nullptr)
                      : nullptr);
        return static_cast<bool>(done);
    }

    // node_impl.unflatten(children, metadata): flax's own list/tuple/dict/None registrations and
    // a PytreeState's generic node natively, any other by the impl's function.
    Ref PytreeNode(int kind, PyObject* impl, PyObject* metadata,
                   const std::vector<std::pair<Ref, Ref>>& children) {
        if (kind == kNone) return Ref::FromBorrowed(Py_None);
        if (kind == kList || kind == kTuple) {
            RefVector values;
            for (const auto& child : children) PushNewRef(values, child.second.get());
            return Ref(StealIntoSequence(values, kind == kTuple));
        }
        if (kind == kDict) {
            Ref dict(PyDict_New());
            if (!dict) return Ref();
            for (const auto& [key, value] : children) {
                if (PyDict_SetItem(dict.get(), key.get(), value.get()) < 0) return Ref();
            }
            return dict;
        }
        if (kind == kGenericPytree && children.empty()) {
            Ref state = PytreeState(metadata);
            if (state || PyErr_Occurred()) return state;
        }
        Ref list = ChildrenList(children);
        Ref unflatten(list ? PyObject_GetAttr(impl, GetNames()->unflatten) : nullptr);
        return unflatten ? Ref(PyObject_CallFunctionObjArgs(unflatten.get(), list.get(), metadata,
                                                            nullptr))
                         : Ref();
    }

    // PytreeState(initializing, is_setup) for the treedef of a lone PytreeState (kStateAuxes):
    // object.__new__ and its three slots, as __init__ sets them. Null without an error where the
    // metadata is no such treedef's.
    Ref PytreeState(PyObject* metadata) {
        const Names* n = GetNames();
        if (Py_TYPE(metadata) != Cls(kUIndexesPytreeDef) || PyTuple_GET_SIZE(metadata) != 2) {
            return Ref();
        }
        // The aux data of this treedef: known by its identity, or learnt once from the Python
        // side (which checks that it is a lone PytreeState's).
        PyObject* treedef = PyTuple_GET_ITEM(metadata, 1);
        Ref id(PyLong_FromVoidPtr(treedef));
        if (!id) return Ref();
        Ref aux;
        Ref known = DictItemRef(ctx_[kStateAuxes], id.get());  // owned: the table is shared
        if (known && PyTuple_CheckExact(known.get()) && PyTuple_GET_SIZE(known.get()) == 2 &&
            PyTuple_GET_ITEM(known.get(), 0) == treedef) {
            aux = Ref::FromBorrowed(PyTuple_GET_ITEM(known.get(), 1));
        } else {
            if (PyErr_Occurred()) return Ref();
            aux = Ref(PyObject_CallOneArg(ctx_[kLearnStateAux], treedef));
            if (!aux) return Ref();
        }
        if (!PyTuple_CheckExact(aux.get()) || PyTuple_GET_SIZE(aux.get()) != 2) return Ref();
        Ref state = vars_.NewTraceState();
        if (!state) return Ref();
        Ref obj(attr::NewInstance(ctx_[kPytreeStateType]));
        if (!obj || PyObject_GenericSetAttr(obj.get(), n->trace_state, state.get()) < 0 ||
            PyObject_GenericSetAttr(obj.get(), n->initializing_slot,
                                    PyTuple_GET_ITEM(aux.get(), 0)) < 0 ||
            PyObject_GenericSetAttr(obj.get(), n->is_setup_slot, PyTuple_GET_ITEM(aux.get(), 1)) <
                0) {
            return Ref();
        }
        return obj;
    }

    PyObject* ctx_[kUnflattenSize];
    // Owned, as flax's iterators hold them: Python code the walk runs may rebind the GraphDef's
    // fields. Their items are read afresh at each step, never kept across a call.
    const Ref nodes_;
    const Ref attributes_;
    const Ref leaves_;
    RefVector judged_;  // the records the first look judged, in their places
    PyObject* const index_ref_;   // borrowed: written to
    PyObject* const outer_ref_;   // borrowed, or null
    const bool recreate_variables_;
    Py_ssize_t next_node_ = 0, next_attribute_ = 0, next_leaf_ = 0;
    VariableOps vars_;
};

}  // namespace

PyObject* Unflatten(PyObject* nodes, PyObject* attributes, PyObject* leaves, PyObject* index_ref,
                    PyObject* outer_ref, bool recreate_variables, PyObject* context) {
    if (!PyList_CheckExact(nodes) || !PyList_CheckExact(attributes) || !PyList_CheckExact(leaves) ||
        !PyDict_Check(index_ref) || (outer_ref != Py_None && !PyDict_Check(outer_ref)) ||
        !PyTuple_CheckExact(context) || PyTuple_GET_SIZE(context) != kUnflattenSize) {
        PyErr_SetString(PyExc_TypeError,
                        "nnx_graph_unflatten(nodes: list, attributes: list, leaves: list, "
                        "index_ref: dict, outer_ref: dict | None, recreate_variables, context)");
        return nullptr;
    }
    if (PyList_GET_SIZE(nodes) == 0) Py_RETURN_NONE;
    Walk walk(nodes, attributes, leaves, index_ref, outer_ref == Py_None ? nullptr : outer_ref,
              recreate_variables, context);
    PyObject* leaf_kinds = PyTuple_GET_ITEM(context, kLeafKinds);
    PyObject* node_kinds = PyTuple_GET_ITEM(context, kNodeKinds);
    const Py_ssize_t known = PyDict_GET_SIZE(leaf_kinds) + PyDict_GET_SIZE(node_kinds);
    switch (walk.Check()) {
        case kFailed:
            return nullptr;
        case kNotServed:
            Py_RETURN_NONE;
        case kServed:
            break;
    }
    // Types met for the first time: the Python side may want to check this walk against flax's.
    if (PyDict_GET_SIZE(leaf_kinds) + PyDict_GET_SIZE(node_kinds) != known) Py_RETURN_FALSE;
    Ref node(walk.Run());
    return node ? PyTuple_Pack(1, node.get()) : nullptr;
}

}  // namespace fastree::nnx_graph
