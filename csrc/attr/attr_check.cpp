// Checks on first instances: when the checker an integration attached runs, and the switch to
// the library's own functions once it finds a difference ("Checked use" in registry/attr_node.h).
#include "attr/attr_node_internal.h"

#include "registry/registry.h"

namespace fastree {
namespace attr {

bool SwitchToLibrary(AttrNode* node) {
    node->use_library = true;
    node->checks_left = 0;
    node->irregular_checks_left = 0;
    return registry::DelegateAttribute(reinterpret_cast<PyObject*>(node));
}

bool CheckDue(const AttrNode* node) {
    return node->checker != nullptr && (node->checks_left > 0 || node->irregular_checks_left > 0);
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
    if (node->checker == nullptr) return Outcome::kNative;
    if (node->checks_left > 0) {
        --node->checks_left;
    } else if (!regular && node->irregular_checks_left > 0) {
        --node->irregular_checks_left;
    } else {
        return Outcome::kNative;
    }
    *ran = true;
    // Held for the call: the checker may drop the node's own reference (check_with again).
    Ref checker = Ref::FromBorrowed(node->checker);
    Ref verdict(PyObject_CallOneArg(checker.get(), obj));
    if (!verdict) return Outcome::kError;
    const int same = PyObject_IsTrue(verdict.get());
    if (same < 0) return Outcome::kError;
    if (!same && !SwitchToLibrary(node)) return Outcome::kError;
    return node->use_library ? Outcome::kLibrary : Outcome::kNative;
}

}  // namespace attr
}  // namespace fastree
