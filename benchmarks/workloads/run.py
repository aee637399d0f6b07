"""Run the workloads: build each once, check both modes agree, time them interleaved."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from benchmarks.results import WorkloadRow
from benchmarks.selection import case_selected
from benchmarks.timing import ModeFailed, measure_modes
from benchmarks.unsupported import Unsupported
from benchmarks.workloads import WORKLOAD_OP, WORKLOADS
from benchmarks.workloads.base import Workload
from benchmarks.workloads.install import Installer, fastree_installer

PLAIN, INSTALLED = "plain", "installed"


def selected_workloads(only: Sequence[str]) -> list[Workload]:
    return [w for w in WORKLOADS if case_selected(WORKLOAD_OP, w.name, only)]


def run_workloads(
    workloads: Sequence[Workload],
    size: str,
    target_ns: int,
    repeats: int,
    installer: Installer | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> list[WorkloadRow]:
    """One row per workload: timed, or with ``not_run`` saying why not.

    ``installer`` defaults to ``fastree.installed``; tests pass another context manager factory to
    exercise the machinery without one.
    """
    if not workloads:
        return []
    if installer is None:
        try:
            installer = fastree_installer()
        except Unsupported as reason:
            # Each workload is still listed, so the report shows what would have run.
            progress(f"  workloads not run: {reason}")
            return [_row(w, w.description, not_run=str(reason)) for w in workloads]
    rows = []
    for workload in workloads:
        row = run_one(workload, workload.sizes[size], target_ns, repeats, installer)
        rows.append(row)
        progress(_progress_line(row))
    return rows


def run_one(
    workload: Workload, size: int, target_ns: int, repeats: int, installer: Installer
) -> WorkloadRow:
    try:
        prepared = workload.build(size)
    except Unsupported as reason:
        return _row(workload, workload.description, not_run=str(reason))
    except Exception as error:  # noqa: BLE001 - a library's API moved: say so, run the rest
        return _row(
            workload,
            workload.description,
            not_run=f"building it raised {type(error).__name__}: {error}",
        )
    description = f"{workload.description} ({prepared.size})"
    modes = {PLAIN: contextlib.nullcontext, INSTALLED: installer}
    try:
        timings, results = measure_modes(prepared.call, modes, target_ns, repeats)
    except ModeFailed as failure:
        return _row(workload, description, not_run=f"raised {failure}")
    disagreement = prepared.compare(results[PLAIN], results[INSTALLED])
    if disagreement is not None:
        return _row(
            workload, description, not_run=f"EXCLUDED: installed result differs: {disagreement}"
        )
    plain, installed = timings[PLAIN], timings[INSTALLED]
    return _row(
        workload,
        description,
        plain=plain.median_ns,
        installed=installed.median_ns,
        plain_min=plain.min_ns,
        installed_min=installed.min_ns,
        speedup=plain.median_ns / installed.median_ns,
        loops={PLAIN: plain.loops, INSTALLED: installed.loops},
        repeats=len(plain.samples_ns),
    )


def _row(workload: Workload, description: str, **fields: object) -> WorkloadRow:
    return WorkloadRow(name=workload.name, description=description, why=workload.why, **fields)


def _progress_line(row: WorkloadRow) -> str:
    from benchmarks.report.format import format_ratio, format_value

    if row.not_run:
        return f"  workload {row.name}: not run ({row.not_run})"
    return (
        f"  workload {row.name}: plain {format_value(row.plain, 'ns')}  installed "
        f"{format_value(row.installed, 'ns')}  ({format_ratio(row.speedup)} speedup)"
    )
