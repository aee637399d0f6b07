"""End-to-end workloads (issue 13): real program fragments timed plain and with fastree installed.

The tree benchmarks time one tree function at a time; these time what a user's program does, with
``fastree.installed()`` routing every ``jax.tree_util`` / ``jax.tree`` call in the process, to show
how much of a micro-benchmark gain survives once JAX dispatch, tracing and the libraries' own
Python are counted. One module per workload; ``run`` times them.
"""

from __future__ import annotations

from benchmarks.workloads import checkpoint, equinox_jit, nnx_train_step, optax_adamw, trace_lower
from benchmarks.workloads.base import Workload

WORKLOADS: tuple[Workload, ...] = (
    equinox_jit.WORKLOAD,
    optax_adamw.WORKLOAD,
    nnx_train_step.WORKLOAD,
    trace_lower.WORKLOAD,
    checkpoint.WORKLOAD,
)
WORKLOAD_OP = "workload"
"""The op name workloads answer to in ``--only``, e.g. ``--only 'workload/nnx*'``."""
