// The identity-preserving objects one walk has entered, and what it made of each: flatten, the
// index of the object's node; tree_map, the index of its output. The walks' only knowledge of
// sharing: the first occurrence of such an object is walked as usual, a later one is told apart
// from a cycle (the first occurrence's subtree still being walked) here.
#pragma once

#include <Python.h>

#include <cstddef>

#include "util/pointer_map.h"

namespace fastree {

class IdentitySeen {
 public:
    // Holds a reference to each object entered, so that an object freed mid-walk (a callback
    // dropping its last reference) cannot hand its address to a new object, which would then
    // read as met before. Released in the order entered: a release can run Python code, and
    // only this walk's own vector is read meanwhile.
    ~IdentitySeen() {
        for (const PointerMap::Entry& entry : seen_.entries()) Py_DECREF(entry.key);
    }

    enum class Met {
        kFirst,       // entered now: walk it, then Finish(entry, ...)
        kInProgress,  // its first occurrence's subtree is being walked: a cycle
        kBefore,      // walked already: *made is what the walk made of it
    };
    // Throws std::bad_alloc with nothing entered.
    Met Enter(PyObject* obj, size_t* entry, Py_ssize_t* made) {
        bool inserted;
        *entry = seen_.FindOrInsert(obj, kInProgress, &inserted);
        if (inserted) {
            Py_INCREF(obj);
            return Met::kFirst;
        }
        *made = seen_[*entry].value;
        return *made == kInProgress ? Met::kInProgress : Met::kBefore;
    }
    // `made` (>= 0): what the walk made of the object entered as `entry`.
    void Finish(size_t entry, Py_ssize_t made) { seen_[entry].value = made; }

 private:
    static constexpr Py_ssize_t kInProgress = -1;
    PointerMap seen_;
};

}  // namespace fastree
