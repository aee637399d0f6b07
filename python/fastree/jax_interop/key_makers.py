"""Key-path entries for the core's key cache (csrc/registry/keys.cpp), made so that running out of memory
raises ``MemoryError`` instead of killing the process.

jaxlib's key classes (``SequenceKey``, ``DictKey``, ...) are nanobind types, and on every
supported jaxlib making an instance when memory runs out ends the process: the constructor lets
``std::bad_alloc`` escape a ``noexcept`` frame (abort) while nanobind grows its table of live
instances, and jaxlib's own ``flatten_one_level_with_keys`` crashes the same way (a segfault in
jaxlib 0.6.2 and 0.10.2, under ``RLIMIT_AS``). No jaxlib route is safe, so none is used: each
maker first asks the operating system for enough address space to cover what making the entries
can allocate (the instances, and nanobind's table of live instances doubling), gives it straight
back, and only then calls the classes. When the ask fails, the maker raises ``MemoryError``
before any jaxlib code runs. The ask reserves address space and touches no page, but it costs
about 18 us (two system calls on a 64 MiB mapping); one ask covers the next ``_CREDIT``
entries too, so that making many single entries (an attribute node with thousands of new field
names, a key-path walk over fresh dict keys) costs one ask per ``_CREDIT`` entries, not one
each. Within a credit the ask's margin (64 MiB, checked at the ask) is what covers the
entries; they allocate well under 1 MiB.

>>> from fastree.jax_interop import key_makers
>>> key_makers.sequence_block(3)
[SequenceKey(idx=0), SequenceKey(idx=1), SequenceKey(idx=2)]
>>> key_makers.dict_key('w'), key_makers.getattr_key('bias')
(DictKey(key='w'), GetAttrKey(name='bias'))
"""

from __future__ import annotations

import mmap
import threading
from typing import Any

from .compat import tree_util as _jtu

# What making `n` entries may allocate: a fixed margin for nanobind's table of live instances
# (a robin-hood map that doubles: tens of MiB for a few hundred thousand live instances of any
# nanobind type, which fastree cannot count) plus, per entry, the instance and its share of the
# table (generously: an instance is ~48 bytes, a table slot 16-32, and the table doubles).
_HEADROOM_BASE = 64 << 20
_HEADROOM_PER_ENTRY = 256
# Entries one ask covers beyond its own (see the module docstring), and what is left of it.
_CREDIT = 1024
_credit_left = 0
# The credit is shared by every thread; a lost update on a free-threaded build would let a block
# skip its probe. Held for arithmetic only, never across the probe.
_credit_lock = threading.Lock()


def ensure_headroom(n: int) -> None:
    """Raises ``MemoryError`` unless making ``n`` key entries can allocate what it needs.

    >>> ensure_headroom(1000)
    """
    global _credit_left
    with _credit_lock:  # read-modify-write of the credit: one thread at a time
        if n <= _credit_left:
            _credit_left -= n
            return
        _credit_left = 0  # spent, whatever the ask below finds
    size = _HEADROOM_BASE + _HEADROOM_PER_ENTRY * (n + _CREDIT)
    try:
        # An anonymous private mapping counts against the address-space limit as malloc's
        # would, and is returned at once without a page being touched.
        probe = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError, ValueError):
        raise MemoryError(f"fastree: not enough memory to make {n} key-path entries") from None
    probe.close()
    with _credit_lock:
        _credit_left = _CREDIT


def sequence_block(n: int) -> list[Any]:
    """``[SequenceKey(0), ..., SequenceKey(n - 1)]``."""
    ensure_headroom(n)
    return list(map(_jtu.SequenceKey, range(n)))


def flattened_index_block(n: int) -> list[Any]:
    """``[FlattenedIndexKey(0), ..., FlattenedIndexKey(n - 1)]``."""
    ensure_headroom(n)
    return list(map(_jtu.FlattenedIndexKey, range(n)))


def dict_key(key: Any) -> Any:
    """``DictKey(key)``."""
    ensure_headroom(1)
    return _jtu.DictKey(key)


def dict_key_block(keys: list[Any]) -> list[Any]:
    """``[DictKey(k) for k in keys]``, in order."""
    ensure_headroom(len(keys))
    return list(map(_jtu.DictKey, keys))


def getattr_key(name: Any) -> Any:
    """``GetAttrKey(name)``."""
    ensure_headroom(1)
    return _jtu.GetAttrKey(name)


def install() -> None:
    from .. import _core

    _core.set_key_makers(
        sequence_block, flattened_index_block, dict_key, getattr_key, dict_key_block
    )
