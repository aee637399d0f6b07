"""Instructions per call of two fastree builds, counted by callgrind: the A/B without timing noise.

``scripts/ab_builds.py`` times two builds side by side, but a timing A/B cannot resolve a 1-3%
difference on some cells: where code and data land in memory moves them by that much (its
``--aa`` mode measures this). This counts what the two builds execute instead. Each build runs
each op on each tree under ``valgrind --tool=callgrind``, collecting only inside the op's C entry
point (``--toggle-collect`` on its ``Guarded<...>::Call`` wrapper), so Python's interpreter,
imports and the dealloc of the previous result are not counted; everything the entry point calls
(CPython's dict and list code included) is. It reports instructions per call and the B / A ratio.

Counts repeat to a few instructions for ops that only read (flatten, leaves, structure, equality).
Ops that allocate (unflatten, tree_map, flatten_with_path) move by up to ~2% with the allocator's
state at the time (a new pymalloc arena, a freelist that ran dry), which the other ops run before
them leave different in each build: confirm such a cell with a run of that op alone.

Instructions are not time (a cache miss costs no instruction), so this complements the timing
A/B rather than replacing it: a cell that is slower in time but not in instructions points at
memory behaviour or code placement, one that executes more points at code.

Needs valgrind and unstripped builds (symbols: ``-Ccmake.define.CMAKE_STRIP=/bin/true``, or
``-Cinstall.strip=false`` for a non-editable install). tree_map2 is left out: it shares
tree_map's entry point.

Each (build, tree) runs twice per build under valgrind (see count()); the default trees take
~10 minutes on 2 cores.

Usage: ``python scripts/ab_instructions.py BASE_PACKAGE_DIR [--trees t1,t2] [--calls N]``
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ab_builds

# op -> the C entry point it goes through (the Guarded<...> wrapper is never inlined away).
ENTRY_POINTS = {
    "flatten": "Guarded<&fastree::TreeFlatten>",
    "leaves": "Guarded<&fastree::TreeLeaves>",
    "structure": "Guarded<&fastree::TreeStructure>",
    "unflatten": "Guarded<&fastree::TreeUnflatten>",
    "flatten_up_to": "Guarded<&fastree::(anonymous namespace)::MFlattenUpTo>",
    "tree_map": "Guarded<&fastree::TreeMap>",
    "flatten_with_path": "Guarded<&fastree::TreeFlattenWithPath>",
    "treedef_eq": "Guarded<&fastree::(anonymous namespace)::RichCompare>",
}
# Small and mid-sized trees: under valgrind a call runs ~50x slower.
DEFAULT_TREES = ("tuple3", "mlp", "transformer-12", "deep-500", "custom-callbacks")


def child(build: str, tree_name: str, calls: int) -> None:
    """Runs every op ``calls`` times on one tree with one build (under valgrind)."""
    if build == "-":
        tu = importlib.import_module("fastree.tree_util")
    else:
        tu = ab_builds.load_base(Path(build))
    tree = ab_builds.tree_for(tu, tree_name, ab_builds.leaf_factory("numpy", "cpu"))
    ops = ab_builds.ops_for(tu, tree)
    # As the timings do: a collection started inside an op would charge it for the heap's size,
    # which differs between builds (their Python modules, the trees each one made).
    gc.disable()
    for op in ENTRY_POINTS:
        fn, args = ops[op]
        for _ in range(calls):
            fn(*args)


def count(build: str, tree_name: str, calls: int) -> dict[str, float]:
    """Instructions per call of each op, for one build and tree.

    Counted as the difference between a run of ``calls // 4`` calls per op and one of
    ``calls // 4 + calls``: what happens once (caches of key entries and classifications filled,
    the setup's own calls) is in both and cancels out.
    """
    warmup = max(1, calls // 4)
    short = total_costs(build, tree_name, warmup)
    long = total_costs(build, tree_name, warmup + calls)
    return {op: (long[op] - short[op]) / calls for op in ENTRY_POINTS}


def total_costs(build: str, tree_name: str, calls: int) -> dict[str, int]:
    """Instructions spent in each op's entry point over a run of ``calls`` calls per op."""
    with tempfile.TemporaryDirectory(prefix="fastree-cg-") as tmp:
        out = Path(tmp) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        command += [f"--toggle-collect=*{entry}::Call*" for entry in ENTRY_POINTS.values()]
        command += [sys.executable, __file__, "--child", build, tree_name, str(calls)]
        # A fixed hash seed: with str hashes randomised per process, dict probing (insertions,
        # lookups) executes a different number of instructions in each run.
        env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
        subprocess.run(command, check=True, capture_output=True, env=env)
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    totals = {}
    for op, entry in ENTRY_POINTS.items():
        # Inclusive cost lines read "1,234,567 (12.34%)  file:function"; the .cold clone and
        # the main body are listed apart, and the main body's line holds the call's total.
        costs = [
            int(m.group(1).replace(",", ""))
            for line in report.splitlines()
            if entry in line
            and "[clone .cold]" not in line
            and (m := re.match(r"\s*([\d,]+)\s", line))
        ]
        if not costs:
            raise RuntimeError(f"no cost found for {entry}: is the build stripped?")
        totals[op] = max(costs)
    return totals


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2], int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="directory of the base build's fastree package")
    parser.add_argument("--trees", default=",".join(DEFAULT_TREES))
    parser.add_argument("--calls", type=int, default=100, help="calls per op (default 100)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        parser.error("needs valgrind and callgrind_annotate on PATH")

    print(f"B = the installed fastree, A = {args.base}; B / A instructions per call")
    print(f"{'tree':<20} " + " ".join(f"{op:>17}" for op in ENTRY_POINTS))
    for name in (t for t in args.trees.split(",") if t):
        a = count(str(args.base), name, args.calls)
        b = count("-", name, args.calls)
        print(f"{name:<20} " + " ".join(f"{b[op] / a[op]:>17.3f}" for op in ENTRY_POINTS))
        print(f"{'  (A per call)':<20} " + " ".join(f"{a[op]:>17,.0f}" for op in ENTRY_POINTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
