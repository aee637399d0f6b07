// Reusable scratch buffers for per-call vectors (leaf lists, the node vector being built). A small
// tree's flatten would otherwise spend a noticeable share of its time in malloc/free, and a large
// one in growth copies and first-touch page faults. It is a pool rather than one
// static buffer because flatten re-enters itself through user callbacks (is_leaf, custom
// flatten functions calling tree_flatten). One pool per instantiation, and per thread on
// free-threaded builds (util/thread_state.h).
#pragma once

#include <Python.h>

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastree {

template <class T, class Alloc = std::allocator<T>>
class Scratch {
 public:
    using Vector = std::vector<T, Alloc>;

    Scratch() : items_(Take()) {}
    ~Scratch() {
        // Callers normally leave the vector empty (ownership of its references moved
        // elsewhere). What is left, after an error or a C++ exception (std::bad_alloc from a
        // growing vector) unwinding through the caller, is owned and released here.
        if constexpr (std::is_same_v<T, PyObject*>) {
            for (PyObject* p : items_) Py_XDECREF(p);
        }
        Give(std::move(items_));
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    Vector& get() { return items_; }

    // A spare vector from the pool (empty, its capacity kept), or a new one.
    static Vector Take() {
        Pool& pool = GetPool();
        return pool.count > 0 ? std::move(pool.slots[--pool.count]) : Vector();
    }
    // Empties `v` and keeps it for the next Take, unless the pool is full or `v` is huge.
    static void Give(Vector&& v) {
        v.clear();
        constexpr size_t kKeepBytes = size_t{8} << 20;  // don't pin huge buffers forever
        Pool& pool = GetPool();
        if (v.capacity() != 0 && pool.count < kPoolSize && v.capacity() * sizeof(T) <= kKeepBytes) {
            pool.slots[pool.count++] = std::move(v);
        }
    }

 private:
    // A fixed stack of spare vectors: taking and returning one is a move of three pointers,
    // with none of a growable pool's bookkeeping (a 3-leaf flatten takes two per call).
    // Nesting deeper than kPoolSize (re-entrant flattens) just allocates.
    static constexpr size_t kPoolSize = 8;
    struct Pool {
        Vector slots[kPoolSize];
        size_t count = 0;
    };
    static Pool& GetPool() {
#ifdef Py_GIL_DISABLED
        // One pool per thread (util/thread_state.h), destroyed with its thread: its vectors are
        // empty (Give clears them), so that frees their capacity and releases no reference.
        // Not the GIL build's never-destroyed pointer, which would leak every ended thread's.
        static thread_local Pool pool;
        return pool;
#else
        static Pool* pool = new Pool();  // guarded by the GIL; never destroyed (exit order)
        return *pool;
#endif
    }
    Vector items_;
};

using ScratchVector = Scratch<PyObject*>;

}  // namespace fastree
