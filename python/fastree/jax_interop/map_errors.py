"""Why one tree does not have another's structure: ``tree_map``'s key-path explanation.

When ``tree_map(f, tree, other)`` finds that ``other`` does not have ``tree``'s structure, the core
raises a terse error (``Tuple arity mismatch: ...``) and then asks :func:`explain` for JAX's
friendlier one (``pytree structure error: different lengths of tuple at key path ...``). JAX
computes it by flattening both trees again through jaxlib; fastree does it here, with its own
one-level flatten:

* no second flatten runs through jaxlib (whose walk of a list mutated by another thread, and
  whose handling of a self-containing node, are unsafe);
* the walk is fastree's one tree walker (``_walk.Walk``, walking every path as flatten does):
  iterative (no recursion limit of its own), linear in ``tree``; it visits a shared
  identity-preserving pair once, and honours ``is_leaf`` at every level (JAX's applies it at the
  root only, an accident not copied);
* an exception raised while explaining (a custom flatten function failing or interrupted) is not
  swallowed: it propagates, with the mismatch as its ``__context__``.

The texts, and the order in which differences are looked for (the first difference in
depth-first, left-to-right order), are JAX's. JAX releases before 0.7 did not explain (the bare
error came through); fastree follows the installed JAX. ``tree_broadcast`` explains its own
mismatches with :func:`first_difference` too (as JAX's does with its ``prefix_errors``).

>>> import fastree.tree_util as tu
>>> try:
...     tu.tree_map(lambda x, y: x + y, (1, 2), (1, 2, 3))
... except ValueError as error:
...     print(str(error).splitlines()[0])
pytree structure error: different lengths of tuple at key path
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Callable
from typing import Any

from .. import _core
from .._walk import Walk
from . import compat as _jax_compat
from .compat import tree_util as _jtu

KeyPath = tuple[Any, ...]
Explanation = Callable[[str], ValueError]

# jax 0.7 began to explain tree_map structure mismatches by key path (asked of JAX at import).
_ENABLED = _jax_compat.JAX_EXPLAINS_MAP_ERRORS


def explain(
    tree: Any,
    other: Any,
    is_leaf: Callable[..., Any] | None,
    name: str,
    is_leaf_takes_path: bool = False,
) -> Any:
    """The exception JAX raises for ``tree_map(f, tree, other)``, or None to keep the core's.

    Called by the core only for a structure mismatch it raised itself.
    """
    if not _ENABLED:
        return None
    found = first_difference(tree, other, is_leaf, is_leaf_takes_path)
    return None if found is None else found(name)


def _key_text(key: Any) -> str:
    # jax 0.11 and later print the entry itself (`['a']`, `.f0`). Before, JAX printed `k.key`,
    # which GetAttrKey and SequenceKey lack: each is named by what it has.
    if _jax_compat.JAX_MAP_ERRORS_PRINT_KEY_ENTRIES:
        return str(key)
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _keystr(path: KeyPath) -> str:
    return _jtu.keystr(path)


def first_difference(
    prefix: Any, full: Any, is_leaf: Callable[..., Any] | None, takes_path: bool
) -> Explanation | None:
    """The first place where ``full`` does not have the structure of ``prefix`` (a maker of
    JAX's ValueError for it, given the name of the prefix tree), or None if none is found.

    >>> first_difference((1, 2), (1, 2, 3), None, False)('tree').args[0].splitlines()[0]
    'pytree structure error: different lengths of tuple at key path'
    """
    # One walk of the prefix tree (depth first, left to right, every path as flatten walks
    # it); each node is paired with the full tree's subtree at the same place.
    walk = Walk(prefix, is_leaf, once=False, is_leaf_takes_path=takes_path)
    full_children: dict[int, tuple[Any, ...]] = {}  # walk index -> the full tree's children
    visited: set[tuple[int, int]] = set()  # identity-preserving pairs already compared
    alive: list[Any] = []  # keeps the objects whose ids are in `visited` from being reused
    for occurrence in walk:
        if occurrence.node is None:
            continue  # a leaf is a prefix of anything (a repeat is a cycle: not in a prefix)
        p = occurrence.obj
        if occurrence.parent < 0:
            f = full
        else:
            siblings = full_children[occurrence.parent]
            if occurrence.position >= len(siblings):
                # The prefix's node has more children now than when it was compared with the
                # full tree's: a callback changed the trees under the explanation.
                return _changed_while_explaining(walk.path_of(occurrence))
            f = siblings[occurrence.position]
        if type(p) is not type(f):
            return _different_types(walk.path_of(occurrence), p, f)
        f_level = _core.flatten_one_level_with_keys(f)
        if f_level is None:
            return _different_types(walk.path_of(occurrence), p, f)
        if _core.is_identity_type(type(p)):
            pair = (id(p), id(f))
            if pair in visited:
                walk.skip()
                continue
            visited.add(pair)
            alive.append((p, f))
        (p_pairs, p_meta), (f_pairs, f_meta) = occurrence.node, f_level
        f_pairs = tuple(f_pairs)
        p_keys = tuple(k for k, _ in p_pairs)
        f_keys = tuple(k for k, _ in f_pairs)
        if isinstance(p, (list, tuple)):
            # The lengths of the children read just now (one snapshot per node, as the walk
            # reads them), never a second, live len(): a list changed in between is compared as
            # it was read.
            if len(p_pairs) != len(f_pairs):
                return _different_lengths(walk.path_of(occurrence), p, len(p_pairs), len(f_pairs))
        elif len(p_pairs) != len(f_pairs):
            return _different_numbers(walk.path_of(occurrence), p, p_keys, f_keys)
        if p_meta != f_meta:
            return _different_metadata(walk.path_of(occurrence), p, p_meta, f_meta)
        full_children[occurrence.index] = tuple(child for _, child in f_pairs)
    return None


def _different_types(path: KeyPath, p: Any, f: Any) -> Explanation:
    return lambda name: ValueError(
        "pytree structure error: different types at key path\n"
        f"    {name}{_keystr(path)}\n"
        f"At that key path, the prefix pytree {name} has a subtree of type\n"
        f"    {type(p)}\n"
        "but at the same key path the full pytree has a subtree of different type\n"
        f"    {type(f)}."
    )


def _different_lengths(path: KeyPath, p: Any, p_length: int, f_length: int) -> Explanation:
    kind = type(p).__name__
    return lambda name: ValueError(
        f"pytree structure error: different lengths of {kind} at key path\n"
        f"    {name}{_keystr(path)}\n"
        f"At that key path, the prefix pytree {name} has a subtree of type "
        f"{kind} of length {p_length}, but the full pytree "
        f"has a subtree of the same type but of length {f_length}."
    )


def _changed_while_explaining(path: KeyPath) -> Explanation:
    return lambda name: ValueError(
        "pytree structure error: the trees changed while their mismatch was being explained"
        f" (at key path {name}{_keystr(path)}): a callback (is_leaf, a custom node's flatten"
        " function) mutated them"
    )


def _different_numbers(
    path: KeyPath, p: Any, p_keys: tuple[Any, ...], f_keys: tuple[Any, ...]
) -> Explanation:
    try:
        difference: set[Any] | None = set(p_keys).symmetric_difference(set(f_keys))
    except Exception:  # noqa: BLE001 - unhashable keys: the message goes without the difference, as in JAX
        difference = None
    listed = " ".join(map(_key_text, p_keys)), " ".join(map(_key_text, f_keys))
    tail = (
        ""
        if difference is None
        else "so the symmetric difference on key sets is\n"
        f"    {' '.join(map(_key_text, difference))}"
    )
    return lambda name: ValueError(
        "pytree structure error: different numbers of pytree children at key path\n"
        f"    {name}{_keystr(path)}\n"
        f"At that key path, the prefix pytree {name} has a subtree of type\n"
        f"    {type(p)}\n"
        f"with {len(p_keys)} child keys\n"
        f"    {listed[0]}\n"
        "but at the same key path the full pytree has a subtree of the same "
        f"type but with {len(f_keys)} child keys\n"
        f"    {listed[1]}\n" + tail
    )


def _different_metadata(path: KeyPath, p: Any, p_meta: Any, f_meta: Any) -> Explanation:
    p_text, f_text = str(p_meta), str(f_meta)
    diff = textwrap.indent(
        "\n".join(difflib.ndiff(p_text.splitlines(), f_text.splitlines())), prefix="    "
    )
    return lambda name: ValueError(
        "pytree structure error: different pytree metadata at key path\n"
        f"    {name}{_keystr(path)}\n"
        f"At that key path, the prefix pytree {name} has a subtree of type\n"
        f"    {type(p)}\n"
        "with metadata\n"
        f"    {p_text}\n"
        "but at the same key path the full pytree has a subtree of the same "
        "type but with metadata\n"
        f"    {f_text}\n"
        "so the diff in the metadata at these pytree nodes is\n"
        f"{diff}"
    )
