"""Checkpoint-style host work on a large tree: key paths, filtering by path, casting, rebuilding."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.data.trees import ScaleByAdamState, transformer_params
from benchmarks.workloads.base import Prepared, Workload


def build(layers: int) -> Prepared:
    import jax

    def leaf(shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, 0.5, np.float32)

    state = {
        "params": transformer_params(layers, leaf),
        "opt_state": ScaleByAdamState(
            count=np.zeros((), np.int32),
            mu=transformer_params(layers, leaf),
            nu=transformer_params(layers, leaf),
        ),
        "step": np.zeros((), np.int64),
    }

    def call() -> Any:
        return save_and_restore(state)

    leaves = len(jax.tree_util.tree_leaves(state))
    return Prepared(call, f"params + adam moments of {layers} layers, {leaves} numpy arrays")


def save_and_restore(state: Any) -> Any:
    """What a checkpointer does on the host around the bytes it writes, on one tree.

    Save: list every leaf under its key path string (a checkpoint's index), and cast the
    parameters, chosen by path, to float16. Restore into the live state as the target: every
    saved leaf cast back to its target's dtype, the tree rebuilt in the target's structure.
    """
    import jax

    tree_util = jax.tree_util  # looked up per call, so fastree.installed() routes these
    index = [tree_util.keystr(path) for path, _ in tree_util.tree_leaves_with_path(state)]
    saved = tree_util.tree_map_with_path(_to_half_if_param, state)
    restored = tree_util.tree_map(_cast_like, state, saved)
    return index, restored


def _to_half_if_param(path: Any, leaf: np.ndarray) -> np.ndarray:
    return leaf.astype(np.float16) if getattr(path[0], "key", None) == "params" else leaf


def _cast_like(target: np.ndarray, saved: np.ndarray) -> np.ndarray:
    return saved if saved.dtype == target.dtype else saved.astype(target.dtype)


WORKLOAD = Workload(
    name="checkpoint-paths",
    description="checkpoint-style save + restore on the host: `keystr` of every leaf's path "
    "(`tree_leaves_with_path`), parameters cast to float16 by path (`tree_map_with_path`, numpy "
    "`astype`), restored into the live tree's dtypes (`tree_map` over both trees)",
    why="No JAX dispatch at all: the tree walks are routed and are most of the call; what stays "
    "is numpy's astype on small arrays, the Python callbacks and keystr (JAX's, not routed: "
    "it formats one path), the same in both modes.",
    build=build,
    sizes={"tiny": 1, "quick": 200, "full": 1000},
)
