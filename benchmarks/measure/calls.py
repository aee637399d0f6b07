"""How each timed operation is called through a TreeApi, and on what input.

``prepare`` does all setup (treedefs, twin trees) outside the timed loop and returns ``(fn, args)``;
the timer calls ``fn(*args)``. Functions mapped over trees are trivial on purpose: the suite times
the tree traversal, not the work done per leaf.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from benchmarks.unsupported import Unsupported

if TYPE_CHECKING:
    from benchmarks.data.trees import TreeCase
    from benchmarks.libraries.base import TreeApi

Prepared = tuple[Callable[..., Any], tuple[Any, ...]]


def _identity(x: Any) -> Any:
    return x


def _first_of_three(x: Any, _y: Any, _z: Any) -> Any:
    return x


def _leaf_ignoring_path(_path: Any, x: Any) -> Any:
    return x


def _require(api: TreeApi, op: str, *fields: str) -> list[Any]:
    """The named TreeApi fields; raises Unsupported when one is missing or the op has a note."""
    values = [getattr(api, name) for name in fields]
    if op in api.notes or any(value is None for value in values):
        raise Unsupported(api.notes.get(op, f"no {op}"))
    return values


def _flatten(api: TreeApi, case: TreeCase) -> Prepared:
    (flatten,) = _require(api, "flatten", "flatten")
    return flatten, (case.tree,)


def _leaves(api: TreeApi, case: TreeCase) -> Prepared:
    (leaves,) = _require(api, "leaves", "leaves")
    return leaves, (case.tree,)


def _structure(api: TreeApi, case: TreeCase) -> Prepared:
    (structure,) = _require(api, "structure", "structure")
    return structure, (case.tree,)


def _unflatten(api: TreeApi, case: TreeCase) -> Prepared:
    unflatten, treedef_of, leaves = _require(api, "unflatten", "unflatten", "treedef_of", "leaves")
    return unflatten, (treedef_of(case.tree), leaves(case.tree))


def _tree_map(api: TreeApi, case: TreeCase) -> Prepared:
    (tree_map,) = _require(api, "tree_map", "tree_map")
    return tree_map, (_identity, case.tree)


def _tree_map3(api: TreeApi, case: TreeCase) -> Prepared:
    (tree_map,) = _require(api, "tree_map3", "tree_map")
    return tree_map, (_first_of_three, case.tree, *case.twins)


def _flatten_with_path(api: TreeApi, case: TreeCase) -> Prepared:
    (flatten_with_path,) = _require(api, "flatten_with_path", "flatten_with_path")
    return flatten_with_path, (case.tree,)


def _map_with_path(api: TreeApi, case: TreeCase) -> Prepared:
    (map_with_path,) = _require(api, "map_with_path", "map_with_path")
    return map_with_path, (_leaf_ignoring_path, case.tree)


def _flatten_up_to(api: TreeApi, case: TreeCase) -> Prepared:
    # The tree's own full structure is the prefix: every library can express that, and it measures
    # the checked walk that tree_map-with-prefix and jax's vmap in_axes handling rely on.
    bind, treedef_of = _require(api, "flatten_up_to", "bind_flatten_up_to", "treedef_of")
    return bind(treedef_of(case.tree)), (case.tree,)


def _copy(api: TreeApi, case: TreeCase) -> Prepared:
    (copy,) = _require(api, "copy", "copy")
    return copy, (case.tree,)


def _treedef_hash(api: TreeApi, case: TreeCase) -> Prepared:
    (structure,) = _require(api, "treedef_hash", "structure")
    treedef = structure(case.tree)
    try:
        hash(treedef)
    except TypeError as error:
        raise Unsupported(f"treedef is not hashable ({error})") from None
    return hash, (treedef,)


def _treedef_eq(api: TreeApi, case: TreeCase) -> Prepared:
    (structure,) = _require(api, "treedef_eq", "structure")
    # Two separately built treedefs, so no library can answer from an identity shortcut.
    left, right = structure(case.tree), structure(case.tree)
    return operator.eq, (left, right)


def _all_leaves(api: TreeApi, case: TreeCase) -> Prepared:
    (all_leaves,) = _require(api, "all_leaves", "all_leaves")
    return all_leaves, (case.reference_leaves,)


def _split_merge(api: TreeApi, _case: TreeCase) -> Prepared:
    (split_merge,) = _require(api, "split_merge", "split_merge")
    return split_merge, ()


def _identity_copy(api: TreeApi, _case: TreeCase) -> Prepared:
    (identity_copy,) = _require(api, "identity_copy", "identity_copy")
    return identity_copy, ()


CALLS: dict[str, Callable[[TreeApi, TreeCase], Prepared]] = {
    "flatten": _flatten,
    "leaves": _leaves,
    "structure": _structure,
    "unflatten": _unflatten,
    "tree_map": _tree_map,
    "tree_map3": _tree_map3,
    "flatten_with_path": _flatten_with_path,
    "map_with_path": _map_with_path,
    "flatten_up_to": _flatten_up_to,
    "copy": _copy,
    "treedef_hash": _treedef_hash,
    "treedef_eq": _treedef_eq,
    "all_leaves": _all_leaves,
    "split_merge": _split_merge,
    "identity_copy": _identity_copy,
}
"""op name -> prepare(api, case): every timed op of ``data.operations.OPERATIONS`` (the memory
probe is measured by ``measure.memory`` instead)."""
