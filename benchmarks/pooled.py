"""``python -m benchmarks --runs N``: N runs one after another, each a process of its own, pooled.

One run's intervals cover its own rounds, so a second run lands outside them in about half the
cells; the published run is pooled from several (``benchmarks.measure.pooling``). Each run is
``python -m benchmarks`` with this command's options, into ``DIR/runs/1`` ... ``DIR/runs/N``
(its own results.json, report.md and charts, kept), started only once the one before it has
finished, so no two compete for the machine. The pooled run then goes into ``DIR`` (and, with
``--publish``, becomes the published run) like a single run's.

This module must not import JAX: the runs do, each in its own process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.destination import kind_of_args, refusal

RUNS_DIR = "runs"
"""Under the pooled run's folder: one folder per run, named by its number."""


def run_folders(out: Path, runs: int) -> list[Path]:
    return [out / RUNS_DIR / str(number) for number in range(1, runs + 1)]


def child_argv(args: argparse.Namespace, out: Path) -> list[str]:
    """The options of one run: this command's, less --runs and --publish, into ``out``."""
    argv = ["--out", str(out)]
    if args.quick:
        argv.append("--quick")
    for pattern in args.only:
        argv += ["--only", pattern]
    if args.leaves:
        argv += ["--leaves", ",".join(args.leaves)]
    argv += ["--device", args.device, "--baseline", args.baseline]
    if args.workload_rounds is not None:
        argv += ["--workload-rounds", str(args.workload_rounds)]
    if args.overwrite:
        argv.append("--overwrite")
    return argv


def run_child(argv: list[str]) -> int:
    """One run, ``python -m benchmarks ARGV``, in a fresh interpreter; its exit status."""
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], check=False).returncode


def run_pooled(
    args: argparse.Namespace,
    run_one: Callable[[list[str]], int] = run_child,
    command: str | None = None,
) -> int:
    """Make ``args.runs`` runs, one after another, pool them into ``args.out`` (publishing the
    pooled run with ``args.publish``); the exit status. ``command``: what the pooled run says
    made it (default: this process's command line)."""
    from benchmarks.report import write_outputs
    from benchmarks.report.publish import read_results

    folders = run_folders(args.out, args.runs)
    kind = kind_of_args(args)
    for folder in folders:  # before anything is timed, as for a single run
        why_not = refusal(folder, kind, args.overwrite)
        if why_not is not None:
            print(f"python -m benchmarks: refused: {why_not}", file=sys.stderr)
            return 2
    started = time.perf_counter()
    for number, folder in enumerate(folders, start=1):
        print(f"run {number} of {args.runs}, into {folder}/", file=sys.stderr, flush=True)
        status = run_one(child_argv(args, folder))
        if status != 0:
            print(
                f"python -m benchmarks: run {number} of {args.runs} failed (exit status "
                f"{status}); nothing pooled",
                file=sys.stderr,
            )
            return status
    try:
        pooled = read_results([folder / "results.json" for folder in folders])
    except (OSError, ValueError) as error:
        print(f"python -m benchmarks: {error}", file=sys.stderr)
        return 1
    pooled.settings["command"] = command or " ".join(["python -m benchmarks", *sys.argv[1:]])
    print(
        f"pooled {args.runs} runs ({time.perf_counter() - started:.0f} s) into {args.out}/",
        file=sys.stderr,
    )
    return write_outputs(pooled, args.out, publish_run=args.publish)
