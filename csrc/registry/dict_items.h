// Gathering a dict's items in JAX's order (sorted keys), shared by flatten, tree_map and
// flatten_up_to.
#pragma once

#include <Python.h>

#include <new>
#include <utility>
#include <vector>

#include "registry/key_sort.h"
#include "util/free_threading.h"
#include "util/pyutils.h"
#include "util/small_vector.h"

namespace fastree {

// An owned (key, value) pair gathered from a dict before recursing, so a callback that mutates
// the dict cannot free what we are about to visit.
struct Item {
    PyObject* key;
    PyObject* value;
};

// Owned pairs. Whatever is still held when the vector dies is released, so an error or a C++
// exception (std::bad_alloc from a growing vector) between gathering and consuming leaks nothing.
// Consumers null out (or clear) what they have taken.
class Items : public SmallVector<Item, 8> {
 public:
    Items() = default;
    Items(Items&& other) noexcept { *this = std::move(other); }
    Items& operator=(Items&& other) noexcept {
        Release(0);
        SmallVector::operator=(std::move(other));
        keys_owned_ = other.keys_owned_;
        other.keys_owned_ = true;
        return *this;
    }
    // Inline, and free when empty (the usual end: every pair consumed): one runs per dict.
    [[gnu::always_inline]] ~Items() {
        if (size() != 0) Release(0);
    }

    // Releases the pairs from position `from` on and empties the vector (the ones before were
    // consumed already).
    void Release(size_t from) {
        for (size_t i = from; i < size(); ++i) {
            if (keys_owned_) Py_XDECREF((*this)[i].key);
            Py_XDECREF((*this)[i].value);
        }
        Forget();
    }

    // Empties the vector without releasing anything: its pairs were borrowed, or handed on.
    void Forget() {
        clear();
        keys_owned_ = true;
    }

    // Moves the pairs' key references, in order, to the end of `owner` (a treedef's key table, or
    // tree_map's key stack, which outlives this dict's visit) and returns where they start. The
    // pairs keep the keys as borrowed pointers, and only the values are theirs to release. A
    // flatten's keys then cost one reference each, the owner's, instead of the pair's taken and
    // dropped around it; on 3.12+ that drop, a 64-bit read right after the 32-bit write of
    // Py_INCREF, stalled on store forwarding once per key. The room is made first: if that
    // throws (std::bad_alloc), the pairs still own their keys.
    size_t HandKeysTo(std::vector<PyObject*>& owner) {
        const size_t begin = owner.size();
        ReserveMore(owner, size());
        for (const Item& item : *this) owner.push_back(item.key);  // cannot throw now
        keys_owned_ = false;
        return begin;
    }
    bool keys_owned() const { return keys_owned_; }

 private:
    bool keys_owned_ = true;
};

inline void ReleaseItems(Items& items, size_t from) { items.Release(from); }

// A defaultdict's order: JAX flattens it in Python, as `sorted(d)` and then `d[k]` per key.
// Timsort's permutation differs from jaxlib's stable_sort for keys without a total order, so
// this path calls list.sort; its TypeError for unorderable keys comes through unwrapped.
inline bool SortItemsLikeSorted(PyObject* dict, Items& items) {
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    Ref keys(NewList(n));
    if (!keys) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyList_SET_ITEM(keys.get(), i, Py_NewRef(items[static_cast<size_t>(i)].key));
    }
    if (PyList_Sort(keys.get()) < 0) return false;
    Items sorted;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys.get()); ++i) {
        Ref key(Py_NewRef(PyList_GET_ITEM(keys.get(), i)));
        Ref value(PyObject_GetItem(dict, key.get()));
        if (!value) return false;
        sorted.push_back(Item{key.get(), value.get()});
        key.release();
        value.release();
    }
    items = std::move(sorted);
    return true;
}

// Replaces `item`'s value by the dict's value for its key now; a key no longer there is JAX's
// KeyError. The lookup can run Python code (a key's __eq__): the key is held across it and the
// new value owned before the old one is released.
inline bool ReadValueAgain(PyObject* dict, Item& item) {
    Ref key = Ref::FromBorrowed(item.key);
    PyObject* found;  // a new reference: another thread may replace the entry at once
    if (DictGetItemRef(dict, key.get(), &found) <= 0) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key.get());
        return false;
    }
    Ref value(found);
    Ref old(item.value);  // released at the end, after the swap
    item.value = value.release();
    return true;
}

