"""Single tree operations on an equinox model, where fastree's library nodes apply.

Installed before equinox is imported, fastree makes every equinox Module class an attribute node
that JAX and fastree read in C (README, "Library nodes"). Each operation here is one workload of
the "equinox model" group, timed like the others: plain JAX in one process, ``python -m
fastree.run`` in another. The model is the equinox-filter-jit workload's (``equinox_jit``): 12
blocks of attention, MLP and two layer norms, an embedding and a linear head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from benchmarks.workloads.base import EQUINOX_MODEL, Prepared, Workload, require
from benchmarks.workloads.equinox_jit import TOKENS, VOCAB, _classes

SIZES = {"tiny": 1, "quick": 12, "full": 12}


@functools.cache
def _model(blocks: int) -> Any:
    require("equinox")
    import jax

    return _classes().Model(blocks, jax.random.key(0))


def _identity(x: Any) -> Any:
    return x


def _tree_op(make_call: Callable[[Any], Callable[[], Any]]) -> Callable[[int], Prepared]:
    def build(blocks: int) -> Prepared:
        import jax

        model = _model(blocks)
        leaves = len(jax.tree_util.tree_leaves(model))
        return Prepared(make_call(model), f"{blocks} blocks, {leaves} leaves")

    return build


def _flatten(model: Any) -> Callable[[], Any]:
    import jax

    return lambda: jax.tree_util.tree_flatten(model)[0]


def _leaves(model: Any) -> Callable[[], Any]:
    import jax

    return lambda: jax.tree_util.tree_leaves(model)


def _tree_map(model: Any) -> Callable[[], Any]:
    import jax

    return lambda: jax.tree_util.tree_map(_identity, model)


def _flatten_with_path(model: Any) -> Callable[[], Any]:
    import jax

    return lambda: [leaf for _path, leaf in jax.tree_util.tree_flatten_with_path(model)[0]]


def _unflatten(model: Any) -> Callable[[], Any]:
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(model)
    return lambda: jax.tree_util.tree_unflatten(treedef, leaves)


def _partition_combine(model: Any) -> Callable[[], Any]:
    import equinox as eqx

    return lambda: eqx.combine(*eqx.partition(model, eqx.is_array))


def _train_step(blocks: int) -> Prepared:
    eqx = require("equinox")
    optax = require("optax")
    import jax
    import jax.numpy as jnp

    model = _model(blocks)
    tokens = jnp.arange(TOKENS) % VOCAB
    optimiser = optax.adamw(1e-3)
    opt_state = optimiser.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model: Any, opt_state: Any) -> Any:
        def loss(m: Any) -> Any:
            return jnp.mean(m(tokens) ** 2)

        grads = eqx.filter_grad(loss)(model)
        updates, opt_state = optimiser.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state

    def call() -> Any:
        # The same step from the same state each time: pure, so every call does equal work.
        return jax.block_until_ready(step(model, opt_state))

    arrays = len(jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array)))
    return Prepared(call, f"{blocks} blocks, {arrays} arrays")


_WHY_TREE = (
    "Installed first, every Module class is an attribute node: JAX's own flatten calls its C "
    "functions instead of equinox's Python ones, and the routed functions read it in fastree's "
    "core."
)

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "eqx-tree_flatten",
        "`jax.tree_util.tree_flatten(model)` of an equinox Module transformer",
        _WHY_TREE + " tree_flatten itself stays JAX's (it returns a treedef).",
        _tree_op(_flatten),
        SIZES,
        EQUINOX_MODEL,
    ),
    Workload(
        "eqx-tree_leaves",
        "`jax.tree_util.tree_leaves(model)`",
        _WHY_TREE,
        _tree_op(_leaves),
        SIZES,
        EQUINOX_MODEL,
    ),
    Workload(
        "eqx-tree_map",
        "`jax.tree_util.tree_map(lambda x: x, model)`",
        _WHY_TREE,
        _tree_op(_tree_map),
        SIZES,
        EQUINOX_MODEL,
    ),
    Workload(
        "eqx-flatten_with_path",
        "`jax.tree_util.tree_flatten_with_path(model)`",
        _WHY_TREE + " It stays JAX's function (it returns a treedef).",
        _tree_op(_flatten_with_path),
        SIZES,
        EQUINOX_MODEL,
    ),
    Workload(
        "eqx-tree_unflatten",
        "`jax.tree_util.tree_unflatten(treedef, leaves)`",
        _WHY_TREE + " It stays JAX's function (it takes a treedef).",
        _tree_op(_unflatten),
        SIZES,
        EQUINOX_MODEL,
    ),
    Workload(
        "eqx-partition-combine",
        "`eqx.combine(*eqx.partition(model, eqx.is_array))`",
        "equinox's own Python around several tree_map / tree_flatten calls on the model.",
        _tree_op(_partition_combine),
        SIZES,
        EQUINOX_MODEL,
    ),
    Workload(
        "eqx-train-step",
        "one `eqx.filter_jit` training step: loss, `eqx.filter_grad`, `optax.adamw` update",
        "filter_jit partitions and flattens the model and optimizer state on every call; jit's "
        "dispatch and the compiled step take the rest.",
        _train_step,
        SIZES,
        EQUINOX_MODEL,
    ),
)
