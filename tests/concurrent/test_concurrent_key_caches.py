"""The key-entry caches filled from many threads at once (csrc/registry/keys.cpp;
docs/threads.md R11-R13).

* SequenceKey / FlattenedIndexKey entries below 2**17 sit in a fixed array of atomic slots, each
  filled once by compare-exchange (the thread that loses a slot releases its own entry). Every
  thread starts from fresh caches (the bridge installed again) and walks lists of its own
  lengths, so their blocks overlap: every key must be of its class with its index, and once the
  walks are over every thread gets the very same entry object per index.
* DictKey / GetAttrKey entries sit in a dict filled through the dict's own lock, an entry once in
  never replaced: the same checks, through dicts of few keys (made one by one) and of many (made
  in one block), and dataclass fields.
* The bridge installed again on one thread (fresh caches, the replaced ones kept alive on
  free-threaded builds, as JAX's registry and the hooks are) while the others walk with key
  paths: every walk's keys stay right.
"""

from __future__ import annotations

import dataclasses

import fastree.tree_util as tu
from concurrency_harness import THREADS, check, isolated, run_threads
from fastree.jax_interop import bridge as _jax_bridge


@tu.register_dataclass
@dataclasses.dataclass
class Fields:
    alpha: object
    beta: object


def _keys(tree):
    return [path for path, _ in tu.tree_leaves_with_path(tree)]


def _check_index_keys(keys, n, what):
    for i, (key,) in enumerate(keys):
        if type(key) is not tu.SequenceKey or key.idx != i:
            raise AssertionError(f"{what}: entry {i} is {key!r}")
    check(len(keys), n, f"{what}: count")


def _named_tree(k, many):
    names = [f"name{j}" for j in range(40 if many else 5)]
    return {name: Fields(k, [j]) for j, name in enumerate(names)}


def _expected_named(tree):
    return [
        (tu.DictKey(name), tu.GetAttrKey(field)) + rest
        for name in sorted(tree)
        for field, rest in (("alpha", ()), ("beta", (tu.SequenceKey(0),)))
    ]


def _fill_workload():
    _jax_bridge.install()  # fresh caches: every entry below is made during the threaded walks
    lengths = [300 + 700 * k for k in range(THREADS)]

    def work(k):
        # Each thread's lists reach past the blocks the others made, from its own start.
        for step in range(4):
            n = lengths[(k + step) % THREADS]
            _check_index_keys(_keys(list(range(n))), n, f"thread {k} list of {n}")
            tree = _named_tree(k, many=bool((k + step) % 2))
            check(_keys(tree), _expected_named(tree), f"thread {k} named keys")
        return True

    run_threads(work)
    # Filled once per slot: every thread now gets one and the same entry per index and name.
    longest = max(lengths)
    first = [_keys(list(range(longest)))] + [_keys(_named_tree(0, many=True))]

    def again(k):
        got = [_keys(list(range(longest)))] + [_keys(_named_tree(k, many=True))]
        for mine, theirs in zip(got, first):
            for a, b in zip(mine, theirs):
                if len(a) != len(b) or any(x is not y for x, y in zip(a, b)):
                    raise AssertionError(f"thread {k}: entries differ: {a!r} {b!r}")
        return True

    run_threads(again)


def test_key_caches_filled_from_many_threads():
    isolated(_fill_workload)


def _reinstall_workload():
    rounds = 25
    n = 5000

    def installer():
        for _ in range(rounds):
            _jax_bridge.install()
        return rounds

    def walker(k):
        for r in range(rounds):
            _check_index_keys(_keys(list(range(n + k))), n + k, f"thread {k} round {r}")
            tree = _named_tree(k, many=bool(r % 2))
            check(_keys(tree), _expected_named(tree), f"thread {k} round {r}: named keys")
        return rounds

    check(
        run_threads(lambda k: installer() if k == 0 else walker(k)),
        [rounds] * THREADS,
        "rounds",
    )


def test_bridge_installed_again_during_key_path_walks():
    isolated(_reinstall_workload)
