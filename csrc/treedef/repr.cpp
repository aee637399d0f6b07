// str/repr of a treedef, character-for-character JAX's `PyTreeDef(...)` text.
// Built bottom-up over the post-order nodes with a stack of strings (no recursion).
#include <string>
#include <unordered_map>

#include "treedef/node_kinds.h"
#include "util/pyutils.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"

namespace fastree {

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
        const std::string* kids = stack.data() + (stack.size() - static_cast<size_t>(n));
        if (node.IsSharedRef()) {
            auto it = labels.find(node.ref);
            s = "&" + std::to_string(it == labels.end() ? 0 : it->second);
        } else if (!kinds::Describe(PartsOf(def, node), kids, &s)) {
            return nullptr;
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
