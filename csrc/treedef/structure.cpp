// Building and taking apart treedefs: children(), compose(), treedef_tuple(), node_data(),
// from_node_data_and_children(), walk() and from_iterable_tree().
#include <string>
#include <unordered_map>

#include "keys.h"
#include "pyutils.h"
#include "treedef.h"
#include "treedef_ops.h"
#include "walkers.h"
#include "unflatten_with.h"

namespace fastree {
namespace {

Py_ssize_t SubtreeBegin(const TreeDef& def, Py_ssize_t root) {
    return root - def.nodes[root].num_nodes + 1;
}

// What walk() passes to f_node as the node's data: node_data()'s second half, except that a
// namedtuple passes its class (as JAX does).
PyObject* DataPart(const TreeDef& def, const Node& node) {
    if (node.kind == NodeKind::kNamedTuple) return Py_NewRef(def.Data(node));
    Ref nd(def.NodeData(node));
    if (!nd) return nullptr;
    return Py_NewRef(PyTuple_GET_ITEM(nd.get(), 1));
}


}  // namespace

PyObject* ChildKey(const TreeDef& def, const Node& node, Py_ssize_t k) {
    switch (node.kind) {
        case NodeKind::kDict:
            return keys::Dict(def.keys[node.keys_begin + k]);
        case NodeKind::kOrderedDict:
            return keys::Dict(PyTuple_GET_ITEM(def.Data(node), k));
        case NodeKind::kDefaultDict:
            return keys::Dict(PyTuple_GET_ITEM(PyTuple_GET_ITEM(def.Data(node), 1), k));
        case NodeKind::kNamedTuple: {
            Ref fields(PyObject_GetAttrString(def.Data(node), "_fields"));
            Ref name(fields ? PySequence_GetItem(fields.get(), k) : nullptr);
            return name ? keys::GetAttr(name.get()) : nullptr;
        }
        case NodeKind::kDataclass:
            return keys::GetAttr(PyTuple_GET_ITEM(def.Custom(node)->data_fields, k));
        case NodeKind::kTuple:
        case NodeKind::kList:
            return keys::Sequence(k);
        default:
            return keys::FlattenedIndex(k);
    }
}

std::string KeyPathString(const TreeDef& def, Py_ssize_t index) {
    std::string out;
    Py_ssize_t at = def.num_nodes() - 1;
    std::vector<Py_ssize_t> roots;
    while (at != index && at >= 0) {
        def.ChildRoots(at, &roots);
        Py_ssize_t next = -1;
        for (size_t k = 0; k < roots.size(); ++k) {
            const Py_ssize_t c = roots[k];
            if (c - def.nodes[c].num_nodes < index && index <= c) {
                Ref key(ChildKey(def, def.nodes[at], static_cast<Py_ssize_t>(k)));
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
    node.arity = arity;
    // What the payload will hold (borrowed until it is stored), for the kinds that have one.
    PyObject* payload_data = data;
    const Registration* payload_custom = reg;
    switch (reg->kind) {
        case NodeKind::kLeaf:
        case NodeKind::kSharedRef:
            PyErr_Format(PyExc_RuntimeError, "Could not find type: %R.", type);
            return false;
        case NodeKind::kNone:
            if (arity != 0) {
                PyErr_SetString(PyExc_ValueError, "None nodes have no children.");
                return false;
            }
            break;
        case NodeKind::kTuple:
        case NodeKind::kList:
            break;
        case NodeKind::kNamedTuple:
            payload_data = type;
            payload_custom = nullptr;
            break;
        case NodeKind::kDict: {
            Ref keys(PySequence_Tuple(data));
            if (!keys) return false;
            if (PyTuple_GET_SIZE(keys.get()) != arity) {
                PyErr_Format(PyExc_ValueError, "Dict node data has %zd keys for %zd children.",
                             PyTuple_GET_SIZE(keys.get()), arity);
                return false;
            }
            node.keys_begin = static_cast<Py_ssize_t>(def->keys.size());
            for (Py_ssize_t i = 0; i < arity; ++i) {
                PushNewRef(def->keys, PyTuple_GET_ITEM(keys.get(), i));
            }
            break;
        }
        case NodeKind::kOrderedDict:
            if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != arity) {
                PyErr_SetString(PyExc_ValueError,
                                "OrderedDict node data must be a tuple with one key per child.");
                return false;
            }
            break;
        case NodeKind::kDefaultDict:
            if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 ||
                !PyTuple_Check(PyTuple_GET_ITEM(data, 1)) ||
                PyTuple_GET_SIZE(PyTuple_GET_ITEM(data, 1)) != arity) {
                PyErr_SetString(PyExc_ValueError,
                                "defaultdict node data must be (default_factory, keys) with one "
                                "key per child.");
                return false;
            }
            break;
        case NodeKind::kDataclass:
            if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != PyTuple_GET_SIZE(reg->meta_fields) ||
                arity != PyTuple_GET_SIZE(reg->data_fields)) {
                PyErr_Format(PyExc_ValueError,
                             "Dataclass node %R expects %zd meta values and %zd children.", type,
                             PyTuple_GET_SIZE(reg->meta_fields), PyTuple_GET_SIZE(reg->data_fields));
                return false;
            }
            break;
        case NodeKind::kCustom:
            break;
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
        node.payload = def->AddPayload(payload_data, payload_custom);
        Py_INCREF(payload_data);
    }
    def->nodes.push_back(node);
    return true;
}

PyObject* Children(const TreeDef& def) {
    if (def.nodes.empty()) return PyList_New(0);
    std::vector<Py_ssize_t> roots;
    def.ChildRoots(def.num_nodes() - 1, &roots);
    Ref list(PyList_New(static_cast<Py_ssize_t>(roots.size())));
    if (!list) return nullptr;
    for (size_t i = 0; i < roots.size(); ++i) {
        TreeDef child;
        child.AppendRange(def, SubtreeBegin(def, roots[i]), roots[i] + 1);
        PyObject* wrapped = WrapTreeDef(std::move(child));
        if (wrapped == nullptr) return nullptr;
        PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(i), wrapped);
    }
    return list.release();
}

