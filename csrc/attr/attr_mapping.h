// The mapping layout of attribute nodes: a class whose children are the instance's own
// attributes that a per-instance mapping marks as data (flax.nnx's Pytree and Module classes).
//
// Layout (what one instance gives), as flax.nnx 0.12's Pytree._pytree__flatten reads it:
//   fields    every entry of the instance __dict__ (exact str names), in sorted name order; where
//             the class or instance says its names may be integers (int_keys_attr, a bool),
//             each name int() can read is that int, and the ints come first, in value order.
//   split     a field is data when the mapping found at flags_attr (the instance __dict__ first,
//             then the class) holds True for its name (str(name) for an int name); it is static
//             otherwise. The mapping is an instance of flags_type whose flags_inner attribute is
//             an exact dict of exact bools.
//   children  the data fields' values, in order; keys GetAttrKey(name) or SequenceKey(int).
//   aux data  (tuple(data names), tuple(static names), tuple(static values)).
//   rebuild   object.__new__(cls), then object.__setattr__(str(name), value) for each data field,
//             then for each static one. __init__ never runs.
//
// Anything else (a __dict__ that is not an exact dict, a name that is not an exact str, a
// mapping of another type or a flag that is not a bool, two names reading as one int) is not
// read natively: the read answers kLibraryOnce, and the library's own functions answer for that
// instance.
#pragma once

#include <Python.h>

#include <cstdint>

#include "registry/attr_node.h"

namespace fastree {
namespace attr {

// The node's mapping-layout settings (all owned by the node; interned names).
struct MappingLayout {
    PyObject* flags_attr;     // "_pytree__nodes": where the name -> is-data mapping lives
    PyObject* flags_type;     // the mapping's exact class (flax's HashableMapping)
    PyObject* flags_inner;    // "_mapping": the mapping's attribute holding its dict
    PyObject* int_keys_attr;  // "_pytree__has_int_keys": whether names may read as ints
    // The last layout read (instances of a class are made by one __init__: the same names, in
    // the same order, split the same way), so that the next instance like it skips the sort and
    // reuses the two name tuples of its aux data. Names only, never a value: it keeps alive
    // nothing but attribute names. Kept for str-named instances (int_keys false) only.
    PyObject* last_names;        // tuple: the __dict__'s names in insertion order, or null
    PyObject* last_data_keys;    // tuple: aux item 0 for that layout
    PyObject* last_static_keys;  // tuple: aux item 1
    Py_ssize_t* last_order;      // PyMem, len(last_names): insertion index of each sorted name
    bool* last_data;             // PyMem, len(last_names): each name's flag, insertion order
    // The flags dict that layout was read with: its names in its own order (exact str) and
    // whether each was True (every value was a bool), or null. An instance whose flags dict holds
    // these very name objects, in this order, with these flags, splits its names as the memo
    // does: no lookup per name (ReadMemo). Names only, like the rest of the memo.
    PyObject* last_flag_names;   // tuple, or null
    bool* last_flag_data;        // PyMem, len(last_flag_names)
    uint64_t version;            // counts replacements of the memo (read in the node's section)
};

// Releases what ReadMapping kept (the GC's clear, and the node's dealloc).
void ClearMappingMemo(MappingLayout* m);

// Reads a plain instance (`dict`: its exact __dict__) into `out`. kNative, kLibraryOnce (not
// readable natively, nothing read), or kError.
Outcome ReadMapping(const AttrNode* node, PyObject* dict, bool want_aux, Fields* out);

// Whether `aux` has this layout's shape for `arity` children: false with a ValueError set.
bool CheckMappingAux(const AttrNode* node, PyObject* aux, Py_ssize_t arity);

// Rebuilds an instance (aux checked by the caller). Null with an error set.
PyObject* BuildMapping(const AttrNode* node, PyObject* aux, PyObject* const* children,
                       Py_ssize_t n);

// The key of child k: GetAttrKey(name) or SequenceKey(int). A new reference.
PyObject* MappingChildKey(PyObject* aux, Py_ssize_t k);

// object.__new__(cls) (attr/attr_rebuild.cpp).
PyObject* NewInstance(PyObject* cls);

// nnx's key order, shared by the mapping layout and flax's graph walk (nnx_graph):
// `name` as int() reads it, or `name` itself (a new reference); null with an error set on a
// failure other than the ValueError of a name that is no integer.
PyObject* MaybeInt(PyObject* name);
// `name` as Python finds it on a plain instance whose __dict__ is `dict` (an exact dict): the
// instance dict, else a plain class attribute. A new reference; null without an error when
// absent or not plain (a data descriptor on the class, which would win over the instance dict;
// a method or property), with one only on failure. Runs no Python code. Shared with the items
// layout (attr_items.h).
PyObject* PlainAttribute(PyObject* cls, PyObject* dict, PyObject* name);
// Ints before strs; ints by value, strs by code point (sorted()'s order for such keys, and
// flax's _type_aware_sort). Exact int and str only: no Python code runs.
bool KeyLess(PyObject* a, PyObject* b);

}  // namespace attr
}  // namespace fastree
