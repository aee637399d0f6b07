"""``fastree.audit(tree)``: every custom node's aux_data, with its key path and its problems.

The flatten-time checks (``diagnostics/aux.py``) only stop what is wrong (arrays, tracers, broken ``==``).
The audit also points out what is legal but costly, because aux_data is part of every jit cache
key and a treedef only matches a cached one if every aux_data compares equal:

* ``array``, ``tracer``, ``partial``, ``eq``: as in the flatten-time checks;
* ``unhashable``: ``hash(aux)`` fails (JAX accepts it; strict mode does not);
* ``mutable container``: a list/dict/set inside: mutating it after flattening silently changes
  the static metadata of treedefs already built from it;
* ``float``: a float changes the cache key whenever its value changes (a learning rate or a
  step size kept in aux_data recompiles on every new value), and a NaN never compares equal to
  a fresh NaN, so it misses the cache every time. Keep floats that vary as leaves;
* ``identity``: an object compared by identity (no ``__eq__`` of its own, not a function, class,
  module or enum member): a new instance per call means a new cache entry per call.

The audit walks the tree once in Python (``_walk.Walk``): each object once however many paths
lead to it, so its cost is linear in the distinct nodes, and a cycle raises what flatten
raises; which nodes are custom ones is the core's answer (``Walk.kind``). aux_data values are
looked into once per distinct container (``_values.ValueWalk``), and shown through
:func:`short_repr`, which stops after its limit.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._values import ATOM, CYCLE, ENTER, LEAVE, ValueWalk, never
from .._walk import Walk
from ..jax_interop.compat import keystr
from . import aux as _aux

# the core's kinds of the nodes the audit lists
_CUSTOM_KINDS = ("custom", "dataclass", "attribute")


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    """One custom node: where it is, its type, its aux_data (repr) and the problems found."""

    path: tuple[Any, ...]
    node_type: type
    aux_repr: str
    problems: tuple[str, ...]

    def __str__(self) -> str:
        where = keystr(self.path) or "(root)"
        verdict = "; ".join(self.problems) if self.problems else "ok"
        return f"{where}: {_aux._type_name(self.node_type)} aux_data={self.aux_repr}: {verdict}"


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """The result of :func:`audit`: ``entries`` in flattening order; ``ok`` if no problems."""

    entries: tuple[AuditEntry, ...]

    @property
    def ok(self) -> bool:
        return not any(e.problems for e in self.entries)

    @property
    def problems(self) -> tuple[AuditEntry, ...]:
        return tuple(e for e in self.entries if e.problems)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __str__(self) -> str:
        n_bad = len(self.problems)
        head = f"aux_data audit: {len(self.entries)} custom node(s), {n_bad} with problems"
        return "\n".join([head, *(f"  {e}" for e in self.entries)])


def short_repr(value: Any, limit: int = 80) -> str:
    """repr(value), shortened; never raises (shared by the audit and structure diffs).

    Built-in containers are written piece by piece and only up to ``limit``: a full repr of a
    value whose tuples share sub-tuples writes every copy (2**40 for 40 levels of pairs), and
    one that contains itself is shown as repr shows it.

    >>> short_repr({'a': [1, 2.5], 'b': (None,)})
    "{'a': [1, 2.5], 'b': (None,)}"
    >>> pair = ()
    >>> for _ in range(40):
    ...     pair = (pair, pair)
    >>> short_repr(pair, limit=20)
    '(((((((((((((((((...'
    """
    pieces: list[str] = []
    size = 0
    try:
        for piece in _repr_pieces(value):
            pieces.append(piece)
            size += len(piece)
            if size > limit:
                break
        text = "".join(pieces)
    except Exception as e:  # a broken __repr__ must not break the audit
        text = f"<{type(value).__name__}: repr raised {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_BRACKETS = {list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})")}


def _written_piecewise(value: Any, depth: int) -> bool:
    # The exact built-in containers, unless empty (never bool() of anything else: an array).
    tp = type(value)
    return (tp is dict or tp in _BRACKETS) and bool(value)


def _repr_pieces(value: Any) -> Iterator[str]:
    """repr(value) in pieces, lazily, for the exact built-in containers; repr() of the rest.

    Shared containers are written at every occurrence, as repr writes them (the caller stops
    after its limit); a container inside itself is written in repr's own notation.
    """
    open_: list[list[Any]] = []  # per open container: [its type, how many items are written]
    walk = ValueWalk(_written_piecewise, _aux.items, memo_key=never)
    for event, item, _, _ in walk.events(value):
        tp = type(item)
        if event == LEAVE:
            open_.pop()
            closer = "}" if tp is dict else _BRACKETS[tp][1]
            yield "," + closer if tp is tuple and len(item) == 1 else closer
            continue
        if open_:  # the separator before this item of the innermost open container
            holder = open_[-1]
            n = holder[1]
            holder[1] += 1
            if n:
                yield ": " if holder[0] is dict and n % 2 else ", "
        if event == ENTER:
            yield "{" if tp is dict else _BRACKETS[tp][0]
            open_.append([tp, 0])
        elif event == CYCLE:  # repr's own notation for a container inside itself
            yield "{...}" if tp is dict else "[...]"
        else:  # anything else, or an empty container: its own repr
            yield repr(item)


def _uses_identity_eq(value: Any) -> bool:
    tp = type(value)
    if (
        isinstance(
            value,
            (
                type,
                types.FunctionType,
                types.BuiltinFunctionType,
                types.MethodType,
                types.ModuleType,
                enum.Enum,
            ),
        )
        or tp.__module__ == "builtins"
    ):
        return False
    return tp.__eq__ is object.__eq__


def _right_to_left(container: Any) -> list[Any]:
    # The audit has always listed an aux_data's problems in this order (last item first; a
    # dict's values, then its keys): kept, so that reports read as before.
    if type(container) is dict:
        return [*reversed(container.values()), *reversed(container.keys())]
    return list(reversed(list(container)))


def _aux_problems(aux: Any) -> list[str]:
    problems: list[str] = []

    def add(text: str) -> None:
        if text not in problems:
            problems.append(text)

    # Each distinct container once (_values.ValueWalk): shared sub-values cost nothing more
    # and a container holding itself ends the walk.
    walk = ValueWalk(_aux.is_container, _right_to_left, max_containers=10_000)
    for event, value, _, _ in walk.events(aux):
        tp = type(value)
        if event == ENTER:
            if tp in (list, dict, set):
                add(f"mutable container: {tp.__name__}")
            continue
        if event != ATOM:
            continue
        if isinstance(value, (float, np.floating)):
            if math.isnan(value):
                add("float: NaN never equals a fresh NaN, so every flatten misses the jit cache")
            else:
                add(f"float: {value!r} changes the jit cache key whenever the value changes")
            continue
        if isinstance(value, (type(None), bool, int, complex, str, bytes, type)):
            continue
        kind = _aux._problem_of_type(tp, value, probe=True)
        if kind is not None and kind != "unhashable":
            add(f"{kind}: {_aux._type_name(tp)}: {_aux._ADVICE[kind][0]}")
        elif _uses_identity_eq(value):
            add(
                f"identity: {_aux._type_name(tp)} compares by identity; a new instance per "
                "call is a new jit cache entry per call"
            )
    if not _aux._hashable(aux):
        add("unhashable: hash(aux_data) fails (strict mode rejects it)")
    return problems


def audit(tree: Any, is_leaf: Callable[[Any], Any] | None = None) -> AuditReport:
    """Lists every custom node's aux_data with its key path and any problem found.

    Args:
        tree: any pytree.
        is_leaf: as in ``tree_flatten``: an object it accepts is a leaf, not looked into.

    Returns:
        An :class:`AuditReport`; ``str(report)`` is a readable summary. A node object reached
        through several key paths is listed once, at the first (flatten order).

    Raises:
        RecursionError, ValueError: what ``tree_flatten`` raises on a cycle (ValueError when
        the cycle passes through an identity-preserving node) or on a tree too deep to flatten.

    >>> import fastree, fastree.tree_util as tu
    >>> class Scaled:  # aux_data: a float scale (legal, but a new jit cache key per value)
    ...     def __init__(self, x, scale): self.x, self.scale = x, scale
    >>> tu.register_pytree_node(Scaled, lambda s: ((s.x,), s.scale), lambda a, c: Scaled(c[0], a))
    >>> print(fastree.audit({'layer': Scaled(1.0, 0.5), 'fixed': Scaled(2.0, ('unit',))}))
    aux_data audit: 2 custom node(s), 1 with problems
      ['fixed']: ...Scaled aux_data=('unit',): ok
      ['layer']: ...Scaled aux_data=0.5: float: 0.5 changes the jit cache key whenever the value changes
    >>> cyclic = [Scaled(1.0, 'a')]
    >>> cyclic.append(cyclic)
    >>> fastree.audit(cyclic)
    Traceback (most recent call last):
    RecursionError: maximum recursion depth exceeded in flatten; PyTree may have cyclical ...
    >>> len(fastree.audit(cyclic, is_leaf=lambda x: x is cyclic))  # is_leaf stops at the root
    0
    """
    entries: list[AuditEntry] = []
    walk = Walk(tree, is_leaf)
    for occurrence in walk:
        if occurrence.node is None:  # a leaf, or a node already listed at its first path
            continue
        if walk.kind(occurrence) in _CUSTOM_KINDS:
            aux = occurrence.node[1]
            path = walk.path(occurrence.index)
            entries.append(
                AuditEntry(path, type(occurrence.obj), short_repr(aux), tuple(_aux_problems(aux)))
            )
    return AuditReport(tuple(entries))
