"""Scaling rows: time per child of one wide list, from 10**3 to 10**6 children.

Every operation must be linear in the tree at every size, past every internal cache (the key-path
entry cache holds 2**17 indices; past it, entries are made per walk). A linear operation keeps its
time per child flat along a row; an earlier, quadratic ``_nodes()`` made its row climb by ~10**5x
between 10**5 and 10**6 children. Each cell is the best of a few calls of the operation over
``[0.0] * n``, in microseconds per child; the last column is the largest size's time per child
over the smallest's. Past 2**17 children the key-path walks make their entries anew on every
call (JAX's key constructors, about 1 us each), so their time per child steps up once at the
cache's edge and is flat again after it (300,000 and 1,000,000 cost the same per child): linear,
with a larger constant.

    python -m benchmarks.scaling              # 10**3 .. 10**6 children, writes bench_out/scaling.md
    python -m benchmarks.scaling --max 100000 # a quicker run

The operations are fastree's own: the key-path walks (which make entries past the cache), the
treedef descriptions built on its node records (``_nodes()``, ``serialize()``, ``fingerprint()``)
and, for reference, plain ``tree_flatten``.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastree
import fastree.tree_util as tu

SIZES = (1_000, 10_000, 100_000, 300_000, 1_000_000)

# Each takes the tree, its treedef and a second, separately built treedef of the same structure.
OPERATIONS: dict[str, Callable[[list[float], Any, Any], Any]] = {
    "tree_flatten": lambda tree, _td, _other: tu.tree_flatten(tree),
    "tree_flatten_with_path": lambda tree, _td, _other: tu.tree_flatten_with_path(tree),
    "tree_map_with_path": lambda tree, _td, _other: tu.tree_map_with_path(lambda p, x: x, tree),
    "treedef._nodes()": lambda _tree, td, _other: td._nodes(),
    "treedef.serialize()": lambda _tree, td, _other: td.serialize(),
    "treedef.fingerprint()": lambda _tree, td, _other: td.fingerprint(),
    "structure_diff (equal trees)": lambda _tree, td, other: fastree.structure_diff(td, other),
}


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(sizes: tuple[int, ...], repeats: int) -> dict[str, list[float]]:
    """Operation name -> microseconds per child at each size."""
    rows: dict[str, list[float]] = {name: [] for name in OPERATIONS}
    for n in sizes:
        tree = [0.0] * n
        treedef, other = tu.tree_structure(tree), tu.tree_structure(list(tree))
        for name, op in OPERATIONS.items():
            seconds = _best_seconds(lambda op=op: op(tree, treedef, other), repeats)
            rows[name].append(seconds * 1e6 / n)
    return rows


def markdown(sizes: tuple[int, ...], rows: dict[str, list[float]]) -> str:
    head = " | ".join(f"{n:,}" for n in sizes)
    lines = [
        f"| operation (us per child) | {head} | largest / smallest |",
        "|---|" + "---:|" * (len(sizes) + 1),
    ]
    for name, cells in rows.items():
        body = " | ".join(f"{c:.3f}" for c in cells)
        lines.append(f"| {name} | {body} | {cells[-1] / cells[0]:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=SIZES[-1], help="largest list (children)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    args = parser.parse_args(argv)
    sizes = tuple(n for n in SIZES if n <= args.max)
    table = markdown(sizes, measure(sizes, args.repeats))
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.md").write_text(table)


if __name__ == "__main__":
    main()
