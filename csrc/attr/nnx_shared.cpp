// object.__new__ with fields set, as flax's frozen dataclasses are made (see nnx_shared.h).
#include "attr/nnx_shared.h"

namespace fastree::nnx_graph {

PyObject* NewRecord(PyObject* cls, std::initializer_list<std::pair<PyObject*, PyObject*>> fields) {
    Ref obj(attr::NewInstance(cls));
    if (!obj) return nullptr;
    for (const auto& [name, value] : fields) {
        if (PyObject_GenericSetAttr(obj.get(), name, value) < 0) return nullptr;
    }
    return obj.release();
}

}  // namespace fastree::nnx_graph
