"""Key-path walks over containers wider than the key caches, on many threads at once.

csrc/registry/keys.cpp caches SequenceKey/FlattenedIndexKey entries for indices below 2**17 and
DictKey/GetAttrKey entries for up to 65536 names; entries past those are made per walk and kept
only while a key-path walk is running (KeysWalkState in csrc/registry/registry_state.h: per
thread on free-threaded builds). Here threads walk a list, a dict and a custom node wider than
that, and walks nested in a custom node's flatten function (a walk inside a walk, in one
thread: the inner walk's end must not release what the outer one still reads), while other
threads' walks begin and end.
"""

from __future__ import annotations

import fastree.tree_util as tu
from concurrency_harness import THREADS, check, isolated, run_threads

INDEX_CACHE = 1 << 17  # keys.cpp: kIndexCacheSize
NAME_CACHE = 65536  # keys.cpp: kStrCacheSize
PAST = 2500  # entries past each cache

WIDE_LIST = list(range(INDEX_CACHE + PAST))
# More names than the cache holds: whatever else the process cached, PAST of these at least are
# made per walk.
WIDE_DICT = {f"wide{i:06d}": i for i in range(NAME_CACHE + PAST)}


class Flat:
    """A custom node without keys: its children's entries are FlattenedIndexKey."""

    def __init__(self, items):
        self.items = items


tu.register_pytree_node(Flat, lambda f: (f.items, None), lambda _, items: Flat(list(items)))


class Nested:
    """A custom node whose flatten function runs a key-path walk of its own (a nested walk)."""


def _nested_flatten(_):
    inner = tu.tree_leaves_with_path(WIDE_LIST)
    return (), (len(inner), tu.keystr(inner[-1][0]))


tu.register_pytree_node(Nested, _nested_flatten, lambda aux, _: Nested())

WIDE_FLAT = Flat(list(range(INDEX_CACHE + PAST)))
# The first list fills the thread's entries past the cache; the nested walk reuses them and
# ends; the second list reads them again.
NESTED = [WIDE_LIST, Nested(), WIDE_LIST]

WALKS = {
    "list": lambda: tu.tree_leaves_with_path(WIDE_LIST),
    "dict": lambda: tu.tree_leaves_with_path(WIDE_DICT),
    "flat": lambda: tu.tree_flatten_with_path(WIDE_FLAT)[0],
    "nested": lambda: tu.tree_leaves_with_path(NESTED),
}
ITERATIONS = 2  # per thread: each one walk of 68k to 270k entries


def _tail(with_path):
    """The walk's entries past the caches, with a sample of the rest, as (keystr, leaf)."""
    picked = with_path[:50] + with_path[NAME_CACHE - 50 : NAME_CACHE + 50] + with_path[-PAST - 50 :]
    return [(tu.keystr(p), x) for p, x in picked]


def _wide_workload():
    expected = {name: walk() for name, walk in WALKS.items()}
    # The premise: the walks reach past the caches.
    assert tu.keystr(expected["list"][-1][0]) == f"[{INDEX_CACHE + PAST - 1}]"
    assert tu.keystr(expected["flat"][-1][0]) == f"[<flat index {INDEX_CACHE + PAST - 1}>]"
    assert len(expected["dict"]) == NAME_CACHE + PAST
    assert len(expected["nested"]) == 2 * len(WIDE_LIST)
    expected_tail = {name: _tail(value) for name, value in expected.items()}
    names = sorted(WALKS)

    def work(k):
        for i in range(ITERATIONS):
            name = names[(k + i) % len(names)]
            got = WALKS[name]()
            check(len(got), len(expected[name]), f"{name}: entries")
            check(got, expected[name], f"{name}: (path, leaf) pairs")
            check(_tail(got), expected_tail[name], f"{name}: keystr of the entries")
        return ITERATIONS

    assert run_threads(work) == [ITERATIONS] * THREADS


def test_wide_key_path_walks():
    isolated(_wide_workload)
