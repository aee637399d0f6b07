"""Bytes a treedef holds per node.

tracemalloc sees only allocations made through Python's allocator, so it misses a C++ library's
node vectors (fastree, JAX, optree allocate with operator new). The primary figure is therefore the
process RSS growth while many treedefs of one tree are alive, divided by their total node count;
the tracemalloc figure is kept alongside as the Python-visible part. Before each probe, freed
memory is returned to the OS (glibc malloc_trim) so earlier probes' free lists do not absorb the
growth and hide it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import statistics
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIN_COPIES = 10
"""At least this many treedefs per probe, so one treedef's fixed overhead does not dominate."""


@dataclass(frozen=True)
class MemoryProbe:
    rss_bytes_per_node: float | None
    """RSS growth / (copies x num_nodes); None when no RSS source is available."""
    traced_bytes_per_node: float
    """tracemalloc growth / (copies x num_nodes): the Python-allocator part only."""
    copies: int
    method: str
    """How rss_bytes_per_node was read: "psutil RSS", "/proc/self/statm RSS", or "tracemalloc"."""


def _statm_rss() -> int:
    import resource

    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * resource.getpagesize()


def _rss_reader() -> tuple[Callable[[], int] | None, str]:
    """A function returning the process RSS in bytes, and the method's name for the report."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        process = psutil.Process()
        return (lambda: process.memory_info().rss), "psutil RSS"
    try:
        _statm_rss()
    except (ImportError, OSError):
        return None, "tracemalloc"
    return _statm_rss, "/proc/self/statm RSS"


def _trim() -> None:
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


def probe(structure: Callable[[Any], Any], tree: Any, num_nodes: int, copies: int) -> MemoryProbe:
    """Hold ``copies`` treedefs of ``tree`` alive and measure what they cost per node."""
    read_rss, method = _rss_reader()
    total_nodes = copies * num_nodes

    rss_per_node = None
    if read_rss is not None:
        _trim()
        before = read_rss()
        held = [structure(tree) for _ in range(copies)]
        rss_per_node = (read_rss() - before) / total_nodes
        del held
        _trim()

    tracemalloc.start()
    try:
        before_traced = tracemalloc.get_traced_memory()[0]
        held = [structure(tree) for _ in range(copies)]
        traced_per_node = (tracemalloc.get_traced_memory()[0] - before_traced) / total_nodes
        del held
    finally:
        tracemalloc.stop()
    _trim()
    return MemoryProbe(rss_per_node, traced_per_node, copies, method)


def median_probe(probes: list[MemoryProbe]) -> MemoryProbe:
    rss = [p.rss_bytes_per_node for p in probes if p.rss_bytes_per_node is not None]
    return MemoryProbe(
        rss_bytes_per_node=statistics.median(rss) if rss else None,
        traced_bytes_per_node=statistics.median(p.traced_bytes_per_node for p in probes),
        copies=probes[0].copies,
        method=probes[0].method,
    )
