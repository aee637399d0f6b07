"""One linear, cycle-safe walk of a live pytree in Python, shared by the helper walkers.

The core flattens in C++; a few diagnostics walk the user's tree in Python instead, one level at
a time through ``_core.flatten_one_level_with_keys``: ``fastree.audit``, ``fastree.find_shared``
and the aux_data reporter (``_aux._locate``). A naive walk there is a trap on exactly the inputs
those diagnostics exist for: a node reached through two paths is walked twice (a 40-level DAG
with two references per level is 2**40 paths), a cycle is walked forever, and building each
node's key path by tuple concatenation is quadratic on a deep tree. :class:`Walk` avoids all
three:

* every object is visited once, remembered by ``id`` (the walk keeps each object alive so that
  an id cannot be reused by a new object during the walk); a later occurrence is reported as a
  repeat of the first and not descended into;
* an object met again while its own subtree is still being walked is a cycle. Strict walks raise
  what flatten raises for it: ``ValueError`` naming the type and both key paths if an
  identity-preserving node lies on the cycle, else flatten's ``RecursionError``. Lenient walks
  (the reporter, which only looks for one node) skip the repeat;
* nesting deeper than ``sys.getrecursionlimit()`` is flatten's ``RecursionError`` too (strict) or
  ends the walk (lenient). This also bounds trees whose flatten functions make a fresh
  child object on every call, which no memo by id can recognise;
* key paths are stored as (parent, key) links and built only for the nodes a caller asks about.

So a walk costs one ``flatten_one_level_with_keys`` per distinct object plus the paths asked for.
``is_leaf`` is honoured: an object it accepts is a leaf and not descended into.

>>> import fastree._walk as fw
>>> shared = [1]
>>> walk = fw.Walk({'a': shared, 'b': shared})
>>> [(walk.path_of(o), o.first) for o in walk if isinstance(o.obj, list)]
[((DictKey(key='a'),), True), ((DictKey(key='b'),), False)]
>>> cyclic = []
>>> cyclic.append(cyclic)
>>> list(fw.Walk(cyclic))
Traceback (most recent call last):
RecursionError: maximum recursion depth exceeded in flatten; PyTree may have cyclical ...
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax.tree_util as _jtu

from . import _core

# flatten's RecursionError text (csrc/treedef.h, kFlattenRecursionWhere, after CPython's own
# "maximum recursion depth exceeded"); tests/test_walkers.py checks that the two agree.
FLATTEN_RECURSION_MESSAGE = (
    "maximum recursion depth exceeded in flatten; PyTree may have cyclical node references."
)

# Set while a helper walker runs: its one-level flattens go through the core's aux_data checks
# again, which must neither re-enter the reporter nor warn about the tree a diagnostic inspects.
_muted = threading.local()


def hooks_muted_now() -> bool:
    """Whether the aux_data reporter must stay quiet (a helper walker is flattening)."""
    return getattr(_muted, "on", False)


class Occurrence(NamedTuple):
    """One place where the walk meets an object.

    Attributes:
        obj: the object.
        index: the walk's number for the object (that of its first occurrence).
        parent: the index of the node holding this occurrence; -1 at the root.
        key: the key entry from that node to ``obj`` (None at the root).
        first: whether this is the object's first occurrence (only those are descended into).
        node: on a first occurrence of a node, ``flatten_one_level_with_keys(obj)``: its
            (key, child) pairs as a list and its aux_data; None for a leaf or a repeat.
    """

    obj: Any
    index: int
    parent: int
    key: Any
    first: bool
    node: tuple[list[tuple[Any, Any]], Any] | None


_EXIT = object()  # stack marker: the subtree of the node below it is done


class Walk:
    """A pre-order walk of ``tree`` that visits each object once; iterate it for occurrences.

    Args:
        tree: the pytree.
        is_leaf: as in ``tree_flatten`` (one argument); an accepted object is not descended into.
        strict: raise flatten's errors on a cycle, on too deep a tree and when a node's flatten
            function raises. When False (the aux_data reporter) a cycle's repeat is reported
            as a repeat, a node whose flatten (or is_leaf) raises is taken as a leaf, and the
            walk ends quietly at the first node deeper than the limit.
    """

    def __init__(
        self, tree: Any, is_leaf: Callable[[Any], Any] | None = None, *, strict: bool = True
    ) -> None:
        self.tree = tree
        self.is_leaf = is_leaf
        self.strict = strict
        self.objects: list[Any] = []  # by index; keeps every id in `_index` valid
        self.parents: list[int] = []
        self.keys: list[Any] = []
        self._index: dict[int, int] = {}
        self._open: list[bool] = []  # True while the object's subtree is being walked

    # ---- key paths

    def path(self, index: int) -> tuple[Any, ...]:
        """The key path of the first occurrence of object ``index``."""
        keys = []
        while index > 0:  # the root (index 0) has no key
            keys.append(self.keys[index])
            index = self.parents[index]
        return tuple(reversed(keys))

    def path_of(self, occurrence: Occurrence) -> tuple[Any, ...]:
        """The key path of one occurrence (a repeat has its own path, not its first's)."""
        if occurrence.parent < 0:
            return ()
        return (*self.path(occurrence.parent), occurrence.key)

    # ---- the walk

    def __iter__(self) -> Iterator[Occurrence]:
        limit = sys.getrecursionlimit()
        index_of, open_, one_level = self._index, self._open, self._one_level
        stack: list[Any] = [(-1, None, self.tree, 0)]
        while stack:
            item = stack.pop()
            if item[0] is _EXIT:
                open_[item[1]] = False
                continue
            parent, key, obj, depth = item
            seen = index_of.get(id(obj))
            if seen is not None:
                if open_[seen] and self.strict:
                    raise self._cycle_error(seen, parent, key)
                yield Occurrence(obj, seen, parent, key, False, None)
                continue
            index = len(self.objects)
            index_of[id(obj)] = index
            self.objects.append(obj)
            self.parents.append(parent)
            self.keys.append(key)
            open_.append(False)
            node = one_level(obj)
            if node is not None and depth > limit:
                if self.strict:
                    raise RecursionError(FLATTEN_RECURSION_MESSAGE)
                # Past the limit flatten fails, so this subtree cannot be part of a tree that
                # flattened (only is_leaf, which a lenient walk may not know, could have
                # stopped it): end the walk rather than explore a subtree that may be
                # unbounded (a flatten function that makes fresh children on every call).
                return
            yield Occurrence(obj, index, parent, key, True, node)
            if node is not None and node[0]:
                open_[index] = True
                stack.append((_EXIT, index))
                stack.extend([(index, k, c, depth + 1) for k, c in reversed(node[0])])

    def _one_level(self, obj: Any) -> tuple[list[tuple[Any, Any]], Any] | None:
        """(key-child pairs, aux_data) of a node; None for a leaf (by is_leaf or by type)."""
        try:
            if self.is_leaf is not None and self.is_leaf(obj):
                return None
            muted = hooks_muted_now()
            _muted.on = True
            try:
                out = _core.flatten_one_level_with_keys(obj)
            finally:
                _muted.on = muted
        except Exception:
            if self.strict:
                raise
            return None
        return None if out is None else (list(out[0]), out[1])

    def _cycle_error(self, index: int, parent: int, key: Any) -> BaseException:
        """What flatten raises on meeting object ``index`` again inside its own subtree.

        Flatten unrolls the cycle until it meets an identity-preserving object a second time
        (ValueError, naming the first such object along the cycle and both of its key paths),
        or runs out of recursion depth if the cycle has none.
        """
        cycle = [parent]  # the open nodes from `index` down to `parent`
        while cycle[-1] != index:
            cycle.append(self.parents[cycle[-1]])
        cycle.reverse()
        for n, member in enumerate(cycle):
            tp = type(self.objects[member])
            if _core.is_identity_type(tp):
                again = (
                    *self.path(parent),
                    key,
                    *(self.keys[m] for m in cycle[1 : n + 1]),
                )
                return ValueError(
                    "Reference cycle through an identity-preserving node: the "
                    f"{tp!r} at key path {_jtu.keystr(self.path(member)) or '()'} contains "
                    f"itself (again at key path {_jtu.keystr(again)})."
                )
        return RecursionError(FLATTEN_RECURSION_MESSAGE)
