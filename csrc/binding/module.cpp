// fastree._core: bindings only. The hot functions are raw C entry points (entry_points.cpp);
// the cold ones (registration, bridge set-up) go through pybind11.
#include <pybind11/pybind11.h>

#include <stdexcept>

#include "registry/attr_node.h"
#include "diagnostics/aux_check.h"
#include "binding/entry_points.h"
#include "registry/jax_texts.h"
#include "util/pyutils.h"
#include "registry/keys.h"
#include "binding/module_state.h"
#include "nnx/nnx_graph.h"
#include "nnx/nnx_graph_walk.h"
#include "nnx/nnx_tree_variables.h"
#include "attr/nnx_shared.h"
#include "registry/registry.h"
#include "treedef/treedef.h"
#include "treedef/treedef_ops.h"

namespace py = pybind11;

namespace fastree {
namespace {

// Casts for PyMethodDef: fast-call signatures are stored as PyCFunction, each wrapped in Guard
// (see pyutils.h). FnOwnScope: an entry point that opens its aux-report scope itself, after a
// fast path that can find no report (entry_points.cpp, FlattenEntry).
template <auto F>
PyCFunction FnOwnScope() {
    return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Guard<F>));
}

// Any other: it makes its aux_data reports after its walk (aux::ReportScope).
template <auto F>
PyCFunction Fn() {
    return FnOwnScope<aux::ReportAfter<F>>();
}

constexpr int kFastKw = METH_FASTCALL | METH_KEYWORDS;

PyMethodDef kFastFunctions[] = {
    {"tree_flatten", FnOwnScope<TreeFlatten>(), kFastKw,
     "tree_flatten(tree, is_leaf=None)\n--\n\n"
     "Flattens a pytree into (leaves, treedef).\n\n"
     ">>> import fastree.tree_util as tu\n"
     ">>> tu.tree_flatten({'b': (1, 2), 'a': None})\n"
     "([1, 2], PyTreeDef({'a': None, 'b': (*, *)}))\n"},
    {"tree_leaves", FnOwnScope<TreeLeaves>(), kFastKw,
     "tree_leaves(tree, is_leaf=None)\n--\n\n"
     "The leaves of a pytree, in flattening order; builds no treedef.\n\n"
     ">>> import fastree.tree_util as tu\n"
     ">>> tu.tree_leaves([1, {'x': 2, 'w': 3}])\n"
     "[1, 3, 2]\n"},
    {"tree_structure", FnOwnScope<TreeStructure>(), kFastKw,
     "tree_structure(tree, is_leaf=None)\n--\n\n"
     "The treedef of a pytree.\n\n"
     ">>> import fastree.tree_util as tu\n"
     ">>> tu.tree_structure((1, [2, None]))\n"
     "PyTreeDef((*, [*, None]))\n"},
    {"tree_flatten_with_path", Fn<TreeFlattenWithPath>(), kFastKw,
     "tree_flatten_with_path(tree, is_leaf=None, is_leaf_takes_path=False)\n--\n\n"
     "Flattens a pytree into ([(key_path, leaf), ...], treedef).\n\n"
     ">>> import fastree.tree_util as tu\n"
     ">>> tu.tree_flatten_with_path({'a': [5]})[0]\n"
     "[((DictKey(key='a'), SequenceKey(idx=0)), 5)]\n"},
    {"tree_leaves_with_path", Fn<TreeLeavesWithPath>(), kFastKw,
     "tree_leaves_with_path(tree, is_leaf=None, is_leaf_takes_path=False)\n--\n\n"
     "[(key_path, leaf), ...] of a pytree.\n"},
    {"tree_unflatten", Fn<TreeUnflatten>(), kFastKw,
     "tree_unflatten(treedef, leaves)\n--\n\n"
     "Builds a pytree of `treedef`'s structure from an iterable of leaves.\n\n"
     ">>> import fastree.tree_util as tu\n"
     ">>> tu.tree_unflatten(tu.tree_structure((0, [0])), 'ab')\n"
     "('a', ['b'])\n"},
    {"tree_map", FnOwnScope<TreeMap>(), kFastKw,
     "tree_map(f, tree, *rest, is_leaf=None)\n--\n\n"
     "Applies f to the leaves of `tree` (and the matching subtrees of `rest`).\n\n"
     ">>> import fastree.tree_util as tu\n"
     ">>> tu.tree_map(lambda x, y: x + y, {'a': 1, 'b': (2,)}, {'a': 10, 'b': (20,)})\n"
     "{'a': 11, 'b': (22,)}\n"},
    {"tree_map_with_path", Fn<TreeMapWithPath>(), kFastKw,
     "tree_map_with_path(f, tree, *rest, is_leaf=None, is_leaf_takes_path=False)\n--\n\n"
     "Like tree_map, with f(key_path, leaf, *rest_leaves).\n"},
    {"all_leaves", Fn<AllLeaves>(), METH_O,
     "all_leaves(iterable, /)\n--\n\nTrue if no element of `iterable` is a pytree node.\n"},
    {"flatten_one_level", Fn<FlattenOneLevelEntry>(), METH_O,
     "flatten_one_level(tree, /)\n--\n\n(children, node_data) of the root, or None for a leaf.\n"},
    {"flatten_one_level_with_keys", Fn<FlattenOneLevelWithKeysEntry>(), METH_O,
     "flatten_one_level_with_keys(tree, /)\n--\n\n"
     "(key_child_pairs, node_data) of the root, or None for a leaf.\n"},
    {"is_node_type", Fn<IsNodeType>(), METH_O,
     "is_node_type(type, /)\n--\n\nTrue if instances of `type` are pytree nodes.\n"},
    {"treedef_tuple", Fn<TreeDefTupleEntry>(), METH_O,
     "treedef_tuple(treedefs, /)\n--\n\nThe treedef of a tuple of the given structures.\n"},
    {"_treedef_from_state", Fn<TreeDefFromState>(), METH_O,
     "_treedef_from_state(state, /)\n--\n\nUnpickling constructor of PyTreeDef.\n"},
    {"nnx_variables_by_path", Fn<nnx_tree::VariablesByPath>(), kFastKw,
     "nnx_variables_by_path(check, tree, structure=False)\n--\n\n"
     "flax's check_no_aliases result for the labeled arguments `tree` (csrc/nnx/\n"
     "nnx_tree_variables.h): {path: Variable} in walk order, or None where a Variable is met\n"
     "twice. `check` is an nnx_variable_check callable. With `structure`: (that, the walk's\n"
     "treedef, the Variables' positions among its leaves).\n"},
    {"nnx_variables_unchanged", Fn<nnx_tree::VariablesUnchanged>(), kFastKw,
     "nnx_variables_unchanged(check, tree, treedef, positions, variables)\n--\n\n"
     "Whether `tree` walks to `treedef`'s structure and key paths with the same Variables at\n"
     "`positions` and no other (csrc/nnx/nnx_tree_variables.h).\n"},
    {"nnx_apply_updates", Fn<nnx_tree::ApplyUpdates>(), kFastKw,
     "nnx_apply_updates(variables, updates, updates_type, context)\n--\n\n"
     "flax's extract.apply_updates (csrc/nnx/nnx_tree_variables.h): True once applied, False\n"
     "(nothing applied) where flax's function must run.\n"},
    {nullptr, nullptr, 0, nullptr},
};

