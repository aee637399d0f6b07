"""The one walk of a live pytree in Python: linear, cycle-safe, honouring ``is_leaf``.

The core flattens in C++; a few diagnostics walk the user's tree in Python instead, one level at
a time through ``_core.flatten_one_level_with_keys``: ``fastree.audit``, ``fastree.find_shared``,
the aux_data reporter (``_aux._locate``) and the explanation of a structure mismatch
(``_map_errors``, for ``tree_map`` and ``tree_broadcast``). A naive walk there is a trap on
exactly the inputs those diagnostics exist for: a node reached through two paths is walked twice
(a 40-level DAG with two references per level is 2**40 paths), a cycle is walked forever, and
building each node's key path by tuple concatenation is quadratic on a deep tree. :class:`Walk`
avoids all three:

* every object is visited once, remembered by ``id`` (the walk keeps each object alive so that
  an id cannot be reused by a new object during the walk); a later occurrence is reported as a
  repeat of the first and not descended into. ``once=False`` walks every path instead, as
  flatten does (a DAG of plain nodes is expanded; the caller decides what to skip);
* an object met again while its own subtree is still being walked is a cycle. Strict walks raise
  what flatten raises for it: ``ValueError`` naming the type and both key paths if an
  identity-preserving node lies on the cycle, else flatten's ``RecursionError``. Lenient walks
  (the reporter, which only looks for one node) skip the repeat;
* nesting deeper than ``sys.getrecursionlimit()`` is flatten's ``RecursionError`` too (strict) or
  ends the walk (lenient). This also bounds trees whose flatten functions make a fresh
  child object on every call, which no memo by id can recognise;
* key paths are stored as (parent, key) links and built only for the nodes a caller asks about
  (and, with ``is_leaf_takes_path``, for the ``is_leaf`` calls).

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

from . import _core
from .jax_interop.compat import tree_util as _jtu

# flatten's RecursionError text (csrc/treedef/treedef.h, kFlattenRecursionWhere, after CPython's own
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
        position: the number of ``obj`` among its parent's children (-1 at the root).
    """

    obj: Any
    index: int
    parent: int
    key: Any
    first: bool
    node: tuple[list[tuple[Any, Any]], Any] | None
    position: int = -1


_EXIT = object()  # stack marker: the subtree of the node below it is done


class Walk:
    """A pre-order walk of ``tree``; iterate it for occurrences.

    Args:
        tree: the pytree.
        is_leaf: as in ``tree_flatten``; an accepted object is not descended into.
        strict: raise flatten's errors on a cycle, on too deep a tree and when a node's flatten
            function raises. When False (the aux_data reporter) a cycle's repeat is reported
            as a repeat, a node whose flatten (or is_leaf) raises is taken as a leaf, and the
            walk ends quietly at the first node deeper than the limit.
        once: visit each object once (a later occurrence is a repeat, not descended into).
            When False every path is walked, as flatten walks it; each occurrence then has an
            index of its own, and only a cycle is reported as a repeat (or raised, strict).
        is_leaf_takes_path: call ``is_leaf(key_path, obj)`` rather than ``is_leaf(obj)``.

    While iterating, :meth:`skip` keeps the walk out of the node just yielded.
    """

    def __init__(
        self,
        tree: Any,
        is_leaf: Callable[..., Any] | None = None,
        *,
        strict: bool = True,
        once: bool = True,
        is_leaf_takes_path: bool = False,
    ) -> None:
        self.tree = tree
        self.is_leaf = is_leaf
        self.strict = strict
        self.once = once
        self.is_leaf_takes_path = is_leaf_takes_path
        self.objects: list[Any] = []  # by index; keeps every id in `_index` valid
        self.parents: list[int] = []
        self.keys: list[Any] = []
        # id -> index: every object met (once=True), or the open nodes only (once=False).
        self._index: dict[int, int] = {}
        self._open: list[bool] = []  # True while the object's subtree is being walked
        self._skip = False
        self._kinds: dict[type, str] = {}

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

    # ---- what the core makes of a node

    def kind(self, occurrence: Occurrence) -> str:
        """The core's kind of the node at a first occurrence (see ``PyTreeDef._nodes()``).

        Asked of the core through a one-node treedef rebuilt from the node data the walk read
        (no user code runs), once per type; per object for tuple subclasses, which JAX and the
        core count as namedtuples per object. A node the core cannot rebuild that way is taken
        as ``"custom"``.
        """
        assert occurrence.node is not None
        tp = type(occurrence.obj)
        kind = self._kinds.get(tp)
        if kind is None:
            pairs, aux = occurrence.node
            muted = hooks_muted_now()
            _muted.on = True
            try:
                one_node = _core.PyTreeDef.from_node_data_and_children(
                    (tp, aux), [_LEAF] * len(pairs)
                )
                kind = one_node._nodes()[-1][0]
            except Exception:  # noqa: BLE001 - not rebuildable from its node data: see above
                kind = "custom"
            finally:
                _muted.on = muted
            if not issubclass(tp, tuple):
                self._kinds[tp] = kind
        return kind

    # ---- the walk

    def skip(self) -> None:
        """Do not descend into the node just yielded (call before asking for the next one)."""
        self._skip = True

    def __iter__(self) -> Iterator[Occurrence]:
        limit = sys.getrecursionlimit()
        index_of, open_, one_level, once = self._index, self._open, self._one_level, self.once
        stack: list[Any] = [(-1, None, self.tree, 0, -1)]
        while stack:
            item = stack.pop()
            if item[0] is _EXIT:
                open_[item[1]] = False
                if not once:
                    del index_of[id(self.objects[item[1]])]
                continue
            parent, key, obj, depth, position = item
            seen = index_of.get(id(obj))
            if seen is not None:
                if open_[seen] and self.strict:
                    raise self._cycle_error(seen, parent, key)
                yield Occurrence(obj, seen, parent, key, False, None, position)
                continue
            index = len(self.objects)
            if once:
                index_of[id(obj)] = index
            self.objects.append(obj)
            self.parents.append(parent)
            self.keys.append(key)
            open_.append(False)
            node = one_level(obj, parent, key)
            if node is not None and depth > limit:
                if self.strict:
                    raise RecursionError(FLATTEN_RECURSION_MESSAGE)
                # Past the limit flatten fails, so this subtree cannot be part of a tree that
                # flattened (only is_leaf, which a lenient walk may not know, could have
                # stopped it): end the walk rather than explore a subtree that may be
                # unbounded (a flatten function that makes fresh children on every call).
                return
            self._skip = False
            yield Occurrence(obj, index, parent, key, True, node, position)
            if self._skip:
                self._skip = False
                continue
            if node is not None and node[0]:
                open_[index] = True
                if not once:
                    index_of[id(obj)] = index
                stack.append((_EXIT, index))
                children = node[0]
                stack.extend(
                    [
                        (index, children[n][0], children[n][1], depth + 1, n)
                        for n in range(len(children) - 1, -1, -1)
                    ]
                )

    def _one_level(
        self, obj: Any, parent: int, key: Any
    ) -> tuple[list[tuple[Any, Any]], Any] | None:
        """(key-child pairs, aux_data) of a node; None for a leaf (by is_leaf or by type)."""
        try:
            if self.is_leaf is not None:
                if self.is_leaf_takes_path:
                    path = () if parent < 0 else (*self.path(parent), key)
                    stop = self.is_leaf(path, obj)
                else:
                    stop = self.is_leaf(obj)
                if stop:
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


_LEAF = _core.tree_structure(0)
