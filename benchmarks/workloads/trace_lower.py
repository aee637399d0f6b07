"""Tracing + lowering of a jitted train step on a large parameter tree, retraced on every call."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from benchmarks.data.trees import transformer_params
from benchmarks.workloads.base import Prepared, Workload


def build(layers: int) -> Prepared:
    import jax
    import jax.numpy as jnp

    params = transformer_params(layers, lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32))
    batch = jax.ShapeDtypeStruct((4,), jnp.float32)

    def call() -> Any:
        # A new function object each time: jax.jit caches traces per function, so this really
        # traces and lowers again, as a fresh process (or a changed closure) would.
        return jax.jit(_make_train_step()).lower(params, batch)

    def fingerprint(lowered: Any) -> str:
        return hashlib.sha256(lowered.as_text().encode()).hexdigest()

    leaves = len(jax.tree_util.tree_leaves(params))
    return Prepared(call, f"{layers} layers, {leaves} arrays", fingerprint=fingerprint)


def _make_train_step() -> Callable[[Any, Any], Any]:
    import jax
    import jax.numpy as jnp

    def loss(params: Any, batch: Any) -> Any:
        return sum(jnp.sum(p * p) for p in jax.tree.leaves(params)) * jnp.mean(batch)

    def train_step(params: Any, batch: Any) -> Any:
        grads = jax.grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    return train_step


WORKLOAD = Workload(
    name="jit-trace-lower",
    description="`jax.jit(train_step).lower(params, batch)` with a fresh train_step each call "
    "(grad of a loss over every leaf, then an SGD tree_map), abstract transformer parameters",
    why="Tracing runs the user's jax.tree.leaves / jax.tree.map (routed) once each, but JAX's "
    "own flattening of arguments, outputs and the grad's pytrees goes through jax._src.tree_util "
    "(not routed), and tracing, grad and lowering to StableHLO cost far more than any tree walk.",
    build=build,
    sizes={"tiny": 1, "quick": 12, "full": 50},
)
