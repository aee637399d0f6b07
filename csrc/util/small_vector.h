// A vector with inline storage for the first N elements: the per-dict scratch buffer in flatten
// would otherwise allocate on every dict node, and almost every dict has few keys. Past N, the
// storage is a vector taken from and given back to Scratch<T>'s pool: a wide dict's buffer
// (160 KB for 10k keys) is then neither allocated, nor page-faulted in, on every call.
#pragma once

#include <Python.h>

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "util/scratch.h"

namespace fastree {

// An allocator whose argument-less construction default-initialises: a vector<T> of a trivial T
// then grows without writing its new elements (std::allocator value-initialises them, which for
// a wide dict's item buffer meant zeroing 160 KB before every one of them was overwritten).
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
    template <class U>
    struct rebind {
        using other = DefaultInitAllocator<U>;
    };
    DefaultInitAllocator() = default;
    template <class U>
    DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
    template <class U>
    void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
        ::new (static_cast<void*>(p)) U;
    }
    template <class U, class... Args>
    void construct(U* p, Args&&... args) {
        ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
};

template <class T, size_t N>
class SmallVector {
 public:
    SmallVector() = default;
    // The heap storage is held only while the elements live there (size_ > N): an emptied vector
    // has given it back, and a destructor after clear() (every consumed dict's) tests nothing the
    // compiler does not already know.
    // (Forced inline, the giving back out of line: as a call, the destructor cost tree_map 0.8%
    // on a transformer's parameters, one call per dict.)
    [[gnu::always_inline]] ~SmallVector() {
        if (size_ > N) GiveHeap();
    }
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
            if (size_ == N) {
                heap_ = HeapPool::Take();
                heap_.assign(inline_, inline_ + N);
            }
            heap_.push_back(v);
        }
        ++size_;
    }
    // Makes the vector `n` long (it must be empty) without setting the elements: the caller
    // writes every one before anything reads or releases them. May throw (std::bad_alloc)
    // while still empty.
    void ResizeForOverwrite(size_t n) {
        if (n > N) {
            heap_ = HeapPool::Take();
            heap_.resize(n);
        }
        size_ = n;
    }
    size_t size() const { return size_; }
    void clear() {
        if (size_ > N) GiveHeap();
        size_ = 0;
    }
    T* begin() { return size_ <= N ? inline_ : heap_.data(); }
    T* end() { return begin() + size_; }
    T& operator[](size_t i) { return begin()[i]; }
    const T& operator[](size_t i) const { return const_cast<SmallVector*>(this)->begin()[i]; }

 private:
    using HeapPool = Scratch<T, DefaultInitAllocator<T>>;
    [[gnu::noinline]] void GiveHeap() { HeapPool::Give(std::move(heap_)); }
    T inline_[N];
    typename HeapPool::Vector heap_;
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
