// An allocator that keeps freed small blocks for reuse: the node vectors of small treedefs.
//
// Flattening a 3-leaf tuple makes a treedef whose node vector is the one allocation the call
// makes outside Python's own allocator; its malloc and free were a visible share of the call.
// Blocks for at most kBlockElements elements are all made kBlockElements long and kept, when
// freed, on a free list of at most kKeptBlocks: a small treedef's vector then comes from that
// list and goes back to it. Larger requests go to operator new and delete, as std::allocator's.
//
// The list is process-wide under the GIL (the module supports one interpreter; every vector is
// made and freed with the GIL held). On free-threaded builds there is no list: a per-thread one
// would be reached through __tls_get_addr and would strand blocks freed by another thread, so
// every request goes to operator new there.
// Under AddressSanitizer there is no list either: a reused block would hide a use after free.
#pragma once

#include <Python.h>  // Py_GIL_DISABLED

#include <cstddef>
#include <new>

namespace fastree {

namespace small_blocks {

#if defined(Py_GIL_DISABLED) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kKeepBlocks = false;
#else
inline constexpr bool kKeepBlocks = true;
#endif

// The free list of one block size: a singly linked list threaded through the blocks themselves.
template <size_t kBytes>
class FreeList {
 public:
    static constexpr int kKeptBlocks = 64;

    static void* Take() {
        if (kKeepBlocks && head_ != nullptr) {
            Block* block = head_;
            head_ = block->next;
            --count_;
            return block;
        }
        return ::operator new(kBytes);
    }

    static void Give(void* p) noexcept {
        if (kKeepBlocks && count_ < kKeptBlocks) {
            Block* block = static_cast<Block*>(p);
            block->next = head_;
            head_ = block;
            ++count_;
            return;
        }
        ::operator delete(p, kBytes);
    }

 private:
    struct Block {
        Block* next;
    };
    static_assert(kBytes >= sizeof(Block), "a kept block holds the list's link");
    inline static Block* head_ = nullptr;
    inline static int count_ = 0;
};

}  // namespace small_blocks

template <class T, size_t kBlockElements>
struct SmallBlockAllocator {
    using value_type = T;
    template <class U>
    struct rebind {
        using other = SmallBlockAllocator<U, kBlockElements>;
    };
    static constexpr size_t kBlockBytes = kBlockElements * sizeof(T);

    SmallBlockAllocator() = default;
    template <class U>
    SmallBlockAllocator(const SmallBlockAllocator<U, kBlockElements>&) noexcept {}

    T* allocate(size_t n) {
        using Blocks = small_blocks::FreeList<kBlockBytes>;
        if (n <= kBlockElements) return static_cast<T*>(Blocks::Take());
        if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
        return static_cast<T*>(::operator new(n * sizeof(T)));
    }
    void deallocate(T* p, size_t n) noexcept {
        if (n <= kBlockElements) {
            small_blocks::FreeList<kBlockBytes>::Give(p);
        } else {
            ::operator delete(p, n * sizeof(T));
        }
    }

    template <class U>
    bool operator==(const SmallBlockAllocator<U, kBlockElements>&) const noexcept {
        return true;
    }
    template <class U>
    bool operator!=(const SmallBlockAllocator<U, kBlockElements>&) const noexcept {
        return false;
    }
};

}  // namespace fastree
