"""``python -m benchmarks.report.compare A.json B.json``: how far two runs of the suite agree.

A run's intervals cover its own rounds, under its own load (report.md, "What an interval
covers"); two runs of the same code show the spread between runs, which a user sees. For every
cell both runs timed (a peer's ratio on a tree and op; a workload's speedup), this counts the
cells whose verdicts (faster / same / slower) differ, the cells whose intervals do not overlap,
and how far the ratios moved, and lists the verdicts that changed. Nothing is timed.

Coverage: with A the published run (pooled, its intervals saying where a new run lands) and B a
new run, how many of A's intervals hold B's figure, N of M cells, and the same the other way.
The published run's promise is that a new quick run on its stack lands inside at least
COVERAGE_GOAL of them; the cells that miss are listed, furthest first.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.measure.results import MEMORY_UNIT, RunResult

MOVED = 1.35
"""A ratio counts as moved when the two runs' values differ by more than this factor."""
COVERAGE_GOAL = 0.90
"""The share of the published intervals a new run on the published stack should land inside."""
MISSES_LISTED = 15
"""How many of the cells outside the intervals are listed (the furthest out)."""


@dataclass(frozen=True)
class Cell:
    name: str
    """``op/tree vs library`` or ``workload NAME``."""
    ratio: float
    low: float | None
    high: float | None
    verdict: str | None


@dataclass(frozen=True)
class Comparison:
    pairs: list[tuple[Cell, Cell]]
    """The cells both runs have, in A's order: (A's, B's)."""
    only_a: list[str]
    only_b: list[str]

    @property
    def verdict_changes(self) -> list[tuple[Cell, Cell]]:
        return [(a, b) for a, b in self.pairs if a.verdict != b.verdict]

    @property
    def disjoint(self) -> list[tuple[Cell, Cell]]:
        """Pairs whose intervals do not overlap (both runs gave one)."""
        return [
            (a, b)
            for a, b in self.pairs
            if None not in (a.low, a.high, b.low, b.high)
            and (a.high < b.low or b.high < a.low)  # type: ignore[operator]
        ]

    def inside(self, of_a: bool = True) -> list[tuple[Cell, Cell]]:
        """Pairs where one run's interval holds the other's figure: A's interval and B's
        figure (``of_a``, A the published run), or B's interval and A's figure."""
        return [
            (a, b)
            for a, b in self.pairs
            if _holds(a if of_a else b, (b if of_a else a).ratio)
        ]

    def with_interval(self, of_a: bool = True) -> list[tuple[Cell, Cell]]:
        """Pairs where that run gave an interval (the cells coverage is counted over)."""
        return [
            (a, b)
            for a, b in self.pairs
            if None not in ((a if of_a else b).low, (a if of_a else b).high)
        ]

    def misses(self, of_a: bool = True) -> list[tuple[Cell, Cell]]:
        """Pairs with an interval that does not hold the other run's figure, furthest out
        first (by the factor between the figure and the nearer end)."""
        inside = {id(pair[0]) for pair in self.inside(of_a)}
        missed = [pair for pair in self.with_interval(of_a) if id(pair[0]) not in inside]
        return sorted(missed, key=lambda pair: -_distance(pair, of_a))

    @property
    def moves(self) -> list[float]:
        """Per pair, the factor between the two ratios (>= 1)."""
        return [math.exp(abs(math.log(b.ratio / a.ratio))) for a, b in self.pairs]


def _holds(cell: Cell, figure: float) -> bool:
    return cell.low is not None and cell.high is not None and cell.low <= figure <= cell.high


def _distance(pair: tuple[Cell, Cell], of_a: bool) -> float:
    """How far out the other run's figure lies: figure / nearer end, as a factor >= 1."""
    interval, other = pair if of_a else pair[::-1]
    figure, low, high = other.ratio, interval.low or other.ratio, interval.high or other.ratio
    return max(low / figure, figure / high, 1.0)


def cells(result: RunResult) -> dict[str, Cell]:
    """Every timed peer ratio and every timed workload of a run, by name."""
    found = {}
    for row in result.rows:
        if row.library == result.baseline or not row.ratio or row.unit == MEMORY_UNIT:
            continue
        name = f"{row.op}/{row.tree} vs {row.library}"
        found[name] = Cell(name, row.ratio, row.ratio_low, row.ratio_high, row.verdict)
    for workload in result.workloads:
        if workload.speedup:
            name = f"workload {workload.name}"
            found[name] = Cell(
                name, workload.speedup, workload.speedup_low, workload.speedup_high,
                workload.verdict,
            )  # fmt: skip
    return found


