"""torch.utils._pytree, when torch is installed (it is optional and large).

Written against torch >= 2.2's private-but-stable pytree module; anything a given torch lacks (e.g.
TreeSpec.flatten_up_to, multi-tree tree_map) is detected at load time and skipped with a note.
"""

from __future__ import annotations

import inspect
from typing import Any

from benchmarks.data import custom_nodes
from benchmarks.data.trees import CUSTOM_NODES, NNX, TreeCase
from benchmarks.libraries.base import CORE_TREE_OPS, Library, TreeApi, compare_leaves
from benchmarks.unsupported import Unsupported


def load() -> Library:
    try:
        import torch
        import torch.utils._pytree as pytree
    except ImportError as error:
        raise Unsupported(f"torch is not installed ({error})") from None

    api = _api(pytree)

    def api_for(case: TreeCase) -> TreeApi:
        if NNX in case.features:
            raise Unsupported("flax.nnx's node types are registered with JAX only")
        if CUSTOM_NODES in case.features:
            _register_custom_types(pytree)
        # torch keeps dicts in insertion order (JAX sorts keys) and takes None as a leaf (JAX: an
        # empty node), so on many trees it computes different leaves: timing it there would not
        # compare like with like.
        if compare_leaves(pytree.tree_leaves(case.tree), case.reference_leaves) is not None:
            raise Unsupported(
                "torch.utils._pytree orders dict children by insertion and takes None as a "
                "leaf: its leaves differ from JAX's on this tree"
            )
        return api

    ops = CORE_TREE_OPS | {"treedef_hash", "treedef_eq", "treedef_memory"}
    return Library(name="torch", version=torch.__version__, ops=ops, api_for=api_for)


def _api(pytree: Any) -> TreeApi:
    flatten, torch_unflatten = pytree.tree_flatten, pytree.tree_unflatten

    # torch takes (leaves, treespec); the suite's convention is (treedef, leaves).
    def unflatten(treespec: Any, leaves: Any, torch_unflatten: Any = torch_unflatten) -> Any:
        return torch_unflatten(leaves, treespec)

    def copy(tree: Any, flatten: Any = flatten, torch_unflatten: Any = torch_unflatten) -> Any:
        leaves, treespec = flatten(tree)
        return torch_unflatten(leaves, treespec)

    notes: dict[str, str] = {}
    multi_tree_map = "rests" in inspect.signature(pytree.tree_map).parameters
    if not multi_tree_map:
        notes["tree_map3"] = "this torch's tree_map takes one tree"
    has_flatten_up_to = hasattr(pytree.TreeSpec, "flatten_up_to")
    if not has_flatten_up_to:
        notes["flatten_up_to"] = "this torch's TreeSpec has no flatten_up_to"
    has_paths = hasattr(pytree, "tree_flatten_with_path")
    if not has_paths:
        notes["flatten_with_path"] = notes["map_with_path"] = "this torch has no key paths"

    return TreeApi(
        flatten=flatten,
        leaves=pytree.tree_leaves,
        structure=pytree.tree_structure,
        treedef_of=pytree.tree_structure,
        unflatten=unflatten,
        # When tree_map takes one tree, the tree_map3 note alone skips that op.
        tree_map=pytree.tree_map,
        flatten_with_path=pytree.tree_flatten_with_path if has_paths else None,
        map_with_path=pytree.tree_map_with_path if has_paths else None,
        bind_flatten_up_to=(lambda spec: spec.flatten_up_to) if has_flatten_up_to else None,
        copy=copy,
        notes=notes,
    )


_registered = False


def _register_custom_types(pytree: Any) -> None:
    global _registered
    if _registered:
        return
    for cls, flatten, unflatten in custom_nodes.CUSTOM_TYPES:
        # torch's unflatten takes (children, context): the reverse of JAX's (aux, children).
        pytree.register_pytree_node(
            cls, flatten, lambda children, aux, unflatten=unflatten: unflatten(aux, children)
        )
    _registered = True
