// flax.nnx graphlib._graph_update_dynamic (nnx.update), natively (nnx_graph.h).
//
// flax's function, per node: `node_dict = node_impl.node_dict(node)` (the children its flatten
// gives, unwrapped), then for each (key, value) of the state: a subgraph is updated recursively,
// a Variable in place (update_from_state, or set_raw_value), anything else by the impl's set_key.
// This walk does the same for the kinds it serves, and hands any other subtree, or any other
// key's update, to flax's own function (for a single key: `_graph_update_dynamic(node,
// {key: value})`, which is the loop body for that key).
#include <vector>

#include "nnx/nnx_graph.h"
#include "nnx/nnx_graph_walk.h"
#include "nnx/nnx_graph_variables.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {
namespace {

// A state as flax's loop sees it: `obj` itself, or (wrapped) a dict held inside a State, which
// State.__getitem__ hands out as `State(obj, _copy=False)`.
struct StateView {
    Ref obj;
    bool wrapped;
};

class Walk {
 public:
    explicit Walk(PyObject* context) : ctx_(context), vars_(context) {}

    bool Node(PyObject* node, const StateView& state) {
        if (depth_ >= kMaxNativeDepth) return Flax(node, state);
        RecursionGuard guard(" in nnx graph update");
        if (!guard.ok()) return false;
        ++depth_;
        const bool done = NodeAt(node, state);
        --depth_;
        return done;
    }

 private:
    bool NodeAt(PyObject* node, const StateView& state) {
        Ref entry = vars_.LeafEntry(Py_TYPE(node));
        if (!entry) return false;
        const int kind = KindOf(entry.get());
        PyObject* items = RawItems(state);
        if (items == nullptr && PyErr_Occurred()) return false;
        if (items == nullptr || !(kind == kNnxPytree || (kind >= kList && kind <= kDict))) {
            Py_XDECREF(items);
            return Flax(node, state);
        }
        Ref held_items(items);
        Ref node_dict = NodeDict(node, kind);
        if (!node_dict) return PyErr_Occurred() ? false : Flax(node, state);

        // `for key, value in state.items()`, live: each update below can run Python code, and a
        // change to the state's dict meanwhile raises as flax's loop raises.
        const bool wrapped = state.wrapped || !PyDict_CheckExact(state.obj.get());
        LiveItems pairs(items);
        for (;;) {
            Ref k, v;
            const int got = pairs.Next(&k, &v);
            if (got < 0) return false;
            if (got == 0) return true;
            const bool nested = wrapped && PyDict_CheckExact(v.get());
            StateView child{std::move(v), nested};
            if (!Key(node, node_dict.get(), k.get(), child)) return false;
        }
    }

    PyObject* Item(Py_ssize_t i) const { return PyTuple_GET_ITEM(ctx_, i); }

    // The dict whose items flax's `state.items()` yields (new reference), or null (no error) for
    // a state of another kind.
    PyObject* RawItems(const StateView& state) {
        PyObject* obj = state.obj.get();
        if (state.wrapped || PyDict_CheckExact(obj)) return Py_NewRef(obj);
        if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(Item(kStateType))) return nullptr;
        PyObject* raw = PyObject_GetAttr(obj, GetNames()->mapping);
        if (raw != nullptr && !PyDict_CheckExact(raw)) Py_CLEAR(raw);
        return raw;
    }

    // The state as flax's code receives it: the object, or State(raw, _copy=False).
    Ref Materialize(const StateView& state) {
        if (!state.wrapped) return Ref::FromBorrowed(state.obj.get());
        Ref args(PyTuple_Pack(1, state.obj.get()));
        Ref kwargs(Py_BuildValue("{s:O}", "_copy", Py_False));
        if (!args || !kwargs) return Ref();
        return Ref(PyObject_Call(Item(kStateType), args.get(), kwargs.get()));
    }

    // flax's _graph_update_dynamic(node, state), for a subtree this walk does not serve.
    bool Flax(PyObject* node, const StateView& state) {
        Ref value = Materialize(state);
        if (!value) return false;
        Ref done(PyObject_CallFunctionObjArgs(Item(kUpdateDynamic), node, value.get(), nullptr));
        return static_cast<bool>(done);
    }