// Keys without a total order in C (SortTotalOrderKeys declined them), owned by `items`.
// `wrap_error`: a dict's keys are sorted as jaxlib sorts them (see key_sort.h), and a comparison
// that raises becomes JAX's C++ ValueError; a defaultdict is sorted as JAX's Python flatten
// sorts it (SortItemsLikeSorted).
//
// After a sort that ran Python code, each value is read again from the dict, by key, as jaxlib
// does (it sorts a snapshot of the keys, then looks every value up): a comparison that changed
// the dict is seen as JAX sees it, a key it removed raising JAX's KeyError
// (tests/test_dict_read_order.py). Where the keys are str or int, sorting runs no Python code and the gathered values
// are the dict's (GatherDictItems).
//
// `read_again` false leaves that to the caller: read::Values looks each value up when the walk
// reaches its key, as jaxlib does, so a key's __hash__ runs once per lookup, as in JAX.
inline bool SortItemsByPython(PyObject* dict, Items& items, bool wrap_error, bool read_again) {
    auto key_of = [](const Item& item) { return item.key; };
    if (!wrap_error) return SortItemsLikeSorted(dict, items);
    if (!JaxStableSortKeys(items.begin(), items.end(), key_of)) {
        RaiseFromCurrent(PyExc_ValueError,
                         "Comparator raised exception while sorting pytree dictionary keys.");
        return false;
    }
    // Each lookup runs Python code (__hash__, __eq__): `items` is indexed afresh per step (it is
    // ours alone).
    for (size_t i = 0; read_again && i < items.size(); ++i) {
        if (!ReadValueAgain(dict, items[i])) return false;
    }
    return true;
}

// Whether GatherItems hands out owned pairs. Under the GIL it leaves them borrowed: nothing it
// does runs Python code, and tree_leaves' dicts of plain leaves (kinds_read.h) then never touch
// the keys' reference counts. On a free-threaded build another thread can change the dict at any
// moment, so the pairs are INCREFed inside the dict's critical section, before leaving it.
#ifdef Py_GIL_DISABLED
inline constexpr bool kGatheredOwned = true;
#else
inline constexpr bool kGatheredOwned = false;
#endif

// Empties `items` after a failure between the gathering and OwnGatheredItems: releases the
// pairs where the gathering owned them (`kOwned`), else only forgets them.
template <bool kOwned = kGatheredOwned>
inline void DropGathered(Items& items) {
    if constexpr (kOwned) {
        items.Release(0);
    } else {
        items.Forget();
    }
}

