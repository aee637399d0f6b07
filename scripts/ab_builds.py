"""A/B of two fastree builds in one process, on the benchmark suite's builtin trees.

Speed claims between builds ("no op slower than 3%") need both builds timed side by side: runs in
separate processes on a shared 2-core machine drift by more than that. This loads the installed
(or editable) ``fastree`` as B, and a second build, given as the directory of its ``fastree``
package (Python files plus its compiled ``_core``), as A under the name ``fastree_base``. The
package imports itself only relatively, and each copy of ``_core`` is its own shared object with
its own globals, so the two coexist.

Each (tree, op) is timed interleaved, the build timed first alternating per repeat (A B, B A,
A B, ...: whichever runs second finds the caches warmed by the other), min over repeats, and the
ratio B / A is reported; below 1 means B is faster.

``--aa`` times the current build against a copy of itself: the ratios it reports are the
method's own noise on this machine (code and data placement, the tree objects each build gets),
the resolution any A/B claim has to be read against. The suite's trees with registered custom nodes are left out:
a type can be registered with JAX only once, so one build would see them through JAX's registry
and the other through its own, which times different code. Their kinds are covered by the
``custom-*`` trees below instead: each build registers its own freshly made classes (same code,
distinct class objects) and is timed on its own copy of the tree, over the same leaves.

To make a base build of an old commit::

    git worktree add /tmp/base 83d042d && pip wheel --no-deps -w /tmp/base-wheel /tmp/base
    unzip -q /tmp/base-wheel/fastree-*.whl -d /tmp/base-site
    python scripts/ab_builds.py /tmp/base-site/fastree

Usage: ``python scripts/ab_builds.py (BASE_PACKAGE_DIR | --aa) [--trees t1,t2] [--repeats N]
[--json F]``
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.data import trees as bench_trees
from benchmarks.data.leaves import leaf_factory
from benchmarks.measure.timing import calibrate, time_loop

DEFAULT_TREES = (
    "tuple3",
    "mlp",
    "transformer-12",
    "transformer-50",
    "transformer-1000",
    "resnet50",
    "adam-state",
    "flat-100k",
    "dict-10k",
    "dict-10k-natural",
    "dict-10k-flax",
    "dict-10k-reversed",
    "dict-10k-nearly",
    "dict-10k-random",
    "deep-500",
    "custom-callbacks",
    "custom-dataclass",
)
# Trees of registered nodes, built per build (see the module docstring): name -> registration.
PER_BUILD_TREES = {"custom-callbacks": "callbacks", "custom-dataclass": "dataclass"}
TARGET_NS = 20_000_000  # per repeat and build


def load_base(package_dir: Path, core_file: Path | None = None) -> Any:
    """Imports the build in ``package_dir`` as ``fastree_base`` (copied to a temporary dir).

    ``core_file``: the compiled ``_core`` to use, where the package directory has none (an
    editable install keeps it in the build directory).
    """
    tmp = Path(tempfile.mkdtemp(prefix="fastree-ab-"))
    shutil.copytree(package_dir, tmp / "fastree_base")
    if core_file is not None:
        for stale in (tmp / "fastree_base").glob("_core.*"):
            if stale.suffix != ".pyi":
                stale.unlink()
        shutil.copy(core_file, tmp / "fastree_base" / core_file.name)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("fastree_base.tree_util")


def registered_model(tu: Any, how: str, leaf: Callable[[tuple[int, ...]], Any]) -> Any:
    """The suite's custom-nodes model (12 blocks of Linear/LayerNorm under a list) over classes
    made and registered here with ``tu`` alone: with flatten/unflatten callbacks
    (``how="callbacks"``) or as dataclasses with a static ``name`` (``how="dataclass"``)."""

    @dataclasses.dataclass
    class Linear:
        weight: Any
        bias: Any

    @dataclasses.dataclass
    class LayerNorm:
        scale: Any
        bias: Any

    @dataclasses.dataclass
    class Block:
        attention: Any
        mlp: Any
        norm: Any
        name: str

    if how == "dataclass":
        for cls in (Linear, LayerNorm):
            tu.register_dataclass(
                cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[]
            )
        tu.register_dataclass(Block, data_fields=["attention", "mlp", "norm"], meta_fields=["name"])
    else:
        tu.register_pytree_node(
            Linear, lambda n: ((n.weight, n.bias), None), lambda _, c: Linear(*c)
        )
        tu.register_pytree_node(
            LayerNorm, lambda n: ((n.scale, n.bias), None), lambda _, c: LayerNorm(*c)
        )
        tu.register_pytree_node(
            Block,
            lambda n: ((n.attention, n.mlp, n.norm), n.name),
            lambda name, c: Block(*c, name=name),
        )

    def linear(i: int) -> Any:
        return Linear(leaf_at(2 * i), leaf_at(2 * i + 1))

    # The same leaf objects for both builds' trees: leaf_at memoises them by position.
    def leaf_at(i: int) -> Any:
        if i not in _LEAVES:
            _LEAVES[i] = leaf((2,))
        return _LEAVES[i]

    blocks = [
        Block(
            attention=linear(3 * b + 1),
            mlp=linear(3 * b + 2),
            norm=LayerNorm(leaf_at(1000 + 2 * b), leaf_at(1001 + 2 * b)),
            name=f"block{b}",
        )
        for b in range(12)
    ]
    return [linear(0), *blocks]


_LEAVES: dict[int, Any] = {}


def tree_for(tu: Any, name: str, leaf: Callable[[tuple[int, ...]], Any]) -> Any:
    """The tree called ``name``: a suite recipe, or a PER_BUILD_TREES model registered with ``tu``."""
    if name in PER_BUILD_TREES:
        return registered_model(tu, PER_BUILD_TREES[name], leaf)
    return next(r for r in bench_trees.RECIPES if r.name == name).build(leaf)


def ops_for(tu: Any, tree: Any) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    leaves, treedef = tu.tree_flatten(tree)
    other = tu.tree_structure(tree)

    def ident(x: Any) -> Any:
        return x

    return {
        "flatten": (tu.tree_flatten, (tree,)),
        "leaves": (tu.tree_leaves, (tree,)),
        "structure": (tu.tree_structure, (tree,)),
        "unflatten": (tu.tree_unflatten, (treedef, leaves)),
        "flatten_up_to": (treedef.flatten_up_to, (tree,)),
        "tree_map": (tu.tree_map, (ident, tree)),
        "tree_map2": (tu.tree_map, (lambda x, y: x, tree, tree)),
        "flatten_with_path": (tu.tree_flatten_with_path, (tree,)),
        "treedef_eq": (treedef.__eq__, (other,)),
    }


def ab(tree: Any, base: Any, new: Any, repeats: int, tree_b: Any = None) -> dict[str, float]:
    """B / A time ratio per op for one tree (``tree_b``: B's own copy, where it needs one)."""
    a_ops, b_ops = ops_for(base, tree), ops_for(new, tree if tree_b is None else tree_b)
    ratios = {}
    for op, (fa, args_a) in a_ops.items():
        fb, args_b = b_ops[op]
        loops = calibrate(fa, args_a, TARGET_NS)
        best_a = best_b = None
        for repeat in range(repeats):
            if repeat % 2 == 0:
                ta = time_loop(fa, args_a, loops)
                tb = time_loop(fb, args_b, loops)
            else:
                tb = time_loop(fb, args_b, loops)
                ta = time_loop(fa, args_a, loops)
            best_a = ta if best_a is None else min(best_a, ta)
            best_b = tb if best_b is None else min(best_b, tb)
        ratios[op] = best_b / best_a
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "base", type=Path, nargs="?", help="directory of the base build's fastree package"
    )
    parser.add_argument(
        "--aa", action="store_true", help="A is a copy of the current build (the noise floor)"
    )
    parser.add_argument("--trees", default=",".join(DEFAULT_TREES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the ratios here")
    args = parser.parse_args(argv)
    if (args.base is None) == (not args.aa):
        parser.error("give either a base build's package directory or --aa")

    new = importlib.import_module("fastree.tree_util")
    if args.aa:
        core = Path(importlib.import_module("fastree._core").__file__)
        base = load_base(Path(new.__file__).parent, core)
    else:
        base = load_base(args.base)
    recipes = {r.name: r for r in bench_trees.RECIPES}
    leaf = leaf_factory("numpy", "cpu")
    wanted = [name for name in args.trees.split(",") if name]
    unknown = [name for name in wanted if name not in recipes and name not in PER_BUILD_TREES]
    if unknown:
        parser.error(f"unknown trees: {', '.join(unknown)}")

    gc.disable()  # as the benchmark suite times: collections are not the operation's cost
    results: dict[str, dict[str, float]] = {}
    print(f"B = {new.__name__} ({Path(new.__file__).parent}), A = {args.base}")
    print(f"{'tree':<20} " + " ".join(f"{op:>17}" for op in ops_for(new, ())))
    for name in wanted:
        tree_b = tree_for(new, name, leaf) if name in PER_BUILD_TREES else None
        results[name] = ab(tree_for(base, name, leaf), base, new, args.repeats, tree_b)
        print(f"{name:<20} " + " ".join(f"{r:>17.3f}" for r in results[name].values()))
    gc.enable()
    worst = max((r, f"{t}.{op}") for t, ops in results.items() for op, r in ops.items())
    print(f"slowest relative to A: {worst[1]} at {worst[0]:.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
