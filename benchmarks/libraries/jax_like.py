"""TreeApi for any module with jax.tree_util's names: jax.tree_util itself and fastree.tree_util."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from benchmarks.libraries.base import CORE_TREE_OPS, TreeApi

TREE_OPS_OF_JAX_LIKE = CORE_TREE_OPS | {
    "treedef_hash",
    "treedef_eq",
    "all_leaves",
    "treedef_memory",
}


def tree_util_api(tu: ModuleType) -> TreeApi:
    flatten, unflatten = tu.tree_flatten, tu.tree_unflatten

    # Default arguments bind the functions once, so the copy costs no module attribute lookups.
    def copy(tree: Any, flatten: Any = flatten, unflatten: Any = unflatten) -> Any:
        leaves, treedef = flatten(tree)
        return unflatten(treedef, leaves)

    return TreeApi(
        flatten=flatten,
        leaves=tu.tree_leaves,
        structure=tu.tree_structure,
        treedef_of=tu.tree_structure,
        unflatten=unflatten,
        tree_map=tu.tree_map,
        flatten_with_path=tu.tree_flatten_with_path,
        map_with_path=tu.tree_map_with_path,
        bind_flatten_up_to=lambda treedef: treedef.flatten_up_to,
        all_leaves=tu.all_leaves,
        copy=copy,
    )
