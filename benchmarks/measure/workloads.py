"""Time the end-to-end workloads: plain and installed processes, alternating, round after round.

Each round starts two child processes (``benchmarks.measure.child``), one per mode, in an order
that alternates from round to round: ``python -m benchmarks.measure.child`` (plain JAX) and
``python -m fastree.run -m benchmarks.measure.child`` (fastree installed before any library is
imported, the way README tells users to start a program). Each child times every selected
workload once, after a warm-up; a round's ratio is plain time / installed time, and the figure is
the median of the rounds' ratios with its interval (``stats``). Separate processes are what make
"installed" mean what it means for a user: a library that registers its classes at definition
time (equinox) sees fastree from its first line, and neither mode inherits the other's caches,
compiled executables or heap.

A workload whose two modes fingerprint their results differently is excluded (its speedup would
compare different work); one that fails in either mode is reported with the failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.measure import stats
from benchmarks.measure.child import MODE_KEY
from benchmarks.measure.results import WorkloadRow
from benchmarks.workloads.base import Workload

PLAIN, INSTALLED = "plain", "installed"
REPO_ROOT = Path(__file__).resolve().parents[2]

Spawn = Callable[[str, list[str]], dict[str, Any]]
"""(mode, workload names) -> the child's JSON record (tests pass a stand-in)."""


def installed_mode_unavailable() -> str | None:
    """Why no installed process can be started here (None when it can)."""
    try:
        import fastree
        import fastree.run  # noqa: F401 - the entry point the installed processes use
    except Exception as error:  # noqa: BLE001 - a broken build can raise anything
        return f"unavailable: fastree did not import ({type(error).__name__}: {error})"
    if not hasattr(fastree, "install"):
        return "unavailable: this fastree has no install()"
    return None


def child_spawner(size: str, target_ns: int, repeats: int) -> Spawn:
    """Runs ``benchmarks.measure.child`` in a fresh interpreter, plain or under fastree.run."""

    def spawn(mode: str, names: list[str]) -> dict[str, Any]:
        prefix = ["-m", "fastree.run"] if mode == INSTALLED else []
        env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        command = [
            sys.executable,
            *prefix,
            "-m",
            "benchmarks.measure.child",
            "--workloads",
            ",".join(names),
            "--size",
            size,
            "--target-ns",
            str(target_ns),
            "--repeats",
            str(repeats),
        ]
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise RuntimeError(
                f"the {mode} process failed (exit {done.returncode}): {done.stderr[-2000:]}"
            )
        return json.loads(lines[-1])

    return spawn


def run_workloads(
    workloads: Sequence[Workload],
    rounds: int,
    spawn: Spawn,
    progress: Callable[[str], None] = lambda _line: None,
) -> list[WorkloadRow]:
    """One row per workload: timed over ``rounds`` process pairs, or ``not_run`` saying why."""
    rows = {w.name: _row(w, w.description) for w in workloads}
    if not workloads:
        return []
    samples: dict[str, dict[str, list[float]]] = {
        w.name: {PLAIN: [], INSTALLED: []} for w in workloads
    }
    active = [w.name for w in workloads]
    for index in range(rounds):
        if not active:
            break
        order = (PLAIN, INSTALLED) if index % 2 == 0 else (INSTALLED, PLAIN)
        records: dict[str, dict[str, Any]] = {}
        for mode in order:
            try:
                records[mode] = spawn(mode, active)
            except RuntimeError as error:
                for name in active:
                    rows[name].not_run = str(error)
                return list(rows.values())
            wanted = mode == INSTALLED
            if records[mode].get(MODE_KEY, {}).get("installed") != wanted:
                for name in active:
                    rows[name].not_run = (
                        f"unavailable: the {mode} process ran with fastree "
                        f"{'not ' if wanted else ''}installed"
                    )
                return list(rows.values())
        for name in list(active):
            row = rows[name]
            plain, installed = records[PLAIN][name], records[INSTALLED][name]
            failed = [
                (m, r["not_run"])
                for m, r in ((PLAIN, plain), (INSTALLED, installed))
                if "not_run" in r
            ]
            if failed:
                mode, reason = failed[0]
                both = len(failed) == 2 or reason.startswith("unavailable")
                row.not_run = reason if both else f"{reason} (in the {mode} process only)"
            elif plain["fingerprint"] != installed["fingerprint"]:
                row.not_run = (
                    "EXCLUDED: the installed process's result differs from the plain one's"
                )
            if row.not_run:
                active.remove(name)
                continue
            row.description = f"{_workload(workloads, name).description} ({plain['size']})"
            samples[name][PLAIN].append(plain["median_ns"])
            samples[name][INSTALLED].append(installed["median_ns"])
            row.loops = {PLAIN: plain["loops"], INSTALLED: installed["loops"]}
        progress(f"  workloads: round {index + 1}/{rounds} done ({len(active)} timed)")
    for name in active:
        _finish(rows[name], samples[name][PLAIN], samples[name][INSTALLED])
    return list(rows.values())


def _finish(row: WorkloadRow, plain: list[float], installed: list[float]) -> None:
    estimate = stats.paired(plain, installed)
    row.plain = stats.median(plain)
    row.installed = stats.median(installed)
    row.speedup, row.speedup_low, row.speedup_high = estimate.value, estimate.low, estimate.high
    row.confidence, row.verdict, row.rounds = estimate.confidence, estimate.verdict, estimate.rounds
    row.plain_samples, row.installed_samples = list(plain), list(installed)


def _workload(workloads: Sequence[Workload], name: str) -> Workload:
    return next(w for w in workloads if w.name == name)


def _row(workload: Workload, description: str, **fields: object) -> WorkloadRow:
    return WorkloadRow(
        name=workload.name,
        description=description,
        why=workload.why,
        group=workload.group,
        **fields,  # type: ignore[arg-type]
    )
