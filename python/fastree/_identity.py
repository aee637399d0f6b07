"""Identity-preserving ("PyDAG") nodes: sharing that survives flatten/unflatten, and JAX.

The core does the work (a repeated identity-preserving object becomes a shared reference in the
treedef; unflatten builds it once). This module holds the pieces around it:

* the JAX-facing flatten/unflatten for identity-preserving types: JAX flattens one node at a
  time and would duplicate a shared child, so JAX sees each such object as one node whose
  children are its unique leaves and whose aux data is fastree's treedef of the whole subtree
  (sharing included). Sharing inside the object then survives jit/grad/vmap, and a leaf used twice
  is one leaf, so its gradient is the sum of both uses;
* :func:`find_shared`, the aliasing diagnostic that works on any tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from . import _core
from ._walk import Walk

# Immutable scalars are never reported by find_shared: CPython interns many of them, and
# aliasing them is harmless (they cannot be mutated or donated).
_UNREPORTED = (type(None), bool, int, float, complex, str, bytes)


def jax_flatten(obj: Any) -> tuple[list[Any], _core.PyTreeDef]:
    """JAX-facing flatten of an identity-preserving object: (unique leaves, subtree treedef)."""
    return _core.tree_flatten(obj)


def jax_unflatten(treedef: _core.PyTreeDef, leaves: Any) -> Any:
    """JAX-facing unflatten: rebuilds the object with its sharing."""
    return treedef.unflatten(leaves)


class SharedObject(NamedTuple):
    """An object found at several key paths of a tree (see :func:`find_shared`)."""

    obj: Any
    paths: list[tuple[Any, ...]]


def find_shared(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[SharedObject]:
    """Lists every object (node or leaf) that appears at more than one key path.

    Works on any tree, identity-preserving types or not: use it before donating buffers or
    crossing a jit boundary, where aliasing silently turns into copies. A shared node is
    reported with all its paths; its contents are not descended into again from the second
    path on (they are shared with it), so the cost is linear in the distinct objects, however
    many paths lead to them. Immutable scalars (None, bool, int, float, complex, str, bytes) and
    the empty tuple/frozenset singletons are not reported. Results are in order of first
    occurrence.

    Raises:
        RecursionError, ValueError: what ``tree_flatten`` raises on a cycle (ValueError when
        the cycle passes through an identity-preserving node) or on a tree too deep to flatten.
        A cycle is not sharing: an object inside itself has no finite set of key paths.

    >>> import numpy as np, fastree
    >>> w = np.zeros(2)
    >>> [(type(s.obj).__name__, s.paths) for s in fastree.find_shared({'a': w, 'b': [w]})]
    [('ndarray', [(DictKey(key='a'),), (DictKey(key='b'), SequenceKey(idx=0))])]
    """
    walk = Walk(tree, is_leaf)
    found: dict[int, SharedObject] = {}  # by the walk's index of the object
    for occurrence in walk:
        if occurrence.first or not _reportable(occurrence.obj):
            continue
        record = found.get(occurrence.index)
        if record is None:  # the first path is built only for objects that turn out shared
            record = found[occurrence.index] = SharedObject(
                occurrence.obj, [walk.path(occurrence.index)]
            )
        record.paths.append(walk.path_of(occurrence))
    return [found[index] for index in sorted(found)]


def _reportable(obj: Any) -> bool:
    # Empty tuples/frozensets are interpreter-wide singletons: never aliasing worth reporting.
    return not isinstance(obj, _UNREPORTED) and not (type(obj) in (tuple, frozenset) and not obj)
