"""What a workload is: a named, sized program fragment, timed plain and with fastree installed.

A workload looks its tree functions up on ``jax.tree_util`` / ``jax.tree`` at call time (as
libraries do), so ``fastree.installed()`` reaches exactly what it would reach in a user's program.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import jax
import numpy as np

from benchmarks.unsupported import Unsupported

# Bound at import, before any install, so the agreement check compares with JAX's own functions.
_jax_flatten = jax.tree_util.tree_flatten


def require(module: str) -> ModuleType:
    """The imported module, or Unsupported naming what is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise Unsupported(f"unavailable: {module} is not installed ({error})") from None


def same_values(plain: Any, installed: Any) -> str | None:
    """None when both results have JAX's same structure and bitwise-equal leaves.

    Tree functions move leaves around without touching them, so the numbers must not change at
    all when fastree is installed; a tolerance would hide a reordering of equal-shaped arrays.
    """
    plain_leaves, plain_def = _jax_flatten(plain)
    installed_leaves, installed_def = _jax_flatten(installed)
    if str(plain_def) != str(installed_def):
        return f"structure {installed_def} instead of {plain_def}"
    for index, (a, b) in enumerate(zip(plain_leaves, installed_leaves, strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        nan_is_equal = a.dtype.kind in "fc"  # isnan is undefined on str and object arrays
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b, nan_is_equal):
            return f"leaf {index} differs ({a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)})"
    return None


def same_shapes(plain: Any, installed: Any) -> str | None:
    """For stateful calls (a train step moves the weights): structure, shapes and dtypes agree."""
    plain_leaves, plain_def = _jax_flatten(plain)
    installed_leaves, installed_def = _jax_flatten(installed)
    if str(plain_def) != str(installed_def):
        return f"structure {installed_def} instead of {plain_def}"
    for index, (a, b) in enumerate(zip(plain_leaves, installed_leaves, strict=True)):
        a_type, b_type = getattr(a, "dtype", type(a)), getattr(b, "dtype", type(b))
        if np.shape(a) != np.shape(b) or a_type != b_type:
            return (
                f"leaf {index}: {b_type}{list(np.shape(b))} instead of {a_type}{list(np.shape(a))}"
            )
    return None


@dataclass(frozen=True)
class Prepared:
    """A built workload: the call to time and how to compare its results across modes."""

    call: Callable[[], Any]
    """One unit of work; it returns what the agreement check compares (and waits for the device)."""
    size: str
    """What was built, e.g. "12 blocks, 147 arrays": goes into the report's description."""
    compare: Callable[[Any, Any], str | None] = same_values
    """(plain result, installed result) -> None when they agree, else what differs."""


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
