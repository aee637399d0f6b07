# Hand-written stub for the C++ extension fastree._core, with the PyTreeDef methods that
# fastree._treedef_methods attaches in Python at import. tests/test_stubs.py checks it against
# the runtime both ways: everything declared here exists with this signature (where the runtime
# says), and everything the runtime has is declared here.
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Literal, TypeVar, overload

_T = TypeVar("_T")
KeyPath = tuple[Any, ...]

class PyTreeDef:
    """The structure of a pytree: immutable, hashable, picklable."""

    @property
    def num_leaves(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    def unflatten(self, leaves: Iterable[Any], /) -> Any: ...
    def flatten_up_to(self, tree: Any) -> list[Any]: ...
    def children(self) -> list[PyTreeDef]: ...
    def compose(self, inner: PyTreeDef, /) -> PyTreeDef: ...
    def node_data(self) -> tuple[type, Any] | None: ...
    def walk(
        self,
        f_node: Callable[[tuple[Any, ...], Any], Any],
        f_leaf: Callable[[Any], Any] | None,
        leaves: Iterable[Any],
    ) -> Any: ...
    def from_iterable_tree(self, tree: Any, /) -> Any: ...
    @overload
    @staticmethod
    def from_node_data_and_children(
        node_data: tuple[type, Any] | None, children: Iterable[PyTreeDef]
    ) -> PyTreeDef: ...
    @overload
    @staticmethod
    def from_node_data_and_children(
        registry: Any, node_data: tuple[type, Any] | None, children: Iterable[PyTreeDef]
    ) -> PyTreeDef:
        """JAX's form: the registry (fastree's or jaxlib's default one) is not used."""
    def to_jax(self) -> Any: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    def _state(self) -> tuple[int, tuple[tuple[type | None, Any, int, int], ...]]: ...
    def _nodes(self) -> tuple[tuple[str, type | None, Any, int, int, int, tuple[Any, ...]], ...]:
        """(kind, type, data, arity, num_leaves, ref, child_keys) per post-order node."""
    # Written in Python and attached at import, all in fastree._treedef_methods: structure
    # diffs (fastree.diagnostics.diff), fingerprints and the byte format (fastree._serialize), and JAX's
    # protocol-buffer encoding through a JAX treedef (fastree.jax_interop.bridge).
    def diff(self, other: Any) -> list[Any]: ...
    def fingerprint(self) -> str: ...
    def serialize(self) -> bytes: ...
    def serialize_using_proto(self) -> bytes: ...
    @staticmethod
    def deserialize_using_proto(registry: Any, data: bytes) -> PyTreeDef: ...

# The type of `_module_state` (not a module attribute at runtime).
class ModuleState:
    """The core's module state: owns every reference the core keeps between calls and shows
    them to the garbage collector (csrc/binding/module_state.h)."""

_module_state: ModuleState

def tree_flatten(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> tuple[list[Any], PyTreeDef]: ...
def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]: ...
def tree_structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> PyTreeDef: ...
def tree_flatten_with_path(
    tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
) -> tuple[list[tuple[KeyPath, Any]], PyTreeDef]: ...
def tree_leaves_with_path(
    tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
) -> list[tuple[KeyPath, Any]]: ...
def tree_unflatten(treedef: PyTreeDef, leaves: Iterable[Any]) -> Any: ...
def tree_map(
    f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None
) -> Any: ...
def tree_map_with_path(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> Any: ...
def all_leaves(iterable: Iterable[Any], /) -> bool: ...
def flatten_one_level(tree: Any, /) -> tuple[Iterable[Any], Hashable] | None: ...
def flatten_one_level_with_keys(
    tree: Any, /
) -> tuple[Iterable[tuple[Any, Any]], Hashable] | None: ...
def is_node_type(type: object, /) -> bool: ...
def treedef_tuple(treedefs: Iterable[PyTreeDef], /) -> PyTreeDef: ...
def _treedef_from_state(state: tuple[int, tuple[Any, ...]], /) -> PyTreeDef: ...
def register_node(
    type: type,
    flatten: Callable[[Any], tuple[Iterable[Any], Any]] | None,
    unflatten: Callable[[Any, tuple[Any, ...]], Any],
    flatten_with_keys: Callable[[Any], tuple[Iterable[tuple[Any, Any]], Any]] | None = None,
    preserve_identity: bool = False,
) -> None: ...
def register_dataclass_node(
    type: type,
    data_fields: tuple[str, ...],
    meta_fields: tuple[str, ...],
    preserve_identity: bool = False,
) -> None: ...
def register_attribute_node(node: AttrNode, preserve_identity: bool = False) -> None: ...
def attribute_node(type: Any) -> AttrNode | None: ...

class AttrNode:
    """The layout of an attribute node (see fastree.register_attribute_node)."""

    def __new__(
        cls,
        type: type,
        data_fields: Iterable[str],
        meta_fields: Iterable[str] = ...,
        *,
        missing: Any = ...,
        extra_fields: Iterable[str] | None = None,
        names_as_aux: bool = False,
        rebuild_order: Iterable[str] | None = None,
        post_init: bool = False,
        trusted_getattribute: Any = None,
        mapping: tuple[str, type, str, str] | None = None,
        meta_items: bool = False,
        key_names: Iterable[str] | None = None,
        rebuild_with: str | None = None,
        trace_classes: tuple[Any, Any, Any, Any] | None = None,
        trace_field: str | None = None,
        items_field: str | None = None,
    ) -> AttrNode: ...
    @property
    def cls(self) -> type: ...
    @property
    def data_fields(self) -> tuple[str, ...]: ...
    @property
    def meta_fields(self) -> tuple[str, ...]: ...
    @property
    def extra_fields(self) -> tuple[str, ...] | None: ...
    @property
    def missing(self) -> Any: ...
    @property
    def checks_left(self) -> int: ...
    @property
    def plain_attribute_access(self) -> bool:
        """Whether the class's instances can be read natively (its attribute lookup is
        object's, or the ``__getattribute__`` the integration vouched for)."""
    @property
    def use_library(self) -> bool: ...
    @use_library.setter
    def use_library(self, value: bool) -> None: ...
    def flatten(self, obj: Any, /) -> tuple[tuple[Any, ...], tuple[Any, ...]]: ...
    def flatten_with_keys(
        self, obj: Any, /
    ) -> tuple[tuple[tuple[Any, Any], ...], tuple[Any, ...]]: ...
    def unflatten(self, aux_data: tuple[Any, ...], children: Iterable[Any], /) -> Any: ...
    def native_flatten(self, obj: Any, /) -> tuple[tuple[Any, ...], tuple[Any, ...]]: ...
    def native_flatten_with_keys(
        self, obj: Any, /
    ) -> tuple[tuple[tuple[Any, Any], ...], tuple[Any, ...]]: ...
    def native_unflatten(self, aux_data: tuple[Any, ...], children: Iterable[Any], /) -> Any: ...
    def check_with(
        self,
        checker: Callable[[Any], bool],
        flatten: Callable[[Any], Any],
        flatten_with_keys: Callable[[Any], Any],
        unflatten: Callable[[Any, Any], Any],
        *,
        checks: int = 2,
        irregular_checks: int = 8,
    ) -> None: ...

def is_identity_type(type: Any) -> bool: ...
def dataclass_fields(type: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | None: ...
def install_jax_bridge(
    jax_registry: dict[type, Any],
    flatten_one_level: Callable[[Any], Any],
    flatten_one_level_with_keys: Callable[[Any], Any],
    DictKey: type,
    SequenceKey: type,
    GetAttrKey: type,
    FlattenedIndexKey: type,
    to_jax: Callable[[PyTreeDef], Any],
    map_error: Callable[[Any, Any, Any, str, bool], BaseException | None],
) -> None: ...
def set_jaxlib_adopter(
    adopter: Callable[[type], tuple[Callable[[Any], Any], Callable[[Any, Any], Any]] | None] | None,
) -> None: ...
def set_library_adopter(adopter: Callable[[type, Any, Any], bool] | None) -> None: ...
def set_iterable_leaf_warning(
    types: tuple[type, ...] | None, warn: Callable[[Any], None] | None
) -> None: ...
def set_key_makers(
    sequence_block: Callable[[int], list[Any]] | None,
    flattened_index_block: Callable[[int], list[Any]] | None,
    dict_key: Callable[[Any], Any] | None,
    getattr_key: Callable[[Any], Any] | None,
    dict_key_block: Callable[[list[Any]], list[Any]] | None,
) -> None: ...
def set_aux_hooks(
    classify: Callable[[type, Any], bool] | None,
    reporter: Callable[[type, Any, Any], None] | None,
) -> None: ...
def set_jax_texts(
    dict_mismatch_shows_dict: bool, aux_equality_names_type: bool, dict_grown_mid_walk_raises: bool
) -> None: ...
def set_strict_aux(strict: bool) -> None: ...
def strict_aux() -> bool: ...

# flax.nnx graph mode (csrc/nnx/nnx_graph.h; used by fastree.integrations.flax_nnx_graph only). Each
# takes the context tuple that module builds; None (for the flatten, a list) means "not served:
# run flax's function".
NNX_GRAPH_CONTEXT: tuple[str, ...]
"""The names of the flatten context's items, in the order the C walks read them."""
NNX_GRAPH_UNFLATTEN_CONTEXT: tuple[str, ...]
"""The names of the unflatten (and update, merge) context's items, in order."""
NNX_GRAPH_KINDS: tuple[str, ...]
"""The node kinds' names (nnx/nnx_graph.h, Kind), each kind's code its position."""

def type_version(type: object) -> int:
    """CPython's version tag of ``type`` (a new one whenever it or a base changes); 0 where it
    has none or ``type`` is not a type."""

def nnx_graph_flatten(
    node: Any,
    with_paths: bool,
    ref_mapping: dict[int, tuple[Any, int]],
    outer_mapping: dict[int, tuple[Any, int]] | None,
    context: tuple[Any, ...],
) -> tuple[list[Any], list[tuple[Any, Any]], list[Any], list[tuple[Any, ...]] | None,
           dict[int, tuple[Any, int]], list[Any]] | list[Any]:
    """The walk's (nodes, attributes, leaves, paths, added, called), or only ``called`` (a
    list) where it is not served. ``called`` is [node, result, ...]: each node impl's flatten
    the walk called, with its result, in order."""
def nnx_graph_unflatten(
    nodes: list[Any],
    attributes: list[tuple[Any, Any]],
    leaves: list[Any],
    index_ref: dict[int, Any],
    outer_ref: dict[int, Any] | None,
    recreate_variables: bool,
    context: tuple[Any, ...],
) -> tuple[Any] | bool | None: ...
def nnx_graph_update(node: Any, state: Any, context: tuple[Any, ...]) -> None: ...
def nnx_graph_merge_leaves(states: tuple[Any, ...], context: tuple[Any, ...]) -> list[Any] | None: ...
def nnx_variable_check(variable: type, tracer: type, hijax: type | None) -> Callable[[Any], bool]:
    """``isinstance(x, variable)`` as flax's ``VariableMeta`` answers it, without a Python frame
    (tracers and ``hijax`` objects by ``isinstance`` itself)."""
@overload
def nnx_variables_by_path(
    check: Callable[[Any], bool], tree: Any, structure: Literal[False] = False
) -> dict[Any, Any] | None: ...
@overload
def nnx_variables_by_path(
    check: Callable[[Any], bool], tree: Any, structure: Literal[True]
) -> tuple[dict[Any, Any] | None, PyTreeDef | None, list[int]]:
    """flax's ``check_no_aliases`` dict for the labeled arguments ``tree``: each Variable leaf
    (``check``, an :func:`nnx_variable_check`) by its key path, in walk order; None where a
    Variable is met twice. With ``structure``: that, the walk's treedef (None where its key paths
    do not follow from it: a custom node), and the Variables' positions among its leaves."""
def nnx_variables_unchanged(
    check: Callable[[Any], bool], tree: Any, treedef: PyTreeDef, positions: tuple[int, ...],
    variables: tuple[Any, ...],
) -> bool:
    """Whether ``tree`` walks to ``treedef``'s structure and key paths (compared without running
    Python code) with the same ``variables`` at ``positions`` among its leaves, and no other."""
def nnx_apply_updates(
    variables: dict[Any, Any], updates: list[Any], updates_type: type, context: tuple[Any, ...]
) -> bool:
    """flax's ``extract.apply_updates``: True once every update is applied; False, with nothing
    applied, where flax's own function must run."""
