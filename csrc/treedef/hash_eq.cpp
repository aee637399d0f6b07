// Treedef hashing and equality.
//
// Equal treedefs must hash equal. Shared references are part of the structure: (m, m) and
// (m1, m2) differ in both hash and equality. Like JAX, the hash covers the shape (kinds, arities, node types)
// and not aux_data, which may be unhashable; unlike JAX it also mixes in dict keys, which are
// always hashable, so same-shaped dicts with different keys spread across buckets. The hash is
// computed once and cached in the (immutable) treedef.
#include <string>

#include "jax_texts.h"
#include "pyutils.h"
#include "treedef.h"

namespace fastree {
namespace {

inline Py_uhash_t Mix(Py_uhash_t h, Py_uhash_t v) {
    // boost::hash_combine's mixing step, widened to Py_uhash_t.
    return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

}  // namespace

Py_hash_t Hash(PyTreeDefObject* self) {
    if (self->hash != -1) return self->hash;
    const TreeDef& def = self->def;
    Py_uhash_t h = static_cast<Py_uhash_t>(def.nodes.size());
    for (const Node& node : def.nodes) {
        h = Mix(h, static_cast<Py_uhash_t>(node.kind));
        h = Mix(h, static_cast<Py_uhash_t>(node.arity));
        if (node.kind == NodeKind::kSharedRef) {
            h = Mix(h, static_cast<Py_uhash_t>(node.ref));  // the sharing pattern is structure
        } else if (node.kind == NodeKind::kNamedTuple) {
            h = Mix(h, reinterpret_cast<Py_uhash_t>(def.Data(node)));
        } else if (const Registration* custom = def.Custom(node)) {
            h = Mix(h, reinterpret_cast<Py_uhash_t>(custom->type));
        } else if (node.kind == NodeKind::kDict) {
            for (Py_ssize_t i = 0; i < node.arity; ++i) {
                Py_hash_t kh = PyObject_Hash(def.keys[node.keys_begin + i]);
                if (kh == -1) return -1;
                h = Mix(h, static_cast<Py_uhash_t>(kh));
            }
        }
    }
    Py_hash_t out = static_cast<Py_hash_t>(h);
    if (out == -1) out = -2;  // -1 is reserved for errors
    self->hash = out;
    return out;
}

int Equal(const TreeDef& a, const TreeDef& b) {
    if (&a == &b) return 1;
    if (a.nodes.size() != b.nodes.size()) return 0;
    // Cheap structural pass first, so unequal shapes never call into Python.
    for (size_t i = 0; i < a.nodes.size(); ++i) {
        const Node& x = a.nodes[i];
        const Node& y = b.nodes[i];
        if (x.kind != y.kind || x.arity != y.arity) return 0;
        if (x.kind == NodeKind::kSharedRef) {
            if (x.ref != y.ref) return 0;
        } else if (HasPayload(x.kind)) {
            const NodePayload& px = a.payloads[x.payload];
            const NodePayload& py = b.payloads[y.payload];
            if (px.custom != py.custom) return 0;
            if (x.kind == NodeKind::kNamedTuple && px.data != py.data) return 0;
        }
    }
    // Then the values: dict keys and aux data, equal when identical (the usual case: the same
    // interned keys, the same static aux objects) without a call into Python.
    for (size_t i = 0; i < a.nodes.size(); ++i) {
        const Node& x = a.nodes[i];
        const Node& y = b.nodes[i];
        if (x.kind == NodeKind::kDict && x.arity > 0) {  // (no pointer into an empty vector)
            PyObject* const* kx = a.keys.data() + x.keys_begin;
            PyObject* const* ky = b.keys.data() + y.keys_begin;
            for (Count k = 0; k < x.arity; ++k) {
                if (kx[k] == ky[k]) continue;
                int eq = PyObject_RichCompareBool(kx[k], ky[k], Py_EQ);
                if (eq <= 0) return eq;
            }
        } else if (HasPayload(x.kind) && x.kind != NodeKind::kNamedTuple) {
            // JAX compares aux_data with `!=`.
            PyObject* dx = a.payloads[x.payload].data;
            PyObject* dy = b.payloads[y.payload].data;
            if (dx == dy) continue;
            int ne = PyObject_RichCompareBool(dx, dy, Py_NE);
            if (ne < 0) {
                // JAX's explanation, with the comparison's own error as the cause.
                std::string message = "Exception raised while checking equality of metadata "
                                      "fields of pytree";
                const Registration* custom = a.payloads[x.payload].custom;
                if (Texts().aux_equality_names_type && custom != nullptr) {
                    message += " node of type " + Repr(custom->type);
                }
                message += ". Make sure that metadata fields are hashable and have simple "
                           "equality semantics. (Note: arrays cannot be passed as metadata "
                           "fields!)";
                RaiseFromCurrent(PyExc_ValueError, message.c_str());
                return -1;
            }
            if (ne != 0) return 0;
        }
    }
    return 1;
}

}  // namespace fastree
