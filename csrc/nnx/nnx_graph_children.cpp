// The children of the node kinds every nnx walk reads alike (nnx_graph_walk.h): an nnx Pytree's
// (Pytree._graph_node_flatten) and flax's own list/tuple/dict/None registrations'. The flatten
// makes a NodeDef from them; the update's node_dict (which is flax's `flatten` unwrapped) a dict.
#include <algorithm>
#include <optional>
#include <vector>

#include "attr/attr_mapping.h"
#include "nnx/nnx_graph.h"
#include "nnx/nnx_graph_walk.h"
#include "util/pyutils.h"

namespace fastree::nnx_graph {

// Whether every key of the exact dict `dict` is an exact str. Read in the dict's critical
// section: another thread's change frees no key being looked at.
static bool AllKeysExactStr(PyObject* dict) {
    bool all_str = true;
    FASTREE_BEGIN_CRITICAL_SECTION(dict);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (all_str && PyDict_Next(dict, &pos, &key, &value)) all_str = PyUnicode_CheckExact(key);
    FASTREE_END_CRITICAL_SECTION();
    return all_str;
}

// Pytree._graph_node_flatten: sorted(vars(self).items()), wrapped by _pytree__nodes.
Step PytreeChildren(PyObject* node, PyObject* flags_type, std::vector<Child>* children) {
    const Names* n = GetNames();
    Ref dict(PyObject_GetAttr(node, n->dict));
    if (!dict) return kFailed;
    if (!PyDict_CheckExact(dict.get())) return kNotServed;
    // Served for exact str names only: known before any Python code runs.
    if (!AllKeysExactStr(dict.get())) return kNotServed;
    Ref is_pytree_flag(PyObject_GetAttr(node, n->is_pytree));
    if (!is_pytree_flag) return kFailed;
    const int is_pytree = PyObject_IsTrue(is_pytree_flag.get());
    if (is_pytree < 0) return kFailed;
    Ref data_flags;  // _pytree__nodes._mapping
    if (is_pytree) {
        Ref nodes(PyObject_GetAttr(node, n->nodes));
        if (!nodes) return kFailed;
        if (Py_TYPE(nodes.get()) != reinterpret_cast<PyTypeObject*>(flags_type)) {
            return kNotServed;
        }
        data_flags = Ref(PyObject_GetAttr(nodes.get(), n->mapping));
        if (!data_flags) return kFailed;
        if (!PyDict_CheckExact(data_flags.get())) return kNotServed;
    }
    // flax's items iterator starts here where the names are wrapped (its first generator
    // takes it at once), else after the int-keys flag is read (the next one, or sorted()).
    std::optional<LiveItems> items;
    if (is_pytree) items.emplace(dict.get());
    Ref int_keys_flag(PyObject_GetAttr(node, n->has_int_keys));
    if (!int_keys_flag) return kFailed;
    const int int_keys = PyObject_IsTrue(int_keys_flag.get());
    if (int_keys < 0) return kFailed;
    if (!is_pytree) items.emplace(dict.get());

    // Read live, as flax's generators read it: judging an item can run Python code (a
    // flag's truth, an allocation's GC), and a change to the dict meanwhile raises there.
    for (;;) {
        Child child{Ref(), Ref(), -1};
        const int got = items->Next(&child.key, &child.value);
        if (got < 0) return kFailed;
        if (got == 0) break;
        if (!PyUnicode_CheckExact(child.key.get())) return kNotServed;  // put in meanwhile
        if (is_pytree) {
            // `name in pytree_nodes and pytree_nodes[name]`
            PyObject* found;  // a new reference: another thread may replace the entry
            if (DictGetItemRef(data_flags.get(), child.key.get(), &found) < 0) return kFailed;
            Ref flag(found);
            child.is_data = flag ? PyObject_IsTrue(flag.get()) : 0;
            if (child.is_data < 0) return kFailed;
        }
        if (int_keys) {  // _maybe_int(name)
            child.key = Ref(attr::MaybeInt(child.key.get()));
            if (!child.key) return kFailed;
        }
        children->push_back(std::move(child));
    }
    // sorted(): distinct str names by code point, or _type_aware_sort (stable) with ints.
    std::stable_sort(children->begin(), children->end(), [](const Child& a, const Child& b) {
        return attr::KeyLess(a.key.get(), b.key.get());
    });
    return kServed;
}

// flax's own list/tuple/dict/None registrations: enumerate, sorted items, nothing.
Step BuiltinChildren(PyObject* node, int kind, std::vector<Child>* children) {
    if (kind == kNone) return kServed;
    if (kind == kList || kind == kTuple) {
        const Py_ssize_t size = PySequence_Fast_GET_SIZE(node);
        for (Py_ssize_t i = 0; i < size; ++i) {
            // Re-read each time: making the index below can run the GC (rule 2).
            Ref index(PyLong_FromSsize_t(i));
            if (!index) return kFailed;
            // A list's item taken with a reference (ListItemRef: another thread may resize
            // the list or replace the item); a tuple's is immutable.
            Ref item;
            if (PyList_Check(node)) {
                item = Ref(ListItemRef(node, i));
                if (!item) break;
            } else {
                if (i >= PySequence_Fast_GET_SIZE(node)) break;
                item = Ref::FromBorrowed(PySequence_Fast_GET_ITEM(node, i));
            }
            children->push_back({std::move(index), std::move(item), -1});
        }
        return kServed;
    }
    // dict: sorted(x.items()), served for exact str keys (compared by code point) only. Read in
    // its critical section (another thread may change it), into room made before it.
    bool served = true;
    for (;;) {
        children->reserve(children->size() + static_cast<size_t>(PyDict_GET_SIZE(node)));
        const size_t begin = children->size();
        bool fit;
        FASTREE_BEGIN_CRITICAL_SECTION(node);
        fit = begin + static_cast<size_t>(PyDict_GET_SIZE(node)) <= children->capacity();
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (fit && served && PyDict_Next(node, &pos, &key, &value)) {
            served = PyUnicode_CheckExact(key);
            if (served) children->push_back({Ref::FromBorrowed(key), Ref::FromBorrowed(value), -1});
        }
        FASTREE_END_CRITICAL_SECTION();
        if (fit) break;  // else grown meanwhile (free-threaded only): make more room
    }
    if (!served) return kNotServed;
    std::sort(children->begin(), children->end(), [](const Child& a, const Child& b) {
        return PyUnicode_Compare(a.key.get(), b.key.get()) < 0;
    });
    return kServed;
}

}  // namespace fastree::nnx_graph
