"""The timer: calibrated inner loops, every library once per round, rounds until the ratios settle.

One round times every library PASSES times, each time in a loop calibrated to about the same
duration, the libraries taking turns (in an order rotated from round to round); a library's time
in the round is its fastest pass. On a shared machine a pass is now and then descheduled and
takes several times as long; the fastest of three passes drops that pass instead of charging it
to one side of the round's ratio. Each round therefore yields one ratio per peer (peer time /
baseline time) from timings taken moments apart; ``stats`` turns those ratios into a figure and
an interval. Rounds go on until every peer's interval is narrow enough (``Rounds.tolerance``), or
the round or time limit is reached, whichever comes first; the interval then says how precise
the figure is. GC is collected before a case and off while it is timed, so no library pays for a
collection another one's garbage triggered.
"""

from __future__ import annotations

import gc
import itertools
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from benchmarks.measure import stats

CALIBRATION_FRACTION = 5
"""Calibration grows the loop until it runs for target/5, then scales it up to the target."""
PASSES = 3
"""Loops per library per round; the round keeps each library's fastest."""


@dataclass(frozen=True)
class Rounds:
    """How many rounds a case gets."""

    minimum: int
    """Rounds always run (5 gives a 94% interval: the rounds' whole range)."""
    maximum: int
    """Rounds never exceeded, however wide the intervals still are."""
    tolerance: float
    """Stop once every peer's interval half-width (stats.Estimate.half_width) is at most this."""
    max_seconds: float
    """Stop adding rounds to a case after this much time (the interval then says how precise)."""


@dataclass(frozen=True)
class Timing:
    median_ns: float
    """Median over rounds of the time per call (each round's: its fastest pass)."""
    min_ns: float
    """Fastest round's time per call: the least disturbed estimate."""
    loops: int
    """Calls per loop, from calibration."""
    samples_ns: tuple[float, ...]
    """Per-call time of every round, in the order they ran."""


def time_loop(fn: Callable[..., Any], args: tuple[Any, ...], loops: int) -> int:
    """Nanoseconds for ``loops`` calls of ``fn(*args)``; itertools.repeat is the cheapest loop."""
    start = perf_counter_ns()
    for _ in itertools.repeat(None, loops):
        fn(*args)
    return perf_counter_ns() - start


def calibrate(fn: Callable[..., Any], args: tuple[Any, ...], target_ns: int) -> int:
    """Calls per round so that one round takes about ``target_ns`` (at least one call)."""
    loops = 1
    while True:
        elapsed = time_loop(fn, args, loops)
        if elapsed * CALIBRATION_FRACTION >= target_ns:
            return max(1, round(loops * target_ns / max(elapsed, 1)))
        # Jump by up to 10x, aiming straight at target/5 once a measurable time is seen.
        loops *= min(10, max(2, target_ns // (CALIBRATION_FRACTION * max(elapsed, 1))))


def settled(samples: Mapping[str, list[float]], baseline: str | None, tolerance: float) -> bool:
    """True when every peer's ratio to ``baseline`` has an interval within ``tolerance``."""
    if baseline not in samples:
        return True  # no ratios to make precise: the minimum rounds are all there is
    base = samples[baseline]
    return all(
        stats.paired(values, base).half_width <= tolerance
        for name, values in samples.items()
        if name != baseline
    )


def measure(
    candidates: Mapping[str, tuple[Callable[..., Any], tuple[Any, ...]]],
    target_ns: int,
    rounds: Rounds,
    baseline: str | None = None,
) -> tuple[dict[str, Timing], dict[str, Exception]]:
    """Time every candidate ``name -> (fn, args)`` of one case in interleaved rounds.

    A candidate whose warm-up call raises is dropped and its exception returned, not timed.
    """
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    failures: dict[str, Exception] = {}
    try:
        loops: dict[str, int] = {}
        passes: dict[str, int] = {}
        for name, (fn, args) in candidates.items():
            try:
                fn(*args)  # warm-up: first-call caches, lazy imports, allocator pools
            except Exception as error:  # noqa: BLE001 - any library failure is reported
                failures[name] = error
                continue
            loops[name] = calibrate(fn, args, max(1, target_ns // PASSES))
            # A single call that alone takes the whole round's time (dm-tree on a 16k-leaf tree:
            # ~0.2 s) runs once per round: a scheduler's interruption is a small part of it, and
            # three passes would triple the slowest library's share of the run.
            once = loops[name] == 1 and time_loop(fn, args, 1) >= target_ns
            passes[name] = 1 if once else PASSES
        names = list(loops)
        samples: dict[str, list[float]] = {name: [] for name in names}
        started = perf_counter_ns()
        for index in range(rounds.maximum if names else 0):
            start = index % len(names)
            order = names[start:] + names[:start]
            fastest = dict.fromkeys(names, float("inf"))
            for index_of_pass in range(PASSES):
                for name in order:
                    if index_of_pass >= passes[name]:
                        continue
                    fn, args = candidates[name]
                    per_call = time_loop(fn, args, loops[name]) / loops[name]
                    fastest[name] = min(fastest[name], per_call)
            for name in names:
                samples[name].append(fastest[name])
            if index + 1 < rounds.minimum:
                continue
            out_of_time = (perf_counter_ns() - started) / 1e9 >= rounds.max_seconds
            if out_of_time or settled(samples, baseline, rounds.tolerance):
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    timings = {name: _timing(samples[name], loops[name]) for name in names}
    return timings, failures


def _timing(samples: list[float], loops: int) -> Timing:
    return Timing(
        median_ns=statistics.median(samples),
        min_ns=min(samples),
        loops=loops,
        samples_ns=tuple(samples),
    )


def time_call(fn: Callable[[], Any], target_ns: int, repeats: int) -> Timing:
    """One call timed alone: calibrated, ``repeats`` loops, GC collected before and off during
    each (the end-to-end workloads in their child processes)."""
    loops = calibrate(fn, (), target_ns)
    samples = []
    gc_was_enabled = gc.isenabled()
    try:
        for _ in range(repeats):
            gc.collect()
            gc.disable()
            samples.append(time_loop(fn, (), loops) / loops)
            gc.enable()
    finally:
        if not gc_was_enabled:
            gc.disable()
    return _timing(samples, loops)
