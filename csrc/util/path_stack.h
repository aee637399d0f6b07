// The key path from the root to the node being visited, and a new tuple of it for each leaf.
//
// Why not one Py_INCREF per entry per tuple: key entries are cached and shared (see keys.cpp), so
// one object recurs along a deep path (SequenceKey(1) at every level of a nested list), and
// increments of one object's refcount cannot overlap: each waits for the one before. On a
// 500-deep tree that chain was most of flatten_with_path's time. So below the first kShallow
// levels the stack counts how often each distinct entry occurs, and a new tuple adds that count
// to each one's refcount in one write. The shallow levels, all of a typical tree, are plain
// increments: counting there cost more than it saved (8% on transformer parameter trees).
#pragma once

#include <Python.h>

#include <algorithm>
#include <vector>

namespace fastree {

class PathStack {
 public:
    PathStack() = default;
    PathStack(const PathStack&) = delete;
    PathStack& operator=(const PathStack&) = delete;
    ~PathStack() {
        for (PyObject* key : entries_) Py_DECREF(key);
    }

    // `key` is stolen.
    void Push(PyObject* key) {
        try {
            entries_.push_back(key);
        } catch (...) {
            Py_DECREF(key);
            throw;
        }
        if (entries_.size() > kShallow) Count(key);
    }

    void Pop() {
        PyObject* key = entries_.back();
        if (entries_.size() > kShallow) Uncount(key);
        entries_.pop_back();
        Py_DECREF(key);
    }

    size_t size() const { return entries_.size(); }
    const std::vector<PyObject*>& entries() const { return entries_; }

    // A new tuple of the entries, root first; null with an error set.
    PyObject* NewTuple() const {
        const Py_ssize_t n = static_cast<Py_ssize_t>(entries_.size());
        PyObject* t = PyTuple_New(n);
        if (t == nullptr) return nullptr;
        PyObject** items = reinterpret_cast<PyTupleObject*>(t)->ob_item;
        const size_t shallow = std::min(entries_.size(), kShallow);
        for (size_t i = 0; i < shallow; ++i) items[i] = Py_NewRef(entries_[i]);
        if (entries_.size() > kShallow) {
            // The deep entries' references, by count. (Py_SET_REFCNT leaves immortal objects
            // alone, as Py_INCREF does.)
            std::copy(entries_.begin() + kShallow, entries_.end(), items + kShallow);
            for (const Distinct& d : deep_) Py_SET_REFCNT(d.key, Py_REFCNT(d.key) + d.count);
        }
        return t;
    }

 private:
    static constexpr size_t kShallow = 8;

    struct Distinct {
        PyObject* key;
        Py_ssize_t count;  // occurrences in entries_ past the first kShallow
    };

    [[gnu::noinline]] void Count(PyObject* key) {
        // From the end: a recurring entry was most likely pushed recently.
        for (auto it = deep_.rbegin(); it != deep_.rend(); ++it) {
            if (it->key == key) {
                ++it->count;
                return;
            }
        }
        deep_.push_back(Distinct{key, 1});
    }

    [[gnu::noinline]] void Uncount(PyObject* key) {
        for (auto it = deep_.rbegin(); it != deep_.rend(); ++it) {
            if (it->key == key) {
                if (--it->count == 0) deep_.erase(std::next(it).base());
                return;
            }
        }
    }

    std::vector<PyObject*> entries_;  // owned, root first
    std::vector<Distinct> deep_;      // each distinct entry past the first kShallow, once
};

}  // namespace fastree
