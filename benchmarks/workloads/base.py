"""What a workload is: a named, sized program fragment, timed plain and with fastree installed.

A workload looks its tree functions up on ``jax.tree_util`` / ``jax.tree`` at call time (as
libraries do). Each mode runs in a process of its own (``benchmarks.measure.workloads``): plain
JAX, or ``python -m fastree.run``, which installs fastree before the workload imports any library,
as a user's program would be started. The two processes' results are compared through
fingerprints: a digest of what the call returned that does not depend on the process.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from benchmarks.unsupported import Unsupported

PROGRAM, EQUINOX_MODEL, NNX_MODEL = "program", "equinox model", "nnx model"
"""Workload groups: end-to-end program fragments, and single operations on an equinox model and
on a flax.nnx model (where fastree's library nodes apply)."""
FLOOR = "builtin-shape floor"
"""The group of workloads timed against a floor (``Prepared.floor``): a library's tree against
the same shape built from builtin containers, in the same process (``floor``)."""


def require(module: str) -> ModuleType:
    """The imported module, or Unsupported naming what is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise Unsupported(f"unavailable: {module} is not installed ({error})") from None


def _leaves_and_shape(result: Any) -> tuple[list[Any], str]:
    import jax

    treedef = jax.tree_util.tree_structure(result)
    # num_leaves and num_nodes rather than str(treedef): aux data may print memory addresses.
    return jax.tree_util.tree_leaves(result), f"{treedef.num_leaves}/{treedef.num_nodes}"


def values_fingerprint(result: Any) -> str:
    """Structure size, and every leaf's dtype, shape and bytes.

    Tree functions move leaves around without touching them, so the numbers must not change at
    all when fastree is installed; a tolerance would hide a reordering of equal-shaped arrays.
    """
    leaves, shape = _leaves_and_shape(result)
    digest = hashlib.sha256(shape.encode())
    for leaf in leaves:
        array = np.asarray(leaf)
        if array.dtype == object:  # a function or other object: its repr may hold an address
            digest.update(type(leaf).__qualname__.encode())
            continue
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def shapes_fingerprint(result: Any) -> str:
    """For stateful calls (a train step moves the weights): structure, shapes and dtypes."""
    leaves, shape = _leaves_and_shape(result)
    parts = [shape] + [f"{getattr(x, 'dtype', type(x).__name__)}{np.shape(x)}" for x in leaves]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class Prepared:
    """A built workload: the call to time and how to fingerprint its result."""

    call: Callable[[], Any]
    """One unit of work; it returns what is fingerprinted (and waits for the device)."""
    size: str
    """What was built, e.g. "12 blocks, 147 arrays": goes into the report's description."""
    fingerprint: Callable[[Any], str] = values_fingerprint
    """result -> a digest equal in both modes when they agree."""
    floor: Callable[[], Any] | None = None
    """The same work on the builtin-shape twin of the call's tree, or None. When set, each turn
    times both calls, interleaved, and the row reports call / floor in each process; its
    result is fingerprinted along with the call's."""


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    """What one call does (the size is appended from Prepared.size)."""
    why: str
    """Where the call's time goes: what installing fastree can and cannot speed up."""
    build: Callable[[int], Prepared]
    """size -> Prepared; raises Unsupported when a library it needs is missing."""
    sizes: Mapping[str, int]
    """"tiny" (tests), "quick" and "full" -> the size build takes (layers, blocks...)."""
    group: str = PROGRAM
