// Sorting dict keys into exactly JAX's order, fast on the orders real trees have.
//
// jaxlib sorts a dict's keys with std::stable_sort over Python's `<` (libstdc++'s algorithm).
// For keys with a total order (the same type of str or int: nearly every pytree) any correct sort
// gives that order, since dict keys are distinct; such keys are compared in C and sorted by
// natural merging, which takes n - 1 comparisons on sorted input and a few passes on input made
// of a few sorted runs (k0..k9 | k10..k99 | k100..k999 inserted in numeric order, reversed
// input). For other keys (NaN, frozensets, mixed numbers, user classes) `<` is not a total
// order and different algorithms give different permutations: those are sorted by a replica of
// libstdc++'s stable_sort, which reproduces jaxlib's permutation exactly (tests compare the two
// on random NaN and frozenset dicts). Unlike the original, the replica's inner loops are bounds
// checked, so a `__lt__` that answers inconsistently cannot walk it off the array.
//
// Every routine here sorts a range of records that own their keys, so a comparison that runs
// Python code (and with it the cyclic GC, finalizers, other threads) finds nothing borrowed.
#pragma once

#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "registry/registry_state.h"
#include "util/pyutils.h"
#include "util/scratch.h"

namespace fastree {

// `a < b` for two exact str keys, in code-point order (Python's). ASCII keys, nearly all pytree
// keys, compare byte by byte inline: sorting is a visible share of flattening parameter dicts, and
// PyUnicode_Compare re-checks types and kinds on every call.
inline bool StrLess(PyObject* a, PyObject* b) {
    if (PyUnicode_IS_COMPACT_ASCII(a) && PyUnicode_IS_COMPACT_ASCII(b)) {
        const Py_UCS1* pa = PyUnicode_1BYTE_DATA(a);
        const Py_UCS1* pb = PyUnicode_1BYTE_DATA(b);
        const Py_ssize_t la = PyUnicode_GET_LENGTH(a);
        const Py_ssize_t lb = PyUnicode_GET_LENGTH(b);
        const Py_ssize_t common = la < lb ? la : lb;
        Py_ssize_t i = 0;
        // Eight bytes at a time while both have them: numbered keys ("key00017", "layers_12")
        // share long prefixes, and a byte loop then dominated sorting a big, already sorted
        // dict. Loaded big-endian, two words compare as their bytes do.
        for (; i + 8 <= common; i += 8) {
            uint64_t wa;
            uint64_t wb;
            std::memcpy(&wa, pa + i, 8);
            std::memcpy(&wb, pb + i, 8);
            if (wa != wb) return __builtin_bswap64(wa) < __builtin_bswap64(wb);
        }
        // Short keys, and the tail: they usually differ early, so a byte loop beats memcmp.
        for (; i < common; ++i) {
            if (pa[i] != pb[i]) return pa[i] < pb[i];
        }
        return la < lb;
    }
    return PyUnicode_Compare(a, b) < 0;  // cannot fail for two str objects
}

// Merges the sorted, non-empty ranges [first, mid) and [mid, last) in place, the shorter one
// copied into `buffer` (a vector, its capacity reused) and merged from the front, or from the
// back: libstdc++'s __merge_adaptive when its buffer holds the shorter range, so the same
// comparisons in the same order. On ties the element of [first, mid) comes first.
template <class It, class Buffer, class Less>
void MergeThroughBuffer(It first, It mid, It last, Buffer& buffer, Less& less) {
    if (mid - first <= last - mid) {
        buffer.assign(first, mid);
        auto f1 = buffer.begin();
        It f2 = mid;
        It out = first;
        while (f1 != buffer.end() && f2 != last) {
            if (less(*f2, *f1)) {
                *out++ = *f2++;
            } else {
                *out++ = *f1++;
            }
        }
        std::copy(f1, buffer.end(), out);  // what is left of [mid, last) is in place already
        return;
    }
    buffer.assign(mid, last);
    It l1 = mid - 1;
    auto l2 = buffer.end() - 1;
    It out = last;
    while (true) {
        if (less(*l2, *l1)) {
            *--out = *l1;
            if (l1 == first) {
                std::copy_backward(buffer.begin(), l2 + 1, out);
                return;
            }
            --l1;
        } else {
            *--out = *l2;
            if (l2 == buffer.begin()) return;  // what is left of [first, mid) is in place
            --l2;
        }
    }
}

// Sorts [first, last) by a strict total order `less` with no equal elements, if it is made of
// few sorted runs: ascending runs are found first (a strictly descending run is reversed in
// place); a range of one run is done, a range of few runs is merged run by run. Returns false,
// with the elements permuted but not sorted, when the input has too little order for that to
// pay (then the caller sorts it some other way).
template <class It, class Less>
bool NaturalSortIfOrdered(It first, It last, Less less) {
    const ptrdiff_t n = last - first;
    if (n < 2) return true;
    std::vector<ptrdiff_t> bounds{0};  // start of each run, then n
    ptrdiff_t i = 0;
    while (i < n) {
        ptrdiff_t j = i + 1;
        if (j < n && less(first[j], first[j - 1])) {
            while (j < n && less(first[j], first[j - 1])) ++j;
            std::reverse(first + i, first + j);  // strictly descending: no ties to keep stable
        } else {
            while (j < n && !less(first[j], first[j - 1])) ++j;
        }
        i = j;
        bounds.push_back(i);
        // Mostly unordered input: runs of ~2; merging them would lose to one std::sort.
        if (bounds.size() > 64 && static_cast<ptrdiff_t>(bounds.size()) * 8 > i) return false;
    }
    // Merge neighbouring runs pairwise until one is left: n log2(runs) comparisons. Each merge
    // goes through one pooled buffer (std::inplace_merge allocated its own, per merge).
    using Record = typename std::iterator_traits<It>::value_type;
    Scratch<Record> buffer_scratch;
    while (bounds.size() > 2) {
        std::vector<ptrdiff_t> merged{0};
        for (size_t r = 0; r + 1 < bounds.size(); r += 2) {
            if (r + 2 < bounds.size()) {
                MergeThroughBuffer(first + bounds[r], first + bounds[r + 1], first + bounds[r + 2],
                                   buffer_scratch.get(), less);
                merged.push_back(bounds[r + 2]);
            } else {
                merged.push_back(bounds[r + 1]);
            }
        }
        bounds.swap(merged);
    }
    return true;
}

template <class It, class Less>
void NaturalSort(It first, It last, Less less) {
    if (!NaturalSortIfOrdered(first, last, less)) std::sort(first, last, less);
}

// Up to this many keys a dict is sorted by insertion: fewer comparisons than a merge would need
// on such short inputs, no allocation, and stable.
inline constexpr ptrdiff_t kSmallSort = 16;

template <class It, class Less>
void InsertionSort(It first, It last, Less less) {
    for (It i = first + (first != last ? 1 : 0); i < last; ++i) {
        auto record = std::move(*i);
        It j = i;
        for (; j != first && less(record, *(j - 1)); --j) *j = std::move(*(j - 1));
        *j = std::move(record);
    }
}

// A str whose code points are all below 256, stored one byte each (ASCII and Latin-1 text):
// byte order is code-point order.
inline bool IsOneByteStr(PyObject* s) {
    return PyUnicode_IS_COMPACT(s) && PyUnicode_KIND(s) == PyUnicode_1BYTE_KIND;
}

// The first 8 code points of a one-byte str, big-endian and zero-padded: comparing two prefixes
// as integers orders the strings by those code points, and equal prefixes leave the tie to
// StrLess.
inline uint64_t OneBytePrefix(PyObject* s) {
    const Py_UCS1* p = PyUnicode_1BYTE_DATA(s);
    const Py_ssize_t n = std::min<Py_ssize_t>(PyUnicode_GET_LENGTH(s), 8);
    uint64_t out = 0;
    for (Py_ssize_t i = 0; i < 8; ++i) out = (out << 8) | (i < n ? p[i] : 0);
    return out;
}

// Sorts records with exact-str keys that have little order (random insertion). The comparisons
// of a plain sort chase each key object through the heap; here each key's first 8 bytes are
// read once into a dense array, and most comparisons are settled there.
template <class It, class KeyOf>
void SortStrKeysByPrefix(It first, It last, KeyOf key_of) {
    using Record = typename std::iterator_traits<It>::value_type;
    const ptrdiff_t n = last - first;
    for (It it = first; it != last; ++it) {
        if (!IsOneByteStr(key_of(*it))) {
            NaturalSort(first, last, [&](const Record& a, const Record& b) {
                return StrLess(key_of(a), key_of(b));
            });
            return;
        }
    }
    struct Entry {
        uint64_t prefix;
        ptrdiff_t index;
    };
    std::vector<Entry> entries;
    entries.reserve(static_cast<size_t>(n));
    for (ptrdiff_t i = 0; i < n; ++i) entries.push_back(Entry{OneBytePrefix(key_of(first[i])), i});
    std::sort(entries.begin(), entries.end(), [&](const Entry& a, const Entry& b) {
        if (a.prefix != b.prefix) return a.prefix < b.prefix;
        return StrLess(key_of(first[a.index]), key_of(first[b.index]));
    });
    std::vector<Record> sorted;
    sorted.reserve(static_cast<size_t>(n));
    for (const Entry& e : entries) sorted.push_back(first[e.index]);
    std::copy(sorted.begin(), sorted.end(), first);
}

// An exact int key's value, if it fits in 64 bits.
inline bool SmallIntValue(PyObject* key, long long* out) {
    if (!PyLong_CheckExact(key)) return false;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(key, &overflow);
    return overflow == 0 && !(*out == -1 && PyErr_Occurred());
}

// SortTotalOrderKeys past its inline case.
template <class It, class KeyOf>
[[gnu::noinline]] bool SortTotalOrderKeysGeneral(It first, It last, KeyOf key_of) {
    // A big dict of exact-str keys already in order (built in order: the commonest big dict):
    // types and order checked in one pass, each key object touched once.
    if (last - first > kSmallSort && PyUnicode_CheckExact(key_of(*first))) {
        It it = first + 1;
        for (; it != last; ++it) {
            PyObject* key = key_of(*it);
            if (!PyUnicode_CheckExact(key) || !StrLess(key_of(*(it - 1)), key)) break;
        }
        if (it == last) return true;
    }
    // str keys (nearly every pytree) are checked for first, on their own.
    bool all_str = true;
    for (It it = first; it != last && all_str; ++it) all_str = PyUnicode_CheckExact(key_of(*it));
    bool all_int = !all_str;
    for (It it = first; it != last && all_int; ++it) all_int = PyLong_CheckExact(key_of(*it));
    using Record = typename std::iterator_traits<It>::value_type;
    if (all_str) {
        auto less = [&](const Record& a, const Record& b) { return StrLess(key_of(a), key_of(b)); };
        // Parameter dicts ({"bias", "kernel"}, {"q", "k", "v", "o"}) are small: sorted in place,
        // with no run bookkeeping and no merge buffer to allocate.
        if (last - first <= kSmallSort) {
            InsertionSort(first, last, less);
            return true;
        }
        if (!NaturalSortIfOrdered(first, last, less)) SortStrKeysByPrefix(first, last, key_of);
        return true;
    }
    if (!all_int) return false;
    if (last - first <= kSmallSort) {
        bool small = true;
        for (It it = first; it != last && small; ++it) {
            long long unused;
            small = SmallIntValue(key_of(*it), &unused);
        }
        if (small) {
            // Exact ints of 64 bits compare equal to their values; PyLong_AsLongLong cannot fail.
            InsertionSort(first, last, [&](const Record& a, const Record& b) {
                return PyLong_AsLongLong(key_of(a)) < PyLong_AsLongLong(key_of(b));
            });
            return true;
        }
        PyErr_Clear();
    }
    // Sort (value, position) pairs, then permute the records once.
    std::vector<std::pair<long long, ptrdiff_t>> order;
    order.reserve(static_cast<size_t>(last - first));
    for (It it = first; it != last; ++it) {
        long long value;
        if (!SmallIntValue(key_of(*it), &value)) {
            PyErr_Clear();
            return false;  // a big int: the general path compares it
        }
        order.emplace_back(value, it - first);
    }
    NaturalSort(order.begin(), order.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Record> sorted;
    sorted.reserve(order.size());
    for (const auto& entry : order) sorted.push_back(first[entry.second]);
    std::copy(sorted.begin(), sorted.end(), first);
    return true;
}

// Keys all exact str, or all exact ints of 64 bits: sorted in C (no Python code runs) and true.
// Otherwise false, with nothing changed. Two str keys ({"bias", "kernel"}, the commonest dict of
// all) are ordered inline, with one comparison; everything else is out of line.
template <class It, class KeyOf>
[[gnu::always_inline]] inline bool SortTotalOrderKeys(It first, It last, KeyOf key_of) {
    if (last - first == 2 && PyUnicode_CheckExact(key_of(first[0])) &&
        PyUnicode_CheckExact(key_of(first[1]))) {
        if (StrLess(key_of(first[1]), key_of(first[0]))) std::swap(first[0], first[1]);
        return true;
    }
    return SortTotalOrderKeysGeneral(first, last, key_of);
}

// ---- jaxlib's order for keys without a total order

// Python's `a < b`, remembering the first failure: the sort then runs to its end without calling
// Python again (every later comparison answers false), and the caller reports the error.
class PyLess {
 public:
    bool operator()(PyObject* a, PyObject* b) {
        if (failed_) return false;
        NoteUserCode();
        int r = PyObject_RichCompareBool(a, b, Py_LT);
        if (r < 0) {
            failed_ = true;
            return false;
        }
        return r != 0;
    }
    bool failed() const { return failed_; }

 private:
    bool failed_ = false;
};

// libstdc++'s std::stable_sort (GCC 12, buffer available): each half sorted by insertion sort
// of 7-element chunks and alternating merge passes through a buffer, then the halves merged.
// Same comparisons in the same order, so the same permutation for any comparator; the inner
// loops check their bounds.
template <class Record, class Less>
class StableSortReplica {
 public:
    StableSortReplica(Record* a, ptrdiff_t n, Less& less) : a_(a), n_(n), less_(less) {}

    void Run() {
        if (n_ < 2) return;
        buffer_.resize(static_cast<size_t>((n_ + 1) / 2));
        const ptrdiff_t half = (n_ + 1) / 2;
        MergeSortWithBuffer(a_, half);
        MergeSortWithBuffer(a_ + half, n_ - half);
        MergeAdaptive(half);
    }

 private:
    static constexpr ptrdiff_t kChunk = 7;  // libstdc++'s _S_chunk_size

    void InsertionSort(Record* first, Record* last) {
        if (first == last) return;
        for (Record* i = first + 1; i < last; ++i) {
            Record value = *i;
            if (less_(value, *first)) {
                std::move_backward(first, i, i + 1);
                *first = value;
            } else {
                // libstdc++ leaves this loop unguarded (comp(value, *first) was false); kept
                // guarded here so an inconsistent comparator stays inside the array.
                Record* hole = i;
                while (hole - 1 >= first && less_(value, *(hole - 1))) {
                    *hole = *(hole - 1);
                    --hole;
                }
                *hole = value;
            }
        }
    }

    static Record* MoveMerge(Record* f1, Record* l1, Record* f2, Record* l2, Record* out,
                             Less& less) {
        while (f1 != l1 && f2 != l2) {
            if (less(*f2, *f1)) {
                *out++ = *f2++;
            } else {
                *out++ = *f1++;
            }
        }
        out = std::copy(f1, l1, out);
        return std::copy(f2, l2, out);
    }

    void MergeSortLoop(Record* first, Record* last, Record* out, ptrdiff_t step) {
        const ptrdiff_t two = 2 * step;
        while (last - first >= two) {
            out = MoveMerge(first, first + step, first + step, first + two, out, less_);
            first += two;
        }
        step = std::min<ptrdiff_t>(last - first, step);
        MoveMerge(first, first + step, first + step, last, out, less_);
    }

    void MergeSortWithBuffer(Record* first, ptrdiff_t len) {
        Record* const last = first + len;
        Record* const buffer = buffer_.data();
        ptrdiff_t step = kChunk;
        Record* chunk = first;
        while (last - chunk >= step) {
            InsertionSort(chunk, chunk + step);
            chunk += step;
        }
        InsertionSort(chunk, last);
        while (step < len) {
            MergeSortLoop(first, last, buffer, step);
            step *= 2;
            MergeSortLoop(buffer, buffer + len, first, step);
            step *= 2;
        }
    }

    // The two sorted halves [0, middle) and [middle, n) merged, the shorter one through the
    // buffer.
    void MergeAdaptive(ptrdiff_t middle) {
        MergeThroughBuffer(a_, a_ + middle, a_ + n_, buffer_, less_);
    }

    Record* a_;
    ptrdiff_t n_;
    Less& less_;
    std::vector<Record> buffer_;
};

// Sorts [first, last) into jaxlib's order under Python's `<`. False with the Python error set if
// a comparison raised (the records are then in some order, all still present).
template <class Record, class KeyOf>
bool JaxStableSortKeys(Record* first, Record* last, KeyOf key_of) {
    PyLess py_less;
    auto less = [&](const Record& a, const Record& b) { return py_less(key_of(a), key_of(b)); };
    StableSortReplica<Record, decltype(less)> sorter(first, last - first, less);
    sorter.Run();
    return !py_less.failed();
}

}  // namespace fastree
