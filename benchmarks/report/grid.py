"""Results rearranged for display: per tree, one row per op, one cell per library."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.results import Row, RunResult, TreeInfo


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