def compare(a: RunResult, b: RunResult) -> Comparison:
    cells_a, cells_b = cells(a), cells(b)
    return Comparison(
        pairs=[(cell, cells_b[name]) for name, cell in cells_a.items() if name in cells_b],
        only_a=[name for name in cells_a if name not in cells_b],
        only_b=[name for name in cells_b if name not in cells_a],
    )


def render(comparison: Comparison, a: RunResult, b: RunResult, names: tuple[str, str]) -> str:
    pairs = comparison.pairs
    lines = [f"A: {names[0]} ({_run(a)})", f"B: {names[1]} ({_run(b)})", ""]
    if not pairs:
        return "\n".join([*lines, "no cell in common"]) + "\n"
    changes = comparison.verdict_changes
    moves = comparison.moves
    moved = sum(move > MOVED for move in moves)
    lines += [
        f"cells in both runs: {len(pairs)} (only in A: {len(comparison.only_a)}, only in B: "
        f"{len(comparison.only_b)})",
        f"verdicts that differ: {len(changes)} of {len(pairs)}",
        f"intervals that do not overlap: {len(comparison.disjoint)} of {len(pairs)}",
        f"ratios that moved by more than {MOVED - 1:.0%}: {moved} of {len(pairs)} (median move "
        f"{statistics.median(moves) - 1:.1%})",
        _coverage_line(comparison, True, a),
        _coverage_line(comparison, False, b),
    ]
    missed = comparison.misses(True)
    if missed:
        shown = missed[:MISSES_LISTED]
        lines += [
            "",
            f"B's figures outside A's intervals ({len(missed)}"
            + (f", the {len(shown)} furthest out" if len(shown) < len(missed) else "")
            + "):",
        ]
        lines += [f"  {cell_a.name}: A {_cell(cell_a)}, B {cell_b.ratio:.2f}×" for cell_a, cell_b
                  in shown]  # fmt: skip
    if changes:
        lines += ["", "verdicts that differ (A -> B):"]
        lines += [
            f"  {cell_a.name}: {_cell(cell_a)} -> {_cell(cell_b)}" for cell_a, cell_b in changes
        ]
    return "\n".join(lines) + "\n"


def coverage(comparison: Comparison, of_a: bool = True) -> tuple[int, int]:
    """(cells whose interval holds the other run's figure, cells with an interval): A's
    intervals and B's figures (``of_a``), or the other way."""
    return len(comparison.inside(of_a)), len(comparison.with_interval(of_a))


def _coverage_line(comparison: Comparison, of_a: bool, intervals_of: RunResult) -> str:
    held, total = coverage(comparison, of_a)
    share = held / total if total else 0.0
    whose, figures = ("A's", "B's") if of_a else ("B's", "A's")
    goal = ""
    if of_a:
        goal = f"; goal {COVERAGE_GOAL:.0%}: {'met' if share >= COVERAGE_GOAL else 'NOT met'}"
    return (
        f"coverage: {whose} intervals{_pooled(intervals_of)} holding {figures} figure: {held} of "
        f"{total} cells ({share:.1%}{goal})"
    )


def _pooled(result: RunResult) -> str:
    return f" ({result.pooled_runs} runs pooled)" if result.pooled_runs > 1 else ""


def _run(result: RunResult) -> str:
    env = result.environment
    return (
        f"{result.settings.get('mode', '?')} run of {env.get('date', '?')}, "
        f"{env.get('source_revision') or 'revision unknown'}"
        + (f", {result.pooled_runs} runs pooled" if result.pooled_runs > 1 else "")
    )


def _cell(cell: Cell) -> str:
    interval = f" [{cell.low:.2f}–{cell.high:.2f}]" if cell.low and cell.high else ""
    return f"{cell.verdict or '?'} {cell.ratio:.2f}×{interval}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report.compare",
        description="Compare two runs' results.json: the cells both timed whose verdicts differ, "
        "whose intervals do not overlap, how far the ratios moved, and the coverage: how many "
        "of A's intervals hold B's figure (A the published run, B a new one: the published "
        "intervals should hold at least 90%% of a new run's figures on the published stack), "
        "and the other way. Prints to stdout; writes nothing.",
    )
    parser.add_argument("a", type=Path, metavar="A_JSON")
    parser.add_argument("b", type=Path, metavar="B_JSON")
    args = parser.parse_args(argv)
    runs = []
    for path in (args.a, args.b):
        try:
            runs.append(RunResult.from_json(path.read_text()))
        except (OSError, ValueError) as error:
            parser.error(f"cannot read {path}: {error}")
    print(render(compare(*runs), *runs, (str(args.a), str(args.b))), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
