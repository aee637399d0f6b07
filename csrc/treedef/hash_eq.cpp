// Treedef hashing and equality.
//
// Equal treedefs must hash equal. Shared references are part of the structure: (m, m) and
// (m1, m2) differ in both hash and equality. Like JAX, the hash covers the shape (kinds, arities,
// node types) and neither aux_data, which may be unhashable, nor dict keys: a key's __hash__ can
// be user code that raises (JAX's hash never does), and a key equal to a str key need not be one
// (a str enum member, a user class), so no subset of keys could be mixed in consistently with
// equality. Hashing therefore runs no Python code and cannot fail. It is computed once and cached
// in the (immutable) treedef.
#include <cstring>
#include <string>

#include "registry/jax_texts.h"
#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"

namespace fastree {
namespace {

inline Py_uhash_t Mix(Py_uhash_t h, Py_uhash_t v) {
    // boost::hash_combine's mixing step, widened to Py_uhash_t.
    return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

}  // namespace

Py_hash_t Hash(PyTreeDefObject* self) {
    // The cache is read and written with relaxed atomic accesses (treedef.h, the field): threads
    // hashing one treedef at once each compute the same value, and either store wins.
    const Py_hash_t cached = __atomic_load_n(&self->hash, __ATOMIC_RELAXED);
    if (cached != -1) return cached;
    const TreeDef& def = self->def;
    Py_uhash_t h = static_cast<Py_uhash_t>(def.nodes.size());
    for (const Node& node : def.nodes) {
        h = Mix(h, static_cast<Py_uhash_t>(node.kind));
        h = Mix(h, static_cast<Py_uhash_t>(node.arity));
        if (node.IsSharedRef()) {
            h = Mix(h, static_cast<Py_uhash_t>(node.ref));  // the sharing pattern is structure
        } else if (kinds::DataIsType(node.kind)) {  // a namedtuple: its class
            h = Mix(h, reinterpret_cast<Py_uhash_t>(def.Data(node)));
        } else if (const Registration* custom = def.Custom(node)) {
            h = Mix(h, reinterpret_cast<Py_uhash_t>(custom->type));
        }
    }
    Py_hash_t out = static_cast<Py_hash_t>(h);
    if (out == -1) out = -2;  // -1 is reserved for errors
    __atomic_store_n(&self->hash, out, __ATOMIC_RELAXED);
    return out;
}

namespace {

// The shape, node by node: kinds, arities, shared references, node types. No Python code runs.
bool SameShape(const TreeDef& a, const TreeDef& b) {
    for (size_t i = 0; i < a.nodes.size(); ++i) {
        const Node& x = a.nodes[i];
        const Node& y = b.nodes[i];
        if (x.kind != y.kind || x.arity != y.arity) return false;
        if (x.IsSharedRef()) {
            if (x.ref != y.ref) return false;
        } else if (HasPayload(x.kind)) {
            const NodePayload& px = a.payloads[x.payload];
            const NodePayload& py = b.payloads[y.payload];
            if (px.custom != py.custom) return false;
            if (kinds::DataIsType(x.kind) && px.data != py.data) return false;
        }
    }
    return true;
}

// Byte-identical node vectors mean the same kinds, arities and references (every other field
// of a Node follows from those, and a Node has no padding); the node types, kept in the
// payloads, are compared here too. False does not mean a different shape: SameShape decides.
bool SameShapeFast(const TreeDef& a, const TreeDef& b) {
    if (a.payloads.size() != b.payloads.size() ||
        std::memcmp(a.nodes.data(), b.nodes.data(), a.nodes.size() * sizeof(Node)) != 0) {
        return false;
    }
    for (size_t i = 0; i < a.payloads.size(); ++i) {
        const NodePayload& px = a.payloads[i];
        const NodePayload& py = b.payloads[i];
        if (px.custom != py.custom) return false;
        if (px.custom == nullptr && px.data != py.data) return false;  // namedtuple classes
    }
    return true;
}

// Dict keys compared with ==, equal when identical (the usual case: the same interned keys)
// without a call into Python. 1, 0, or -1 with an error set.
int SameKeys(PyObject* const* kx, PyObject* const* ky, size_t n) {
    // All identical, the usual case: one vectorised comparison of the pointer arrays.
    if (n == 0 || std::memcmp(kx, ky, n * sizeof(PyObject*)) == 0) return 1;
    for (size_t k = 0; k < n; ++k) {
        if (kx[k] == ky[k]) continue;
        int eq = PyObject_RichCompareBool(kx[k], ky[k], Py_EQ);
        if (eq <= 0) return eq;
    }
    return 1;
}

// aux_data compared with `!=`, as JAX does. 1 (equal), 0, or -1 with JAX's error set.
int SameData(const NodePayload& x, const NodePayload& y) {
    if (x.data == y.data) return 1;
    int ne = PyObject_RichCompareBool(x.data, y.data, Py_NE);
    if (ne >= 0) return ne == 0 ? 1 : 0;
    // JAX's explanation, with the comparison's own error as the cause. That error is set aside
    // while the message is built: repr() of the type can run Python code (a metaclass __repr__,
    // the cyclic GC's callbacks), which must not run with an exception pending, and a repr that
    // fails is cleared, which must not clear the comparison's error.
    SavedError cause;
    cause.Save();
    std::string message = "Exception raised while checking equality of metadata fields of pytree";
    if (Texts().aux_equality_names_type && x.custom != nullptr) {
        message += " node of type " + Repr(x.custom->type);
    }
    message += ". Make sure that metadata fields are hashable and have simple equality "
               "semantics. (Note: arrays cannot be passed as metadata fields!)";
    cause.Restore();
    RaiseFromCurrent(PyExc_ValueError, message.c_str());
    return -1;
}

}  // namespace

int Equal(const TreeDef& a, const TreeDef& b) {
    if (&a == &b) return 1;
    if (a.nodes.size() != b.nodes.size()) return 0;
    // The shape first, so that unequal shapes never call into Python.
    if (SameShapeFast(a, b)) {
        // Same node vectors, so keys and payloads sit at the same positions in both: compared
        // as flat arrays, without walking the nodes again.
        if (a.keys.size() != b.keys.size()) return 0;  // (cannot happen; cheap to rule out)
        // (SameKeys is a call: a treedef without dicts does not pay for it.)
        int same = a.keys.empty() ? 1 : SameKeys(a.keys.data(), b.keys.data(), a.keys.size());
        for (size_t i = 0; same == 1 && i < a.payloads.size(); ++i) {
            if (a.payloads[i].custom != nullptr) same = SameData(a.payloads[i], b.payloads[i]);
        }
        return same;
    }
    if (!SameShape(a, b)) return 0;
    // Same shape, laid out differently: compare the values node by node.
    for (size_t i = 0; i < a.nodes.size(); ++i) {
        const Node& x = a.nodes[i];
        const Node& y = b.nodes[i];
        int same = 1;
        if (x.HasKeys() && x.arity > 0) {  // (no pointer into an empty vector)
            same = SameKeys(a.keys.data() + x.keys_begin, b.keys.data() + y.keys_begin,
                            static_cast<size_t>(x.arity));
        } else if (HasPayload(x.kind) && !kinds::DataIsType(x.kind)) {
            same = SameData(a.payloads[x.payload], b.payloads[y.payload]);
        }
        if (same != 1) return same;
    }
    return 1;
}

namespace {

// The same object, or exact tuples of the same length whose items are (recursively, to a small
// depth) the same objects: an attribute node's aux is a new tuple per flatten, built from the
// same field values. Never calls into Python.
bool SameObjects(PyObject* x, PyObject* y, int depth) {
    if (x == y) return true;
    if (depth == 0 || !PyTuple_CheckExact(x) || !PyTuple_CheckExact(y)) return false;
    const Py_ssize_t n = PyTuple_GET_SIZE(x);
    if (PyTuple_GET_SIZE(y) != n) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!SameObjects(PyTuple_GET_ITEM(x, i), PyTuple_GET_ITEM(y, i), depth - 1)) return false;
    }
    return true;
}

}  // namespace

bool KeysFollowFromStructure(const TreeDef& def) {
    // Not a custom node's (its flatten_with_keys gives them), nor a shared reference's.
    for (const Node& node : def.nodes) {
        if (node.kind == NodeKind::kCustom || node.kind == NodeKind::kSharedRef) return false;
    }
    return true;
}

bool SameStructureAndKeys(const TreeDef& a, const TreeDef& b) {
    // Equal's fast shape test (the node vectors byte for byte, the registrations), then each
    // key and each node's data by identity where Equal would ask `==`.
    if (a.nodes.size() != b.nodes.size() || a.keys.size() != b.keys.size() ||
        !SameShapeFast(a, b) || !KeysFollowFromStructure(a)) {
        return false;
    }
    if (!a.keys.empty() &&
        std::memcmp(a.keys.data(), b.keys.data(), a.keys.size() * sizeof(PyObject*)) != 0) {
        return false;
    }
    constexpr int kAuxDepth = 3;  // an attribute node's aux: (names, names, (values...))
    for (size_t i = 0; i < a.payloads.size(); ++i) {
        if (!SameObjects(a.payloads[i].data, b.payloads[i].data, kAuxDepth)) return false;
    }
    return true;
}

}  // namespace fastree
