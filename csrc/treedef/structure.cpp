// Building and taking apart treedefs: children(), compose(), treedef_tuple(), node_data(),
// from_node_data_and_children(), walk() and from_iterable_tree().
#include <string>
#include <unordered_map>

#include "registry/keys.h"
#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/walkers.h"
#include "treedef/unflatten_with.h"

namespace fastree {
namespace {

Py_ssize_t SubtreeBegin(const TreeDef& def, Py_ssize_t root) {
    return root - def.nodes[root].num_nodes + 1;
}

// What walk() passes to f_node as the node's data: node_data()'s second half, except that a
// namedtuple passes its class (as JAX does).
PyObject* DataPart(const TreeDef& def, const Node& node) {
    const NodeParts parts = PartsOf(def, node);
    if (kinds::DataIsType(node.kind)) return Py_NewRef(parts.data);
    return kinds::Data(parts);
}

}  // namespace

std::string KeyPathString(const TreeDef& def, Py_ssize_t index) {
    keys::WalkScope key_scope;  // a wide node's entries made once per call (see NodeRecords)
    std::string out;
    Py_ssize_t at = def.num_nodes() - 1;
    std::vector<Py_ssize_t> roots;
    while (at != index && at >= 0) {
        def.ChildRoots(at, &roots);
        Py_ssize_t next = -1;
        for (size_t k = 0; k < roots.size(); ++k) {
            const Py_ssize_t c = roots[k];
            if (c - def.nodes[c].num_nodes < index && index <= c) {
                Ref key(kinds::ChildKey(PartsOf(def, def.nodes[at]), static_cast<Py_ssize_t>(k)));
                if (!key || !StrInto(key.get(), &out)) {
                    PyErr_Clear();
                    out += "<?>";
                }
                next = c;
                break;
            }
        }
        at = next;
    }
    return out;
}

bool MakeRootNode(PyObject* type, PyObject* data, Py_ssize_t arity, TreeDef* def) {
    if (!PyType_Check(type)) {
        PyErr_Format(PyExc_TypeError, "Expected a type in node_data, got %R.", type);
        return false;
    }
    const Registration* reg = registry::ClassifyType(reinterpret_cast<PyTypeObject*>(type));
    Node node;
    node.kind = reg->kind;
    node.arity = static_cast<Count>(arity);
    // What the payload will hold (borrowed until it is stored), for the kinds that have one.
    NodeParts parts;
    parts.kind = reg->kind;
    parts.arity = arity;
    parts.data = data;
    parts.custom = reg;
    if (kinds::DataIsType(node.kind)) {  // a namedtuple: its class is its data
        parts.data = type;
        parts.custom = nullptr;
    }
    if (node.HasKeys()) {
        // A dict's keys, given as any sequence, are stored in the treedef's key vector.
        Ref keys(PySequence_Tuple(data));
        if (!keys) return false;
        if (PyTuple_GET_SIZE(keys.get()) != arity) {
            PyErr_Format(PyExc_ValueError, "Dict node data has %zd keys for %zd children.",
                         PyTuple_GET_SIZE(keys.get()), arity);
            return false;
        }
        node.keys_begin = static_cast<Count>(def->keys.size());
        for (Py_ssize_t i = 0; i < arity; ++i) {
            PushNewRef(def->keys, PyTuple_GET_ITEM(keys.get(), i));
        }
    } else if (!kinds::CheckParts(parts, type)) {
        return false;
    }
    // Counts follow from the children already appended (the last `arity` subtrees).
    Py_ssize_t child = def->num_nodes() - 1;
    for (Py_ssize_t k = 0; k < arity; ++k) {
        if (child < 0) {
            PyErr_SetString(PyExc_ValueError, "Not enough child subtrees for node arity.");
            return false;
        }
        node.num_leaves += def->nodes[child].num_leaves;
        node.num_nodes += def->nodes[child].num_nodes;
        child -= def->nodes[child].num_nodes;
    }
    node.num_nodes += 1;
    if (HasPayload(node.kind)) {
        // Stored first, referenced once stored: a push that throws leaks nothing.
        node.payload = def->AddPayload(parts.data, parts.custom);
        Py_INCREF(parts.data);
    }
    def->nodes.push_back(node);
    return true;
}

PyObject* Children(const TreeDef& def) {
    if (def.nodes.empty()) return PyList_New(0);
    std::vector<Py_ssize_t> roots;
    def.ChildRoots(def.num_nodes() - 1, &roots);
    // Each treedef object allocates (the cyclic GC can run): NewSequenceOf (pyutils.h).
    return NewSequenceOf<false>(static_cast<Py_ssize_t>(roots.size()), [&](Py_ssize_t i) {
        TreeDef child;
        child.AppendRange(def, SubtreeBegin(def, roots[static_cast<size_t>(i)]),
                          roots[static_cast<size_t>(i)] + 1);
        return WrapTreeDef(std::move(child));
    });
}

PyObject* Compose(const TreeDef& outer, const TreeDef& inner) {
    TreeDef out;
    // Where each outer node landed, so outer shared references can be re-pointed.
    std::vector<Py_ssize_t> moved(static_cast<size_t>(outer.num_nodes()), -1);
    for (Py_ssize_t i = 0; i < outer.num_nodes(); ++i) {
        const Node& node = outer.nodes[i];
        if (node.IsLeaf()) {
            out.AppendRange(inner, 0, inner.num_nodes());  // a fresh, self-contained copy
        } else if (node.IsSharedRef()) {
            out.AppendSharedRef(moved[node.ref]);
        } else {
            out.AppendRange(outer, i, i + 1);
        }
        moved[i] = out.num_nodes() - 1;
    }
    out.Renormalize(0);
    return WrapTreeDef(std::move(out));
}

PyObject* TreeDefTuple(PyObject* treedefs) {
    Ref seq(PySequence_Tuple(treedefs));
    if (!seq) return nullptr;
    TreeDef out;
    const Py_ssize_t n = PyTuple_GET_SIZE(seq.get());
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* td = PyTuple_GET_ITEM(seq.get(), i);
        if (!IsTreeDef(td)) {
            PyErr_Format(PyExc_TypeError, "Expected a PyTreeDef, got %R.", td);
            return nullptr;
        }
        out.AppendRange(DefOf(td), 0, DefOf(td).num_nodes());
    }
    if (!MakeRootNode(reinterpret_cast<PyObject*>(&PyTuple_Type), Py_None, n, &out)) return nullptr;
    return WrapTreeDef(std::move(out));
}

