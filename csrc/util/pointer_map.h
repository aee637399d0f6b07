// An open-addressing hash map from object address to an entry (the key and a value), for the
// walks that must know whether they met an object before: identity-preserving nodes
// (treedef/identity_seen.h) and flax Variables. Entries are numbered 0, 1, 2, ... in the order
// their keys were first inserted, and kept in that order beside the table. Keys are borrowed
// here: the owner decides their lifetime.
//
// What shapes it is cost. std::unordered_map allocated a node per insertion, which doubled the
// cost of flattening a tree of identity-preserving nodes. A table of slots grown from 64 on every
// walk then cost a tree of 135 such modules 139 instructions an insertion (allocating, zeroing
// and rehashing three tables on the way to 512 slots, finding each key twice, then scanning all
// 512 slots to release the keys; callgrind, 3.13): a fifth of its flatten. The table is now the
// thread's spare one (util/scratch.h), sized at the start for as many keys as the thread's last
// map held, and an insertion returns its entry's number, which stays valid as the table grows.
#pragma once

#include <Python.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/scratch.h"
#include "util/thread_state.h"

namespace fastree {

namespace pointer_map_detail {
// How many keys the calling thread's last PointerMap held: the next one starts with a table
// for as many. Per thread on free-threaded builds; a nested map (a walk re-entered from a
// callback) overwriting it costs the outer one's next table a resize, nothing else.
inline FASTREE_PER_THREAD size_t g_last_size = 0;
}  // namespace pointer_map_detail

class PointerMap {
 public:
    struct Entry {
        PyObject* key;
        Py_ssize_t value;
    };

    PointerMap() {
        // Capped: a small walk after a huge one starts with a table of at most 1 MiB to clear.
        const size_t expected = std::min(pointer_map_detail::g_last_size, kMaxExpected);
        entries_.get().reserve(expected);
        Rebuild(SlotsFor(expected));
    }
    ~PointerMap() { pointer_map_detail::g_last_size = entries_.get().size(); }
    PointerMap(const PointerMap&) = delete;
    PointerMap& operator=(const PointerMap&) = delete;

    // The number of `key`'s entry, inserting {key, value} if absent (*inserted says which).
    // Throws std::bad_alloc with the map unchanged.
    size_t FindOrInsert(PyObject* key, Py_ssize_t value, bool* inserted) {
        std::vector<Entry>& entries = entries_.get();
        if ((entries.size() + 1) * 2 > table_.get().size()) Rebuild(table_.get().size() * 2);
        Slot& slot = table_.get()[Probe(key)];
        *inserted = slot.key == nullptr;
        if (!*inserted) return slot.entry;
        entries.push_back(Entry{key, value});  // first: if it throws, nothing has changed
        slot = Slot{key, entries.size() - 1};
        return slot.entry;
    }

    Entry& operator[](size_t entry) { return entries_.get()[entry]; }
    // Every entry, in insertion order.
    const std::vector<Entry>& entries() { return entries_.get(); }

 private:
    struct Slot {
        PyObject* key;  // null: empty
        size_t entry;
    };
    static constexpr size_t kMinSlots = 64;
    static constexpr size_t kMaxExpected = size_t{1} << 15;
    // A table at most half full for `n` keys (a power of two).
    static size_t SlotsFor(size_t n) {
        size_t slots = kMinSlots;
        while (slots < 2 * n + 2) slots *= 2;
        return slots;
    }

    size_t Probe(PyObject* key) {
        const std::vector<Slot>& table = table_.get();
        const size_t mask = table.size() - 1;
        // Fibonacci hashing of the address (objects are 16-byte aligned: drop those bits).
        size_t i = static_cast<size_t>((reinterpret_cast<uintptr_t>(key) >> 4) *
                                       0x9E3779B97F4A7C15ULL >> 20) & mask;
        while (table[i].key != nullptr && table[i].key != key) i = (i + 1) & mask;
        return i;
    }

    // An empty table of `slots` slots, filled from the entries. assign() builds a bigger buffer
    // before it drops the old one: if that throws, the table is the one it was.
    void Rebuild(size_t slots) {
        table_.get().assign(slots, Slot{nullptr, 0});
        const std::vector<Entry>& entries = entries_.get();
        for (size_t i = 0; i < entries.size(); ++i) {
            table_.get()[Probe(entries[i].key)] = Slot{entries[i].key, i};
        }
    }

    // The thread's spare vectors while this map lives (util/scratch.h gives them back).
    Scratch<Slot> table_;      // power-of-two size
    Scratch<Entry> entries_;
};

}  // namespace fastree
