"""Several runs of the suite, made in separate processes, pooled into one result.

A run's intervals cover its own rounds; a second run of the same code on the same machine lands
outside them in about half the cells (``python -m benchmarks.report.compare``). The published
run is therefore pooled from several runs (``python -m benchmarks --runs N``, or ``python -m
benchmarks.report --publish A.json B.json ...``), cell by cell, with ``stats.across_runs``: the
median of the runs' figures, with an interval that covers where a new run's figure lands.

What a pooled result holds:

- every figure (a row's ratio and median, a workload's speedup, plain and installed medians, a
  floor distance) is the pooled one, so the report, the README and the charts read it as they
  read a single run;
- each row and workload keeps every run's own figures and samples in ``runs``, and its
  ``samples`` are every run's rounds, run after run; ``RunResult.runs`` says when each run ran;
- a cell present in only some runs (a library excluded on a tree in one run) is pooled from the
  runs that have it, and says so through its ``runs``.

Only runs of one kind (mode, selection, device, baseline) on one stack and machine, of the same
code, are pooled: anything else would mix what the interval is meant to separate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.measure import stats
from benchmarks.measure.results import FloorDistance, Note, Row, RunResult, TreeInfo, WorkloadRow

SAME_KIND = ("mode", "only", "leaves", "device")
"""Settings that make two runs the same kind of run (with the baseline)."""
SAME_STACK = ("python", "implementation", "cpu", "cpu_count", "device", "source_revision")
"""Environment entries that must agree: one interpreter, one machine, one revision of the code."""


class NotPoolable(ValueError):
    """Runs that must not be pooled, and why."""


def why_not_poolable(results: Sequence[RunResult]) -> str | None:
    """Why these runs cannot be pooled into one figure per cell, or None."""
    if len(results) < 2:
        return "pooling needs at least two runs"
    first = results[0]
    for number, result in enumerate(results[1:], start=2):
        if result.runs:
            return f"run {number} is itself pooled: pool the runs it was made from"
        for key in SAME_KIND:
            if _setting(result, key) != _setting(first, key):
                return (
                    f"runs 1 and {number} are different kinds of run ({key}: "
                    f"{_setting(first, key)!r} against {_setting(result, key)!r})"
                )
        if result.baseline != first.baseline:
            return f"runs 1 and {number} have different baselines"
        for key in SAME_STACK:
            if result.environment.get(key) != first.environment.get(key):
                return (
                    f"runs 1 and {number} differ in {key} ({first.environment.get(key)!r} "
                    f"against {result.environment.get(key)!r}): pool runs of one stack, machine "
                    "and revision"
                )
        if result.libraries != first.libraries:
            return f"runs 1 and {number} timed different library versions"
    if first.runs:
        return "run 1 is itself pooled: pool the runs it was made from"
    return None


def _setting(result: RunResult, key: str) -> Any:
    value = result.settings.get(key)
    if key == "only":
        return sorted(value or [])
    if key == "leaves":
        return "default" if value in (None, "default") else sorted(value)
    if key == "device":
        return value or "cpu"
    return value


def pool(
    results: Sequence[RunResult],
    sources: Sequence[str] | None = None,
    command: str | None = None,
) -> RunResult:
    """One result from ``results`` (runs in the order they ran; ``sources``: where each came
    from, e.g. its results.json, recorded in ``runs``; ``command``: the command that made them
    all, for the report). Raises NotPoolable."""
    why_not = why_not_poolable(results)
    if why_not:
        raise NotPoolable(why_not)
    first, last = results[0], results[-1]
    environment = dict(first.environment)
    environment["load_average_end"] = last.environment.get("load_average_end")
    settings = dict(first.settings)
    settings["runs"] = len(results)
    settings["prediction_confidence"] = stats.PREDICTION_CONFIDENCE  # the pooled intervals'
    if command:
        settings["command"] = command
    pooled = RunResult(
        environment=environment,
        settings=settings,
        baseline=first.baseline,
        libraries=dict(first.libraries),
        trees=_union_trees(results),
        rows=_pooled_rows(results),
        skipped=_union_notes(result.skipped for result in results),
        excluded=_union_notes(result.excluded for result in results),
        workloads=_pooled_workloads(results),
        duration_s=round(sum(result.duration_s for result in results), 1),
    )
    pooled.runs = [
        {
            "run": number,
            "source": sources[number - 1] if sources else None,
            "date": result.environment.get("date"),
            "duration_s": result.duration_s,
            "load_average_start": result.environment.get("load_average_start"),
            "load_average_end": result.environment.get("load_average_end"),
            "command": result.settings.get("command"),
        }
        for number, result in enumerate(results, start=1)
    ]
    return pooled


def _union_trees(results: Sequence[RunResult]) -> list[TreeInfo]:
    trees: dict[str, TreeInfo] = {}
    for result in results:
        for tree in result.trees:
            trees.setdefault(tree.name, tree)
    return list(trees.values())


def _union_notes(groups: Any) -> list[Note]:
    notes: dict[tuple[Any, ...], Note] = {}
    for group in groups:
        for note in group:
            notes.setdefault((note.library, note.tree, note.op, note.reason), note)
    return list(notes.values())


def _estimate(
    value: float, low: float | None, high: float | None, rounds: int, confidence: float | None
) -> stats.Estimate:
    """One run's figure as an Estimate (an end it lacks is its value)."""
    return stats.Estimate(value, low or value, high or value, rounds, confidence or 0.0)


