"""Thread rows: flatten, unflatten and map throughput with 1, 2, 4 and 8 threads (issue 45).

Each thread walks a private tree of its own (built in that thread: no object is shared, so no
container's lock is contended) for a fixed time, all threads started together at a barrier; a
cell is the calls per second of all threads together, the median of ``--repeats`` runs, with the
runs' range. On a free-threaded interpreter with the GIL off the threads can run at once, up to
the machine's cores (``os.cpu_count()`` is printed with the table: past it more threads only
share the cores); under the GIL a second thread adds nothing. fastree, JAX's own
``jax.tree_util`` and optree run the same calls on the same interpreter.

    python -m benchmarks.threads                        # 1, 2, 4, 8 threads; bench_out/threads.md
    python -m benchmarks.threads --threads 1 --json a.json   # one thread, kept for --compare
    python -m benchmarks.threads --compare gil.json ft.json  # per call: ft's speed over gil's

``--compare`` takes two ``--json`` files of the same calls (say one from CPython 3.13 with the
GIL, one from 3.13t without it) and gives, per library and call, the second's one-thread calls
per second over the first's: what running without the GIL costs a single thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

THREADS = (1, 2, 4, 8)


def make_tree(seed: int) -> dict[str, Any]:
    """A parameter-tree-like mix of dicts, lists, tuples and None: 100 modules, 1,000 leaves."""
    return {
        f"layer{i:03d}": {
            "w": [float(seed + i), float(i + 1)],
            "b": (float(i), None),
            "norm": {"scale": [float(i)] * 3, "bias": (float(i), float(i))},
            "extra": [None, (float(i),)],
        }
        for i in range(100)
    }


def _identity(x: Any) -> Any:
    return x


def libraries() -> dict[str, Any]:
    """Library name -> module with tree_flatten / tree_unflatten / tree_map (those importable)."""
    import fastree.tree_util as fastree_tu
    from fastree.jax_interop.compat import tree_util as jax_tu  # JAX's own, installed or not

    libs: dict[str, Any] = {"fastree": fastree_tu, "jax.tree_util": jax_tu}
    try:
        import optree
    except ImportError:
        pass
    else:
        libs["optree"] = optree
    return libs


def calls(lib: Any) -> dict[str, Callable[[dict[str, Any]], Callable[[], Any]]]:
    """Call name -> (tree -> the timed call over it), each prepared once per thread."""

    def flatten(tree: dict[str, Any]) -> Callable[[], Any]:
        return lambda: lib.tree_flatten(tree)

    def unflatten(tree: dict[str, Any]) -> Callable[[], Any]:
        leaves, treedef = lib.tree_flatten(tree)
        return lambda: lib.tree_unflatten(treedef, leaves)

    def tree_map(tree: dict[str, Any]) -> Callable[[], Any]:
        return lambda: lib.tree_map(_identity, tree)

    return {"flatten": flatten, "unflatten": unflatten, "map": tree_map}


def throughput(
    prepare: Callable[[dict[str, Any]], Callable[[], Any]], threads: int, seconds: float
) -> float:
    """Calls per second of `threads` threads together, each on its own tree, for `seconds`."""
    counts = [0] * threads
    errors: list[BaseException] = []
    ready = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(slot: int) -> None:
        try:
            call = prepare(make_tree(slot))  # built here: the tree is this thread's alone
            call()
        except BaseException as e:  # reported after the run, never lost
            errors.append(e)
            ready.abort()
            return
        try:
            ready.wait()
        except threading.BrokenBarrierError:  # another worker failed: the run is off
            return
        n = 0
        while not stop.is_set():
            call()
            call()
            n += 2
        counts[slot] = n

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


def measure(threads: tuple[int, ...], seconds: float, repeats: int) -> dict[str, Any]:
    """{"libraries": {lib: {call: {threads: [calls/s per run]}}}, plus the interpreter}."""
    results: dict[str, Any] = {}
    for lib_name, lib in libraries().items():
        for call_name, prepare in calls(lib).items():
            row = results.setdefault(lib_name, {}).setdefault(call_name, {})
            for n in threads:
                row[str(n)] = [throughput(prepare, n, seconds) for _ in range(repeats)]
    return {
        "python": sys.version.split()[0],
        "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "cpus": os.cpu_count(),
        "seconds": seconds,
        "libraries": results,
    }


def _cell(runs: list[float], base: float | None) -> str:
    median = statistics.median(runs)
    text = f"{median:,.0f} [{min(runs):,.0f}–{max(runs):,.0f}]"
    return text if base is None else f"{text} ({median / base:.2f}×)"


def markdown(data: dict[str, Any]) -> str:
    """One table per call: calls per second per library and thread count."""
    gil = "on" if data["gil_enabled"] else "off"
    kind = "free-threaded" if data["free_threaded"] else "GIL build"
    lines = [
        f"Python {data['python']} ({kind}, GIL {gil}), {data['cpus']} CPUs, "
        f"{data['seconds']} s per run; calls per second: median [range] "
        "(× the same library's one-thread median)",
        "",
    ]
    libs = data["libraries"]
    call_names = next(iter(libs.values())).keys()
    for call_name in call_names:
        counts = list(next(iter(libs.values()))[call_name])
        lines.append(f"| {call_name} | " + " | ".join(f"{n} threads" for n in counts) + " |")
        lines.append("|---|" + "---:|" * len(counts))
        for lib_name, rows in libs.items():
            row = rows[call_name]
            base = statistics.median(row["1"]) if "1" in row else None
            cells = [_cell(row[n], None if n == "1" else base) for n in counts]
            lines.append(f"| {lib_name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def compare(first: dict[str, Any], second: dict[str, Any]) -> str:
    """Per library and call: the second run's one-thread calls per second over the first's."""

    def label(d: dict[str, Any]) -> str:
        return f"{d['python']} {'free-threaded' if d['free_threaded'] else 'GIL build'}"

    lines = [
        f"One thread: {label(second)} over {label(first)} (calls per second, medians; "
        "below 1: slower)",
        "",
        "| library | " + " | ".join(next(iter(first["libraries"].values())).keys()) + " |",
        "|---|" + "---:|" * len(next(iter(first["libraries"].values()))),
    ]
    for lib_name, rows in first["libraries"].items():
        other = second["libraries"].get(lib_name)
        if other is None:
            continue
        cells = [
            f"{statistics.median(other[c]['1']) / statistics.median(rows[c]['1']):.2f}"
            for c in rows
        ]
        lines.append(f"| {lib_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", default=",".join(map(str, THREADS)), help="comma-separated thread counts"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the raw runs here")
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("FIRST", "SECOND"))
    args = parser.parse_args(argv)
    if args.compare:
        first, second = (json.loads(p.read_text()) for p in args.compare)
        print(compare(first, second))
        return
    threads = tuple(int(n) for n in args.threads.split(","))
    data = measure(threads, args.seconds, args.repeats)
    table = markdown(data)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "threads.md").write_text(table)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