void ThrowIfFalse(bool ok) {
    if (!ok) throw py::error_already_set();
}

}  // namespace

// treedef/node_view.cpp: interns the node kinds' names PyTreeDef._nodes() reports. False with an
// error set.
bool InitKindNames();

}  // namespace fastree

// Multi-phase (PEP 489) init. The core's state is per process (module_state.h), so the module
// declares that it does not support subinterpreters: Python 3.12+ refuses it to isolated ones
// at import, and NewModuleStateObject to legacy ones. (Before 3.12, pybind11's own PyInit takes
// the GIL with PyGILState_Ensure, which hangs in a subinterpreter before this code runs.)
// It declares Py_mod_gil (py::mod_gil_not_used): on a free-threaded interpreter the import leaves
// the GIL off. docs/threads.md lists every piece of shared state and what guards it there; GIL
// builds ignore the declaration. It comes first: pybind11 3.0-3.1 cannot compile an option after
// multiple_interpreters (its slot helper's recursion does not see the overload for it).
PYBIND11_MODULE(_core, m, py::mod_gil_not_used(), py::multiple_interpreters::not_supported()) {
    using namespace fastree;
    m.doc() = "fastree's C++ core: flatten, unflatten, map, treedefs and the node registry.";

    // First: it refuses a subinterpreter or a second initialisation before anything is made.
    py::object state = py::reinterpret_steal<py::object>(NewModuleStateObject());
    if (!state) {
        py::error_already_set error;
        // Its own text, rather than pybind11's "initialization failed" with it as the cause.
        if (error.matches(PyExc_ImportError)) throw py::import_error(py::str(error.value()));
        throw error;
    }
    m.attr("_module_state") = state;

    // What is made once and then read without a lock by every thread (docs/threads.md, step 3):
    // the memo's weakref callback, the node kinds' names, flax's attribute names.
    ThrowIfFalse(registry::Init());
    ThrowIfFalse(InitKindNames());
    ThrowIfFalse(nnx_graph::InitNames());

    if (CreateTreeDefType() == nullptr) throw py::error_already_set();
    m.add_object("PyTreeDef", reinterpret_cast<PyObject*>(g_PyTreeDef_Type));
    if (PyModule_AddFunctions(m.ptr(), kFastFunctions) < 0) throw py::error_already_set();

    m.def(
        "register_node",
        [](py::handle type, py::handle flatten, py::handle unflatten, py::handle flatten_with_keys,
           bool preserve_identity) {
            ThrowIfFalse(registry::RegisterCustom(type.ptr(), flatten.ptr(), unflatten.ptr(),
                                                  flatten_with_keys.ptr(), preserve_identity));
        },
        py::arg("type"), py::arg("flatten"), py::arg("unflatten"),
        py::arg("flatten_with_keys") = py::none(), py::arg("preserve_identity") = false,
        "Registers `type` as a custom node (flatten may be None if flatten_with_keys is given).");
    m.def(
        "register_dataclass_node",
        [](py::handle type, py::tuple data_fields, py::tuple meta_fields, bool preserve_identity) {
            ThrowIfFalse(registry::RegisterDataclass(type.ptr(), data_fields.ptr(), meta_fields.ptr(),
                                                     preserve_identity));
        },
        py::arg("type"), py::arg("data_fields"), py::arg("meta_fields"),
        py::arg("preserve_identity") = false,
        "Registers a dataclass-like `type` whose fields are read and set in C++.");
    PyTypeObject* attr_node_type = attr::CreateType();
    if (attr_node_type == nullptr) throw py::error_already_set();
    m.add_object("AttrNode", reinterpret_cast<PyObject*>(attr_node_type));
    m.def(
        "register_attribute_node",
        [](py::handle node, bool preserve_identity) {
            ThrowIfFalse(registry::RegisterAttribute(node.ptr(), preserve_identity));
        },
        py::arg("node"), py::arg("preserve_identity") = false,
        "Registers an AttrNode's class as an attribute node (read and rebuilt in C++).");
    m.def(
        "install_jax_bridge",
        [](py::dict jax_registry, py::handle flatten_one_level,
           py::handle flatten_one_level_with_keys, py::handle dict_key, py::handle sequence_key,
           py::handle getattr_key, py::handle flattened_index_key, py::handle to_jax,
           py::handle map_error) {
            ThrowIfFalse(registry::InstallJax(jax_registry.ptr(), flatten_one_level.ptr(),
                                              flatten_one_level_with_keys.ptr()));
            ThrowIfFalse(keys::Install(dict_key.ptr(), sequence_key.ptr(), getattr_key.ptr(),
                                       flattened_index_key.ptr()));
            // The treedef layer reads its hooks under its own lock (treedef_state.h): a hook
            // replaced here is released at once, as it always was (docs/threads.md, W3).
            SetToJaxHook(to_jax.ptr());
            SetMapErrorHook(map_error.ptr());
        },
        py::arg("jax_registry"), py::arg("flatten_one_level"),
        py::arg("flatten_one_level_with_keys"), py::arg("DictKey"),
        py::arg("SequenceKey"), py::arg("GetAttrKey"), py::arg("FlattenedIndexKey"),
        py::arg("to_jax"), py::arg("map_error"),
        "Connects the core to JAX: its registry (for JAX-only types), key classes and hooks.");
    m.def(
        "set_jaxlib_adopter",
        [](py::handle adopter) { registry::InstallJaxlibAdopter(adopter.ptr()); },
        py::arg("adopter"),
        "Installs adopter(type) -> (flatten, unflatten) | None for types registered only in "
        "jaxlib's C++ registry.");
    m.def(
        "set_library_adopter",
        [](py::handle adopter) { registry::InstallLibraryAdopter(adopter.ptr()); },
        py::arg("adopter"),
        "Installs adopter(type, flatten, unflatten) -> bool, offered each type adopted from "
        "JAX's Python-side registry: True once it registered an attribute node for it.");
    m.def(
        "set_iterable_leaf_warning",
        [](py::handle types, py::handle warn) {
            if (!registry::InstallIterableLeafWarning(types.ptr(), warn.ptr())) {
                throw py::error_already_set();
            }
        },
        py::arg("types"), py::arg("warn"),
        "Installs the leaf types the installed JAX warns about when a flatten meets one (a tuple "
        "of types, or None: no warning) and warn(leaf), which issues the warning.");
    m.def(
        "set_key_makers",
        [](py::handle sequence_block, py::handle flattened_index_block, py::handle dict_key,
           py::handle getattr_key, py::handle dict_key_block) {
            keys::InstallMakers(sequence_block.ptr(), flattened_index_block.ptr(), dict_key.ptr(),
                                getattr_key.ptr(), dict_key_block.ptr());
        },
        py::arg("sequence_block"), py::arg("flattened_index_block"), py::arg("dict_key"),
        py::arg("getattr_key"), py::arg("dict_key_block"),
        "Installs the jaxlib functions that make key entries (see csrc/registry/keys.cpp).");
    m.def(
        "set_aux_hooks",
        [](py::handle classify, py::handle reporter) { aux::SetHooks(classify.ptr(), reporter.ptr()); },
        py::arg("classify"), py::arg("reporter"),
        "Installs the aux_data checks: classify(type, example) -> bool is asked once per value "
        "type whether it is plain static data; reporter(node_type, aux, tree) warns or raises.");
    m.def(
        "set_jax_texts",
        [](bool dict_mismatch_shows_dict, bool aux_equality_names_type,
           bool dict_grown_mid_walk_raises) {
            // Set once (docs/threads.md, B2): walks read the flags without synchronisation, so
            // they are written by the bridge's install at import only. A later install (the
            // bridge's again, same JAX) finds them equal and writes nothing; different texts
            // would mean another JAX in the same process.
            static bool texts_set = false;  // the first call runs under the import lock
            JaxTexts& texts = Texts();
            if (!texts_set) {
                texts.dict_mismatch_shows_dict = dict_mismatch_shows_dict;
                texts.aux_equality_names_type = aux_equality_names_type;
                texts.dict_grown_mid_walk_raises = dict_grown_mid_walk_raises;
                texts_set = true;
            } else if (texts.dict_mismatch_shows_dict != dict_mismatch_shows_dict ||
                       texts.aux_equality_names_type != aux_equality_names_type ||
                       texts.dict_grown_mid_walk_raises != dict_grown_mid_walk_raises) {
                throw std::runtime_error(
                    "fastree: the JAX error texts are set once, at import, and cannot change");
            }
        },
        py::arg("dict_mismatch_shows_dict"), py::arg("aux_equality_names_type"),
        py::arg("dict_grown_mid_walk_raises"),
        "Selects the error texts of the installed JAX release (see csrc/registry/jax_texts.h).");
    m.def("set_strict_aux", [](bool strict) { aux::SetStrict(strict); }, py::arg("strict"),
          "Strict mode: aux_data must also be hashable (unhashable containers are reported).");
    m.def(
        "is_identity_type",
        [](py::handle type) {
            if (!PyType_Check(type.ptr())) return false;
            return registry::ClassifyType(reinterpret_cast<PyTypeObject*>(type.ptr()))
                ->preserve_identity;
        },
        py::arg("type"), "Whether `type` is registered as an identity-preserving node.");
    m.def(
        "dataclass_fields",
        [](py::handle type) -> py::object {
            if (!PyType_Check(type.ptr())) return py::none();
            const Registration* reg =
                registry::ClassifyType(reinterpret_cast<PyTypeObject*>(type.ptr()));
            if (reg->data_fields == nullptr) return py::none();  // not a register_dataclass type
            return py::make_tuple(py::reinterpret_borrow<py::tuple>(reg->data_fields),
                                  py::reinterpret_borrow<py::tuple>(reg->meta_fields));
        },
        py::arg("type"),
        "(data_fields, meta_fields) of a type registered with fastree's register_dataclass, "
        "else None.");
    // The context tuples' items by name, in the order the walks read them (nnx/nnx_graph.h).
    py::tuple context_names(static_cast<size_t>(nnx_graph::kContextSize));
    for (Py_ssize_t i = 0; i < nnx_graph::kContextSize; ++i)
        context_names[i] = py::str(nnx_graph::kContextNames[i]);
    m.attr("NNX_GRAPH_CONTEXT") = context_names;
    py::tuple unflatten_names(static_cast<size_t>(nnx_graph::kUnflattenSize));
    for (Py_ssize_t i = 0; i < nnx_graph::kUnflattenSize; ++i)
        unflatten_names[i] = py::str(nnx_graph::kUnflattenNames[i]);
    m.attr("NNX_GRAPH_UNFLATTEN_CONTEXT") = unflatten_names;
    // The node kinds' names, the code of each its position (nnx/nnx_graph.h, Kind).
    py::tuple kind_names(static_cast<size_t>(nnx_graph::kKindCount));
    for (int i = 0; i < nnx_graph::kKindCount; ++i)
        kind_names[static_cast<size_t>(i)] = py::str(nnx_graph::kKindNames[i]);
    m.attr("NNX_GRAPH_KINDS") = kind_names;
    m.def(
        "type_version",
        [](py::handle type) -> unsigned int {
            if (!PyType_Check(type.ptr())) return 0;
            return nnx_graph::TypeVersion(reinterpret_cast<PyTypeObject*>(type.ptr()));
        },
        py::arg("type"),
        "The version tag CPython keeps for a type, a new one whenever it or a base changes; 0\n"
        "where it has none, or for anything not a type. The nnx kind tables stamp their\n"
        "entries with it (nnx/nnx_graph_walk.h, KindEntry).");
    m.def(
        "nnx_graph_flatten",
        [](py::handle node, bool with_paths, py::handle ref_mapping, py::handle outer_mapping,
           py::handle context) {
            PyObject* out = nnx_graph::Flatten(node.ptr(), with_paths, ref_mapping.ptr(),
                                               outer_mapping.ptr(), context.ptr());
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
        },
        py::arg("node"), py::arg("with_paths"), py::arg("ref_mapping"), py::arg("outer_mapping"),
        py::arg("context"),
        "flax.nnx graphlib.flatten in graph mode (csrc/nnx/nnx_graph.h): its result and the node\n"
        "functions it called, or those alone (a list) where not served.");
    m.def(
        "nnx_graph_unflatten",
        [](py::handle nodes, py::handle attributes, py::handle leaves, py::handle index_ref,
           py::handle outer_ref, bool recreate_variables, py::handle context) {
            PyObject* out =
                nnx_graph::Unflatten(nodes.ptr(), attributes.ptr(), leaves.ptr(), index_ref.ptr(),
                                     outer_ref.ptr(), recreate_variables, context.ptr());
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
        },
        py::arg("nodes"), py::arg("attributes"), py::arg("leaves"), py::arg("index_ref"),
        py::arg("outer_ref"), py::arg("recreate_variables"), py::arg("context"),
        "flax.nnx graphlib.unflatten in graph mode (csrc/nnx/nnx_graph.h): (node,), or None where "
        "not served.");
    m.def(
        "nnx_graph_update",
        [](py::handle node, py::handle state, py::handle context) {
            PyObject* out = nnx_graph::Update(node.ptr(), state.ptr(), context.ptr());
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
        },
        py::arg("node"), py::arg("state"), py::arg("context"),
        "flax.nnx graphlib._graph_update_dynamic in graph mode (csrc/nnx/nnx_graph.h).");
    m.def(
        "nnx_graph_merge_leaves",
        [](py::handle states, py::handle context) {
            PyObject* out = nnx_graph::MergeLeaves(states.ptr(), context.ptr());
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
        },
        py::arg("states"), py::arg("context"),
        "flax.nnx graphlib._merge_to_flat_state (csrc/nnx/nnx_graph.h), or None where not served.");
    m.def(
        "nnx_variable_check",
        [](py::handle variable, py::handle tracer, py::handle hijax) {
            PyObject* out = nnx_tree::NewVariableCheck(variable.ptr(), tracer.ptr(), hijax.ptr());
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
        },
        py::arg("variable"), py::arg("tracer"), py::arg("hijax"),
        "A callable answering isinstance(x, variable) as flax's VariableMeta does, without a\n"
        "Python frame (csrc/nnx/nnx_tree_variables.h); `hijax` is HijaxVariable or None.");
    m.def(
        "attribute_node",
        [](py::handle type) -> py::object {
            if (!PyType_Check(type.ptr())) return py::none();
            const Registration* reg =
                registry::ClassifyType(reinterpret_cast<PyTypeObject*>(type.ptr()));
            if (reg->kind != NodeKind::kAttribute) return py::none();
            return py::reinterpret_borrow<py::object>(reg->attr_node);
        },
        py::arg("type"), "The AttrNode that fastree reads `type` with, else None.");
    m.def("strict_aux", []() { return aux::Strict(); }, "Whether strict aux checking is on.");
}
