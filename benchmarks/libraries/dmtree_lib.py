"""dm-tree (``import tree``): no treedef object, so ops on a treedef are skipped.

Its model differs from JAX's in ways the suite must respect rather than paper over: None is a leaf,
not an empty node, and registered custom nodes do not exist (they would be leaves). Trees that need
either are skipped with a note; the correctness guard catches any other disagreement.
"""

from __future__ import annotations

from typing import Any

from benchmarks.data.trees import CUSTOM_NODES, NNX, NONE_NODE, TreeCase
from benchmarks.libraries.base import CORE_TREE_OPS, Library, TreeApi
from benchmarks.unsupported import Unsupported

CANNOT_EXPRESS = {
    CUSTOM_NODES: "dm-tree has no registered custom nodes",
    NNX: "dm-tree does not know flax.nnx's registered node types",
    NONE_NODE: "dm-tree treats None as a leaf, JAX as an empty subtree",
}

NO_TREEDEF = "dm-tree has no treedef object"


def load() -> Library:
    try:
        import tree as dm_tree
    except ImportError as error:
        raise Unsupported(f"dm-tree is not installed ({error})") from None
    if not hasattr(dm_tree, "map_structure"):
        raise Unsupported("the importable 'tree' module is not dm-tree")
    version = getattr(dm_tree, "__version__", None) or _dist_version("dm-tree")
    api = _api(dm_tree)

    def api_for(case: TreeCase) -> TreeApi:
        missing = sorted(case.features & CANNOT_EXPRESS.keys())
        if missing:
            raise Unsupported("; ".join(CANNOT_EXPRESS[feature] for feature in missing))
        return api

    ops = CORE_TREE_OPS
    return Library(name="dm-tree", version=version, ops=ops, api_for=api_for)


def _api(dm_tree: Any) -> TreeApi:
    flatten, unflatten_as = dm_tree.flatten, dm_tree.unflatten_as

    def copy(tree: Any, flatten: Any = flatten, unflatten_as: Any = unflatten_as) -> Any:
        return unflatten_as(tree, flatten(tree))

    def bind_flatten_up_to(shallow: Any, flatten_up_to: Any = dm_tree.flatten_up_to) -> Any:
        def flatten_up_to_shallow(tree: Any) -> Any:
            return flatten_up_to(shallow, tree)

        return flatten_up_to_shallow

    return TreeApi(
        # dm-tree's flatten returns the leaves only; its users unflatten against the tree itself.
        flatten=flatten,
        leaves=flatten,
        treedef_of=lambda tree: tree,
        unflatten=unflatten_as,  # unflatten_as(structure, flat_sequence): our order already
        tree_map=dm_tree.map_structure,
        flatten_with_path=dm_tree.flatten_with_path,
        map_with_path=dm_tree.map_structure_with_path,
        bind_flatten_up_to=bind_flatten_up_to,
        copy=copy,
        notes={"structure": NO_TREEDEF},
    )


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"
