// A vector with inline storage for the first N elements: the per-dict scratch buffer in flatten
// would otherwise allocate on every dict node, and almost every dict has few keys.
#pragma once

#include <Python.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace fastree {

template <class T, size_t N>
class SmallVector {
 public:
    SmallVector() = default;
    SmallVector(const SmallVector&) = delete;
    SmallVector& operator=(const SmallVector&) = delete;
    SmallVector& operator=(SmallVector&& o) noexcept {
        size_ = o.size_;
        heap_ = std::move(o.heap_);
        for (size_t i = 0; i < N && i < size_; ++i) inline_[i] = o.inline_[i];
        o.size_ = 0;
        o.heap_.clear();
        return *this;
    }

    void push_back(const T& v) {
        if (size_ < N) {
            inline_[size_] = v;
        } else {
            if (size_ == N) heap_.assign(inline_, inline_ + N);
            heap_.push_back(v);
        }
        ++size_;
    }
    // Makes the vector `n` long (it must be empty) without setting the elements: the caller
    // writes every one before anything reads or releases them. May throw (std::bad_alloc)
    // while still empty.
    void ResizeForOverwrite(size_t n) {
        if (n > N) heap_.resize(n);
        size_ = n;
    }
    size_t size() const { return size_; }
    void clear() {
        size_ = 0;
        heap_.clear();
    }
    T* begin() { return size_ <= N ? inline_ : heap_.data(); }
    T* end() { return begin() + size_; }
    T& operator[](size_t i) { return begin()[i]; }
    const T& operator[](size_t i) const { return const_cast<SmallVector*>(this)->begin()[i]; }

 private:
    T inline_[N];
    std::vector<T> heap_;
    size_t size_ = 0;
};

// Owned references with inline storage: whatever is still held when the vector dies is released
// (after an error path, or when a C++ exception unwinds through the owner). Code that hands the
// references on clears the vector.
template <size_t N>
class RefSmallVector : public SmallVector<PyObject*, N> {
 public:
    RefSmallVector() = default;
    ~RefSmallVector() {
        for (PyObject* p : *this) Py_XDECREF(p);
    }
};

}  // namespace fastree
