// Reusable scratch buffers for per-call vectors (leaf lists, the node vector being built). A small
// tree's flatten would otherwise spend a noticeable share of its time in malloc/free, and a large
// one in growth copies and first-touch page faults. It is a pool rather than one
// static buffer because flatten re-enters itself through user callbacks (is_leaf, custom
// flatten functions calling tree_flatten).
#pragma once

#include <Python.h>

#include <type_traits>
#include <utility>
#include <vector>

namespace fastree {

template <class T>
class Scratch {
 public:
    Scratch() {
        auto& pool = Pool();
        if (!pool.empty()) {
            items_ = std::move(pool.back());
            pool.pop_back();
        }
    }
    ~Scratch() {
        // Callers normally leave the vector empty (ownership of its references moved
        // elsewhere). What is left, after an error or a C++ exception (std::bad_alloc from a
        // growing vector) unwinding through the caller, is owned and released here.
        if constexpr (std::is_same_v<T, PyObject*>) {
            for (PyObject* p : items_) Py_XDECREF(p);
        }
        items_.clear();
        constexpr size_t kKeepBytes = size_t{8} << 20;  // don't pin huge buffers forever
        auto& pool = Pool();
        if (items_.capacity() * sizeof(T) <= kKeepBytes && pool.size() < 8) {
            pool.push_back(std::move(items_));
        }
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    std::vector<T>& get() { return items_; }

 private:
    static std::vector<std::vector<T>>& Pool() {
        static auto* pool = new std::vector<std::vector<T>>();  // guarded by the GIL
        return *pool;
    }
    std::vector<T> items_;
};

using ScratchVector = Scratch<PyObject*>;

}  // namespace fastree
