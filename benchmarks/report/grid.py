"""Results rearranged for display: per tree, one row per op, one cell per library."""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.measure.results import Row, RunResult, TreeInfo


@dataclass(frozen=True)
class OpLine:
    op: str
    cells: dict[str, Row]
    """library -> its row; libraries that did not run on this op are absent."""
    per_leaf_ns: float | None
    """ns per leaf of the baseline, or of jax where the baseline did not run."""
    per_leaf_of: str | None


@dataclass(frozen=True)
class TreeBlock:
    tree: TreeInfo
    lines: list[OpLine]
    libraries: list[str]
    """Columns for this tree: the libraries with at least one row on it (baseline first)."""


def tree_blocks(result: RunResult) -> list[TreeBlock]:
    blocks = []
    for tree in result.trees:
        rows = [row for row in result.rows if row.tree == tree.name]
        ops = list(dict.fromkeys(row.op for row in rows))
        lines = []
        for op in ops:
            cells = {row.library: row for row in rows if row.op == op}
            source = next((name for name in (result.baseline, "jax") if name in cells), None)
            per_leaf = cells[source].per_leaf_ns if source else None
            lines.append(OpLine(op, cells, per_leaf, source if per_leaf is not None else None))
        columns = [
            name for name in library_columns(result) if any(name in line.cells for line in lines)
        ]
        blocks.append(TreeBlock(tree, lines, columns))
    return blocks


def library_columns(result: RunResult) -> list[str]:
    """Libraries that produced at least one row, baseline first, in load order otherwise."""
    ran = {row.library for row in result.rows}
    ordered = [result.baseline] + [name for name in result.libraries if name != result.baseline]
    return [name for name in ordered if name in ran]


@dataclass(frozen=True)
class MeanRatio:
    value: float
    """Geometric mean of the library's ratios over the trees where it ran."""
    low: float
    high: float
    """Geometric means of the trees' interval ends: the mean's interval if every tree's error went
    the same way (a conservative reading; independent errors would narrow it)."""
    trees: int
    verdicts: dict[str, int]
    """"faster" / "same" / "slower" -> how many trees' cells read that way."""
    samples: list[tuple[str, float, str]]
    """(tree, ratio, verdict) of every tree in the mean."""


def mean_ratios(result: RunResult) -> dict[str, dict[str, MeanRatio]]:
    """op -> library -> geometric mean over trees of (library time / baseline time).

    Variant trees (``TreeInfo.variant_of``) are left out: six insertion orders of one dict would
    otherwise weigh six times as much as any other tree in the mean.
    """
    variants = {tree.name for tree in result.trees if tree.variant_of}
    cells: dict[str, dict[str, list[Row]]] = {}
    for row in result.rows:
        if row.ratio and row.library != result.baseline and row.tree not in variants:
            cells.setdefault(row.op, {}).setdefault(row.library, []).append(row)
    return {
        op: {library: _mean(rows) for library, rows in by_library.items()}
        for op, by_library in cells.items()
    }


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _mean(rows: list[Row]) -> MeanRatio:
    verdicts = {"faster": 0, "same": 0, "slower": 0}
    for row in rows:
        verdicts[row.verdict or "same"] += 1
    return MeanRatio(
        value=_geomean([row.ratio for row in rows if row.ratio]),
        low=_geomean([row.ratio_low or row.ratio for row in rows if row.ratio]),
        high=_geomean([row.ratio_high or row.ratio for row in rows if row.ratio]),
        trees=len(rows),
        verdicts=verdicts,
        samples=[(row.tree, row.ratio, row.verdict or "same") for row in rows if row.ratio],
    )


def slower_cells(result: RunResult) -> list[Row]:
    """Rows whose whole interval says the baseline is slower than that library."""
    return [
        row
        for row in result.rows
        if row.library != result.baseline and row.verdict == "slower" and row.ratio
    ]


def row_of(result: RunResult, tree: str, op: str, library: str) -> Row | None:
    return next(
        (r for r in result.rows if r.tree == tree and r.op == op and r.library == library), None
    )


def variant_groups(result: RunResult) -> dict[str, list[TreeInfo]]:
    """base tree name -> [base tree, its variants...], for bases that have variants in the run."""
    groups: dict[str, list[TreeInfo]] = {}
    by_name = {tree.name: tree for tree in result.trees}
    for tree in result.trees:
        if tree.variant_of:
            base = by_name.get(tree.variant_of)
            group = groups.setdefault(tree.variant_of, [base] if base else [])
            group.append(tree)
    return groups


def ratio_of(result: RunResult, tree: str, op: str, library: str) -> float | None:
    """library time / baseline time on one case, or None when either did not run."""
    for row in result.rows:
        if row.tree == tree and row.op == op and row.library == library:
            return row.ratio
    return None
