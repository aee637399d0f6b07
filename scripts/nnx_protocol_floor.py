"""How close can any implementation of flax's nodes get to the nnx floor workloads' floor?

The suite's ``nnx-floor-*`` rows (benchmarks/workloads/nnx_floor.py) time ``jax.tree_util`` and
``jax.jit`` on flax's ``(model, optimizer)`` against its builtin twin: the same leaves in tuples
and dicts, or in one list. Those calls stay jaxlib's (they hand out jaxlib treedefs), so every flax
node, served natively or not, goes through jaxlib's custom-node protocol: one call of the node's
flatten per node, the ``(children, aux)`` pair it returns, and one call of its unflatten per node
when rebuilding. This script measures that protocol on its own, by putting in place of every
custom node a stand-in whose functions do nothing at all:

* flatten is ``operator.attrgetter("pair")``: a C call returning a pair stored on the stand-in in
  advance, so no allocation and no Python frame;
* unflatten is ``operator.is_``: a C call that builds nothing (the "tree" it gives back is bools).

No implementation of the nodes can be cheaper than the stand-ins. The script also counts the heap
blocks that one unflatten's result holds (``sys.getallocatedblocks``): the objects flax's nodes
are, against the twin's tuples and dicts.

    python scripts/nnx_protocol_floor.py                    # plain flax
    FASTREE_INSTALL=1 python scripts/nnx_protocol_floor.py  # with fastree installed

Run from the repository root (it imports ``benchmarks``). Best of 9 repeats per figure.
"""

from __future__ import annotations

import argparse
import gc
import operator
import os
import sys
import timeit
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Stand:
    """A custom node of no cost: its flatten returns ``pair``, made once in advance."""

    __slots__ = ("pair",)

    def __init__(self, children: list[Any], aux: Any) -> None:
        self.pair = (tuple(children), aux)


def stand_ins(tree: Any) -> Any:
    """``tree`` with every custom node replaced by a Stand around the same children and aux data
    (JAX's own one-level flatten of the node), builtin containers and leaves kept."""
    import jax

    from benchmarks.workloads.floor import mirror_containers

    def node(value: Any) -> Any | None:
        if value is None or type(value) in (list, tuple, dict):
            return None
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return None
        try:
            children, aux = jax.tree_util.flatten_one_level(value)
        except ValueError:  # a leaf
            return None
        return Stand([mirror_containers(child, node) for child in children], aux)

    return mirror_containers(tree, node)


def best_us(call: Any, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=9)) / number * 1e6


def blocks_held(make: Any) -> int:
    """Heap blocks held by what ``make()`` returns (made once before, so caches are warm)."""
    make()
    gc.collect()
    gc.disable()
    try:
        before = sys.getallocatedblocks()
        kept = make()
        after = sys.getallocatedblocks()
    finally:
        gc.enable()
    del kept
    return after - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=20, help="MLP blocks (the suite's: 20)")
    args = parser.parse_args()

    import jax

    from benchmarks.workloads.nnx_floor import _own_state, mirror

    jax.tree_util.register_pytree_node(Stand, operator.attrgetter("pair"), operator.is_)
    state = _own_state(args.depth)
    trees = {"nnx tree": (state.model, state.optimizer)}
    trees["stand-ins"] = stand_ins(trees["nnx tree"])
    trees["builtin twin"] = mirror(trees["nnx tree"])
    arrays = jax.tree_util.tree_leaves(trees["builtin twin"])
    noop = jax.jit(lambda tree: None)

    installed = os.environ.get("FASTREE_INSTALL") == "1"
    print(f"flax nnx (model, optimizer), {args.depth} blocks, "
          f"{'fastree installed' if installed else 'plain'}; "
          f"Python {sys.version.split()[0]}, jax {jax.__version__}")
    rows = {}
    for name, tree in trees.items():
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        noop(tree)
        rows[name] = (
            best_us(lambda: jax.tree_util.tree_flatten(tree), 200),
            best_us(lambda: treedef.unflatten(leaves), 200),
            best_us(lambda: noop(tree), 100),
            None if name == "stand-ins" else blocks_held(lambda: treedef.unflatten(leaves)),
            treedef.num_nodes,
        )
    noop(arrays)
    list_call = best_us(lambda: noop(arrays), 100)

    twin = rows["builtin twin"]
    print(f"{'':14s} {'nodes':>5s} {'flatten':>16s} {'unflatten':>16s} {'jit no-op call':>22s}"
          f" {'blocks':>7s}")
    for name, (flat, unflat, call, blocks, nodes) in rows.items():
        print(f"{name:14s} {nodes:5d} {flat:7.1f} us {flat / twin[0]:5.2f}x "
              f"{unflat:7.1f} us {unflat / twin[1]:5.2f}x {call:7.1f} us {call / list_call:5.2f}x"
              f" of list {'' if blocks is None else blocks:>7}")
    print(f"{'arrays, list':14s} {'':5s} {'':16s} {'':16s} {list_call:7.1f} us {1:5.2f}x of list")
    print("flatten and unflatten: x the builtin twin's; jit: x a jax.jit no-op on the arrays in a"
          " list; blocks: heap blocks one unflatten's result holds")


if __name__ == "__main__":
    main()
