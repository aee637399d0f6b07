// str/repr of a treedef, character-for-character JAX's `PyTreeDef(...)` text.
// Built bottom-up over the post-order nodes with a stack of strings (no recursion).
#include <string>
#include <unordered_map>

#include "pyutils.h"
#include "treedef.h"
#include "treedef_ops.h"

namespace fastree {
namespace {

void Join(std::string* out, std::vector<std::string>& stack, Py_ssize_t n) {
    const size_t first = stack.size() - static_cast<size_t>(n);
    for (size_t i = first; i < stack.size(); ++i) {
        if (i > first) out->append(", ");
        out->append(stack[i]);
    }
}

bool TypeName(PyObject* type, std::string* out) {
    PyObject* name = PyObject_GetAttrString(type, "__name__");
    if (name == nullptr) return false;
    bool ok = StrInto(name, out);
    Py_DECREF(name);
    return ok;
}

}  // namespace

// Shared nodes (identity-preserving objects met more than once) are labelled &1, &2, ... in
// order of first occurrence: the first occurrence prints as `&1 CustomNode(...)`, every later
// one as `&1`. JAX has no such nodes, so treedefs without sharing print exactly as JAX's.
PyObject* Repr(const TreeDef& def) {
    std::vector<std::string> stack;
    std::unordered_map<Py_ssize_t, int> labels;
    for (Py_ssize_t index = 0; index < def.num_nodes(); ++index) {
        const Node& node = def.nodes[index];
        std::string s;
        const Py_ssize_t n = node.arity;
        switch (node.kind) {
            case NodeKind::kLeaf:
                s = "*";
                break;
            case NodeKind::kSharedRef: {
                auto it = labels.find(node.ref);
                s = "&" + std::to_string(it == labels.end() ? 0 : it->second);
                break;
            }
            case NodeKind::kNone:
                s = "None";
                break;
            case NodeKind::kTuple:
                s = "(";
                Join(&s, stack, n);
                s += n == 1 ? ",)" : ")";
                break;
            case NodeKind::kList:
                s = "[";
                Join(&s, stack, n);
                s += "]";
                break;
            case NodeKind::kDict: {
                s = "{";
                const size_t first = stack.size() - static_cast<size_t>(n);
                for (Py_ssize_t i = 0; i < n; ++i) {
                    if (i > 0) s += ", ";
                    if (!ReprInto(def.keys[node.keys_begin + i], &s)) return nullptr;
                    s += ": ";
                    s += stack[first + static_cast<size_t>(i)];
                }
                s += "}";
                break;
            }
            case NodeKind::kNamedTuple:
                s = "CustomNode(namedtuple[";
                if (!TypeName(def.Data(node), &s)) return nullptr;
                s += "], [";
                Join(&s, stack, n);
                s += "])";
                break;
            case NodeKind::kOrderedDict:
            case NodeKind::kDefaultDict:
            case NodeKind::kCustom:
            case NodeKind::kDataclass:
                s = "CustomNode(";
                if (!TypeName(def.Custom(node)->type, &s)) return nullptr;
                s += "[";
                if (!StrInto(def.Data(node), &s)) return nullptr;
                s += "], [";
                Join(&s, stack, n);
                s += "])";
                break;
        }
        if (node.shared_target) {
            const int label = static_cast<int>(labels.size()) + 1;
            labels[index] = label;
            s = "&" + std::to_string(label) + " " + s;
        }
        stack.resize(stack.size() - static_cast<size_t>(n));
        stack.push_back(std::move(s));
    }
    std::string out = "PyTreeDef(";
    if (!stack.empty()) out += stack.back();
    out += ")";
    return PyUnicode_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

}  // namespace fastree
