// An open-addressing hash map from object address to index, for the identity-preserving flatten.
// std::unordered_map allocates a node per insertion, which doubled the cost of flattening a tree
// of identity-preserving nodes; this keeps every slot in one vector. Keys are borrowed here: the
// owner decides their lifetime.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

namespace fastree {

class PointerMap {
 public:
    struct Slot {
        PyObject* key = nullptr;  // null: empty
        Py_ssize_t value = 0;
    };

    // The slot for `key`, inserting it with `value` if absent (*inserted says which). The
    // pointer is valid until the next insertion.
    Slot* FindOrInsert(PyObject* key, Py_ssize_t value, bool* inserted) {
        if ((size_ + 1) * 2 > slots_.size()) Grow();
        Slot* slot = Probe(key);
        *inserted = slot->key == nullptr;
        if (*inserted) {
            slot->key = key;
            slot->value = value;
            ++size_;
        }
        return slot;
    }

    // The slot for `key`, or null.
    Slot* Find(PyObject* key) {
        if (slots_.empty()) return nullptr;
        Slot* slot = Probe(key);
        return slot->key == nullptr ? nullptr : slot;
    }

    template <class F>
    void ForEach(F&& f) const {
        for (const Slot& slot : slots_) {
            if (slot.key != nullptr) f(slot.key, slot.value);
        }
    }

 private:
    Slot* Probe(PyObject* key) {
        const size_t mask = slots_.size() - 1;
        // Fibonacci hashing of the address (objects are 16-byte aligned: drop those bits).
        size_t i = static_cast<size_t>((reinterpret_cast<uintptr_t>(key) >> 4) *
                                       0x9E3779B97F4A7C15ULL >> 20) & mask;
        while (slots_[i].key != nullptr && slots_[i].key != key) i = (i + 1) & mask;
        return &slots_[i];
    }

    void Grow() {
        // The bigger table is allocated before the old one is given up: if that throws
        // (std::bad_alloc), the map still holds every entry.
        std::vector<Slot> old(slots_.empty() ? 64 : slots_.size() * 2, Slot{});
        old.swap(slots_);
        for (const Slot& slot : old) {
            if (slot.key != nullptr) *Probe(slot.key) = slot;
        }
    }

    std::vector<Slot> slots_;  // power-of-two size, at most half full
    size_t size_ = 0;
};

}  // namespace fastree