PyObject* FromNodeDataAndChildren(PyObject* node_data, PyObject* children) {
    Ref seq(PySequence_Tuple(children));
    if (!seq) return nullptr;
    const Py_ssize_t n = PyTuple_GET_SIZE(seq.get());
    TreeDef out;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* td = PyTuple_GET_ITEM(seq.get(), i);
        if (!IsTreeDef(td)) {
            PyErr_Format(PyExc_TypeError, "Expected a PyTreeDef child, got %R.", td);
            return nullptr;
        }
        out.AppendRange(DefOf(td), 0, DefOf(td).num_nodes());
    }
    if (node_data == Py_None) {
        if (n != 0) {
            PyErr_SetString(PyExc_ValueError, "A leaf (node_data None) cannot have children.");
            return nullptr;
        }
        out.AppendLeaf();
        return WrapTreeDef(std::move(out));
    }
    if (!PyTuple_Check(node_data) || PyTuple_GET_SIZE(node_data) != 2) {
        PyErr_Format(PyExc_TypeError, "node_data must be None or a (type, data) tuple, got %R.",
                     node_data);
        return nullptr;
    }
    if (!MakeRootNode(PyTuple_GET_ITEM(node_data, 0), PyTuple_GET_ITEM(node_data, 1), n, &out)) {
        return nullptr;
    }
    return WrapTreeDef(std::move(out));
}

