"""Drop-in replacement for ``jax.tree``: the short names over :mod:`fastree.tree_util`.

>>> import fastree.tree as ft
>>> ft.map(lambda x: x * 2, {'a': 1, 'b': [2, 3]})
{'a': 2, 'b': [4, 6]}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import tree_util as _tu

all = _tu.tree_all  # noqa: A001 - the name jax.tree uses
broadcast = _tu.tree_broadcast
flatten = _tu.tree_flatten
flatten_with_path = _tu.tree_flatten_with_path
leaves = _tu.tree_leaves
leaves_with_path = _tu.tree_leaves_with_path
map = _tu.tree_map  # noqa: A001
map_with_path = _tu.tree_map_with_path
reduce = _tu.tree_reduce
reduce_associative = _tu.tree_reduce_associative
structure = _tu.tree_structure
transpose = _tu.tree_transpose
unflatten = _tu.tree_unflatten


def static(**kwargs: Any) -> Any:
    """``dataclasses.field`` marked static for :func:`fastree.tree_util.register_dataclass`."""
    metadata = {"static": True, **(kwargs.pop("metadata", {}) or {})}
    return dataclasses.field(metadata=metadata, **kwargs)


__all__ = [
    "all",
    "broadcast",
    "flatten",
    "flatten_with_path",
    "leaves",
    "leaves_with_path",
    "map",
    "map_with_path",
    "reduce",
    "reduce_associative",
    "static",
    "structure",
    "transpose",
    "unflatten",
]
