"""The operations the suite times, by name: what each one calls, and which trees get which.

Only names and descriptions live here (the data layer); how an operation is called through a
library adapter is ``benchmarks.measure.calls``.
"""

from __future__ import annotations

OPERATIONS: dict[str, str] = {
    "flatten": "tree_flatten(tree)",
    "leaves": "tree_leaves(tree)",
    "structure": "tree_structure(tree)",
    "unflatten": "tree_unflatten(treedef, leaves)",
    "tree_map": "tree_map(lambda x: x, tree)",
    "tree_map3": "tree_map(lambda x, y, z: x, tree, tree2, tree3)",
    "flatten_with_path": "tree_flatten_with_path(tree)",
    "map_with_path": "tree_map_with_path(lambda p, x: x, tree)",
    "flatten_up_to": "treedef.flatten_up_to(tree), treedef = the tree's own",
    "copy": "tree_unflatten(*reversed(tree_flatten(tree)))",
    "treedef_hash": "hash(treedef)",
    "treedef_eq": "treedef == equal_but_distinct_treedef",
    "all_leaves": "all_leaves(leaves)",
    "treedef_memory": "bytes held per treedef node (RSS growth over many live treedefs)",
    "split_merge": "identity-preserving flatten + unflatten (nnx.split / nnx.merge)",
    "identity_copy": "flatten + unflatten of unshared modules registered with "
    "preserve_identity=True (fastree) vs the same modules registered plainly (fastree-plain)",
}
"""name -> what one call does, in display order."""

MEMORY_OP = "treedef_memory"
"""The one operation measured in bytes per node rather than time per call."""

GRAPH_OPS: tuple[str, ...] = ("split_merge",)
"""Ops run on the shared-submodule graph."""
IDENTITY_OPS: tuple[str, ...] = ("identity_copy",)
"""Ops run on the module tree that measures what identity tracking costs without sharing."""
TREE_OPS: tuple[str, ...] = tuple(
    name for name in OPERATIONS if name not in GRAPH_OPS and name not in IDENTITY_OPS
)
"""Ops run on ordinary pytrees (treedef_memory only where the recipe asks for the probe)."""
DICT_ORDER_OPS: tuple[str, ...] = tuple(
    name for name in TREE_OPS if name not in ("treedef_hash", "treedef_eq", "all_leaves", MEMORY_OP)
)
"""Ops run on the dict-order variants of dict-10k: those that walk the dict itself. A treedef keeps
the keys sorted whatever order they were inserted in, and all_leaves gets a list, so hash, equality,
memory and all_leaves would repeat dict-10k's numbers."""
