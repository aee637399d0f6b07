"""One process of the end-to-end workloads: ``python -m benchmarks.measure.child``.

The parent (``benchmarks.measure.workloads``) starts this module plain, or under ``python -m
fastree.run`` so that fastree is installed into JAX before any workload imports a library. It
builds each workload named on the command line, calls it once (compilation, first-use checks),
fingerprints that result, times the call and prints one JSON line: workload name -> its times, or
why it did not run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from benchmarks.measure.timing import time_call
from benchmarks.unsupported import Unsupported
from benchmarks.workloads import WORKLOADS

MODE_KEY = "_mode"
"""Key of the child's own record: whether fastree was installed into JAX in it."""


def installed_here() -> bool:
    fastree = sys.modules.get("fastree")
    return bool(fastree is not None and getattr(fastree, "is_installed", lambda: False)())


def run_one(name: str, size: str, target_ns: int, repeats: int) -> dict[str, Any]:
    workload = next(w for w in WORKLOADS if w.name == name)
    try:
        prepared = workload.build(workload.sizes[size])
    except Unsupported as reason:
        return {"not_run": str(reason)}
    except Exception as error:  # noqa: BLE001 - a library's API moved: say so, run the rest
        return {"not_run": f"building it raised {type(error).__name__}: {error}"}
    try:
        result = prepared.call()
        prepared.call()  # a second warm-up: library nodes check their first instances
        fingerprint = prepared.fingerprint(result)
        timing = time_call(prepared.call, target_ns, repeats)
    except Exception as error:  # noqa: BLE001 - reported as the mode's failure
        return {"not_run": f"raised {type(error).__name__}: {error}"}
    return {
        "size": prepared.size,
        "fingerprint": fingerprint,
        # The fastest repeat: a repeat the scheduler interrupted is dropped, not averaged in;
        # both modes are read the same way.
        "median_ns": timing.min_ns,
        "samples_ns": list(timing.samples_ns),
        "loops": timing.loops,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.measure.child")
    parser.add_argument("--workloads", required=True, help="comma-separated workload names")
    parser.add_argument("--size", default="quick")
    parser.add_argument("--target-ns", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {MODE_KEY: {"installed": installed_here()}}
    for name in args.workloads.split(","):
        out[name] = run_one(name, args.size, args.target_ns, args.repeats)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
