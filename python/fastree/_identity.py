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
    path on (they are shared with it). Immutable scalars (None, bool, int, float, complex, str,
    bytes) and the empty tuple/frozenset singletons are not reported. Results are in order of
    first occurrence.

    >>> import numpy as np, fastree
    >>> w = np.zeros(2)
    >>> [(type(s.obj).__name__, s.paths) for s in fastree.find_shared({'a': w, 'b': [w]})]
    [('ndarray', [(DictKey(key='a'),), (DictKey(key='b'), SequenceKey(idx=0))])]
    """
    seen: dict[int, SharedObject] = {}
    keepalive: list[Any] = []  # ids stay unique only while the objects live

    def visit(obj: Any, path: tuple[Any, ...]) -> None:
        # Empty tuples/frozensets are interpreter-wide singletons: never aliasing worth reporting.
        reportable = not isinstance(obj, _UNREPORTED) and not (
            type(obj) in (tuple, frozenset) and not obj
        )
        if reportable:
            record = seen.get(id(obj))
            if record is not None:
                record.paths.append(path)
                return
            seen[id(obj)] = SharedObject(obj, [path])
            keepalive.append(obj)
        if is_leaf is not None and is_leaf(obj):
            return
        out = _core.flatten_one_level_with_keys(obj)
        if out is None:
            return
        for key, child in out[0]:
            visit(child, (*path, key))

    visit(tree, ())
    return [record for record in seen.values() if len(record.paths) > 1]