PyObject* Compose(const TreeDef& outer, const TreeDef& inner) {
    TreeDef out;
    // Where each outer node landed, so outer shared references can be re-pointed.
    std::vector<Py_ssize_t> moved(static_cast<size_t>(outer.num_nodes()), -1);
    for (Py_ssize_t i = 0; i < outer.num_nodes(); ++i) {
        const Node& node = outer.nodes[i];
        if (node.kind == NodeKind::kLeaf) {
            out.AppendRange(inner, 0, inner.num_nodes());  // a fresh, self-contained copy
        } else if (node.kind == NodeKind::kSharedRef) {
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
        if (node.kind == NodeKind::kSharedRef) {
            // A repeated node folds to the very value of its first occurrence.
            PyObject* target = shared.Find(node.ref);
            value = target != nullptr ? Py_NewRef(target) : nullptr;
            if (value == nullptr) PyErr_SetString(PyExc_ValueError, "dangling shared reference");
        } else if (node.kind == NodeKind::kLeaf) {
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
    if (node.kind == NodeKind::kLeaf) return Py_NewRef(obj);
    if (node.kind == NodeKind::kSharedRef) {  // the object built at the first occurrence
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
    RefVector children;  // owned until BuildNode consumes them
    children.reserve(roots.size());
    for (size_t k = 0; k < roots.size(); ++k) {
        PyObject* child = FromIterable(def, roots[k], PyTuple_GET_ITEM(items.get(), k), shared);
        if (child == nullptr) return nullptr;
        children.push_back(child);  // (reserved: cannot throw)
    }
    Ref built(BuildNode(def, node, children.data()));
    children.clear();  // consumed by BuildNode, success or not
    if (built && node.shared_target) shared->Add(index, built.get());
    return built.release();
}

PyObject* FromIterableTree(const TreeDef& def, PyObject* obj) {
    if (def.nodes.empty()) return Py_NewRef(Py_None);
    SharedObjects shared;
    return FromIterable(def, def.num_nodes() - 1, obj, &shared);
}

}  // namespace fastree
