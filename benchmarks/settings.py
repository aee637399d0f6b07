"""What a quick run and a full run measure, and for how long.

Budget reasoning (2 cores): a full run is 16 tree/leaf combinations x 13 ops plus 5 dict-order
variants x 10 ops, x 4 libraries ~ 1,030 timed cells. At 11 repeats of ~40 ms plus calibration
that is ~0.55 s per cell, ~9.5 minutes, plus dm-tree's slow calls on the big trees, ~1 minute of
memory probes and ~1 minute of workloads: measured 591 s with the machine also busy elsewhere.
A quick run uses ~2 ms repeats and 3 of them, which keeps the whole run (imports, tree building,
the 16k-leaf and 100k-leaf trees and the workloads included) near a minute: 63 s measured.

The end-to-end workloads cost mostly their set-up (importing equinox and flax, building models,
compiling: ~15 s together) plus a warm-up and a calibration call per mode; each of their calls
takes 0.5-450 ms, so repeats are few. A full run times them at larger sizes where that matters
(workloads/*.py say which) and with more repeats, because their ratios sit near 1: quick-mode
workload ratios move by +-0.2 between runs on a shared 2-core machine, full-run ones far less.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    mode: str
    """"quick" or "full"; recorded in results.json and the report."""
    target_ns: int
    """Each repeat runs the call in a loop sized to take about this long."""
    repeats: int
    """Timed repeats per library per case; median and min are reported."""
    memory_copies_nodes: int
    """The treedef-memory probe builds enough treedefs to hold about this many nodes in total."""
    memory_rounds: int
    """Memory probes per library (median reported), interleaved across libraries."""
    extra_leaf_kinds: dict[str, tuple[str, ...]]
    """Leaf kinds run on top of numpy for some trees when --leaves is not given."""
    workload_size: str
    """Which of each workload's sizes to build ("quick" or "full"; tests use "tiny")."""
    workload_target_ns: int
    """Each workload repeat runs its call in a loop sized to take about this long."""
    workload_repeats: int
    """Timed repeats per mode (plain, installed) per workload, interleaved."""


QUICK = Settings(
    mode="quick",
    target_ns=2_000_000,
    repeats=3,
    memory_copies_nodes=100_000,
    memory_rounds=1,
    extra_leaf_kinds={},
    workload_size="quick",
    workload_target_ns=20_000_000,
    workload_repeats=7,
)

FULL = Settings(
    mode="full",
    target_ns=40_000_000,
    repeats=11,
    memory_copies_nodes=1_000_000,
    memory_rounds=3,
    # Training code mostly holds jax arrays; the transformer trees show if the leaf type matters.
    extra_leaf_kinds={
        "transformer-12": ("jax",),
        "transformer-50": ("jax",),
        "transformer-1000": ("jax",),
    },
    workload_size="full",
    workload_target_ns=200_000_000,
    workload_repeats=11,
)


def settings_for(quick: bool) -> Settings:
    return QUICK if quick else FULL
