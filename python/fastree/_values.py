"""The one walk over the values a treedef holds: aux_data, dict keys, node data.

Five users look into such values: the aux_data checks (``_aux``: what a flatten warns about,
whether an aux_data hashes), the audit (``_audit``: the problems it lists, and ``short_repr``)
and the fingerprint/serialization encoder (``_serialize``). The values can be hostile in the
same three ways for all of them: 40 levels of ``(x, x)`` pairs are 40 objects but 2**40 paths, a
list can contain itself, and nesting can go deeper than the interpreter's recursion limit.
:class:`ValueWalk` handles the three once:

* it is iterative (an explicit stack): no recursion limit of its own;
* a container is walked once per memo key (by default its ``id``): met again after its walk, it
  is a ``REPEAT``; met again inside itself, a ``CYCLE``; neither is walked again. The walk keeps
  every container it entered alive, so an id stays its object's for the walk's life;
* it reports events in pre-order (``ENTER`` before a container's items, ``LEAVE`` after them,
  ``ATOM`` for anything not looked into), so a user can check each value as it comes or fold
  results bottom-up (the encoder).

What counts as a container and what its items are is the user's choice (``is_container``,
``items``): each user looks into the built-in containers, and the encoder also into dataclass
instances.

>>> walk = ValueWalk(lambda v, depth: type(v) in (tuple, list), list)
>>> pair = ('a', 1)
>>> [(event, value) for event, value, _, _ in walk.events([pair, pair])]  # doctest: +NORMALIZE_WHITESPACE
[('enter', [('a', 1), ('a', 1)]), ('enter', ('a', 1)), ('atom', 'a'), ('atom', 1),
 ('leave', ('a', 1)), ('repeat', ('a', 1)), ('leave', [('a', 1), ('a', 1)])]
>>> cyclic = [1]
>>> cyclic.append(cyclic)
>>> [event for event, _, _, _ in walk.events(cyclic)]
['enter', 'atom', 'cycle', 'leave']
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

ATOM = "atom"
ENTER = "enter"
LEAVE = "leave"
REPEAT = "repeat"
CYCLE = "cycle"

Event = tuple[str, Any, int, Hashable]
"""(event, value, depth, memo key): the key is None for an atom or when nothing is memoized."""


def by_id(value: Any, depth: int) -> Hashable:
    """The default memo key: each distinct container once, at whatever depth."""
    return id(value)


def never(value: Any, depth: int) -> Hashable:
    """A memo key that memoizes nothing: shared containers are walked at every occurrence."""
    return None


_EXIT = object()  # stack marker: the container below it is done


class ValueWalk:
    """Walks values, each container once per memo key; iterate :meth:`events` for each value.

    Args:
        is_container: ``is_container(value, depth)``: whether to look into ``value``. It is
            asked first, about every value met, so it may also raise for a value the user
            refuses outright (too deep, say).
        items: ``items(container)``: its items, in the order to walk them (a dict's user
            lists keys and values). Asked once per walked container, after the memo and cycle
            checks, so it may raise for a container the user refuses once looked at.
        memo_key: ``memo_key(container, depth)``: containers with the same key are walked
            once; :func:`by_id` (default), or :func:`never`.
        max_containers: stop (quietly) once this many containers have been entered.

    The memo and the count of entered containers last for the walk's life: several
    ``events`` calls on one walk (the encoder walks each node's data in turn) share them.
    """

    def __init__(
        self,
        is_container: Callable[[Any, int], bool],
        items: Callable[[Any], Iterable[Any]],
        *,
        memo_key: Callable[[Any, int], Hashable] = by_id,
        max_containers: int | None = None,
    ) -> None:
        self.is_container = is_container
        self.items = items
        self.memo_key = memo_key
        self.max_containers = max_containers
        self.entered = 0
        self._done: set[Hashable] = set()
        self._open: set[int] = set()  # ids of the containers whose items are being walked
        self._alive: list[Any] = []  # every container entered: their ids stay theirs

    def events(self, root: Any, depth: int = 0) -> Iterator[Event]:
        """The events of one value, in pre-order (a container's items in ``items`` order)."""
        stack: list[Any] = [(root, depth)]
        done, open_ = self._done, self._open
        while stack:
            if self.max_containers is not None and self.entered >= self.max_containers:
                return
            value, at = stack.pop()
            if value is _EXIT:
                container, level, key = at
                open_.discard(id(container))
                if key is not None:
                    done.add(key)
                yield LEAVE, container, level, key
                continue
            if not self.is_container(value, at):
                yield ATOM, value, at, None
                continue
            key = self.memo_key(value, at)
            if key is not None and key in done:
                yield REPEAT, value, at, key
                continue
            if id(value) in open_:
                yield CYCLE, value, at, key
                continue
            contents = list(self.items(value))
            self.entered += 1
            self._alive.append(value)
            open_.add(id(value))
            yield ENTER, value, at, key
            stack.append((_EXIT, (value, at, key)))
            stack.extend([(item, at + 1) for item in reversed(contents)])
