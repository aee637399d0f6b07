"""optax: one adamw update applied outside jit (eagerly) to a transformer parameter tree."""

from __future__ import annotations

from typing import Any

from benchmarks.data.trees import transformer_params
from benchmarks.workloads.base import Prepared, Workload, require


def build(layers: int) -> Prepared:
    optax = require("optax")
    import jax
    import jax.numpy as jnp

    params = transformer_params(layers, lambda shape: jnp.full(shape, 0.5, jnp.float32))
    grads = jax.tree_util.tree_map(lambda p: jnp.full(p.shape, 0.1, p.dtype), params)
    optimizer = optax.adamw(1e-3)
    state = optimizer.init(params)

    def call() -> Any:
        # The same update from the same state each time: pure, so every call does equal work.
        updates, new_state = optimizer.update(grads, state, params)
        return jax.block_until_ready((optax.apply_updates(params, updates), new_state))

    leaves = len(jax.tree_util.tree_leaves(params))
    return Prepared(call, f"{layers} layers, {leaves} arrays")


WORKLOAD = Workload(
    name="optax-adamw-eager",
    description="`optax.adamw(1e-3).update(grads, state, params)` + `optax.apply_updates`, "
    "not jitted, on transformer parameters",
    why="optax runs about a dozen jax.tree.map calls per update (routed), but outside jit each "
    "leaf of each map dispatches one or more XLA ops at microseconds apiece: the tree walks are a "
    "few percent of the call.",
    build=build,
    sizes={"tiny": 1, "quick": 12, "full": 50},
)
