"""The operations: how each one is called through a TreeApi, and on what input.

``prepare`` does all setup (treedefs, twin trees) outside the timed loop and returns ``(fn, args)``;
the timer calls ``fn(*args)``. Functions mapped over trees are trivial on purpose: the suite times
the tree traversal, not the work done per leaf.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks.unsupported import Unsupported

if TYPE_CHECKING:
    from benchmarks.libraries.base import TreeApi
    from benchmarks.trees import TreeCase

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


@dataclass(frozen=True)
class Op:
    name: str
    description: str
    prepare: Callable[[TreeApi, TreeCase], Prepared] | None
    """None for the memory probe, which memory.py measures instead of the timer."""


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op("flatten", "tree_flatten(tree)", _flatten),
        Op("leaves", "tree_leaves(tree)", _leaves),
        Op("structure", "tree_structure(tree)", _structure),
        Op("unflatten", "tree_unflatten(treedef, leaves)", _unflatten),
        Op("tree_map", "tree_map(lambda x: x, tree)", _tree_map),
        Op("tree_map3", "tree_map(lambda x, y, z: x, tree, tree2, tree3)", _tree_map3),
        Op("flatten_with_path", "tree_flatten_with_path(tree)", _flatten_with_path),
        Op("map_with_path", "tree_map_with_path(lambda p, x: x, tree)", _map_with_path),
        Op(
            "flatten_up_to", "treedef.flatten_up_to(tree), treedef = the tree's own", _flatten_up_to
        ),
        Op("copy", "tree_unflatten(*reversed(tree_flatten(tree)))", _copy),
        Op("treedef_hash", "hash(treedef)", _treedef_hash),
        Op("treedef_eq", "treedef == equal_but_distinct_treedef", _treedef_eq),
        Op("all_leaves", "all_leaves(leaves)", _all_leaves),
        Op("treedef_memory", "bytes held per treedef node (RSS delta over many treedefs)", None),
        Op(
            "split_merge",
            "identity-preserving flatten + unflatten (nnx.split / nnx.merge)",
            _split_merge,
        ),
        Op(
            "identity_copy",
            "flatten + unflatten of unshared modules registered with preserve_identity=True "
            "(fastree) vs the same modules registered plainly (fastree-plain)",
            _identity_copy,
        ),
    )
}

GRAPH_OPS: tuple[str, ...] = ("split_merge",)
"""Ops run on the shared-submodule graph."""
IDENTITY_OPS: tuple[str, ...] = ("identity_copy",)
"""Ops run on the module tree that measures what identity tracking costs without sharing."""
TREE_OPS: tuple[str, ...] = tuple(
    name for name in OPS if name not in GRAPH_OPS and name not in IDENTITY_OPS
)
"""Ops run on ordinary pytrees (treedef_memory only where the recipe asks for the probe)."""
DICT_ORDER_OPS: tuple[str, ...] = tuple(
    name
    for name in TREE_OPS
    if name not in ("treedef_hash", "treedef_eq", "all_leaves", "treedef_memory")
)
"""Ops run on the dict-order variants of dict-10k: those that walk the dict itself. A treedef keeps
the keys sorted whatever order they were inserted in, and all_leaves gets a list, so hash, equality,
memory and all_leaves would repeat dict-10k's numbers (unflatten repeats them too, but issue 15's
table asks for it)."""
