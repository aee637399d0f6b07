"""Drop-in replacement for ``jax.tree_util``: same names, signatures and results.

The flatten/unflatten/map family are C functions from ``fastree._core`` (no Python frame per
call); the rest are small Python functions on top of them. Key-path classes and ``Partial`` are
JAX's own objects, so ``isinstance`` checks written against JAX keep working.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from . import _core
from ._core import PyTreeDef as PyTreeDef
from ._core import tree_flatten as tree_flatten
from ._core import tree_flatten_with_path as tree_flatten_with_path
from ._core import tree_leaves as tree_leaves
from ._core import tree_leaves_with_path as tree_leaves_with_path
from ._core import tree_map as tree_map
from ._core import tree_map_with_path as tree_map_with_path
from ._core import tree_structure as tree_structure
from ._core import tree_unflatten as tree_unflatten
from ._registration import register_dataclass as register_dataclass
from ._registration import register_pytree_node as register_pytree_node
from ._registration import register_pytree_node_class as register_pytree_node_class
from ._registration import register_pytree_with_keys as register_pytree_with_keys
from ._registration import register_pytree_with_keys_class as register_pytree_with_keys_class
from ._registration import register_static as register_static
from .jax_interop import map_errors as _map_errors
from .jax_interop.compat import tree_util as _jtu
from .jax_interop.default_registry import default_registry as default_registry

DictKey = _jtu.DictKey
SequenceKey = _jtu.SequenceKey
GetAttrKey = _jtu.GetAttrKey
FlattenedIndexKey = _jtu.FlattenedIndexKey
KeyEntry = _jtu.KeyEntry
KeyPath = _jtu.KeyPath
Partial = _jtu.Partial
keystr = _jtu.keystr

T = TypeVar("T")


class Unspecified:
    """Marker for "no initializer/identity given" (None is a valid value), where JAX has none."""


def _jax_sentinel(function: str, parameter: str) -> Any:
    # JAX's own "not given" default for this parameter (an Unspecified() in recent JAX, a bare
    # object() in older), so that leaving it out, or passing JAX's marker, means the same here.
    jax_function = getattr(_jtu, function, None)
    if jax_function is None:
        return Unspecified()
    return inspect.signature(jax_function).parameters[parameter].default


def _given(value: Any, sentinel: Any) -> bool:
    if type(sentinel) is object:
        return value is not sentinel
    return not isinstance(value, type(sentinel))


_NO_INITIALIZER = _jax_sentinel("tree_reduce", "initializer")
_NO_IDENTITY = _jax_sentinel("tree_reduce_associative", "identity")


def tree_reduce(
    function: Callable[[T, Any], T],
    tree: Any,
    initializer: T | Unspecified = _NO_INITIALIZER,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """Folds ``function`` over the leaves, left to right.

    >>> tree_reduce(lambda a, b: a + b, {'x': [1, 2], 'y': 3})
    6
    """
    leaves = tree_leaves(tree, is_leaf)
    if _given(initializer, _NO_INITIALIZER):
        return functools.reduce(function, leaves, initializer)
    return functools.reduce(function, leaves)


def _pairwise_reduce(leaves: list[Any], operation: Callable[[T, T], T]) -> Any:
    # Balanced split, as JAX does: the association order is part of the observable result
    # for non-associative floating point.
    if len(leaves) == 1:
        return leaves[0]
    half = len(leaves) // 2
    return operation(
        _pairwise_reduce(leaves[:half], operation), _pairwise_reduce(leaves[half:], operation)
    )


def tree_reduce_associative(
    operation: Callable[[T, T], T],
    tree: Any,
    *,
    identity: T | Unspecified = _NO_IDENTITY,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """Reduces the leaves with an associative ``operation`` in a balanced tree.

    >>> tree_reduce_associative(lambda a, b: a + b, [1, 2, 3, 4])
    10
    """
    leaves = tree_leaves(tree, is_leaf=is_leaf)
    if not leaves:
        if not _given(identity, _NO_IDENTITY):
            raise TypeError("Must specify identity for parallel reduction of empty sequence.")
        return identity
    return _pairwise_reduce(leaves, operation)


def tree_all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """True if every leaf is truthy.

    >>> tree_all([True, {'a': 1}]), tree_all([True, (0,)])
    (True, False)
    """
    return all(tree_leaves(tree, is_leaf=is_leaf))


def tree_transpose(
    outer_treedef: PyTreeDef, inner_treedef: PyTreeDef | None, pytree_to_transpose: Any
) -> Any:
    """Turns a tree of trees (outer of inner) into a tree of trees (inner of outer).

    >>> tree_transpose(tree_structure([0, 0]), tree_structure((0, 0)), [(1, 2), (3, 4)])
    ([1, 3], [2, 4])
    """
    flat, treedef = tree_flatten(pytree_to_transpose)
    if inner_treedef is None:
        inner_treedef = tree_structure(outer_treedef.flatten_up_to(pytree_to_transpose)[0])
    inner_size = inner_treedef.num_leaves
    outer_size = outer_treedef.num_leaves
    if treedef.num_leaves != inner_size * outer_size:
        expected_treedef = outer_treedef.compose(inner_treedef)
        raise TypeError(f"Mismatch\n{treedef}\n != \n{expected_treedef}")
    # flat is outer-major: row o holds the inner leaves of outer position o. Transposing the
    # rows with zip gives inner-major columns (and, as in JAX, none at all for an empty outer
    # tree, which the inner unflatten then rejects).
    rows = [flat[o * inner_size : (o + 1) * inner_size] for o in range(outer_size)]
    return inner_treedef.unflatten([outer_treedef.unflatten(col) for col in zip(*rows)])


def tree_broadcast(
    prefix_tree: Any, full_tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> Any:
    """Repeats each leaf of ``prefix_tree`` over the matching subtree of ``full_tree``.

    >>> tree_broadcast((1, 2), (0, {'a': 0, 'b': 0}))
    (1, {'a': 2, 'b': 2})
    """
    leaves: list[Any] = []

    def extend(prefix_leaf: Any, subtree: Any) -> None:
        leaves.extend([prefix_leaf] * tree_structure(subtree).num_leaves)

    try:
        tree_map(extend, prefix_tree, full_tree, is_leaf=is_leaf)
    except ValueError:
        # JAX's message, which JAX finds with its prefix_errors (is_leaf not passed there).
        found = _map_errors.first_difference(prefix_tree, full_tree, None, False)
        if found is None:
            raise
        raise found("broadcast_prefix prefix_tree") from None
    return tree_structure(full_tree).unflatten(leaves)


def treedef_tuple(treedefs: Iterable[PyTreeDef]) -> PyTreeDef:
    """The treedef of a tuple whose children have the given structures.

    >>> treedef_tuple([tree_structure(1), tree_structure([2])])
    PyTreeDef((*, [*]))
    """
    return _core.treedef_tuple(list(treedefs))


def treedef_children(treedef: PyTreeDef) -> list[PyTreeDef]:
    """The treedefs of the root's children.

    >>> treedef_children(tree_structure([(1, 2), 3]))
    [PyTreeDef((*, *)), PyTreeDef(*)]
    """
    return treedef.children()


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
    """True if the treedef has a single node (a leaf, or an empty container/None).

    >>> treedef_is_leaf(tree_structure(1)), treedef_is_leaf(tree_structure([1]))
    (True, False)
    """
    return treedef.num_nodes == 1


def all_leaves(iterable: Iterable[Any], is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """True if every element is a leaf (not a pytree node).

    >>> all_leaves([1, 'a']), all_leaves([1, (2,)])
    (True, False)
    """
    if is_leaf is None:
        return _core.all_leaves(iterable)
    items = list(iterable)
    leaves = tree_leaves(items, is_leaf)
    return len(leaves) == len(items) and all(a is b for a, b in zip(items, leaves))


def flatten_one_level(tree: Any) -> tuple[Iterable[Any], Any]:
    """The children and node data of a pytree node.

    >>> flatten_one_level({'b': 1, 'a': [2]})
    (([2], 1), ('a', 'b'))
    """
    out = _core.flatten_one_level(tree)
    if out is None:
        raise ValueError(f"can't tree-flatten type: {type(tree)}")
    return out


def flatten_one_level_with_keys(tree: Any) -> tuple[Iterable[tuple[Any, Any]], Any]:
    """The (key, child) pairs and node data of a pytree node.

    >>> flatten_one_level_with_keys([7])
    (((SequenceKey(idx=0), 7),), None)
    """
    out = _core.flatten_one_level_with_keys(tree)
    if out is None:
        raise ValueError(f"can't tree-flatten type: {type(tree)}")
    return out


def build_tree(treedef: PyTreeDef, xs: Any) -> Any:
    """The tree of ``treedef`` over the nested iterables ``xs`` (one per node, leaves as is).

    JAX's name up to jax 0.4.x (later ones dropped it); ``treedef.from_iterable_tree(xs)``.

    >>> build_tree(tree_structure([(1, 2), {'a': 3}]), [[10, 11], [12]])
    [(10, 11), {'a': 12}]
    """
    return treedef.from_iterable_tree(xs)


def is_tree_node(typ: type) -> bool:
    """True if instances of ``typ`` are pytree nodes (built-in, registered or namedtuple).

    >>> is_tree_node(dict), is_tree_node(int)
    (True, False)
    """
    return _core.is_node_type(typ)


__all__ = [
    "DictKey",
    "FlattenedIndexKey",
    "GetAttrKey",
    "KeyEntry",
    "KeyPath",
    "Partial",
    "PyTreeDef",
    "SequenceKey",
    "all_leaves",
    "build_tree",
    "default_registry",
    "flatten_one_level",
    "flatten_one_level_with_keys",
    "is_tree_node",
    "keystr",
    "register_dataclass",
    "register_pytree_node",
    "register_pytree_node_class",
    "register_pytree_with_keys",
    "register_pytree_with_keys_class",
    "register_static",
    "tree_all",
    "tree_broadcast",
    "tree_flatten",
    "tree_flatten_with_path",
    "tree_leaves",
    "tree_leaves_with_path",
    "tree_map",
    "tree_map_with_path",
    "tree_reduce",
    "tree_reduce_associative",
    "tree_structure",
    "tree_transpose",
    "tree_unflatten",
    "treedef_children",
    "treedef_is_leaf",
    "treedef_tuple",
]