    // node_impl.node_dict(node) for the served kinds (flax's `flatten`, unwrapped, as a dict:
    // the same children the flatten reads), or null (no error) where not served.
    Ref NodeDict(PyObject* node, int kind) {
        std::vector<Child> children;
        const Step got = kind == kNnxPytree
                             ? PytreeChildren(node, Item(kUHashableMapping), &children)
                             : BuiltinChildren(node, kind, &children);
        if (got != kServed) return Ref();
        Ref out(PyDict_New());
        if (!out) return Ref();
        for (const Child& child : children) {
            if (PyDict_SetItem(out.get(), child.key.get(), child.value.get()) < 0) return Ref();
        }
        return out;
    }

    // One (key, value) of the state, against the node's child under `key`.
    bool Key(PyObject* node, PyObject* node_dict, PyObject* key, const StateView& value) {
        Ref current = DictItemRef(node_dict, key);  // owned by the lookup itself
        if (!current) return PyErr_Occurred() ? false : FlaxKey(node, key, value);
        Ref entry = vars_.LeafEntry(Py_TYPE(current.get()));
        if (!entry) return false;
        const int kind = KindOf(entry.get());
        const bool value_is_mapping =
            value.wrapped || PyDict_CheckExact(value.obj.get()) ||
            Py_TYPE(value.obj.get()) == reinterpret_cast<PyTypeObject*>(Item(kStateType));
        if (kind == kNnxPytree || (kind >= kList && kind <= kDict)) {
            // A subgraph, updated from a mapping (anything else: flax's error or its handling).
            return value_is_mapping ? Node(current.get(), value) : FlaxKey(node, key, value);
        }
        if (kind != kVariable) return FlaxKey(node, key, value);
        const int from_state = vars_.IsPlainVariable(value.obj.get());
        if (from_state < 0) return false;
        if (from_state) return vars_.Update(current.get(), value.obj.get(), true);
        // `isinstance(value, State) and not value`: nothing to do.
        if (value.wrapped && PyDict_GET_SIZE(value.obj.get()) == 0) return true;
        // set_raw_value(value) for an array (never a ref), onto a raw value that is no ref.
        Ref value_entry = vars_.LeafEntry(Py_TYPE(value.obj.get()));
        if (!value_entry) return false;
        if (value.wrapped || KindOf(value_entry.get()) != kArrayLeaf) {
            return FlaxKey(node, key, value);
        }
        Ref raw(PyObject_GetAttr(current.get(), GetNames()->raw_value));
        if (!raw) return false;
        Ref raw_entry = vars_.LeafEntry(Py_TYPE(raw.get()));
        if (!raw_entry) return false;
        if (KindOf(raw_entry.get()) == kUnserved) return FlaxKey(node, key, value);
        return vars_.Update(current.get(), value.obj.get(), false);
    }

    // flax's loop body for one key: _graph_update_dynamic(node, {key: value}).
    bool FlaxKey(PyObject* node, PyObject* key, const StateView& value) {
        Ref materialized = Materialize(value);
        if (!materialized) return false;
        Ref one(PyDict_New());
        if (!one || PyDict_SetItem(one.get(), key, materialized.get()) < 0) return false;
        Ref done(PyObject_CallFunctionObjArgs(Item(kUpdateDynamic), node, one.get(), nullptr));
        return static_cast<bool>(done);
    }

    PyObject* const ctx_;  // borrowed: the caller holds the context for the walk
    VariableOps vars_;
    int depth_ = 0;
};

}  // namespace

PyObject* Update(PyObject* node, PyObject* state, PyObject* context) {
    if (!PyTuple_CheckExact(context) || PyTuple_GET_SIZE(context) != kUnflattenSize) {
        PyErr_SetString(PyExc_TypeError, "nnx_graph_update(node, state, context: tuple)");
        return nullptr;
    }
    Walk walk(context);
    if (!walk.Node(node, StateView{Ref::FromBorrowed(state), false})) return nullptr;
    Py_RETURN_NONE;
}

}  // namespace fastree::nnx_graph