def _pooled_rows(results: Sequence[RunResult]) -> list[Row]:
    by_cell: dict[tuple[str, str, str], list[tuple[int, Row]]] = {}
    for number, result in enumerate(results, start=1):
        for row in result.rows:
            by_cell.setdefault((row.tree, row.op, row.library), []).append((number, row))
    # The spread between runs typical of the tree cells, which each cell's own few runs estimate
    # poorly (stats.across_runs, prior).
    prior = stats.typical_spread(
        [[row.ratio for _n, row in found if row.ratio] for found in by_cell.values()
         if any(row.ratio_low is not None for _n, row in found)]  # fmt: skip
    )
    return [_pooled_row(found, prior) for found in by_cell.values()]


def _pooled_row(found: list[tuple[int, Row]], prior: stats.Spread | None = None) -> Row:
    rows = [row for _number, row in found]
    first = rows[0]
    median = statistics.median(row.median for row in rows)
    pooled = Row(
        tree=first.tree,
        op=first.op,
        library=first.library,
        unit=first.unit,
        median=median,
        min=min(row.min for row in rows),
        per_leaf_ns=(
            None
            if first.per_leaf_ns is None or not first.median
            else first.per_leaf_ns * median / first.median
        ),
        ratio=first.ratio,
        loops=first.loops,
        repeats=sum(row.repeats or 0 for row in rows),
        detail=dict(first.detail),
        samples=[sample for row in rows for sample in row.samples],
        runs=[
            {
                "run": number,
                "median": row.median,
                "min": row.min,
                "ratio": row.ratio,
                "ratio_low": row.ratio_low,
                "ratio_high": row.ratio_high,
                "confidence": row.confidence,
                "repeats": row.repeats,
                "loops": row.loops,
                "samples": row.samples,
            }
            for number, row in found
        ],
    )
    timed = [row for row in rows if row.ratio]
    if timed and any(row.ratio_low is not None for row in timed):
        estimate = stats.across_runs(
            [
                _estimate(row.ratio, row.ratio_low, row.ratio_high, row.repeats or 0,
                          row.confidence)  # fmt: skip
                for row in timed
                if row.ratio is not None
            ],
            prior=prior,
        )
        pooled.ratio, pooled.ratio_low, pooled.ratio_high = (
            estimate.value,
            estimate.low,
            estimate.high,
        )
        pooled.confidence, pooled.verdict = estimate.confidence, estimate.verdict
    elif timed:  # the baseline's own rows: 1.0, no interval
        pooled.ratio = statistics.median(row.ratio for row in timed if row.ratio is not None)
    return pooled


def _pooled_workloads(results: Sequence[RunResult]) -> list[WorkloadRow]:
    by_name: dict[str, list[tuple[int, WorkloadRow]]] = {}
    for number, result in enumerate(results, start=1):
        for row in result.workloads:
            by_name.setdefault(row.name, []).append((number, row))
    return [_pooled_workload(found) for found in by_name.values()]


def _pooled_workload(found: list[tuple[int, WorkloadRow]]) -> WorkloadRow:
    first = found[0][1]
    ran = [row for _number, row in found if row.speedup and not row.not_run]
    pooled = WorkloadRow(
        name=first.name,
        description=first.description,
        why=first.why,
        group=first.group,
        loops=dict(found[-1][1].loops),  # the last pair of processes', as in a single run
        runs=[
            {
                "run": number,
                "plain": row.plain,
                "installed": row.installed,
                "speedup": row.speedup,
                "speedup_low": row.speedup_low,
                "speedup_high": row.speedup_high,
                "confidence": row.confidence,
                "rounds": row.rounds,
                "plain_samples": row.plain_samples,
                "installed_samples": row.installed_samples,
                "floor": {mode: vars(floor) for mode, floor in row.floor.items()},
                "not_run": row.not_run,
            }
            for number, row in found
        ],
    )
    if not ran:
        pooled.not_run = next((row.not_run for _n, row in found if row.not_run), None)
        return pooled
    estimate = stats.across_runs(
        [
            _estimate(row.speedup, row.speedup_low, row.speedup_high, row.rounds, row.confidence)
            for row in ran
            if row.speedup is not None
        ]
    )
    pooled.speedup, pooled.speedup_low, pooled.speedup_high = (
        estimate.value,
        estimate.low,
        estimate.high,
    )
    pooled.confidence, pooled.verdict = estimate.confidence, estimate.verdict
    pooled.rounds = sum(row.rounds for row in ran)
    pooled.plain = _median_of(row.plain for row in ran)
    pooled.installed = _median_of(row.installed for row in ran)
    pooled.plain_samples = [sample for row in ran for sample in row.plain_samples]
    pooled.installed_samples = [sample for row in ran for sample in row.installed_samples]
    for mode in dict.fromkeys(mode for row in ran for mode in row.floor):
        distances = [row.floor[mode] for row in ran if mode in row.floor]
        floor = stats.across_runs(
            [_estimate(d.ratio, d.low, d.high, 0, d.confidence) for d in distances]
        )
        pooled.floor[mode] = FloorDistance(
            ratio=floor.value,
            low=floor.low,
            high=floor.high,
            confidence=floor.confidence,
            floor_ns=statistics.median(d.floor_ns for d in distances),
            floor_samples=[sample for d in distances for sample in d.floor_samples],
        )
    return pooled


def _median_of(values: Any) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None
