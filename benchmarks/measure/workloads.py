"""Time the end-to-end workloads: a plain and an installed process, taking turns, round by round.

A pair of child processes (``benchmarks.measure.child``) runs side by side: ``python -m
benchmarks.measure.child`` (plain JAX) and ``python -m fastree.run -m benchmarks.measure.child``
(fastree installed before any library is imported, the way README tells users to start a
program). For each workload both build it and warm it up; then, round after round, the parent
asks one process and then the other to time it (which goes first alternates), so the two timings
of a round are moments apart and share the machine's state. Separate processes are what make
"installed" mean what it means for a user: a library that registers its classes at definition
time (equinox) sees fastree from its first line, and neither mode inherits the other's caches,
compiled executables or heap.

A round's ratio is plain time / installed time; the figure is the median of all rounds' ratios,
over ``pairs`` pairs of processes, with its interval (``stats``). A workload with a floor
(``benchmarks.workloads.floor``) also answers its floor's time from the same turn; each process's
call / floor ratios give that process's distance from the floor (``FloorDistance``). A workload whose two processes
fingerprint their results differently is excluded (its speedup would compare different work);
one that fails in either process is reported with the failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from benchmarks.measure import stats
from benchmarks.measure.child import ANSWER_PREFIX
from benchmarks.measure.results import FloorDistance, WorkloadRow
from benchmarks.workloads.base import Workload

PLAIN, INSTALLED = "plain", "installed"
REPO_ROOT = Path(__file__).resolve().parents[2]
REQUEST_TIMEOUT_S = 900.0
"""Longest wait for one answer (building a workload in a cold process included)."""


class Child(Protocol):
    def ask(self, request: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


Spawn = Callable[[str], Child]
"""mode -> a started child process (tests pass a stand-in)."""


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


class ChildProcess:
    """A ``benchmarks.measure.child`` process, plain or under ``python -m fastree.run``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        prefix = ["-m", "fastree.run"] if mode == INSTALLED else []
        env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        # stderr goes to a file: a pipe nobody reads could fill up and stall the child.
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, *prefix, "-m", "benchmarks.measure.child"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        line = ""
        # A process that stops answering is killed, so the run (or a test) cannot hang on it.
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            self.process.kill()

        watchdog = threading.Timer(REQUEST_TIMEOUT_S, kill)
        watchdog.start()
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            while not line.startswith(ANSWER_PREFIX):
                line = self.process.stdout.readline()
                if not line:
                    break
        except OSError:
            line = ""
        finally:
            watchdog.cancel()
        if not line:
            self.process.wait()
            self.stderr.seek(0)
            why = f" (no answer in {REQUEST_TIMEOUT_S:g} s: killed)" if timed_out.is_set() else ""
            raise RuntimeError(
                f"the {self.mode} process failed (exit {self.process.returncode}){why}: "
                f"{self.stderr.read()[-2000:]}"
            )
        return json.loads(line[len(ANSWER_PREFIX) :])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.stderr.close()


def run_workloads(
    workloads: Sequence[Workload],
    size: str,
    target_ns: int,
    pairs: int,
    rounds: int,
    spawn: Spawn = ChildProcess,
    progress: Callable[[str], None] = lambda _line: None,
) -> list[WorkloadRow]:
    """One row per workload: timed over ``pairs`` x ``rounds`` rounds, or ``not_run`` saying why."""
    rows = {w.name: _row(w) for w in workloads}
    samples = {w.name: {PLAIN: [], INSTALLED: []} for w in workloads}
    # name -> mode -> each round's floor ns, for the workloads with a floor.
    floors = {w.name: {PLAIN: [], INSTALLED: []} for w in workloads}
    for pair in range(pairs):
        active = [w for w in workloads if rows[w.name].not_run is None]
        if not active:
            break
        children: dict[str, Child] = {}
        try:
            for mode in (PLAIN, INSTALLED):
                children[mode] = spawn(mode)
                if children[mode].ask({"cmd": "mode"}).get("installed") != (mode == INSTALLED):
                    state = "not installed" if mode == INSTALLED else "installed"
                    for workload in active:
                        rows[
                            workload.name
                        ].not_run = f"unavailable: the {mode} process ran with fastree {state}"
                    return list(rows.values())
            for workload in active:
                _time_one(workload, children, size, target_ns, rounds, rows, samples, floors)
        except RuntimeError as error:  # a process died: say so for what it left untimed
            for workload in active:
                if rows[workload.name].not_run is None:
                    rows[workload.name].not_run = str(error)
            return list(rows.values())
        finally:
            for child in children.values():
                child.close()
        progress(f"  workloads: process pair {pair + 1}/{pairs} done")
    for workload in workloads:
        row = rows[workload.name]
        if row.not_run is None:
            _finish(row, samples[workload.name][PLAIN], samples[workload.name][INSTALLED])
            _finish_floor(row, samples[workload.name], floors[workload.name])
    return list(rows.values())


