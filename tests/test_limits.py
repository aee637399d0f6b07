"""Limits: very deep, self-referencing, very wide and long-running input.

Deep and cyclic cases run in a fresh interpreter, so a crash (stack overflow) shows up as a failing
test instead of taking the session down. test_errors.py covers deep/cyclic lists and dicts; this
file adds every other node kind, deep treedefs that never came from a tree, and the memory
checks (scripts/limits.py, scripts/soak.py) at test size.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import run_script_results

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
# Set by scripts/run_sanitized_tests.sh: ASan's quarantine makes RSS grow without a leak.
no_rss_under_asan = pytest.mark.skipif(
    bool(os.environ.get("FASTREE_SANITIZED")), reason="RSS is meaningless under ASan"
)
DEPTH = 100_000
# Deep enough to be far past the recursion limit; not 100k, so that the linear-time operations
# on it stay well under a second each.
TREEDEF_DEPTH = 20_000

_DEEP_SCRIPT = textwrap.dedent(
    f"""
    import collections, dataclasses, pickle, sys
    from typing import Any, NamedTuple
    import fastree, fastree.tree_util as tu
    from fastree import _core

    class Node:
        def __init__(self, kid):
            self.kid = kid

    tu.register_pytree_node(Node, lambda n: ((n.kid,), None), lambda a, c: Node(*c))

    class NT(NamedTuple):
        kid: Any

    @dataclasses.dataclass
    class DC:
        kid: Any

    tu.register_dataclass(DC, data_fields=["kid"], meta_fields=[])

    class SelfFlattening:
        # A custom node whose flatten returns the node itself as its child.
        pass

    tu.register_pytree_node(SelfFlattening, lambda n: ((n,), None), lambda a, c: c[0])

    def nest(wrap, n={DEPTH}):
        x = 1
        for _ in range(n):
            x = wrap(x)
        return x

    trees = {{
        "tuple": nest(lambda x: (x,)),
        "custom": nest(Node),
        "namedtuple": nest(NT),
        "dataclass": nest(DC),
        "ordered_dict": nest(lambda x: collections.OrderedDict(k=x)),
        # Through a list: CPython 3.11's defaultdict dealloc has no trashcan, so freeing a
        # 100k-deep chain of bare defaultdicts overflows the C stack (CPython's crash, not ours).
        "defaultdict": nest(lambda x: collections.defaultdict(list, k=[x])),
        "mixed": nest(lambda x: [{{"k": (Node(x),)}}], {DEPTH} // 4),
    }}
    cyc_custom = Node(None)
    cyc_custom.kid = cyc_custom
    cyc_od = collections.OrderedDict()
    cyc_od["self"] = cyc_od
    cyc_dc = DC(None)
    cyc_dc.kid = [cyc_dc]
    cyc_list_in_dict = {{"a": []}}
    cyc_list_in_dict["a"].append(cyc_list_in_dict)
    trees.update(
        cyclic_custom=cyc_custom,
        cyclic_ordered_dict=cyc_od,
        cyclic_dataclass=cyc_dc,
        cyclic_list_in_dict=cyc_list_in_dict,
        self_flattening=SelfFlattening(),
    )
    ops = {{
        "flatten": lambda t: tu.tree_flatten(t),
        "structure": lambda t: tu.tree_structure(t),
        "flatten_with_path": lambda t: tu.tree_flatten_with_path(t),
        "map": lambda t: tu.tree_map(lambda x: x, t),
        "is_leaf": lambda t: tu.tree_leaves(t, is_leaf=lambda x: False),
    }}

    def report(name, fn):
        try:
            fn()
            result = "ok"
        except BaseException as e:
            result = type(e).__name__
        print(f"{{name}}={{result}}", flush=True)  # flushed: a later crash hides nothing

    for tname, tree in trees.items():
        for oname, op in ops.items():
            report(f"tree:{{tname}}:{{oname}}", lambda: op(tree))

    # A {TREEDEF_DEPTH}-deep treedef built from its pickle state (no tree involved): every
    # method either works or raises RecursionError.
    state = (1, ((None, None, 0, -1),) + ((list, None, 1, -1),) * {TREEDEF_DEPTH})
    td = _core._treedef_from_state(state)
    shallow = tu.tree_structure([1])
    td_ops = {{
        "repr": lambda: repr(td),
        "hash": lambda: hash(td),
        "eq": lambda: td == _core._treedef_from_state(state),
        "ne_shallow": lambda: td == shallow,
        "unflatten": lambda: td.unflatten([1]),
        "flatten_up_to": lambda: td.flatten_up_to(td.unflatten([1])),
        "children": lambda: td.children(),
        "node_data": lambda: td.node_data(),
        "pickle": lambda: pickle.loads(pickle.dumps(td)),
        "to_jax": lambda: td.to_jax(),
        "walk": lambda: td.walk(lambda c, d: c, None, [1]),
        "compose": lambda: td.compose(shallow),
        "tuple": lambda: tu.treedef_tuple([td, td]),
    }}
    for oname, op in td_ops.items():
        report(f"treedef:{{oname}}", op)
    """
)

TREE_NAMES = [
    "tuple",
    "custom",
    "namedtuple",
    "dataclass",
    "ordered_dict",
    "defaultdict",
    "mixed",
    "cyclic_custom",
    "cyclic_ordered_dict",
    "cyclic_dataclass",
    "cyclic_list_in_dict",
    "self_flattening",
]
OP_NAMES = ["flatten", "structure", "flatten_with_path", "map", "is_leaf"]
TREEDEF_OPS = [
    "repr",
    "hash",
    "eq",
    "ne_shallow",
    "unflatten",
    "flatten_up_to",
    "children",
    "node_data",
    "pickle",
    "to_jax",
    "walk",
    "compose",
    "tuple",
]


@pytest.fixture(scope="module")
def deep_results():
    return run_script_results(_DEEP_SCRIPT)


@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("tree", TREE_NAMES)
def test_deep_or_cyclic_tree_raises_recursion_error(deep_results, tree, op):
    results, proc = deep_results
    key = f"tree:{tree}:{op}"
    assert key in results, f"interpreter died (rc={proc.returncode}): {proc.stderr[-2000:]}"
    assert results[key] == "RecursionError"


@pytest.mark.parametrize("op", TREEDEF_OPS)
def test_deep_treedef_works_or_raises_recursion_error(deep_results, op):
    results, proc = deep_results
    key = f"treedef:{op}"
    assert key in results, f"interpreter died (rc={proc.returncode}): {proc.stderr[-2000:]}"
    assert results[key] in ("ok", "RecursionError")


def test_deep_interpreter_exits_cleanly(deep_results):
    _, proc = deep_results
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_compose_is_linear():
    """compose() copies each node once. Linear, this takes ~2 ms; with the node vector regrown
    by an exact reserve() per copied range (quadratic) it took ~2 s."""
    import time

    import fastree.tree_util as tu

    wide = tu.tree_structure([0] * 20_000)
    inner = tu.tree_structure((1, 2))
    start = time.perf_counter()
    composed = wide.compose(inner)
    elapsed = time.perf_counter() - start
    assert composed.num_leaves == 40_000
    assert elapsed < 0.5, f"compose of a 20k-leaf treedef took {elapsed:.2f} s"


# ------------------------------------------------------------------------------------------------
# Wide trees: memory proportional to the tree (scripts/limits.py at 1M leaves).


@no_rss_under_asan
def test_million_leaves_memory_and_round_trip():
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "limits.py"), "--leaves", "1000000", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["round_trip_ok"]
    assert report["treedef_nodes"] == 1_000_001
    # A Node record is ~56 bytes; allow for vector growth slack and allocator rounding.
    assert report["treedef_bytes_per_node"] < 200, report
    # The leaves list (8 bytes a leaf) plus the treedef.
    assert report["flatten"]["bytes_per_leaf"] < 300, report
    assert report["map"]["bytes_per_leaf"] < 300, report
    assert report["unflatten"]["bytes_per_leaf"] < 300, report


# ------------------------------------------------------------------------------------------------
# Soak: a short run of scripts/soak.py (the 1M-cycle numbers are in docs/reliability.md).


@no_rss_under_asan
def test_soak_short_run_does_not_grow():
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "soak.py"), "--cycles", "20000", "--report-every", "5000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "growth after warm-up" in proc.stdout
