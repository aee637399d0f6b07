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

SCHEMA_VERSION = 1

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
    """This library's median / the baseline's median on the same case; > 1 means the baseline is
    faster (or smaller). None when the baseline did not run on the case."""
    loops: int | None = None
    repeats: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    """Extra figures, e.g. the memory probe's tracemalloc bytes/node and copy count."""


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
class WorkloadRow:
    """One end-to-end workload timed plain and with fastree installed into jax.tree_util."""

    name: str
    description: str
    """What one timed call does, with the sizes used."""
    why: str
    """Where the call's time goes, hence what installing fastree can change."""
    plain: float | None = None
    """Median ns per call with jax.tree_util as JAX ships it; None when it did not run."""
    installed: float | None = None
    """Median ns per call inside ``fastree.installed()``."""
    plain_min: float | None = None
    installed_min: float | None = None
    speedup: float | None = None
    """plain / installed: > 1 means the call got faster with fastree installed."""
    loops: dict[str, int] = field(default_factory=dict)
    """Calls per repeat, per mode."""
    repeats: int = 0
    not_run: str | None = None
    """Why it was not timed: a library missing, no fastree.installed() ("unavailable: ..."), or
    results that differ between the two modes ("EXCLUDED: ...")."""


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
    """End-to-end workloads, plain vs fastree installed (results.json files before these existed
    have none)."""
    duration_s: float = 0.0
    schema: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        data = json.loads(text)
        return cls(
            environment=data["environment"],
            settings=data["settings"],
            baseline=data["baseline"],
            libraries=data["libraries"],
            trees=[TreeInfo(**t) for t in data["trees"]],
            rows=[Row(**r) for r in data["rows"]],
            skipped=[Note(**n) for n in data["skipped"]],
            excluded=[Note(**n) for n in data["excluded"]],
            workloads=[WorkloadRow(**w) for w in data.get("workloads", [])],
            duration_s=data["duration_s"],
            schema=data["schema"],
        )

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")
