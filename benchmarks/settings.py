"""What a quick run and a full run measure, and for how long.

Tree cases: every library once per round, in a loop of ``target_ns``; at least ``rounds.minimum``
rounds, then more until every ratio's interval is within ``rounds.tolerance`` (stats.py), up to
``rounds.maximum`` rounds or ``rounds.max_seconds`` per case. A quick run asks for +-5% and stops
at 11 rounds; a full run asks for +-2% and goes to 25. Either way each ratio is reported with the
interval it reached, so an imprecise figure says so instead of passing for a precise one.

End-to-end workloads: ``workload_pairs`` pairs of child processes (plain, installed first) side
by side; in each pair both build every workload, then take turns timing it for
``workload_rounds`` rounds (each turn: the fastest of three loops of ``workload_target_ns / 3``).
The processes' start-up (imports, building, compiling: 10-40 s a process on a busy 2-core
machine, with JAX's compilation cache shared between them) is most of the cost, and the rounds
are cheap; a quick run takes 2 pairs x 5 rounds (10 ratios: an interval with 97.9% confidence),
a full run 3 pairs x 7 rounds.
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
    workload_pairs: int
    """Pairs of child processes (plain, installed first) started one after the other."""
    workload_rounds: int
    """Rounds per pair: each process times each workload once per round, taking turns."""
    workload_target_ns: int
    """Each process's turn in a round runs the call in loops totalling about this long."""


QUICK = Settings(
    mode="quick",
    target_ns=2_000_000,
    rounds=Rounds(minimum=5, maximum=11, tolerance=0.05, max_seconds=1.0),
    memory_copies_nodes=100_000,
    memory_rounds=3,
    extra_leaf_kinds={},
    workload_size="quick",
    workload_pairs=2,
    workload_rounds=5,
    workload_target_ns=10_000_000,
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
    workload_pairs=3,
    workload_rounds=7,
    workload_target_ns=50_000_000,
)


def settings_for(quick: bool) -> Settings:
    return QUICK if quick else FULL
