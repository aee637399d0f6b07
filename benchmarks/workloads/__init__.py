"""End-to-end workloads: program fragments timed plain and with fastree installed first.

The tree benchmarks time one tree function at a time; these time what a user's program does, with
every ``jax.tree_util`` / ``jax.tree`` call in the process routed to fastree, to show how much of
a micro-benchmark gain survives once JAX dispatch, tracing and the libraries' own Python are
counted, and what library nodes do for an equinox model. One module per workload (``equinox_ops``:
one per operation on the equinox model; ``nnx_floor``, ``equinox_floor``: a library's tree against
its builtin-shape twin, ``floor``; ``nnx_decode``: a decode step of a model of ~1,200 Variables,
jitted three ways, each against the same step on its arrays in a list);
``benchmarks.measure.workloads`` times them.
"""

from __future__ import annotations

from benchmarks.workloads import (
    checkpoint,
    equinox_floor,
    equinox_jit,
    equinox_ops,
    nnx_decode,
    nnx_floor,
    nnx_ops,
    nnx_train_step,
    optax_adamw,
    trace_lower,
)
from benchmarks.workloads.base import Workload

WORKLOADS: tuple[Workload, ...] = (
    equinox_jit.WORKLOAD,
    optax_adamw.WORKLOAD,
    nnx_train_step.WORKLOAD,
    trace_lower.WORKLOAD,
    checkpoint.WORKLOAD,
    *equinox_ops.WORKLOADS,
    *nnx_ops.WORKLOADS,
    # Last: the floor rows have a table of their own, after the others.
    *nnx_floor.WORKLOADS,
    *nnx_decode.WORKLOADS,
    *equinox_floor.WORKLOADS,
)
WORKLOAD_OP = "workload"
"""The op name workloads answer to in ``--only``, e.g. ``--only 'workload/nnx*'``."""
