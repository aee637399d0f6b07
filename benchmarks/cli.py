"""Command-line options of ``python -m benchmarks``.

This module must not import JAX (directly or through another benchmarks module): ``__main__`` reads
the options first so it can set XLA_FLAGS for the sharded leaves before JAX initialises
its backends.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks.destination import default_out, kind_of_args

LEAF_KINDS = ("numpy", "jax", "sharded")
"""numpy arrays; jax arrays on --device; jax arrays sharded over 8 host (CPU) devices."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time fastree against jax.tree_util, optree, dm-tree and torch's pytree.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder for results.json, report.md, chart.png and chart_details.png; nothing else "
        "is written unless --publish is given. Default: a folder of the run's own kind (its "
        "mode, --only, --leaves, --device and --baseline): bench_out/ for the unfiltered quick "
        "run, bench_out/full/ for the unfiltered full run, and for any other a folder under "
        "bench_out/ named after it, e.g. bench_out/full-only-flatten_transformer/ for --only "
        "'flatten/transformer*'. The run prints where it writes",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run files in --out even when they hold another kind of run's results "
        "(without it such a run is refused before anything is timed; a rerun of the same kind "
        "replaces its own results either way)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short rounds, fewer of them: about 11 minutes on a 2-core machine beside other jobs; the report "
        "says how precise the figures are",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="OP/TREE",
        help="run only cases matching this glob on op and tree names, e.g. 'flatten/transformer*'; "
        "a pattern without '/' matches either name; repeat or comma-separate for several; the "
        "end-to-end workloads answer to op 'workload', e.g. 'workload/optax*'; a pattern that "
        "matches nothing in the run is refused, with the valid names, before anything is timed; "
        "a run with --only writes a folder of its own unless --out is given (see --out)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="where jax-array leaves live; gpu needs a GPU that JAX sees (jax.devices()): "
        "without one the run is refused before anything is timed",
    )
    parser.add_argument(
        "--leaves",
        default=None,
        metavar="KIND[,KIND]",
        help=f"leaf kinds to run, from {', '.join(LEAF_KINDS)} (default: numpy; the full run also "
        "runs jax arrays on the transformer trees)",
    )
    parser.add_argument(
        "--baseline",
        default="fastree",
        metavar="LIBRARY",
        help="library the ratios are computed against (default: fastree)",
    )
    parser.add_argument(
        "--workload-rounds",
        type=int,
        default=None,
        metavar="N",
        help="rounds per pair of processes (plain, installed first) for the end-to-end "
        "workloads (default: 5 with --quick, 7 without); more rounds, narrower intervals",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        metavar="N",
        help="make N runs one after another, each a fresh process (python -m benchmarks with the "
        "same options, into DIR/runs/1 ... DIR/runs/N), then pool them into DIR: each figure is "
        "the runs' median and its interval covers the spread between runs, where a new run's "
        "figure lands (benchmarks/measure/stats.py, across_runs); N times as long. The published "
        "run is pooled from 3 (default: 1, a single run)",
    )
    parser.add_argument(
        "--publish",
        "--write-results",  # its earlier name
        dest="publish",
        action="store_true",
        help="after an unfiltered run, also make it the published run: its files into "
        "benchmarks/published/ (results.json, report.md, chart.png, chart_details.png) and its "
        "figures into the README's generated blocks (python -m benchmarks.report --publish does "
        "the same from a results.json)",
    )
    args = parser.parse_args(argv)
    args.write_results = args.publish  # the attribute's earlier name
    args.only = [p.strip() for chunk in args.only for p in chunk.split(",") if p.strip()]
    if args.leaves is not None:
        kinds = [k.strip() for k in args.leaves.split(",") if k.strip()]
        unknown = sorted(set(kinds) - set(LEAF_KINDS))
        if unknown:
            parser.error(f"unknown leaf kind(s) {unknown}; choose from {list(LEAF_KINDS)}")
        args.leaves = kinds
    if args.publish and (
        args.only or args.leaves or args.baseline != "fastree" or args.device != "cpu"
    ):
        # The published run is the one the README quotes as the suite, on CPU; a partial run must
        # not replace it. (A quick run may: its report says it is one, and how precise it is.)
        parser.error(
            "--publish needs an unfiltered CPU run: drop --only, --leaves, --baseline and --device"
        )
    if args.workload_rounds is not None and args.workload_rounds < 1:
        parser.error("--workload-rounds must be at least 1")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.out is None:
        args.out = default_out(kind_of_args(args))
    return args
