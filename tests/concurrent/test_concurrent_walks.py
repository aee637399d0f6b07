"""Walks on many threads at once: each result equals the single-threaded one, exactly.

Every thread runs tree_flatten, tree_unflatten, tree_map, tree_leaves_with_path and
tree_structure, many times, over trees of every node kind (dict, list, tuple, None,
namedtuples, OrderedDict/defaultdict, custom nodes with and without keys, register_dataclass
types): trees shared by all threads, and trees each thread builds for itself. The walks take
their scratch vectors from pools, classify through the per-type memo and, with paths, take key
entries from the caches: the state docs/threads.md lists as per-thread (W1, R6, R14, R15).

tests/test_threads.py runs whole rounds of operations for a fixed time while types are
registered; here every step is compared on its own, threads start together at a barrier, and the
iteration counts are fixed.
"""

from __future__ import annotations

import pickle

import fastree.tree_util as tu
from concurrency_harness import THREADS, check, isolated, run_threads
from concurrency_trees import SHARED, make_tree, results_of

ITERATIONS = 200


def _compare(tree, expected: dict, what: str) -> None:
    got = results_of(tree)
    for name, value in expected.items():
        check(got[name], value, f"{what}: {name}")


def _shared_and_own_trees_workload():
    expected_shared = [results_of(t) for t in SHARED]
    expected_own = [results_of(make_tree(k)) for k in range(THREADS)]

    def work(k):
        for i in range(ITERATIONS):
            j = (k + i) % len(SHARED)
            _compare(SHARED[j], expected_shared[j], f"shared tree {j}")
            # Built in the thread: its objects (and the classes' memo entries) are new to it.
            _compare(make_tree(k), expected_own[k], f"thread {k}'s tree")
        return ITERATIONS

    assert run_threads(work) == [ITERATIONS] * THREADS


def test_shared_and_per_thread_trees():
    isolated(_shared_and_own_trees_workload)


def _treedef_workload():
    # Fresh treedefs that no thread has hashed yet: their hash is computed (and memoised in the
    # object) by whichever threads get there first, at once.
    rounds = 40
    fresh = [[tu.tree_structure(make_tree(k)) for k in range(THREADS)] for _ in range(rounds)]
    expected = [tu.tree_structure(make_tree(k)) for k in range(THREADS)]
    expected_hash = [hash(td) for td in expected]
    expected_pickle = [pickle.dumps(td) for td in expected]

    def work(k):
        for r in range(rounds):
            for j in range(THREADS):
                j = (j + k) % THREADS
                td = fresh[r][j]
                check(hash(td), expected_hash[j], f"hash of treedef {j}")
                check(td == expected[j], True, f"treedef {j} == its equal")
                check(td != expected[(j + 1) % THREADS], True, f"treedef {j} != another")
                check(pickle.dumps(td), expected_pickle[j], f"pickle of treedef {j}")
                back = pickle.loads(expected_pickle[j])
                check(back == td and hash(back) == expected_hash[j], True, f"unpickled {j}")
        return rounds

    assert run_threads(work) == [rounds] * THREADS


def test_treedef_hash_eq_pickle():
    isolated(_treedef_workload)
