// The items layout of attribute nodes: a class whose children are the values of one dict the
// instance keeps in an attribute, in sorted key order (flax.nnx's State, a Mapping over its
// `_mapping` dict).
//
// Layout (what one instance gives), as flax.nnx 0.12's statelib._state_flatten reads it:
//   children  the dict's values, in the order of its sorted keys (`sorted(x._mapping.items())`
//             on unique keys compares keys only); keys DictKey(key).
//   aux data  the tuple of the sorted keys.
//   rebuild   object.__new__(cls), then the attribute set (object.__setattr__) to a new dict of
//             key -> child, made as dict(zip(aux, children)) makes it. __init__ never runs: the
//             integration gives this layout only to classes whose __init__ is the library's own
//             one that does just that.
//
// Anything else (no such attribute in the instance __dict__, a value that is not an exact dict,
// keys that are not all exact str or all exact int, whose sort could run Python code or raise)
// is not read natively: the read answers kLibraryOnce, and the library's own functions answer for
// that instance (its sort's TypeError included). A rebuild from aux data that is not a tuple of
// one key per child is the library's too (zip() would pair the shorter).
#pragma once

#include <Python.h>

#include "registry/attr_node.h"

namespace fastree {
namespace attr {

// Reads a plain instance (`dict`: its exact __dict__) into `out`. kNative, kLibraryOnce (not
// readable natively, nothing read), or kError.
Outcome ReadItems(const AttrNode* node, PyObject* dict, bool want_aux, Fields* out);

// Whether `aux` is a tuple of `arity` keys: false with a ValueError set.
bool CheckItemsAux(const AttrNode* node, PyObject* aux, Py_ssize_t arity);

// Rebuilds an instance (the library's unflatten where `aux` does not fit, and the node has it).
// Null with an error set.
PyObject* BuildItems(AttrNode* node, PyObject* aux, PyObject* const* children, Py_ssize_t n);

// The key of child k: DictKey(aux[k]). A new reference.
PyObject* ItemsChildKey(PyObject* aux, Py_ssize_t k);

}  // namespace attr
}  // namespace fastree