// A dict's (key, value) pairs, in sorted-key order where the keys sort in C (str or int keys:
// SortTotalOrderKeys); otherwise in the dict's order, for the caller to sort in Python. Owned
// where `kOwned` says so: by default borrowed under the GIL and owned on a free-threaded build
// (kGatheredOwned); GatherDictItems asks for owned pairs on every build, taken in the same loop
// that reads them (a second loop over the pairs cost a tenth of tree_map's own work per dict).
// False, with an error set and `items` left empty, if the gathering failed.
//
// Borrowed: PyDict_Next, the C comparisons of SortTotalOrderKeys and C++ allocation run no
// Python code (C++ allocation cannot start the cyclic GC). The caller owns or drops the pairs
// before anything that can (OwnGatheredItems, or DropGathered where it handed the values on
// itself). Every value's cache miss is requested up front, so they overlap.
// Sized once, then written in place: per-item push_back was a measurable share of flattening
// parameter dicts. The size and the entries are read inside the dict's critical section (a bare
// block on GIL builds), so the pairs are one snapshot of the dict even while another thread
// changes it; PyDict_Next then yields exactly PyDict_GET_SIZE entries, the bound is belt and
// braces. The buffer is sized inside the section too (C++ allocation blocks on no Python lock);
// what it throws (std::bad_alloc) is caught there and rethrown after the section ends, which an
// exception leaving the block would skip. The sort runs after the section: on owned pairs there.
template <bool kOwned = kGatheredOwned>
inline bool GatherItems(PyObject* dict, Items& items, bool* sorted) {
    bool no_memory = false;
    bool complete = true;
    FASTREE_BEGIN_CRITICAL_SECTION(dict);
    const size_t n = static_cast<size_t>(PyDict_GET_SIZE(dict));
    try {
        items.ResizeForOverwrite(n);
    } catch (...) {
        no_memory = true;
    }
    if (!no_memory) {
        PyObject* key;
        PyObject* value;
        Py_ssize_t pos = 0;
        Item* const first = items.begin();
        size_t count = 0;
        while (count < n && PyDict_Next(dict, &pos, &key, &value)) {
            PrefetchForWrite(value);
            if constexpr (kOwned) {
                Py_INCREF(key);
                Py_INCREF(value);
            }
            first[count].key = key;
            first[count].value = value;
            ++count;
        }
        complete = count == n;
        if (!complete) {  // cannot happen; never sort or release unset entries
            if constexpr (kOwned) {
                for (size_t i = 0; i < count; ++i) {
                    // Kept alive by the dict (locked, or under the GIL with no Python code
                    // run since they were read): these DECREFs free nothing.
                    Py_DECREF(first[i].key);
                    Py_DECREF(first[i].value);
                }
            }
            items.Forget();
        }
    }
    FASTREE_END_CRITICAL_SECTION();
    if (no_memory) throw std::bad_alloc();
    if (!complete) {
        PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
        return false;
    }
    try {
        auto key_of = [](const Item& item) { return item.key; };
        *sorted = items.size() < 2 || SortTotalOrderKeys(items.begin(), items.end(), key_of);
    } catch (...) {
        DropGathered<kOwned>(items);
        throw;
    }
    return true;
}

// Owned pairs whose keys did not sort in C (`sorted` false) sorted as JAX does
// (SortItemsByPython: `wrap_error`, `read_again`; it runs Python code, hence owned pairs). On
// failure `items` is left empty.
inline bool SortGatheredItems(PyObject* dict, Items& items, bool sorted, bool wrap_error,
                              bool read_again) {
    if (!sorted && !SortItemsByPython(dict, items, wrap_error, read_again)) {
        ReleaseItems(items, 0);
        return false;
    }
    return true;
}

// Takes a reference to every pair GatherItems left borrowed (none on a free-threaded build:
// they are owned already), then sorts them (SortGatheredItems). On failure `items` is left
// empty.
inline bool OwnGatheredItems(PyObject* dict, Items& items, bool sorted, bool wrap_error,
                             bool read_again) {
    if constexpr (!kGatheredOwned) {
        for (Item& item : items) {
            Py_INCREF(item.key);
            Py_INCREF(item.value);
        }
    }
    return SortGatheredItems(dict, items, sorted, wrap_error, read_again);
}

// Owned pairs, sorted as JAX sorts a dict's keys. `wrap_error`, `read_again`: see
// SortItemsByPython. On failure `items` is left empty.
inline bool GatherDictItems(PyObject* dict, Items& items, bool wrap_error = true,
                            bool read_again = true) {
    bool sorted;
    return GatherItems</*kOwned=*/true>(dict, items, &sorted) &&
           SortGatheredItems(dict, items, sorted, wrap_error, read_again);
}

// An OrderedDict's items in its own iteration order (it can differ from the underlying dict's):
// the keys first, then each value by lookup. Owned pairs; on failure `items` is left empty.
inline bool GatherOrderedItems(PyObject* obj, Items& items) {
    Ref keys(PySequence_List(obj));
    if (!keys) return false;
    // Each lookup can run Python code (__hash__, __eq__, a __getitem__ override) that changes
    // the key list's owner, not the list itself: `keys` is ours. Items are re-read per step.
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys.get()); ++i) {
        Ref key(Py_NewRef(PyList_GET_ITEM(keys.get(), i)));
        Ref value(PyObject_GetItem(obj, key.get()));
        if (!value) {
            ReleaseItems(items, 0);
            return false;
        }
        items.push_back(Item{key.get(), value.get()});
        key.release();
        value.release();
    }
    return true;
}

}  // namespace fastree
