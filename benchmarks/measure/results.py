"""The records a run produces, and their JSON form (results.json).

results.json is the one complete output; the table, report and chart are all rendered from a
RunResult, so they can be regenerated from results.json without re-running anything.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 3
"""2: ratios carry an interval and a verdict; workloads are timed in child processes. 3: a
result may pool several runs (``runs``, and each row's and workload's ``runs``)."""
READABLE_SCHEMAS = (2, 3)
"""Schemas this suite reads: a schema-2 file is one run, read as a schema-3 one with no runs."""

TIME_UNIT = "ns"
MEMORY_UNIT = "bytes/node"


@dataclass
class Row:
    """One library on one (tree, op) case."""

    tree: str
    op: str
    library: str
    unit: str
    """TIME_UNIT (per call) or MEMORY_UNIT (treedef_memory)."""
    median: float
    min: float
    per_leaf_ns: float | None
    """median / number of leaves, for timings."""
    ratio: float | None
    """This library's time / the baseline's on the same case, the median of the per-round ratios
    (memory: of the probes); > 1 means the baseline is faster (or smaller). None when the baseline
    did not run on the case."""
    loops: int | None = None
    repeats: int | None = None
    """Rounds (memory: probes) this library ran on the case."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Extra figures, e.g. the memory probe's tracemalloc bytes/node and copy count."""
    ratio_low: float | None = None
    ratio_high: float | None = None
    """The ratio's interval (stats.py): it covers the true median ratio with ``confidence``."""
    confidence: float | None = None
    verdict: str | None = None
    """From the baseline's side: "faster" (interval above 1), "slower" (below), "same"."""
    samples: list[float] = field(default_factory=list)
    """Every round's time per call (memory: every probe's bytes/node), in the order they ran
    (pooled: every run's, run after run)."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Pooled (``benchmarks.measure.pooling``): per run that had this cell, in run order, its own
    figures (run, median, min, ratio, ratio_low, ratio_high, confidence, repeats, loops,
    samples); the fields above are then the pooled ones. Empty for a single run."""


@dataclass
class Note:
    """Something that did not run, and why. tree/op are None when it applies to all of them."""

    library: str | None
    tree: str | None
    op: str | None
    reason: str


@dataclass
class TreeInfo:
    name: str
    description: str
    leaf_kind: str
    num_leaves: int
    num_nodes: int
    variant_of: str | None = None
    """The tree this one varies (dict-order variants of dict-10k); left out of the means."""


@dataclass
class FloorDistance:
    """In one process (plain or installed): how far a library's tree is from its builtin-shape
    twin, timed turn by turn with it (a workload of the "builtin-shape floor" group)."""

    ratio: float
    """Median over rounds of call time / floor time: 1.0 would be the floor itself."""
    low: float
    high: float
    """The ratio's interval (stats.py)."""
    confidence: float
    floor_ns: float
    """Median over rounds of the floor's ns per call."""
    floor_samples: list[float] = field(default_factory=list)
    """Each round's floor ns per call (the call's are the row's plain/installed samples)."""


@dataclass
class WorkloadRow:
    """One end-to-end workload: plain JAX vs fastree installed first, in alternating processes."""

    name: str
    description: str
    """What one timed call does, with the sizes used."""
    why: str
    """Where the call's time goes, hence what installing fastree can change."""
    group: str = "program"
    """"program" (end-to-end fragments), "equinox model" or "nnx model" (library-node
    operations)."""
    plain: float | None = None
    """Median over rounds of the plain process's ns per call; None when it did not run."""
    installed: float | None = None
    """Median over rounds of the installed processes' ns per call."""
    speedup: float | None = None
    """Median of the per-round ratios plain / installed: > 1 means installing fastree helped."""
    speedup_low: float | None = None
    speedup_high: float | None = None
    confidence: float | None = None
    verdict: str | None = None
    """"faster" (interval above 1: installing helped), "slower", or "same"."""
    rounds: int = 0
    """Rounds that timed it, over all pairs of processes."""
    plain_samples: list[float] = field(default_factory=list)
    installed_samples: list[float] = field(default_factory=list)
    """Each round's ns per call in each mode (the fastest of the turn's loops), in round order."""
    loops: dict[str, int] = field(default_factory=dict)
    """Calls per loop in the last pair of processes, per mode."""
    not_run: str | None = None
    """Why it was not timed: a library missing, no installed mode ("unavailable: ..."), a failure,
    or results that differ between the two modes ("EXCLUDED: ...")."""
    floor: dict[str, FloorDistance] = field(default_factory=dict)
    """"plain" / "installed" -> that process's distance from the builtin-shape floor; empty for a
    workload without a floor."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Pooled: per run, in run order, its own figures (run, plain, installed, speedup,
    speedup_low, speedup_high, confidence, rounds, samples, floor, not_run); empty for one run."""


@dataclass
class RunResult:
    environment: dict[str, Any]
    settings: dict[str, Any]
    baseline: str
    libraries: dict[str, str]
    """name -> version, for libraries that loaded, in display order."""
    trees: list[TreeInfo] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    skipped: list[Note] = field(default_factory=list)
    """Libraries, trees, or ops that were not run, with the reason."""
    excluded: list[Note] = field(default_factory=list)
    """Libraries the correctness guard removed from a tree: their leaves differ from JAX's."""
    workloads: list[WorkloadRow] = field(default_factory=list)
    """End-to-end workloads, plain vs fastree installed first."""
    duration_s: float = 0.0
    """Seconds the run took (pooled: all its runs together)."""
    schema: int = SCHEMA_VERSION
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Pooled from several runs made in separate processes: one entry per run, in the order they
    ran (its date, duration, load, revision and results file), and every figure is pooled
    (``stats.across_runs``). Empty for a single run."""

    @property
    def pooled_runs(self) -> int:
        """How many runs this result's figures come from (1 for a single run)."""
        return max(len(self.runs), 1)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        data = json.loads(text)
        if data.get("schema") not in READABLE_SCHEMAS:
            raise ValueError(
                f"results.json of schema {data.get('schema')}; this suite reads schemas "
                f"{', '.join(map(str, READABLE_SCHEMAS))} (rerun python -m benchmarks to get one)"
            )
        return cls(
            environment=data["environment"],
            settings=data["settings"],
            baseline=data["baseline"],
            libraries=data["libraries"],
            trees=[TreeInfo(**t) for t in data["trees"]],
            rows=[Row(**r) for r in data["rows"]],
            skipped=[Note(**n) for n in data["skipped"]],
            excluded=[Note(**n) for n in data["excluded"]],
            workloads=[_workload_row(w) for w in data.get("workloads", [])],
            duration_s=data["duration_s"],
            schema=SCHEMA_VERSION,
            runs=data.get("runs", []),
        )

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")


def _workload_row(data: dict[str, Any]) -> WorkloadRow:
    floor = {mode: FloorDistance(**d) for mode, d in data.get("floor", {}).items()}
    return WorkloadRow(**{**data, "floor": floor})
