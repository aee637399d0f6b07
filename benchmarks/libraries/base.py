"""What a library adapter hands the suite: its tree functions under one calling convention.

Each field holds the library's own callable wherever its signature already fits, so the timed call
is the library call and not a wrapper of ours. A small adapter function appears only where the
library's argument order differs, with a comment there, because it adds ~50 ns to every call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.data.trees import TreeCase

Fn = Callable[..., Any]


@dataclass(frozen=True)
class TreeApi:
    """One library's functions, bound for one tree; None means the op is not expressible there."""

    flatten: Fn | None = None
    """tree -> (leaves, treedef), or the library's nearest equivalent (dm-tree: leaves only)."""
    leaves: Fn | None = None
    """tree -> list of leaves. The correctness guard compares this with JAX's."""
    structure: Fn | None = None
    """tree -> treedef."""
    treedef_of: Fn | None = None
    """Untimed setup: tree -> what unflatten and flatten_up_to take (dm-tree: the tree itself)."""
    unflatten: Fn | None = None
    """(treedef, leaves) -> tree."""
    tree_map: Fn | None = None
    """(f, tree, *rest) -> tree."""
    flatten_with_path: Fn | None = None
    """tree -> the library's (path, leaf) listing."""
    map_with_path: Fn | None = None
    """(f(path, *xs), tree, *rest) -> tree."""
    bind_flatten_up_to: Fn | None = None
    """Untimed setup: treedef -> callable(tree) -> leaves (JAX: bound treedef.flatten_up_to)."""
    all_leaves: Fn | None = None
    """iterable -> bool, True when every element is a leaf."""
    copy: Fn | None = None
    """tree -> tree: unflatten of flatten, written as the library's users write it."""
    split_merge: Fn | None = None
    """() -> graph: identity-preserving flatten + unflatten of the case's graph, pre-bound."""
    identity_copy: Fn | None = None
    """() -> tree: flatten + unflatten of the case's module tree, pre-bound (fastree only)."""
    notes: Mapping[str, str] = field(default_factory=dict)
    """op -> why that op is None here."""


@dataclass(frozen=True)
class Library:
    """A library that imported: its name in results, version, the ops it takes part in."""

    name: str
    version: str
    ops: frozenset[str]
    api_for: Callable[[TreeCase], TreeApi]
    """TreeCase -> TreeApi; raises Unsupported when the library cannot express that tree at all."""


CORE_TREE_OPS = frozenset(
    {
        "flatten",
        "leaves",
        "structure",
        "unflatten",
        "tree_map",
        "tree_map3",
        "flatten_with_path",
        "map_with_path",
        "flatten_up_to",
        "copy",
    }
)
"""The ops every tree library adapter can express; treedef-object ops are added per library."""


def compare_leaves(leaves: list[Any], reference: list[Any]) -> str | None:
    """None when ``leaves`` are the very objects of ``reference`` (JAX's), in order."""
    if len(leaves) != len(reference):
        return f"{len(leaves)} leaves, JAX has {len(reference)}"
    for index, (got, expected) in enumerate(zip(leaves, reference, strict=True)):
        if got is not expected:
            return (
                f"leaf {index} is a {type(got).__name__}, not the same object as JAX's "
                f"{type(expected).__name__}"
            )
    return None
