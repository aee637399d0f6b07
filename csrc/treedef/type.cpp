// The PyTreeDef Python type: slots, methods, and the GC protocol.
#include <new>

#include "diagnostics/aux_check.h"
#include "util/pyutils.h"
#include "treedef/node_kinds.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"
#include "treedef/treedef_state.h"
#include "treedef/walkers.h"
// After Python.h (pulled in above): structmember.h relies on its types.
#include <structmember.h>

namespace fastree {

namespace {

PyTreeDefObject* Self(PyObject* o) { return reinterpret_cast<PyTreeDefObject*>(o); }

bool CheckTreeDef(PyObject* obj, const char* what) {
    if (IsTreeDef(obj)) return true;
    PyErr_Format(PyExc_TypeError, "%s expects a fastree PyTreeDef, got %R.", what, obj);
    return false;
}

// ---- GC: every reference the treedef owns is reported; clearing empties the treedef.

int Traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    const TreeDef& def = Self(self)->def;
    for (const NodePayload& payload : def.payloads) Py_VISIT(payload.data);
    for (PyObject* key : def.keys) Py_VISIT(key);
    return 0;
}

int Clear(PyObject* self) {
    Self(self)->def.Release();
    Self(self)->hash = -1;
    return 0;
}

// ---- dead treedefs kept for reuse
//
// Every flatten makes a treedef and most die soon after. Making the object was 208 of the 824
// instructions of tree_flatten on a 3-leaf tuple (pyenv 3.13, callgrind), 145 of them in
// PyObject_GC_New (pymalloc, the GC's allocation count and header, a thread-state lookup),
// against 81 for the C floor's plain object; its free went through PyObject_GC_Del. So, as
// CPython keeps dead tuples, lists and floats, up to kKeptTreeDefs dead treedefs are kept and
// the next WrapTreeDef takes one: PyObject_Init gives it back its type and a reference, as a
// fresh allocation would. A kept object is untracked, its TreeDef destroyed and its weak
// references cleared; it owns nothing. Its memory came from PyObject_GC_New and goes back
// through PyObject_GC_Del when the list is full or emptied (ReleaseKeptTreeDefs), so the GC's
// allocation count, raised once per allocation, is lowered once per free, as if the object had
// lived all along.
//
// Process-wide under the GIL: the module supports the main interpreter only, and treedefs are
// made and freed with the GIL held. Kept where small node blocks are (small_blocks::kKeepBlocks,
// util/small_block_allocator.h): not on free-threaded builds (a shared list would need a lock,
// and a GC object's header there also records its owning thread), nor under AddressSanitizer,
// where reused memory would hide a use after free.
constexpr int kKeptTreeDefs = small_blocks::kKeepBlocks ? 32 : 0;
PyObject* g_kept[kKeptTreeDefs > 0 ? kKeptTreeDefs : 1];
int g_num_kept = 0;

void Dealloc(PyObject* self) {
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (Self(self)->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
    Self(self)->def.~TreeDef();
    // Only the exact type's objects are kept (the type disallows subclasses today; this keeps a
    // subclass's larger object out of the list if that changes).
    if (kKeptTreeDefs > 0 && g_num_kept < kKeptTreeDefs && tp == g_PyTreeDef_Type) {
        g_kept[g_num_kept++] = self;
    } else {
        tp->tp_free(self);
    }
    Py_DECREF(tp);  // the instance's reference to its heap type (CPython's dealloc idiom)
}

// ---- protocol slots

Py_hash_t HashSlot(PyObject* self) { return Hash(Self(self)); }

PyObject* RichCompare(PyObject* a, PyObject* b, int op) {
    if (!IsTreeDef(a) || !IsTreeDef(b) || (op != Py_EQ && op != Py_NE)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    int eq = Equal(DefOf(a), DefOf(b));
    if (eq < 0) return nullptr;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

PyObject* ReprSlot(PyObject* self) { return Repr(DefOf(self)); }

PyObject* GetNumLeaves(PyObject* self, void*) { return PyLong_FromSsize_t(DefOf(self).num_leaves()); }
PyObject* GetNumNodes(PyObject* self, void*) { return PyLong_FromSsize_t(DefOf(self).num_nodes()); }

// ---- methods

PyObject* MUnflatten(PyObject* self, PyObject* leaves) { return UnflattenIterable(DefOf(self), leaves); }

// Takes `tree` by keyword too, as JAX's flatten_up_to does (its unflatten, compose and
// from_iterable_tree are positional-only, as here).
PyObject* MFlattenUpTo(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
    PyObject* tree;
    if (nargs == 1 && kwnames == nullptr) {
        tree = args[0];
    } else {
        static const char* const names[] = {"tree"};
        if (!ParseArgs({"flatten_up_to", names, 1, 1}, args, nargs, kwnames, &tree)) return nullptr;
    }
    if (PyObject* list = FlattenUpToSequence(DefOf(self), tree)) return list;
    if (PyErr_Occurred()) return nullptr;
    ScratchVector out_buf;  // pooled: no allocation per call
    std::vector<PyObject*>& out = out_buf.get();
    out.reserve(static_cast<size_t>(DefOf(self).num_leaves()));
    if (!FlattenUpTo(DefOf(self), tree, &out)) {
        DecrefAll(out);
        return nullptr;
    }
    PyObject* list = StealIntoList(out);
    if (list == nullptr) DecrefAll(out);
    return list;
}

PyObject* MChildren(PyObject* self, PyObject*) { return Children(DefOf(self)); }

PyObject* MCompose(PyObject* self, PyObject* inner) {
    if (!CheckTreeDef(inner, "PyTreeDef.compose()")) return nullptr;
    return Compose(DefOf(self), DefOf(inner));
}

PyObject* MNodeData(PyObject* self, PyObject*) {
    const TreeDef& def = DefOf(self);
    if (def.nodes.empty()) Py_RETURN_NONE;
    return kinds::NodeData(PartsOf(def, def.nodes.back()));
}

PyObject* MFromIterableTree(PyObject* self, PyObject* tree) { return FromIterableTree(DefOf(self), tree); }

PyObject* MWalk(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    static const char* const names[] = {"f_node", "f_leaf", "leaves"};
    PyObject* a[3];
    if (!ParseArgs({"walk", names, 3, 3}, args, nargs, kwnames, a)) return nullptr;
    return Walk(DefOf(self), a[0], OptionalArg(a[1]), a[2]);
}

// from_node_data_and_children(node_data, children), or JAX's spelling with a leading registry
// argument (ignored: fastree has one registry).
PyObject* MFromNodeDataAndChildren(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                                   PyObject* kwnames) {
    if (kwnames == nullptr && nargs == 2) return FromNodeDataAndChildren(args[0], args[1]);
    static const char* const names[] = {"registry", "node_data", "children"};
    PyObject* a[3];
    if (!ParseArgs({"from_node_data_and_children", names, 3, 0}, args, nargs, kwnames, a)) {
        return nullptr;
    }
    for (int i = 1; i < 3; ++i) {
        if (a[i] == nullptr) {
            PyErr_Format(PyExc_TypeError, "from_node_data_and_children() missing required "
                         "argument '%s'", names[i]);
            return nullptr;
        }
    }
    return FromNodeDataAndChildren(a[1], a[2]);
}

PyObject* MReduce(PyObject* self, PyObject*) { return Reduce(DefOf(self)); }
PyObject* MState(PyObject* self, PyObject*) { return State(DefOf(self)); }

PyObject* MNodes(PyObject* self, PyObject*) { return NodeRecords(DefOf(self)); }

PyObject* MToJax(PyObject* self, PyObject*) {
    // Held for the call: the hook may be replaced (and the old one freed) while it runs.
    Ref hook = LoadHook(&TreeDefState::to_jax_hook);
    if (!hook) {
        PyErr_SetString(PyExc_RuntimeError, "fastree's JAX bridge is not installed.");
        return nullptr;
    }
    return PyObject_CallOneArg(hook.get(), self);
}

// A METH_FASTCALL | METH_KEYWORDS function, exception-guarded, as a PyCFunction.
// Its aux_data reports are made after its walk (aux::ReportScope).
template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*)>
const PyCFunction FastCall =
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Guard<aux::ReportAfter<F>>));

PyMethodDef kMethods[] = {
    {"unflatten", Guard<MUnflatten>, METH_O,
     "unflatten($self, leaves, /)\n--\n\nBuilds a tree of this structure from an iterable of "
     "leaves."},
    {"flatten_up_to", FastCall<MFlattenUpTo>, METH_FASTCALL | METH_KEYWORDS,
     "flatten_up_to($self, tree)\n--\n\nFlattens `tree` up to this structure: the subtrees at "
     "this treedef's leaf positions become the leaves."},
    {"children", Guard<MChildren>, METH_NOARGS,
     "children($self, /)\n--\n\nThe treedefs of the root's children."},
    {"compose", Guard<MCompose>, METH_O,
     "compose($self, inner, /)\n--\n\nThe treedef of this structure with `inner` at every leaf."},
    {"node_data", Guard<MNodeData>, METH_NOARGS,
     "node_data($self, /)\n--\n\nNone for a leaf, else (type, data) of the root node."},
    {"walk", FastCall<MWalk>, METH_FASTCALL | METH_KEYWORDS,
     "walk($self, f_node, f_leaf, leaves)\n--\n\nFolds the structure bottom-up: "
     "f_leaf(leaf) at leaves, f_node(children_tuple, node_data) at nodes."},
    {"from_iterable_tree", Guard<MFromIterableTree>, METH_O,
     "from_iterable_tree($self, tree, /)\n--\n\nRebuilds this structure from nested iterables."},
    {"from_node_data_and_children", FastCall<MFromNodeDataAndChildren>,
     METH_FASTCALL | METH_KEYWORDS | METH_STATIC,
     "from_node_data_and_children(node_data, children)\n--\n\nThe inverse of node_data() and "
     "children(). JAX's form with a leading registry argument is accepted too."},
    {"to_jax", Guard<MToJax>, METH_NOARGS,
     "to_jax($self, /)\n--\n\nThe equal jax.tree_util.PyTreeDef."},
    {"__reduce__", Guard<MReduce>, METH_NOARGS, nullptr},
    {"_state", Guard<MState>, METH_NOARGS,
     "_state($self, /)\n--\n\nThe post-order node records (version, ((type, data, arity, ref), "
     "...)): the pickle state, and the input of serialize/fingerprint/diff."},
    {"_nodes", Guard<MNodes>, METH_NOARGS,
     "_nodes($self, /)\n--\n\nOne (kind, type, data, arity, num_leaves, ref, child_keys) "
     "record per post-order node: the kind's name ('leaf', 'dict', 'custom', ...), node_data()'s "
     "type and data (None for a leaf or shared reference), the index a 'shared_ref' repeats "
     "(else -1), and the key entries of the children as flatten_with_path makes them."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef kGetSet[] = {
    {"num_leaves", GetNumLeaves, nullptr, "Number of leaves.", nullptr},
    {"num_nodes", GetNumNodes, nullptr, "Number of nodes, leaves included.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMemberDef kMembers[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PyTreeDefObject, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot kSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(Traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(Clear)},
    {Py_tp_hash, reinterpret_cast<void*>(HashSlot)},
    {Py_tp_richcompare, reinterpret_cast<void*>(Guard<RichCompare>)},
    {Py_tp_repr, reinterpret_cast<void*>(Guard<ReprSlot>)},
    {Py_tp_methods, kMethods},
    {Py_tp_getset, kGetSet},
    {Py_tp_members, kMembers},
    {Py_tp_doc, const_cast<char*>(
        "The structure of a pytree: node types, arities, dict keys and aux data, without the "
        "leaves. Immutable, hashable and picklable.")},
    {0, nullptr},
};

PyType_Spec kSpec = {
    "fastree.PyTreeDef",
    sizeof(PyTreeDefObject),
    0,
    // Treedefs come from flatten and friends only, as in JAX: `PyTreeDef()` would skip the
    // C++ constructor of the embedded TreeDef.
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    kSlots,
};

}  // namespace

PyTypeObject* CreateTreeDefType() {
    // Held by the module state for the process; g_PyTreeDef_Type is its mirror for IsTreeDef.
    TreeDefState& s = state::TreeDef();
    s.type = Ref(PyType_FromSpec(&kSpec));
    g_PyTreeDef_Type = reinterpret_cast<PyTypeObject*>(s.type.get());
    return g_PyTreeDef_Type;
}

PyObject* WrapTreeDef(TreeDef&& def) {
    PyTreeDefObject* self;
    if (kKeptTreeDefs > 0 && g_num_kept > 0) {
        // A kept treedef's memory (see Dealloc): the type's reference and a new refcount of 1.
        self = Self(PyObject_Init(g_kept[--g_num_kept], g_PyTreeDef_Type));
    } else {
        self = PyObject_GC_New(PyTreeDefObject, g_PyTreeDef_Type);
        if (self == nullptr) return nullptr;
    }
    new (&self->def) TreeDef(std::move(def));
    self->hash = -1;
    self->weakrefs = nullptr;
    // A treedef that owns no references (tuples, lists and None only) cannot be part of a
    // reference cycle, so, as CPython does for tuples of atomic objects, it is left untracked:
    // a small flatten then skips tracking and untracking, and collections skip it.
    if (!self->def.keys.empty() || !self->def.payloads.empty()) {
        PyObject_GC_Track(reinterpret_cast<PyObject*>(self));
    }
    return reinterpret_cast<PyObject*>(self);
}

void ReleaseKeptTreeDefs() {
    while (g_num_kept > 0) PyObject_GC_Del(g_kept[--g_num_kept]);
}

void SetToJaxHook(PyObject* hook) { StoreHook(&TreeDefState::to_jax_hook, hook); }

}  // namespace fastree
