"""Where a run of ``python -m benchmarks`` writes, and when it may replace what is there.

The rule, which ``--help`` and the README state:

- Each kind of run has a default folder of its own. A kind is what the run measures: its mode
  (quick or full), ``--only``, ``--leaves``, ``--device`` and ``--baseline``. The unfiltered quick
  run (the README's main command) writes ``bench_out/``; every other kind writes a folder under it
  named after the kind: ``bench_out/full/``, ``bench_out/full-only-flatten_transformer/`` for
  ``--only 'flatten/transformer*'``, and so on. So no run's default overwrites another kind's.
- Whatever the folder (default or ``--out``), a run replaces the results in it only when they
  come from the same kind of run: rerunning a command redoes its own results. A folder holding
  another kind's results.json, a results.json this suite cannot read, or a run's report files
  without their results.json is refused before anything is timed, unless ``--overwrite`` is given.
  Only the run's own four files are ever written; nothing else in the folder is touched.

This module must not import JAX (``cli``'s rule): ``__main__`` checks the folder before the
runner imports anything heavy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path
from typing import Any

DEFAULT_ROOT = Path("bench_out")
"""The unfiltered quick run's folder; the other kinds' default folders sit under it."""
RUN_FILES = ("results.json", "report.md", "chart.png", "chart_details.png")
"""What a run writes into its folder (benchmarks.report.outputs names them)."""
MAX_NAME = 80
"""Longest default folder name; a longer one is cut and given a digest of the whole."""


def run_kind(
    mode: str, only: list[str], leaves: Any, device: str, baseline: str
) -> dict[str, Any]:
    """What makes two runs the same kind: the same selection, measured the same way."""
    return {
        "mode": mode,
        "only": sorted(set(only)),
        "leaves": "default" if leaves in (None, "default") else sorted(set(leaves)),
        "device": device,
        "baseline": baseline,
    }


def kind_of_args(args: argparse.Namespace) -> dict[str, Any]:
    mode = "quick" if args.quick else "full"
    return run_kind(mode, args.only, args.leaves, args.device, args.baseline)


def kind_of_results(data: dict[str, Any]) -> dict[str, Any]:
    """The kind of the run a results.json holds; KeyError/TypeError when it is not one."""
    settings = data["settings"]
    return run_kind(
        settings["mode"],
        settings.get("only") or [],
        settings.get("leaves"),
        settings.get("device", "cpu"),
        data["baseline"],
    )


def describe_kind(kind: dict[str, Any]) -> str:
    """``full run, --only 'flatten/transformer*'``: a kind as a user would have asked for it."""
    parts = [f"{kind['mode']} run"]
    if kind["only"]:
        parts.append("--only " + " ".join(f"'{pattern}'" for pattern in kind["only"]))
    if kind["leaves"] != "default":
        parts.append(f"--leaves {','.join(kind['leaves'])}")
    if kind["device"] != "cpu":
        parts.append(f"--device {kind['device']}")
    if kind["baseline"] != "fastree":
        parts.append(f"--baseline {kind['baseline']}")
    return ", ".join(parts) if len(parts) > 1 else f"unfiltered {parts[0]}"


def default_out(kind: dict[str, Any]) -> Path:
    """The kind's own folder: bench_out/ for the unfiltered quick run, bench_out/NAME/ else."""
    if kind == run_kind("quick", [], None, "cpu", "fastree"):
        return DEFAULT_ROOT
    parts = [kind["mode"]]
    if kind["only"]:
        parts.append("only-" + "+".join(_slug(pattern) for pattern in kind["only"]))
    if kind["leaves"] != "default":
        parts.append("leaves-" + "+".join(kind["leaves"]))
    if kind["device"] != "cpu":
        parts.append(kind["device"])
    if kind["baseline"] != "fastree":
        parts.append("baseline-" + _slug(kind["baseline"]))
    name = "-".join(parts)
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}-{digest}"
    return DEFAULT_ROOT / name


def _slug(text: str) -> str:
    """A glob as a folder name: ``flatten/transformer*`` -> ``flatten_transformer``."""
    return re.sub(r"[^\w@.-]+", "_", text).strip("_") or "all"


def refusal(out: Path, kind: dict[str, Any], overwrite: bool) -> str | None:
    """Why this run must not write into ``out`` (None: it may). Checks only; writes nothing."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a folder: name a folder for the run's files"
    if overwrite or not out.is_dir():
        return None
    ask = (
        f"Name another folder with --out, or add --overwrite to replace {out}/'s "
        f"{', '.join(RUN_FILES)}."
    )
    results = out / "results.json"
    if not results.exists():
        present = [name for name in RUN_FILES if (out / name).exists()]
        if not present:
            return None
        return (
            f"{out}/ holds {', '.join(present)} but no results.json, so which run wrote "
            f"{'them' if len(present) > 1 else 'it'} cannot be told; this run would overwrite "
            f"{'them' if len(present) > 1 else 'it'}. {ask}"
        )
    try:
        theirs = kind_of_results(json.loads(results.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as error:
        return (
            f"{results} is not a results.json this suite can read ({type(error).__name__}: "
            f"{error}), so which run it holds cannot be told; this run would overwrite it. {ask}"
        )
    if theirs == kind:
        return None  # the same kind of run, redone: it replaces its own results
    own = default_out(kind)
    hint = "" if out.resolve() == own.resolve() else f" Its own default folder is {own}/."
    return (
        f"{out}/ holds another run's results ({describe_kind(theirs)}); this run "
        f"({describe_kind(kind)}) would overwrite them.{hint} {ask}"
    )
