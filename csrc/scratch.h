// Reusable scratch buffers for per-call leaf lists. A small tree's flatten would otherwise spend
// a noticeable share of its time in malloc/free for the leaf vector. It is a pool rather than one
// static buffer because flatten re-enters itself through user callbacks (is_leaf, custom
// flatten functions calling tree_flatten).
#pragma once

#include <Python.h>

#include <utility>
#include <vector>

namespace fastree {

class ScratchVector {
 public:
    ScratchVector() {
        auto& pool = Pool();
        if (!pool.empty()) {
            items_ = std::move(pool.back());
            pool.pop_back();
        }
    }
    ~ScratchVector() {
        // Callers leave the vector empty (ownership of its references moved elsewhere).
        items_.clear();
        constexpr size_t kKeepBelow = size_t{1} << 20;  // don't pin huge buffers forever
        auto& pool = Pool();
        if (items_.capacity() < kKeepBelow && pool.size() < 8) pool.push_back(std::move(items_));
    }
    ScratchVector(const ScratchVector&) = delete;
    ScratchVector& operator=(const ScratchVector&) = delete;

    std::vector<PyObject*>& get() { return items_; }

 private:
    static std::vector<std::vector<PyObject*>>& Pool() {
        static auto* pool = new std::vector<std::vector<PyObject*>>();  // guarded by the GIL
        return *pool;
    }
    std::vector<PyObject*> items_;
};

}  // namespace fastree
