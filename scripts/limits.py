"""Memory and time of flatten / map / unflatten on one very wide tree.

    python scripts/limits.py                  # 10M leaves ([0.0] * 10_000_000)
    python scripts/limits.py --leaves 1000000 --json

Reports, per operation, wall time and the growth of resident memory (RSS) it causes, and the
treedef's size per node (RSS growth of tree_structure divided by the node count). RSS is read from
/proc/self/statm (Linux), else from psutil. Exits non-zero if the leaves do not round-trip.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from _rss import rss_bytes  # sibling module: scripts run as `python scripts/<name>.py`


def measure(fn):
    """(result, seconds, RSS growth in bytes) of one call."""
    gc.collect()
    before = rss_bytes()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    return result, seconds, rss_bytes() - before


def run(n: int) -> dict:
    import fastree.tree_util as tu

    tree = [0.0] * n  # one float object, n references: the input itself costs 8 bytes a leaf
    report: dict = {"leaves": n}

    td, t, grow = measure(lambda: tu.tree_structure(tree))
    report["structure"] = {"seconds": t, "rss_growth": grow}
    report["treedef_nodes"] = td.num_nodes
    report["treedef_bytes_per_node"] = grow / td.num_nodes
    del td

    (leaves, td), t, grow = measure(lambda: tu.tree_flatten(tree))
    report["flatten"] = {"seconds": t, "rss_growth": grow, "bytes_per_leaf": grow / n}

    mapped, t, grow = measure(lambda: tu.tree_map(lambda x: x, tree))
    report["map"] = {"seconds": t, "rss_growth": grow, "bytes_per_leaf": grow / n}
    ok_map = len(mapped) == n and mapped[0] == 0.0 and mapped[-1] == 0.0
    del mapped

    rebuilt, t, grow = measure(lambda: tu.tree_unflatten(td, leaves))
    report["unflatten"] = {"seconds": t, "rss_growth": grow, "bytes_per_leaf": grow / n}
    report["round_trip_ok"] = bool(ok_map and rebuilt == tree and tu.tree_leaves(rebuilt) == leaves)
    del rebuilt, leaves, td
    gc.collect()
    report["rss_end"] = rss_bytes()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=10_000_000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = run(args.leaves)
    if args.json:
        print(json.dumps(report))
    else:
        mib = 1 << 20
        print(f"leaves: {report['leaves']:,}   treedef nodes: {report['treedef_nodes']:,}")
        print(f"treedef size: {report['treedef_bytes_per_node']:.1f} bytes/node (RSS growth)")
        for op in ("structure", "flatten", "map", "unflatten"):
            r = report[op]
            print(f"{op:>10}: {r['seconds']:7.3f} s   RSS +{r['rss_growth'] / mib:8.1f} MiB")
        print(f"round trip: {'ok' if report['round_trip_ok'] else 'FAILED'}")
    return 0 if report["round_trip_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
