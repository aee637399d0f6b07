"""Registrations on many threads while the others flatten.

Each registration drops the per-type memo (csrc/registry/registry.h: the table and the
two-way slots read on every leaf), so walks on other threads keep going back to the slow
classification while new records are added. Every thread registers classes of its own
(register_pytree_node, register_dataclass, register_pytree_with_keys) and uses each at once;
between registrations it flattens the shared trees, whose answers must not change.
"""

from __future__ import annotations

import dataclasses

import fastree.tree_util as tu
from concurrency_harness import check, isolated, run_threads
from concurrency_trees import SHARED, results_of

ROUNDS = 40  # registrations per thread, three kinds each
EXPECTED_PATHS = [
    "['p'][<flat index 0>]",
    "['p'][<flat index 1>][0]",
    "['p'][<flat index 1>][1].x[0]",
    "['p'][<flat index 1>][1].x[1]",
    "['w'].v['r']",
]


def _new_classes(k: int, r: int):
    """Three new classes, registered three ways, and a tree using them."""

    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def __eq__(self, other):
            return type(other) is type(self) and (self.a, self.b) == (other.a, other.b)

    tu.register_pytree_node(Pair, lambda p: ((p.a, p.b), "pair"), lambda _, c: Pair(*c))

    @tu.register_dataclass
    @dataclasses.dataclass
    class Data:
        x: object
        tag: str = dataclasses.field(default="t", metadata={"static": True})

    class WithKeys:
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            return type(other) is type(self) and self.v == other.v

    tu.register_pytree_with_keys(
        WithKeys,
        lambda w: (((tu.GetAttrKey("v"), w.v),), None),
        lambda _, c: WithKeys(*c),
    )
    tree = {"p": Pair(k, [r, Data((k, r), tag=f"t{k}")]), "w": WithKeys({"r": r})}
    return (Pair, Data, WithKeys), tree


def _registration_workload():
    expected_shared = [results_of(t) for t in SHARED]

    def work(k):
        made = []
        for r in range(ROUNDS):
            classes, tree = _new_classes(k, r)
            made.append(classes)
            # The new types are nodes at once, in this thread.
            leaves, td = tu.tree_flatten(tree)
            check(leaves, [k, r, k, r, r], f"thread {k} round {r}: leaves")
            check(td.num_nodes, 12, f"thread {k} round {r}: nodes")
            check(tu.tree_unflatten(td, leaves), tree, f"thread {k} round {r}: unflatten")
            paths = [tu.keystr(p) for p, _ in tu.tree_leaves_with_path(tree)]
            check(paths, EXPECTED_PATHS, f"thread {k} round {r}: paths")
            # The shared trees, classified again after the memo was dropped.
            j = (k + r) % len(SHARED)
            got = results_of(SHARED[j])
            for name, value in expected_shared[j].items():
                check(got[name], value, f"thread {k} round {r}: shared tree {j}: {name}")
        return made

    made = run_threads(work)
    # Every thread's types are nodes for every thread now.
    for classes in (c for per_thread in made for c in per_thread):
        pair, data, with_keys = classes
        check(tu.tree_leaves([pair(1, 2), data(3), with_keys(4)]), [1, 2, 3, 4], "afterwards")


def test_registrations_while_flattening():
    isolated(_registration_workload)
