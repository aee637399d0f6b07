"""Correctness guard: a library is timed on a tree only if it yields JAX's leaves.

"Same" means the same objects in the same order (``is``, not ``==``): a library that copied,
reordered or descended into a leaf would otherwise be timed doing different work.
"""

from __future__ import annotations

from benchmarks.data.trees import TreeCase
from benchmarks.libraries.base import TreeApi, compare_leaves


def leaves_disagreement(api: TreeApi, case: TreeCase) -> str | None:
    """None when ``api`` returns JAX's leaves for ``case``; otherwise what differs."""
    if api.leaves is None:
        return None  # nothing to compare (e.g. the nnx split/merge adapter)
    try:
        leaves = list(api.leaves(case.tree))
    except Exception as error:  # noqa: BLE001 - any failure means the library is excluded
        return f"leaves() raised {type(error).__name__}: {error}"
    return compare_leaves(leaves, case.reference_leaves)
