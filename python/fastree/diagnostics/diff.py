"""Explaining why two structures differ (and so why ``jax.jit`` traced again).

A jit cache key holds the treedef of the arguments; two treedefs that print alike can still
differ (an aux_data value, the order of an OrderedDict's keys, a shared object). The functions
here walk two treedefs' states side by side and name every difference with its key path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .. import _core, _statetree
from .._statetree import StateNode
from ..jax_interop.compat import keystr
from ..jax_interop.compat import tree_util as _jtu
from .audit import short_repr
from .aux import _type_name


@dataclasses.dataclass(frozen=True)
class StructureDiff:
    """One difference between two structures.

    Attributes:
        path: key path of the node (JAX's DictKey/SequenceKey/GetAttrKey/FlattenedIndexKey).
        kind: one of "node_type", "num_children", "dict_keys", "aux_data", "leaf_vs_node",
            "sharing" ("unknown" only if the treedefs differ in a way not described above).
        message: a one-line explanation.
    """

    path: tuple[Any, ...]
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{keystr(self.path) or '(root)'}: {self.message}"


def _repr(value: Any) -> str:
    return short_repr(value, limit=120)


def _describe(node: StateNode) -> str:
    if node.is_leaf:
        return "a leaf"
    if node.is_ref:
        return "a shared reference"
    assert node.type is not None
    return f"a {_type_name(node.type)} node"


def _differs(a: Any, b: Any) -> bool:
    # The core's treedef equality compares node data with !=; do the same.
    if a is b:
        return False
    try:
        return bool(a != b)
    except Exception:
        return True


def _keys_of(node: StateNode) -> list[Any] | None:
    """The dict keys of a dict-kind node (from its children's DictKeys), else None."""
    if node.kind in _statetree.DICT_KINDS:
        return [key.key for key in node.keys]
    return None


def _same_target(
    na: list[StateNode], nb: list[StateNode], a: StateNode, b: StateNode, partner: dict[int, int]
) -> bool:
    """Whether shared references ``a`` and ``b`` repeat nodes at the same key path."""
    if a.ref in partner:  # the walk paired the target of `a` (paired nodes share a key path)
        return partner[a.ref] == b.ref
    return keystr(na[a.ref].path) == keystr(nb[b.ref].path)


def _diff_nodes(na: list[StateNode], nb: list[StateNode]) -> list[StructureDiff]:
    """The differences, walking both node lists in pre-order; linear in their length (plus the
    key paths of the differences found)."""
    out: list[StructureDiff] = []
    partner: dict[int, int] = {}  # index in na -> index in nb, for the pairs walked so far
    stack = [(len(na) - 1, len(nb) - 1)]
    while stack:
        i, j = stack.pop()
        partner[i] = j
        a, b = na[i], nb[j]

        def add(kind: str, message: str) -> None:
            out.append(StructureDiff(a.path, kind, message))  # noqa: B023 (used immediately)

        if a.is_ref or b.is_ref:
            # A reference always comes after its target in pre-order, so a target the walk
            # paired is in `partner` already.
            if a.is_ref and b.is_ref:
                if not _same_target(na, nb, a, b, partner):
                    pa, pb = na[a.ref].path, nb[b.ref].path
                    add(
                        "sharing",
                        f"shared reference changed: same object as "
                        f"{keystr(pa) or '(root)'} -> same object as {keystr(pb) or '(root)'}",
                    )
            elif a.is_ref:
                add(
                    "sharing",
                    f"was the same object as {keystr(na[a.ref].path) or '(root)'}, "
                    f"now {_describe(b)} of its own",
                )
            else:
                add(
                    "sharing",
                    f"was {_describe(a)} of its own, now the same object as "
                    f"{keystr(nb[b.ref].path) or '(root)'}",
                )
            continue
        if a.is_leaf and b.is_leaf:
            continue
        if a.is_leaf or b.is_leaf:
            add("leaf_vs_node", f"{_describe(a)} -> {_describe(b)}")
            continue
        assert a.type is not None and b.type is not None
        if a.type is not b.type:
            add("node_type", f"node type changed: {_type_name(a.type)} -> {_type_name(b.type)}")
            continue
        pairs: list[tuple[int, int]] = []
        keys_a, keys_b = _keys_of(a), _keys_of(b)
        if keys_a is not None and keys_b is not None:
            if a.kind == "default_dict" and _differs(a.data[0], b.data[0]):
                add(
                    "aux_data", f"default_factory changed: {_repr(a.data[0])} -> {_repr(b.data[0])}"
                )
            if keys_a != keys_b:
                set_a, set_b = set(keys_a), set(keys_b)  # dict keys are hashable
                removed = [k for k in keys_a if k not in set_b]
                added = [k for k in keys_b if k not in set_a]
                parts = []
                if added:
                    parts.append(f"added {_repr(added)}")
                if removed:
                    parts.append(f"removed {_repr(removed)}")
                if not parts:
                    parts.append(f"order changed: {_repr(keys_a)} -> {_repr(keys_b)}")
                add("dict_keys", "dict keys differ: " + ", ".join(parts))
            index_b = {k: n for n, k in enumerate(keys_b)}
            pairs = [(n, index_b[k]) for n, k in enumerate(keys_a) if k in index_b]
        else:
            if _differs(a.data, b.data):
                add("aux_data", f"aux_data changed: {_repr(a.data)} -> {_repr(b.data)}")
            if a.arity != b.arity:
                add(
                    "num_children", f"{_type_name(a.type)} node has {a.arity} children -> {b.arity}"
                )
            else:
                pairs = [(n, n) for n in range(a.arity)]
        stack.extend((a.children[x], b.children[y]) for x, y in reversed(pairs))
    return out


def _diff_states(state_a: Any, state_b: Any) -> list[StructureDiff]:
    """Differences between two ``PyTreeDef._state()`` tuples (internal; also for hand-made ones)."""
    return _diff_nodes(_statetree.parse_state(state_a), _statetree.parse_state(state_b))


def _as_treedef(x: Any) -> _core.PyTreeDef:
    if isinstance(x, _core.PyTreeDef):
        return x
    if isinstance(x, _jtu.PyTreeDef):
        from ..jax_interop.bridge import from_jax

        return from_jax(x)
    return _core.tree_structure(x)


def structure_diff(a: Any, b: Any) -> list[StructureDiff]:
    """Every difference between the structures of ``a`` and ``b``, with its key path.

    Args:
        a, b: pytrees, or treedefs (fastree's, or JAX's, converted).

    Returns:
        A list of :class:`StructureDiff` in pre-order; empty iff the treedefs are equal.

    >>> import fastree
    >>> for d in fastree.structure_diff({'w': (1, 2), 'b': 0}, {'w': [1, 2], 'c': 0}):
    ...     print(d)
    (root): dict keys differ: added ['c'], removed ['b']
    ['w']: node type changed: tuple -> list
    """
    ta, tb = _as_treedef(a), _as_treedef(b)
    if ta == tb:  # the core's comparison is cheap; the walk below only explains a difference
        return []
    diffs = _diff_nodes(_statetree.parse_nodes(ta), _statetree.parse_nodes(tb))
    if not diffs and ta != tb:
        diffs.append(
            StructureDiff((), "unknown", f"the treedefs differ: {_repr(ta)} != {_repr(tb)}")
        )
    return diffs


def _treedef_diff(self: _core.PyTreeDef, other: Any) -> list[StructureDiff]:
    """``structure_diff(self, other)``.

    >>> import fastree.tree_util as tu
    >>> [str(d) for d in tu.tree_structure([1, 2]).diff(tu.tree_structure([1]))]
    ['(root): list node has 2 children -> 1']
    """
    return structure_diff(self, other)


def explain_retrace(new_treedef: Any, seen_treedefs: Iterable[Any]) -> str:
    """Explains a new structure against the closest previously seen one (fewest differences).

    >>> import fastree.tree_util as tu
    >>> seen = [tu.tree_structure({'a': 1}), tu.tree_structure({'a': 1, 'b': (2, 3)})]
    >>> new = tu.tree_structure({'a': 1, 'b': (2,)})
    >>> print(explain_retrace(new, seen))
    new structure differs from the closest of 2 seen structure(s) in 1 place(s):
      ['b']: tuple node has 2 children -> 1
    """
    seen = list(seen_treedefs)
    if not seen:
        return "no structure was seen before"

    # Closest: fewest differences; on a tie, the one whose differences lie deepest (the longest
    # shared structure above them).
    def distance(diffs: list[StructureDiff]) -> tuple[int, int]:
        return len(diffs), -sum(len(d.path) for d in diffs)

    best = min((structure_diff(old, new_treedef) for old in seen), key=distance)
    if not best:
        return "the structure equals a previously seen one: the retrace has another cause"
    lines = [
        f"new structure differs from the closest of {len(seen)} seen structure(s) "
        f"in {len(best)} place(s):"
    ]
    lines += [f"  {d}" for d in best]
    return "\n".join(lines)
