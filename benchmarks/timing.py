"""The timer: calibrated inner loops, libraries interleaved per repeat, GC off while timing.

Interleaving (every library once per repeat, starting library rotated) spreads slow drifts of the
machine - a C++ build on the other core, thermal changes - over all libraries instead of charging
them to whichever library happened to be timed during the drift.
"""

from __future__ import annotations

import gc
import itertools
import statistics
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

CALIBRATION_FRACTION = 5
"""Calibration grows the loop until it runs for target/5, then scales it up to the target."""


@dataclass(frozen=True)
class Timing:
    median_ns: float
    """Median over repeats of the time per call."""
    min_ns: float
    """Fastest repeat's time per call: the least disturbed estimate."""
    loops: int
    """Calls per repeat, from calibration."""
    samples_ns: tuple[float, ...]
    """Per-call time of every repeat, in the order they ran."""


def time_loop(fn: Callable[..., Any], args: tuple[Any, ...], loops: int) -> int:
    """Nanoseconds for ``loops`` calls of ``fn(*args)``; itertools.repeat is the cheapest loop."""
    start = perf_counter_ns()
    for _ in itertools.repeat(None, loops):
        fn(*args)
    return perf_counter_ns() - start


def calibrate(fn: Callable[..., Any], args: tuple[Any, ...], target_ns: int) -> int:
    """Calls per repeat so that one repeat takes about ``target_ns`` (at least one call)."""
    loops = 1
    while True:
        elapsed = time_loop(fn, args, loops)
        if elapsed * CALIBRATION_FRACTION >= target_ns:
            return max(1, round(loops * target_ns / max(elapsed, 1)))
        # Jump by up to 10x, aiming straight at target/5 once a measurable time is seen.
        loops *= min(10, max(2, target_ns // (CALIBRATION_FRACTION * max(elapsed, 1))))


def measure(
    candidates: Mapping[str, tuple[Callable[..., Any], tuple[Any, ...]]],
    target_ns: int,
    repeats: int,
) -> tuple[dict[str, Timing], dict[str, Exception]]:
    """Time every candidate ``name -> (fn, args)`` of one case, interleaved; GC is off throughout.

    A collection first, so garbage from building trees is not collected inside someone's repeat;
    gc.disable() during timing, so no library pays for a cycle collection the others triggered.
    A candidate whose warm-up call raises is dropped and its exception returned, not timed.
    """
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    failures: dict[str, Exception] = {}
    try:
        loops = {}
        for name, (fn, args) in candidates.items():
            try:
                fn(*args)  # warm-up: first-call caches, lazy imports, allocator pools
            except Exception as error:  # noqa: BLE001 - any library failure is reported
                failures[name] = error
                continue
            loops[name] = calibrate(fn, args, target_ns)
        names = list(loops)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for repeat in range(repeats if names else 0):
            start = repeat % len(names)
            for name in names[start:] + names[:start]:
                fn, args = candidates[name]
                samples[name].append(time_loop(fn, args, loops[name]) / loops[name])
    finally:
        if gc_was_enabled:
            gc.enable()
    timings = {
        name: Timing(
            median_ns=statistics.median(samples[name]),
            min_ns=min(samples[name]),
            loops=loops[name],
            samples_ns=tuple(samples[name]),
        )
        for name in names
    }
    return timings, failures


class ModeFailed(Exception):
    """A call raised in one mode of ``measure_modes`` (e.g. only with fastree installed)."""

    def __init__(self, mode: str, error: Exception) -> None:
        super().__init__(f"{type(error).__name__} in mode {mode!r}: {error}")
        self.mode = mode


def measure_modes(
    fn: Callable[[], Any],
    modes: Mapping[str, Callable[[], AbstractContextManager[Any]]],
    target_ns: int,
    repeats: int,
) -> tuple[dict[str, Timing], dict[str, Any]]:
    """Time one call under each context (plain, fastree installed...), interleaved per repeat.

    Each mode is entered for its warm-up, its calibration and each of its repeats, never around
    another mode's. The warm-up call runs first in every mode (compilation and first-call caches
    are paid there) and its result is returned per mode for the caller to compare. A collection
    before every repeat and GC off inside it, as in ``measure``. A call that raises, in the
    warm-up or later, raises ModeFailed naming the mode.
    """
    loops: dict[str, int] = {}
    results: dict[str, Any] = {}
    for name, context in modes.items():
        try:
            with context():
                results[name] = fn()
                loops[name] = calibrate(fn, (), target_ns)
        except Exception as error:
            raise ModeFailed(name, error) from error
    names = list(modes)
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    try:
        for repeat in range(repeats):
            start = repeat % len(names)
            for name in names[start:] + names[:start]:
                gc.collect()
                gc.disable()
                try:
                    with modes[name]():
                        samples[name].append(time_loop(fn, (), loops[name]) / loops[name])
                except Exception as error:
                    raise ModeFailed(name, error) from error
                gc.enable()
    finally:
        if gc_was_enabled:
            gc.enable()
        else:
            gc.disable()
    timings = {
        name: Timing(
            median_ns=statistics.median(samples[name]),
            min_ns=min(samples[name]),
            loops=loops[name],
            samples_ns=tuple(samples[name]),
        )
        for name in names
    }
    return timings, results
