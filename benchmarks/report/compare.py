"""``python -m benchmarks.report.compare A.json B.json``: how far two runs of the suite agree.

A run's intervals cover its own rounds, under its own load (report.md, "What an interval
covers"); two runs of the same code show the spread between runs, which a user sees. For every
cell both runs timed (a peer's ratio on a tree and op; a workload's speedup), this counts the
cells whose verdicts (faster / same / slower) differ, the cells whose intervals do not overlap,
and how far the ratios moved, and lists the verdicts that changed. Nothing is timed.
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

    @property
    def moves(self) -> list[float]:
        """Per pair, the factor between the two ratios (>= 1)."""
        return [math.exp(abs(math.log(b.ratio / a.ratio))) for a, b in self.pairs]


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
    ]
    if changes:
        lines += ["", "verdicts that differ (A -> B):"]
        lines += [
            f"  {cell_a.name}: {_cell(cell_a)} -> {_cell(cell_b)}" for cell_a, cell_b in changes
        ]
    return "\n".join(lines) + "\n"


def _run(result: RunResult) -> str:
    env = result.environment
    return (
        f"{result.settings.get('mode', '?')} run of {env.get('date', '?')}, "
        f"{env.get('source_revision') or 'revision unknown'}"
    )


def _cell(cell: Cell) -> str:
    interval = f" [{cell.low:.2f}–{cell.high:.2f}]" if cell.low and cell.high else ""
    return f"{cell.verdict or '?'} {cell.ratio:.2f}×{interval}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report.compare",
        description="Compare two runs' results.json: the cells both timed whose verdicts differ, "
        "whose intervals do not overlap, and how far the ratios moved. Prints to stdout; "
        "writes nothing.",
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
