"""The served alias check's last results, handed out again while a call's arguments still walk to
the same Variables (:class:`AliasCache`, used by ``_flax_nnx_alias_check``).

A training or decode loop calls its tree-mode transform on the same model every step, and the
check's answer, a dict of key path -> Variable, is then the same every step. Building it is most
of the check's cost: the key paths are tuples of jaxlib key objects, whose ``__hash__`` is a
Python-level call each, and a dict of 1,219 paths (a 64-layer decoder) hashes 7,000 of them.

An entry keeps one answer with what proves it still holds: the walk's treedef and where its
Variables were among its leaves. A call whose arguments walk (without key paths) to a structure
the core finds the same without asking any Python code, with the same Variable objects in the
same places and no other (``_core.nnx_variables_unchanged``), gets a copy of that dict: the same
paths, in the same order, naming the same objects as flax's loop would give. Anything else is a
miss, and the check builds its answer as before.

Only structures whose key paths follow from the treedef are kept: nodes fastree reads itself
(built-in containers, nnx Modules read natively, dataclasses), no custom node, whose keys its own
``flatten_with_keys`` makes (an ``nnx.Optimizer``, an ``nnx.State``). Those calls build their
answer each time, with no walk of the cache's.

Memory: an entry holds its answer's Variables, and those only while each top-level argument that
holds them (the model, the optimizer) is alive. It holds those arguments weakly, and their weakref
callbacks empty the entry, so the cache never keeps a Variable alive past the arguments it came
in. A call with a Variable held by no weakly referenceable argument (a bare Variable, a list of
them) is not cached.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .. import _core

# Entries kept (the last calls' argument sets): a loop that alternates a train and an eval step
# on one model has two.
MAX_ENTRIES = 8


class _Entry:
    """One cached answer; emptied (``answer`` None) when an argument that held it goes."""

    __slots__ = ("__weakref__", "answer", "holders", "positions", "shape")

    def __init__(self, treedef: Any, positions: tuple[int, ...], result: dict[Any, Any]) -> None:
        # (the dict, the walk's treedef, its values as a tuple): read and emptied as one
        # reference, so a weakref callback on another thread never leaves half of it.
        self.answer: tuple[dict[Any, Any], Any, tuple[Any, ...]] | None = (
            result, treedef, tuple(result.values()))
        self.positions = positions
        # (labeled field name, index or dict key, weakref to the argument there)
        self.holders: tuple[tuple[str, Any, Any], ...] = ()
        # The labeled arguments' outline (_shape): a call of other arguments is passed over
        # without a walk.
        self.shape: tuple[Any, ...] = ()

    def empty(self, _ref: Any = None) -> None:
        # A weakref callback (any thread, any time): no lock, one reference rebound. The
        # treedef goes too: its nodes' data (static fields) came in the same arguments.
        self.answer = None

    def held_by(self, tree: Any, shape: tuple[Any, ...]) -> bool:
        # Whether `tree` has this entry's outline, with each argument the answer came from at
        # its place again.
        if shape != self.shape:
            return False
        for field, index, ref in self.holders:
            held = ref()
            container = getattr(tree, field, None)
            if held is None or type(container) not in (tuple, dict):
                return False
            if type(container) is tuple:
                if not (type(index) is int and index < len(container)):
                    return False
            elif index not in container:
                return False
            if container[index] is not held:
                return False
        return True


def _shape(tree: Any) -> tuple[Any, ...]:
    # The labeled tuple's class (one per set of field names), and each field's container type
    # and length: how many positional arguments, how many keyword ones.
    return (type(tree), *((type(v), len(v) if type(v) in (tuple, dict) else -1) for v in tree))


def _holders(result: dict[Any, Any]) -> dict[tuple[str, Any], None] | None:
    # The top-level arguments the Variables sit in, as (field, index or key), or None where a
    # Variable is no argument's child (a bare Variable argument) or the path is not flax's.
    by_prefix: dict[int, tuple[str, Any]] = {}
    for path in result:
        if len(path) < 3:
            return None
        key = path[1]
        if id(key) in by_prefix:  # one key object per argument, shared by its paths
            continue
        field = getattr(path[0], "name", None)
        index = getattr(key, "idx", getattr(key, "key", None))
        if type(field) is not str or index is None:
            return None
        by_prefix[id(key)] = (field, index)
    return dict.fromkeys(by_prefix.values())


class AliasCache:
    """The answers of the last calls (at most :data:`MAX_ENTRIES`), newest first."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()

    def lookup(self, check: Any, tree: Any) -> dict[Any, Any] | None:
        """A copy of the cached answer for ``tree`` (the labeled arguments), or None."""
        with self._lock:
            entries = tuple(self._entries)
        shape = _shape(tree)
        for entry in entries:
            answer = entry.answer
            if answer is None or not entry.held_by(tree, shape):
                continue
            result, treedef, variables = answer
            if _core.nnx_variables_unchanged(check, tree, treedef, entry.positions, variables):
                return result.copy()
            entry.empty()  # these arguments moved on: not walked for again
        return None

    def store(self, tree: Any, result: dict[Any, Any], treedef: Any,
              positions: list[int]) -> None:
        """Keeps ``result`` (a fresh answer for ``tree``) where it can be kept (module doc).
        ``treedef`` is None where no later walk could be found the same (a custom node's keys
        are its own function's)."""
        holders = _holders(result) if treedef is not None else None
        if holders is None:
            return
        entry = _Entry(treedef, tuple(positions), result.copy())
        refs = []
        for field, index in holders:
            try:
                refs.append((field, index, weakref.ref(getattr(tree, field)[index], entry.empty)))
            except TypeError:  # not weakly referenceable: its Variables could outlive it here
                return
        entry.holders = tuple(refs)
        entry.shape = shape = _shape(tree)
        with self._lock:
            entries = tuple(self._entries)
        # The entries it replaces: emptied ones, and those of the same arguments.
        gone = {id(e) for e in entries if e.answer is None or e.held_by(tree, shape)}
        with self._lock:
            kept = [e for e in self._entries if id(e) not in gone]
            self._entries = [entry, *kept[:MAX_ENTRIES - 1]]

    def clear(self) -> None:
        with self._lock:
            self._entries = []