def _time_one(
    workload: Workload,
    children: dict[str, Child],
    size: str,
    target_ns: int,
    rounds: int,
    rows: dict[str, WorkloadRow],
    samples: dict[str, dict[str, list[float]]],
    floors: dict[str, dict[str, list[float]]],
) -> None:
    row = rows[workload.name]
    request = {"cmd": "build", "name": workload.name, "size": size, "target_ns": target_ns}
    built = {mode: child.ask(request) for mode, child in children.items()}
    failed = [(mode, answer["not_run"]) for mode, answer in built.items() if "not_run" in answer]
    if failed:
        mode, reason = failed[0]
        both = len(failed) == 2 or reason.startswith("unavailable")
        row.not_run = reason if both else f"{reason} (in the {mode} process only)"
        return
    if built[PLAIN]["fingerprint"] != built[INSTALLED]["fingerprint"]:
        row.not_run = "EXCLUDED: the installed process's result differs from the plain one's"
        return
    row.description = f"{workload.description} ({built[PLAIN]['size']})"
    row.loops = {mode: answer["loops"] for mode, answer in built.items()}
    for index in range(rounds):
        order = (PLAIN, INSTALLED) if index % 2 == 0 else (INSTALLED, PLAIN)
        timed = {mode: children[mode].ask({"cmd": "time", "name": workload.name}) for mode in order}
        for mode, answer in timed.items():
            if "not_run" in answer:
                row.not_run = f"{answer['not_run']} (in the {mode} process)"
                return
        for mode in (PLAIN, INSTALLED):
            samples[workload.name][mode].append(timed[mode]["ns"])
            if "floor_ns" in timed[mode]:
                floors[workload.name][mode].append(timed[mode]["floor_ns"])


def _finish(row: WorkloadRow, plain: list[float], installed: list[float]) -> None:
    estimate = stats.paired(plain, installed)
    row.plain = stats.median(plain)
    row.installed = stats.median(installed)
    row.speedup, row.speedup_low, row.speedup_high = estimate.value, estimate.low, estimate.high
    row.confidence, row.verdict, row.rounds = estimate.confidence, estimate.verdict, estimate.rounds
    row.plain_samples, row.installed_samples = list(plain), list(installed)


def _finish_floor(
    row: WorkloadRow, calls: dict[str, list[float]], floors: dict[str, list[float]]
) -> None:
    """Each process's call / floor, round by round, when every round timed a floor."""
    for mode in (PLAIN, INSTALLED):
        if not floors[mode] or len(floors[mode]) != len(calls[mode]):
            continue
        estimate = stats.paired(calls[mode], floors[mode])
        row.floor[mode] = FloorDistance(
            ratio=estimate.value,
            low=estimate.low,
            high=estimate.high,
            confidence=estimate.confidence,
            floor_ns=stats.median(floors[mode]),
            floor_samples=list(floors[mode]),
        )


def _row(workload: Workload) -> WorkloadRow:
    return WorkloadRow(
        name=workload.name, description=workload.description, why=workload.why, group=workload.group
    )
