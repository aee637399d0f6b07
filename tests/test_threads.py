"""Threads: concurrent flatten / map / unflatten on shared trees while types are being registered.

The core runs under the GIL, but Python callbacks (custom flatten/unflatten, is_leaf, the mapped
function) let other threads in mid-operation, and a registration in another thread invalidates the
per-type memo. Results must equal the single-threaded ones, with no crash and no deadlock.
"""

import collections
import sys
import threading
import time

import pytest
from helpers import Keyed, NodeClass, Pair, Point

import fastree.tree_util as tu

WORKERS = 8
DURATION_S = 2.0
JOIN_TIMEOUT_S = 60.0


class Yielding:
    """A custom node whose callbacks sleep(0), handing the GIL to another thread mid-flatten."""

    def __init__(self, kids):
        self.kids = list(kids)

    def __eq__(self, other):
        return isinstance(other, Yielding) and self.kids == other.kids


def _yielding_flatten(node):
    time.sleep(0)
    return node.kids, len(node.kids)


def _yielding_unflatten(aux, children):
    time.sleep(0)
    assert len(children) == aux
    return Yielding(children)


tu.register_pytree_node(Yielding, _yielding_flatten, _yielding_unflatten)


def _shared_tree(i):
    return {
        "a": [i, (i + 1, None), Pair(i + 2, [i + 3], tag="t")],
        "b": collections.OrderedDict(z=Yielding([i + 4, {"q": i + 5}]), y=NodeClass(i + 6)),
        "c": collections.defaultdict(list, {"k": Keyed(i + 7, Point(i + 8, i + 9, label="p"))}),
        "d": Yielding([Yielding([i + 10]), [i + 11] * 3]),
    }


TREES = [_shared_tree(10 * i) for i in range(4)]


def _work(tree):
    """One round of every operation; returns something comparable."""
    leaves, td = tu.tree_flatten(tree)
    doubled = tu.tree_map(lambda x: 2 * x, tree)
    with_path = tu.tree_map_with_path(lambda p, x: (tu.keystr(p), x), tree)
    rebuilt = tu.tree_unflatten(td, leaves)
    is_leaf = tu.tree_leaves(tree, is_leaf=lambda x: isinstance(x, Pair))
    return (
        leaves,
        repr(td),
        hash(td),
        tu.tree_leaves(doubled),
        tu.tree_leaves(with_path),
        tu.tree_structure(rebuilt) == td,
        td.flatten_up_to(tree) == leaves,
        len(is_leaf),
    )


@pytest.fixture
def fast_switching():
    """Make the interpreter hand the GIL over as often as it can."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_concurrent_operations_and_registrations(fast_switching):
    expected = [_work(t) for t in TREES]
    stop = threading.Event()
    errors = []
    rounds = [0] * WORKERS
    registered = []

    def worker(k):
        try:
            while not stop.is_set():
                i = (k + rounds[k]) % len(TREES)
                got = _work(TREES[i])
                if got != expected[i]:
                    errors.append(AssertionError(f"worker {k}: result differs for tree {i}"))
                    return
                rounds[k] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def registrar():
        # New node types keep arriving (each registration drops the per-type memo) and are
        # used straight away, while the workers' trees are mid-flatten.
        try:
            n = 0
            while not stop.is_set():
                cls = type(f"Dyn{n}", (), {"__init__": lambda self, v: setattr(self, "v", v)})
                tu.register_pytree_node(
                    cls, lambda o: ((o.v,), None), lambda a, c, cls=cls: cls(*c)
                )
                registered.append(cls)
                leaves, td = tu.tree_flatten([cls(n), {"x": cls((n, n))}])
                rebuilt = td.unflatten(leaves)
                if leaves != [n, n, n] or td.num_nodes != 8 or type(rebuilt[0]) is not cls:
                    errors.append(AssertionError(f"registrar: {leaves} {td}"))
                    return
                n += 1
                time.sleep(0.002)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(WORKERS)]
    threads.append(threading.Thread(target=registrar, daemon=True))
    for t in threads:
        t.start()
    time.sleep(DURATION_S)
    stop.set()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running (deadlock?): {alive}"
    if errors:
        raise errors[0]
    assert all(r > 0 for r in rounds), rounds
    assert len(registered) > 5
    # The new types are nodes from every thread's point of view now.
    assert tu.tree_leaves([c(1) for c in registered]) == [1] * len(registered)


def test_concurrent_treedef_sharing(fast_switching):
    """Threads share one treedef object: unflatten, compose, children, pickle at once."""
    import pickle

    td = tu.tree_structure(TREES[0])
    leaves = tu.tree_leaves(TREES[0])
    expected_rebuilt_leaves = tu.tree_leaves(td.unflatten(leaves))
    errors = []

    def worker():
        try:
            for _ in range(200):
                assert tu.tree_leaves(td.unflatten(leaves)) == expected_rebuilt_leaves
                assert pickle.loads(pickle.dumps(td)) == td
                assert tu.treedef_tuple(td.children()).num_leaves == td.num_leaves
                assert td.compose(tu.tree_structure((1, 2))).num_leaves == 2 * td.num_leaves
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "deadlock"
    if errors:
        raise errors[0]
