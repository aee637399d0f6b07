// Checks on first instances: when the checker an integration attached runs, and the switch to
// the library's own functions once it finds a difference ("Checked use" in registry/attr_node.h).
#include "attr/attr_node_internal.h"

#include "registry/registry.h"

namespace fastree {
namespace attr {

bool SwitchToLibrary(AttrNode* node) {
    SetCounter(node->checks_left, 0);
    SetCounter(node->irregular_checks_left, 0);
    // The class's custom record is published before the switch is set: another thread that
    // sees the switch (kLibrary) then finds the record. Set even if publishing failed (its
    // error is returned): native reads stop, and the next walk to meet the switch publishes.
    const bool published = registry::DelegateAttribute(reinterpret_cast<PyObject*>(node));
    SetUseLibrary(node, true);
    return published;
}

bool CheckDue(const AttrNode* node) {
    return HasFunction(node, &AttrNode::checker) &&
           (Counter(node->checks_left) > 0 || Counter(node->irregular_checks_left) > 0);
}

int FieldsPresent(const AttrNode* node, const Instance& inst) {
    const Py_ssize_t n = NumData(node) + NumMeta(node);
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (node->slots != nullptr && node->slots[i] != 0) continue;
        if (!inst.dict || inst.general) return 0;
        PyObject* name = i < NumData(node) ? PyTuple_GET_ITEM(node->data_fields, i)
                                           : PyTuple_GET_ITEM(node->meta_fields, i - NumData(node));
        const int has = PyDict_Contains(inst.dict.get(), name);
        if (has <= 0) return has;
    }
    return 1;
}

Outcome CheckIfDue(AttrNode* node, PyObject* obj, bool regular, bool* ran) {
    *ran = false;
    if (!HasFunction(node, &AttrNode::checker)) return Outcome::kNative;
    // Each check is taken by one thread (TakeCheck never counts below zero): as many checks run
    // as were asked for, whichever threads read the first instances.
    if (!TakeCheck(node->checks_left) && (regular || !TakeCheck(node->irregular_checks_left))) {
        return Outcome::kNative;
    }
    // Held for the call, taken in the node's critical section: the checker may drop the node's
    // own reference (check_with again), here or on another thread.
    Ref checker = NodeFunction(node, &AttrNode::checker);
    if (!checker) return Outcome::kNative;  // cleared meanwhile (the node's tp_clear)
    *ran = true;
    Ref verdict(PyObject_CallOneArg(checker.get(), obj));
    if (!verdict) return Outcome::kError;
    const int same = PyObject_IsTrue(verdict.get());
    if (same < 0) return Outcome::kError;
    if (!same && !SwitchToLibrary(node)) return Outcome::kError;
    return UsesLibrary(node) ? Outcome::kLibrary : Outcome::kNative;
}

}  // namespace attr
}  // namespace fastree
