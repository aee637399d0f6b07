#include "aux_check.h"

#include <unordered_map>

#include "pyutils.h"

namespace fastree {
namespace aux {

PyObject* g_reporter = nullptr;

namespace {

PyObject* g_classify = nullptr;  // owned: (type, example) -> bool, "instances are plain data"
bool g_strict = false;

// Verdicts of the classifier per value type. Holds an owned reference to each type (types seen
// in aux data are long-lived: enums, classes), bounded in size.
std::unordered_map<PyTypeObject*, bool>& Verdicts() {
    static auto* verdicts = new std::unordered_map<PyTypeObject*, bool>();
    return *verdicts;
}

void ClearVerdicts() {
    auto old = std::move(Verdicts());
    Verdicts().clear();
    for (auto& entry : old) Py_DECREF(reinterpret_cast<PyObject*>(entry.first));
}

enum class Walk { kPlain, kReport, kError };

bool IsAtom(PyTypeObject* t) {
    return t == Py_TYPE(Py_None) || t == &PyBool_Type || t == &PyLong_Type ||
           t == &PyFloat_Type || t == &PyUnicode_Type || t == &PyBytes_Type ||
           t == &PyComplex_Type || PyType_FastSubclass(t, Py_TPFLAGS_TYPE_SUBCLASS);
}

// Asks the classifier (once per type) whether instances of `t` are plain static data.
Walk Classify(PyObject* value) {
    PyTypeObject* t = Py_TYPE(value);
    auto& verdicts = Verdicts();
    auto it = verdicts.find(t);
    if (it != verdicts.end()) return it->second ? Walk::kPlain : Walk::kReport;
    if (g_classify == nullptr) return Walk::kReport;
    PyObject* args[2] = {reinterpret_cast<PyObject*>(t), value};
    Ref classify(Py_NewRef(g_classify));  // the hooks may be replaced while it runs
    PyObject* r = PyObject_Vectorcall(classify.get(), args, 2, nullptr);
    if (r == nullptr) return Walk::kError;
    int plain = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (plain < 0) return Walk::kError;
    if (verdicts.size() > 1024) ClearVerdicts();
    // The entry first, then its reference: an emplace that throws leaks nothing.
    if (verdicts.emplace(t, plain != 0).second) Py_INCREF(reinterpret_cast<PyObject*>(t));
    return plain ? Walk::kPlain : Walk::kReport;
}

Walk Visit(PyObject* value, int depth) {
    PyTypeObject* t = Py_TYPE(value);
    if (IsAtom(t)) return Walk::kPlain;
    if (depth > 16) return Walk::kReport;  // let the reporter look at pathological nesting
    const bool hashable_container = t == &PyTuple_Type || t == &PyFrozenSet_Type;
    const bool mutable_container = t == &PyList_Type || t == &PyDict_Type || t == &PySet_Type;
    if (mutable_container && g_strict) return Walk::kReport;  // unhashable: strict rejects it
    // The classifier runs user code (an `==` on an example value), which may mutate or free
    // what we are walking: hold a reference to every item while it is visited, and re-read
    // a list's size each step.
    if (t == &PyTuple_Type || t == &PyList_Type) {
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(value); ++i) {
            PyObject* item = Py_NewRef(PySequence_Fast_GET_ITEM(value, i));
            Walk w = Visit(item, depth + 1);
            Py_DECREF(item);
            if (w != Walk::kPlain) return w;
        }
        return Walk::kPlain;
    }
    if (t == &PyDict_Type) {
        PyObject* items = PyDict_Items(value);  // a snapshot the walk owns
        if (items == nullptr) return Walk::kError;
        Walk w = Walk::kPlain;
        for (Py_ssize_t i = 0; w == Walk::kPlain && i < PyList_GET_SIZE(items); ++i) {
            PyObject* pair = PyList_GET_ITEM(items, i);
            w = Visit(PyTuple_GET_ITEM(pair, 0), depth + 1);
            if (w == Walk::kPlain) w = Visit(PyTuple_GET_ITEM(pair, 1), depth + 1);
        }
        Py_DECREF(items);
        return w;
    }
    if (hashable_container || t == &PySet_Type) {  // frozenset/set (tuples were done above)
        PyObject* it = PyObject_GetIter(value);
        if (it == nullptr) return Walk::kError;
        Walk w = Walk::kPlain;
        while (w == Walk::kPlain) {
            PyObject* item = PyIter_Next(it);
            if (item == nullptr) break;
            w = Visit(item, depth + 1);
            Py_DECREF(item);
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) return Walk::kError;
        return w;
    }
    return Classify(value);
}

}  // namespace

bool CheckSlow(PyObject* node_type, PyObject* aux, const Site& site) {
    Walk w = Visit(aux, 0);
    if (w == Walk::kError) return false;
    if (w == Walk::kPlain) return true;
    // reporter(node_type, aux, root, [is_leaf=...], [key_path=...])
    Ref key_path(site.path != nullptr ? site.path->NewTuple() : nullptr);
    if (site.path != nullptr && !key_path) return false;
    PyObject* args[5] = {node_type, aux, site.root};
    Py_ssize_t nkw = 0;
    Ref kwnames(PyTuple_New((site.is_leaf != nullptr) + (site.path != nullptr)));
    if (!kwnames) return false;
    if (site.is_leaf != nullptr) {
        PyObject* name = PyUnicode_InternFromString("is_leaf");
        if (name == nullptr) return false;
        PyTuple_SET_ITEM(kwnames.get(), nkw, name);
        args[3 + nkw++] = site.is_leaf;
    }
    if (site.path != nullptr) {
        PyObject* name = PyUnicode_InternFromString("key_path");
        if (name == nullptr) return false;
        PyTuple_SET_ITEM(kwnames.get(), nkw, name);
        args[3 + nkw++] = key_path.get();
    }
    Ref reporter(Py_NewRef(g_reporter));  // the hooks may be replaced while it runs
    Ref r(PyObject_Vectorcall(reporter.get(), args, 3, nkw > 0 ? kwnames.get() : nullptr));
    return static_cast<bool>(r);
}

void SetHooks(PyObject* classify, PyObject* reporter) {
    Py_XSETREF(g_classify, Py_XNewRef(classify == Py_None ? nullptr : classify));
    Py_XSETREF(g_reporter, Py_XNewRef(reporter == Py_None ? nullptr : reporter));
    ClearVerdicts();
}

void SetStrict(bool strict) { g_strict = strict; }
bool Strict() { return g_strict; }

int Traverse(visitproc visit, void* arg) {
    Py_VISIT(g_classify);
    Py_VISIT(g_reporter);
    for (auto& entry : Verdicts()) Py_VISIT(reinterpret_cast<PyObject*>(entry.first));
    return 0;
}

}  // namespace aux
}  // namespace fastree
