"""aux_data checks on many threads: each thread's reports are its own walks'.

A flatten that meets aux_data with a problem reports it once the entry point's walk is over
(csrc/diagnostics/aux_check.h, ReportScope). With threads, one thread's entry point must make
(strict: raise) exactly the reports its own walk found: never another thread's, and never drop
one. The custom nodes' flatten functions run Python code, where a GIL build hands the GIL to
another thread mid-walk, and a free-threaded build runs the walks at once.

"strict" and "warn" have a test each, and a third changes the mode while other threads walk;
each test sets ``fastree.config.aux_checks`` itself and puts it back.
"""

from __future__ import annotations

import warnings

import fastree
import fastree.tree_util as tu
import numpy as np
from concurrency_harness import THREADS, check, isolated, run_threads
from fastree.diagnostics.aux import AuxDataWarning

ITERATIONS = 150


class Node:
    """A custom node with the aux_data it is given; its flatten runs Python code."""

    def __init__(self, children, aux):
        self.children, self.aux = list(children), aux

    def __eq__(self, other):
        same = (self.children, self.aux) == (other.children, other.aux)
        return type(other) is type(self) and same


def _flatten(node):
    return node.children, node.aux


tu.register_pytree_node(Node, _flatten, lambda aux, children: Node(children, aux))


def _good(k):
    return {"a": [Node([k, (k + 1, k + 2)], ("tag", k)), None], "b": Node([{"x": k + 3}], "m")}


def _bad_strict(k):
    # A list in aux_data: unhashable, a problem in strict mode only.
    return {"p": [k, Node([k + 1], ["not", "hashable"])], "q": Node([k + 2], "fine")}


def _outcome(call):
    """What a call gave: its value, or the exception's type and text."""
    try:
        return ("ok", call())
    except Exception as e:  # noqa: BLE001 - compared with the single-threaded outcome
        return ("raised", type(e).__name__, str(e))


def _steps(tree):
    return [
        ("tree_flatten", lambda: (lambda lv, td: (lv, repr(td)))(*tu.tree_flatten(tree))),
        ("tree_structure", lambda: repr(tu.tree_structure(tree))),
        ("tree_map", lambda: tu.tree_leaves(tu.tree_map(lambda x: x * 2, tree))),
        ("tree_flatten_with_path", lambda: repr(tu.tree_flatten_with_path(tree)[1])),
    ]


def _strict_workload():
    before = fastree.config.aux_checks
    fastree.config.aux_checks = "strict"
    try:
        trees = {}
        for k in range(THREADS):
            trees[("good", k)] = _good(k)
            trees[("bad", k)] = _bad_strict(k)
        expected = {
            (key, name): _outcome(call)
            for key, tree in trees.items()
            for name, call in _steps(tree)
        }
        # The premise: each bad tree raises, each good one does not.
        for (key, name), outcome in expected.items():
            assert outcome[0] == ("raised" if key[0] == "bad" else "ok"), (key, name, outcome)

        def work(k):
            for i in range(ITERATIONS):
                # Half the threads start with a bad tree, half with a good one: at any moment
                # some walks have a report pending while others have none.
                kind = ("bad", "good")[(i + k) % 2]
                for name, call in _steps(trees[(kind, k)]):
                    check(_outcome(call), expected[((kind, k), name)], f"{kind} tree {k}, {name}")
            return ITERATIONS

        assert run_threads(work) == [ITERATIONS] * THREADS
    finally:
        fastree.config.aux_checks = before


def test_strict_reports_raise_in_their_own_thread():
    isolated(_strict_workload)


def _node_class():
    """A new node type per call, all with one name: a warning names the type, and "warn" warns
    once per (node type, problem), so each thread needs its own type and every warning reads the
    same."""

    class PerThread(Node):
        pass

    tu.register_pytree_node(PerThread, _flatten, lambda aux, children: PerThread(children, aux))
    return PerThread


def _bad_warn(cls, k):
    return [{"w": cls([k], np.zeros(2))}, cls([k + 1], "fine")]  # an array in aux_data


def _warn_workload():
    before = fastree.config.aux_checks
    fastree.config.aux_checks = "warn"
    try:
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            reference = _node_class()
            expected_leaves = [tu.tree_leaves(_bad_warn(reference, k)) for k in range(THREADS)]
            tu.tree_flatten(_bad_warn(reference, 0))
            assert [w.category for w in log] == [AuxDataWarning], log
            expected_message = str(log[0].message)
            assert "key path [0]['w']" in expected_message, expected_message
            del log[:]
            classes = [_node_class() for _ in range(THREADS)]

            def work(k):
                tree = _bad_warn(classes[k], k)
                good = _good(k)
                for _ in range(ITERATIONS):
                    leaves, _ = tu.tree_flatten(tree)
                    check(leaves, expected_leaves[k], f"thread {k} leaves")
                    mapped = tu.tree_map(lambda x: x, good)
                    check(tu.tree_leaves(mapped), tu.tree_leaves(good), f"thread {k} good tree")
                return ITERATIONS

            assert run_threads(work) == [ITERATIONS] * THREADS
            got = [(w.category, str(w.message)) for w in log]
        # One warning per thread's type, each naming its node's key path: none lost, none twice.
        assert got == [(AuxDataWarning, expected_message)] * THREADS, got
    finally:
        fastree.config.aux_checks = before


def test_warnings_once_per_type_across_threads():
    isolated(_warn_workload)


def _mode_change_workload():
    """One thread cycles fastree.config.aux_checks through every mode (each change installs or
    removes the core's hooks and may change strictness) while the others flatten trees whose
    aux_data passes in every mode: their answers cannot depend on the mode."""
    before = fastree.config.aux_checks
    trees = [_good(k) for k in range(THREADS)]
    expected = {
        (k, name): _outcome(call) for k in range(THREADS) for name, call in _steps(trees[k])
    }
    modes = ["off", "warn", "strict", "auto"]

    def switcher():
        for i in range(ITERATIONS):
            fastree.config.aux_checks = modes[i % len(modes)]
        return ITERATIONS

    def walker(k):
        for _ in range(ITERATIONS):
            for name, call in _steps(trees[k]):
                check(_outcome(call), expected[(k, name)], f"tree {k}, {name}")
        return ITERATIONS

    try:
        assert run_threads(lambda k: switcher() if k == 0 else walker(k)) == [ITERATIONS] * THREADS
    finally:
        fastree.config.aux_checks = before


def test_mode_changes_during_walks():
    isolated(_mode_change_workload)
