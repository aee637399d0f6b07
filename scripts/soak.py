"""Soak test: many flatten / map / unflatten cycles on a mixed tree, watching resident memory.

    python scripts/soak.py                     # 1,000,000 cycles
    python scripts/soak.py --cycles 20000 --report-every 5000

Every cycle flattens the tree (with and without key paths), maps it, unflattens it and compares
the rebuilt treedef with the original. Resident memory (RSS) is printed at the start, every
--report-every cycles and at the end. After a warm-up (the first --warmup fraction of the cycles,
where caches and allocator pools fill), RSS may grow by at most --max-growth-kib: more than that is
a leak, and the script exits 1.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import sys
import time
from typing import Any, NamedTuple

from _rss import rss_bytes  # sibling module: scripts run as `python scripts/<name>.py`


class Point(NamedTuple):
    x: Any
    y: Any


class Custom:
    def __init__(self, a, b, tag):
        self.a, self.b, self.tag = a, b, tag


@dataclasses.dataclass
class Params:
    w: Any
    b: Any
    name: str = "p"


def make_tree(tu) -> Any:
    tu.register_pytree_node(
        Custom,
        lambda c: ((c.a, c.b), c.tag),
        lambda tag, ch: Custom(*ch, tag),
        lambda c: (((tu.GetAttrKey("a"), c.a), (tu.GetAttrKey("b"), c.b)), c.tag),
    )
    tu.register_dataclass(Params, data_fields=["w", "b"], meta_fields=["name"])
    return {
        "layers": [Params(1.0, (2.0, None), name=f"l{i}") for i in range(3)],
        "point": Point(3, [4, 5]),
        "custom": Custom({"k": 6}, [7, (8,)], tag=("t", 1)),
        "ordered": collections.OrderedDict([("z", 9), ("a", [10, 11])]),
        "default": collections.defaultdict(list, {"q": 12, "p": Point(13, None)}),
        "strs": ("a", "b"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1_000_000)
    parser.add_argument("--report-every", type=int, default=100_000)
    parser.add_argument("--warmup", type=float, default=0.1, help="fraction of cycles")
    parser.add_argument("--max-growth-kib", type=int, default=1024)
    args = parser.parse_args(argv)

    import fastree.tree_util as tu

    tree = make_tree(tu)
    leaves, td = tu.tree_flatten(tree)
    warmup = max(1, int(args.cycles * args.warmup))
    kib = 1024
    start_rss = rss_bytes()
    print(f"start: RSS {start_rss / kib:,.0f} KiB, {args.cycles:,} cycles, {len(leaves)} leaves")
    t0 = time.perf_counter()
    baseline = None
    for i in range(1, args.cycles + 1):
        got_leaves, got_td = tu.tree_flatten(tree)
        tu.tree_flatten_with_path(tree)
        mapped = tu.tree_map(lambda x: x, tree)
        rebuilt = tu.tree_unflatten(got_td, got_leaves)
        if got_td != td or tu.tree_structure(mapped) != td or tu.tree_structure(rebuilt) != td:
            print(f"cycle {i}: structure changed", file=sys.stderr)
            return 2
        if i == warmup:
            gc.collect()
            baseline = rss_bytes()
            print(f"after warm-up ({i:,} cycles): RSS {baseline / kib:,.0f} KiB")
        if i % args.report_every == 0:
            print(f"cycle {i:>9,}: RSS {rss_bytes() / kib:,.0f} KiB", flush=True)
    elapsed = time.perf_counter() - t0
    gc.collect()
    end_rss = rss_bytes()
    growth = (end_rss - baseline) / kib
    print(
        f"end: RSS {end_rss / kib:,.0f} KiB; growth after warm-up {growth:+,.0f} KiB "
        f"(limit {args.max_growth_kib:,}); {elapsed:.1f} s, "
        f"{elapsed / args.cycles * 1e6:.1f} us/cycle"
    )
    if growth > args.max_growth_kib:
        print("FAIL: resident memory grew after warm-up (leak?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
