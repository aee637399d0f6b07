"""What a quick run and a full run measure, and for how long.

Tree cases: every library once per round, in a loop of ``target_ns``; at least ``rounds.minimum``
rounds, then more until every ratio's interval is within ``rounds.tolerance`` (stats.py), up to
``rounds.maximum`` rounds or ``rounds.max_seconds`` per case. A quick run asks for +-5% and stops
at 11 rounds; a full run asks for +-2% and goes to 25. Either way each ratio is reported with the
interval it reached, so an imprecise figure says so instead of passing for a precise one.

End-to-end workloads: ``workload_rounds`` pairs of child processes (plain, installed), each child
timing every workload for ``workload_repeats`` loops of ``workload_target_ns`` after a warm-up and
reporting the fastest.
Their cost is the processes (imports, building, compiling: about 15 s a process on a busy 2-core
machine, with JAX's compilation cache shared between them), so a quick run takes 4 rounds, whose
interval (the rounds' whole range) covers the median with 87.5% confidence; a full run takes 9
(its second-smallest and second-largest ratios bound the median with 96% confidence).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.measure.timing import Rounds


@dataclass(frozen=True)
class Settings:
    mode: str
    """"quick" or "full"; recorded in results.json and the report."""
    target_ns: int
    """Each library's share of a round runs the call in a loop sized to take about this long."""
    rounds: Rounds
    """How many rounds a tree case gets."""
    memory_copies_nodes: int
    """The treedef-memory probe builds enough treedefs to hold about this many nodes in total."""
    memory_rounds: int
    """Memory probes per library, interleaved across libraries."""
    extra_leaf_kinds: dict[str, tuple[str, ...]]
    """Leaf kinds run on top of numpy for some trees when --leaves is not given."""
    workload_size: str
    """Which of each workload's sizes to build ("quick" or "full"; tests use "tiny")."""
    workload_rounds: int
    """Pairs of child processes (plain, installed) per workload."""
    workload_target_ns: int
    """Each workload repeat runs its call in a loop sized to take about this long."""
    workload_repeats: int
    """Timed repeats per workload in each child; the child reports the fastest."""


QUICK = Settings(
    mode="quick",
    target_ns=2_000_000,
    rounds=Rounds(minimum=5, maximum=11, tolerance=0.05, max_seconds=1.0),
    memory_copies_nodes=100_000,
    memory_rounds=3,
    extra_leaf_kinds={},
    workload_size="quick",
    workload_rounds=4,
    workload_target_ns=10_000_000,
    workload_repeats=5,
)

FULL = Settings(
    mode="full",
    target_ns=20_000_000,
    rounds=Rounds(minimum=7, maximum=25, tolerance=0.02, max_seconds=8.0),
    memory_copies_nodes=1_000_000,
    memory_rounds=5,
    # Training code mostly holds jax arrays; the transformer trees show if the leaf type matters.
    extra_leaf_kinds={
        "transformer-12": ("jax",),
        "transformer-50": ("jax",),
        "transformer-1000": ("jax",),
    },
    workload_size="full",
    workload_rounds=9,
    workload_target_ns=100_000_000,
    workload_repeats=5,
)


def settings_for(quick: bool) -> Settings:
    return QUICK if quick else FULL
