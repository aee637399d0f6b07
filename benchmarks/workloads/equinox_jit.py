"""equinox: per-call host time of an ``eqx.filter_jit``-ed forward pass of a Module transformer."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from benchmarks.workloads.base import Prepared, Workload, require

DIM = 8
VOCAB = 16
TOKENS = 4


def build(blocks: int) -> Prepared:
    eqx = require("equinox")
    import jax
    import jax.numpy as jnp

    model = _classes().Model(blocks, jax.random.key(0))
    forward = eqx.filter_jit(_forward)
    tokens = jnp.arange(TOKENS) % VOCAB

    def call() -> Any:
        # Waiting for the result keeps the dispatch queue from growing between calls; the
        # computation itself (4 tokens of width 8) is a few microseconds.
        return jax.block_until_ready(forward(model, tokens))

    arrays = len(jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array)))
    return Prepared(call, f"{blocks} blocks, {arrays} arrays")


def _forward(model: Any, tokens: Any) -> Any:
    return model(tokens)


@functools.cache
def _classes() -> SimpleNamespace:
    """Module classes, defined once on first use (equinox is imported only when needed)."""
    import equinox as eqx
    import jax

    class Block(eqx.Module):
        attention: eqx.nn.MultiheadAttention
        mlp: eqx.nn.MLP
        norm1: eqx.nn.LayerNorm
        norm2: eqx.nn.LayerNorm

        def __init__(self, key: Any) -> None:
            k1, k2 = jax.random.split(key)
            self.attention = eqx.nn.MultiheadAttention(2, DIM, key=k1)
            self.mlp = eqx.nn.MLP(DIM, DIM, 2 * DIM, 1, key=k2)
            self.norm1 = eqx.nn.LayerNorm(DIM)
            self.norm2 = eqx.nn.LayerNorm(DIM)

        def __call__(self, x: Any) -> Any:
            y = jax.vmap(self.norm1)(x)
            x = x + self.attention(y, y, y)
            return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))

    class Model(eqx.Module):
        embed: eqx.nn.Embedding
        blocks: tuple[Block, ...]
        head: eqx.nn.Linear

        def __init__(self, num_blocks: int, key: Any) -> None:
            keys = jax.random.split(key, num_blocks + 2)
            self.embed = eqx.nn.Embedding(VOCAB, DIM, key=keys[0])
            self.blocks = tuple(Block(k) for k in keys[1:-1])
            self.head = eqx.nn.Linear(DIM, VOCAB, key=keys[-1])

        def __call__(self, tokens: Any) -> Any:
            x = jax.vmap(self.embed)(tokens)
            for block in self.blocks:
                x = block(x)
            return jax.vmap(self.head)(x)

    return SimpleNamespace(Model=Model)


WORKLOAD = Workload(
    name="equinox-filter-jit",
    description="`eqx.filter_jit(model)(tokens)` of an equinox Module transformer (attention, "
    "MLP, layer norms), compiled once, timed per call",
    why="Each call equinox partitions the model into arrays and static parts and flattens the "
    "arguments, then jax.jit's C++ dispatch flattens them again and runs the executable. "
    "Installed first, every Module class is an attribute node, so both flattens read the model "
    "in C instead of calling equinox's Python flatten per module; jit's dispatch and equinox's "
    "own Python stay.",
    build=build,
    sizes={"tiny": 1, "quick": 12, "full": 12},
)