PyObject* Walk(const TreeDef& def, PyObject* f_node, PyObject* f_leaf, PyObject* leaves) {
    Ref seq(PySequence_Tuple(leaves));  // a tuple of our own: callbacks cannot change it
    if (!seq) return nullptr;
    if (!CheckLeafCount(def, PyTuple_GET_SIZE(seq.get()))) return nullptr;
    // Both owned and released however the walk ends (error, or a C++ exception unwinding).
    RefVector stack;
    SharedObjects shared;  // results of shared nodes
    Py_ssize_t next = 0;
    for (Py_ssize_t index = 0; index < def.num_nodes(); ++index) {
        const Node& node = def.nodes[index];  // the treedef is immutable
        PyObject* value;
        if (node.IsSharedRef()) {
            // A repeated node folds to the very value of its first occurrence.
            PyObject* target = shared.Find(node.ref);
            value = target != nullptr ? Py_NewRef(target) : nullptr;
            if (value == nullptr) PyErr_SetString(PyExc_ValueError, "dangling shared reference");
        } else if (node.IsLeaf()) {
            PyObject* leaf = PyTuple_GET_ITEM(seq.get(), next++);
            value = f_leaf ? PyObject_CallOneArg(f_leaf, leaf) : Py_NewRef(leaf);
        } else {
            // Allocated before the children leave the stack: the GC this can run sees them owned.
            Ref children(PyTuple_New(node.arity));
            if (!children) return nullptr;
            for (Py_ssize_t k = 0; k < node.arity; ++k) {
                PyTuple_SET_ITEM(children.get(), k, stack[stack.size() - node.arity + k]);
            }
            stack.resize(stack.size() - node.arity);  // their references moved into `children`
            Ref data(DataPart(def, node));
            if (!data) return nullptr;
            PyObject* args[2] = {children.get(), data.get()};
            value = PyObject_Vectorcall(f_node, args, 2, nullptr);
        }
        if (value == nullptr) return nullptr;
        PushOwned(stack, value);
        if (node.shared_target) shared.Add(index, value);
    }
    if (stack.empty()) return Py_NewRef(Py_None);
    PyObject* out = stack.back();
    stack.pop_back();  // `out`'s reference is returned; anything left is released
    return out;
}

// Rebuilds this structure from a tree of iterables: each node's children are read by iterating
// the object at that position.
static PyObject* FromIterable(const TreeDef& def, Py_ssize_t index, PyObject* obj,
                              SharedObjects* shared) {
    const Node& node = def.nodes[index];
    if (node.IsLeaf()) return Py_NewRef(obj);
    if (node.IsSharedRef()) {  // the object built at the first occurrence
        PyObject* target = shared->Find(node.ref);
        if (target == nullptr) {
            PyErr_SetString(PyExc_ValueError, "dangling shared reference");
            return nullptr;
        }
        return Py_NewRef(target);
    }
    RecursionGuard guard(" in PyTreeDef.from_iterable_tree");
    if (!guard.ok()) return nullptr;
    // A tuple of our own: the children stay alive whatever the iteration or a callback below
    // does to `obj`.
    Ref items(PySequence_Tuple(obj));
    if (!items) return nullptr;
    if (PyTuple_GET_SIZE(items.get()) != node.arity) {
        PyErr_SetString(PyExc_ValueError, "Arity mismatch between trees");
        return nullptr;
    }
    std::vector<Py_ssize_t> roots;
    def.ChildRoots(index, &roots);
    RefVector children;  // owned until kinds::Build consumes them
    children.reserve(roots.size());
    for (size_t k = 0; k < roots.size(); ++k) {
        PyObject* child = FromIterable(def, roots[k], PyTuple_GET_ITEM(items.get(), k), shared);
        if (child == nullptr) return nullptr;
        children.push_back(child);  // (reserved: cannot throw)
    }
    Ref built(kinds::Build(PartsOf(def, node), children.data()));
    children.clear();  // consumed by kinds::Build, success or not
    if (built && node.shared_target) shared->Add(index, built.get());
    return built.release();
}

PyObject* FromIterableTree(const TreeDef& def, PyObject* obj) {
    if (def.nodes.empty()) return Py_NewRef(Py_None);
    SharedObjects shared;
    return FromIterable(def, def.num_nodes() - 1, obj, &shared);
}

}  // namespace fastree
