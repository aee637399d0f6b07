"""Which stack (Python, JAX, flax) figures come from, and what to expect on the other stacks.

The published run is measured on one stack, the home one. A user on another supported stack
(an older Python with the JAX it can have, a newer Python) sees other figures; the README says
what to expect there in a short table, one row per stack and one column per operation, each cell
the operation's mean ratio against jax.tree_util over the trees (as the published run's Tree
operations table gives it), the published run's own stack first.

The other stacks' figures come from runs of the same command on those stacks (``python -m
benchmarks --quick``, pooled or not), kept in ``benchmarks/published/stacks.json`` as one entry
per stack: what ran (date, mode, runs, revision) and the per-operation means, no more. ``python
-m benchmarks.report --stacks A.json [B.json ...]`` adds or replaces the stacks those runs come
from (several runs of one stack are pooled first) and rewrites the README's ``stacks`` block;
publishing rewrites the block too, since its first row is the published run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.data.operations import MEMORY_OP, OPERATIONS
from benchmarks.measure.results import RunResult
from benchmarks.report.grid import mean_ratios

STACKS_JSON = "stacks.json"
"""Beside the published run: the other stacks' per-operation means."""
PEER = "jax"
"""The table's columns are against jax.tree_util."""


@dataclass(frozen=True)
class Stack:
    python: str
    jax: str
    flax: str | None
    libpython: str | None = None
    """``shared`` or ``static``: how the interpreter reaches libpython (environment.py's
    libpython_linkage; None for runs that did not record it). The same Python version gives other
    ratios on the two, so they are two stacks."""

    @property
    def key(self) -> str:
        """``Python 3.11.7, jax 0.10.2`` or ``Python 3.13.0 (libpython static), jax 0.12.0.1``:
        what tells two stacks apart in the table."""
        linkage = f" (libpython {self.libpython})" if self.libpython else ""
        return f"Python {self.python}{linkage}, jax {self.jax}"

    def describe(self) -> str:
        """``Python 3.13.0, jax 0.12.0.1, flax 0.12.12`` (flax left out where unknown)."""
        return self.key + (f", flax {self.flax}" if self.flax else "")


def stack_of(result: RunResult) -> Stack:
    """The run's stack. A run records jax and flax in its environment; an older one's versions
    are read from the libraries it timed (``nnx``: ``flax 0.12.8``) or the workloads used."""
    env = result.environment
    jax = env.get("jax") or result.libraries.get(PEER) or "?"
    flax = env.get("flax") or _flax_from_text(
        " ".join(filter(None, [result.libraries.get("nnx"), env.get("workload_libraries")]))
    )
    return Stack(str(env.get("python", "?")), str(jax), flax, env.get("libpython"))


def _flax_from_text(text: str) -> str | None:
    found = re.search(r"\bflax ([\w.+-]+)", text)
    return found.group(1) if found else None


def entry(result: RunResult) -> dict[str, Any]:
    """What stacks.json keeps of a run: its stack, what ran, the per-operation means vs jax."""
    stack = stack_of(result)
    means = {
        op: {"value": mean.value, "low": mean.low, "high": mean.high, "trees": mean.trees}
        for op, by_library in mean_ratios(result).items()
        if op != MEMORY_OP and (mean := by_library.get(PEER)) is not None
    }
    return {
        "python": stack.python,
        "jax": stack.jax,
        "flax": stack.flax,
        "libpython": stack.libpython,
        "mode": result.settings.get("mode"),
        "date": result.environment.get("date"),
        "runs": result.pooled_runs,
        "source_revision": result.environment.get("source_revision"),
        "cpu": result.environment.get("cpu"),
        "cpu_count": result.environment.get("cpu_count"),
        "means": {op: means[op] for op in OPERATIONS if op in means},
    }


def read_entries(path: Path) -> list[dict[str, Any]]:
    """stacks.json's entries ([] when there is none)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return list(data.get("stacks", []))


def write_entries(path: Path, entries: list[dict[str, Any]]) -> None:
    text = json.dumps({"stacks": entries}, indent=2, ensure_ascii=False)
    path.write_text(text + "\n")


def merged(entries: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` with each of ``new`` added, replacing an entry of the same stack in place."""
    out = list(entries)
    for item in new:
        key = stack_key(item)
        at = next((i for i, old in enumerate(out) if stack_key(old) == key), None)
        if at is None:
            out.append(item)
        else:
            out[at] = item
    return out


def stack_of_entry(item: dict[str, Any]) -> Stack:
    return Stack(item["python"], item["jax"], item.get("flax"), item.get("libpython"))


def stack_key(item: dict[str, Any]) -> str:
    return stack_of_entry(item).key


def stack_lines(published: RunResult, entries: list[dict[str, Any]]) -> list[str]:
    """The README's ``stacks`` block, unwrapped: the published run's row, then one row per other
    stack (``entries`` of the published run's own stack are left out: its row is the run's)."""
    home = entry(published)
    others = [item for item in entries if stack_key(item) != stack_key(home)]
    rows = [(home, True), *((item, False) for item in others)]
    ops = [op for op in OPERATIONS if any(op in item["means"] for item, _home in rows)]
    lines = [
        "**What to expect on other stacks.** Per operation, the geometric mean over the trees "
        "of jax.tree_util's time over fastree's, as in the Tree operations table below, measured "
        "by the same command on each stack (`python -m benchmarks --quick`); the first row is "
        "the published run's. Every stack's figures: `benchmarks/published/stacks.json`.",
        "",
        "| stack | " + " | ".join(f"`{op}`" for op in ops) + " |",
        "|---|" + "---:|" * len(ops),
    ]
    for item, is_home in rows:
        cells = [
            f"{item['means'][op]['value']:.2f}×" if op in item["means"] else "–" for op in ops
        ]
        lines.append(f"| {_stack_cell(item, is_home)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _stack_cell(item: dict[str, Any], home: bool) -> str:
    stack = stack_of_entry(item)
    runs = item.get("runs") or 1
    made = f"{item.get('mode', '?')}, {str(item.get('date', '?'))[:10]}" + (
        f", {runs} runs" if runs > 1 else ""
    )
    return f"{'**published**: ' if home else ''}{stack.describe()} ({made})"
