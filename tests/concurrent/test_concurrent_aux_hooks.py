"""The aux_data hooks swapped while walks report (csrc/diagnostics/aux_state.h: the hooks and
verdicts behind a lock, the per-node "is a reporter set" test and strict mode atomics;
docs/threads.md D1-D3).

One thread moves ``fastree.config.aux_checks`` between "strict", "off" and "warn" (each change
installs or removes the core's hooks, clears the verdicts and may change strictness) while the
others flatten trees whose aux_data is a problem in strict mode only. A walk may overlap a change,
so each call's outcome is one that some mode gives: the strict-mode error, with its exact text,
or the result every other mode returns; never another error, never another thread's report, and
the classifier and reporter a walk calls are never freed under it. Trees whose aux_data passes in
every mode give their result every time. Warnings ("warn") are ignored for the run.
"""

from __future__ import annotations

import warnings

import fastree
import fastree.tree_util as tu
from concurrency_harness import THREADS, check, isolated, run_threads
from fastree.diagnostics.aux import AuxDataWarning

ITERATIONS = 120
SWITCHES = 5 * ITERATIONS


class Tagged:
    """A custom node with the aux_data it is given; its flatten runs Python code."""

    def __init__(self, children, aux):
        self.children, self.aux = list(children), aux


tu.register_pytree_node(
    Tagged, lambda n: (n.children, n.aux), lambda aux, children: Tagged(children, aux)
)


class Opaque:
    """A value type of its own in aux_data: the classifier is asked about it (a verdict)."""

    def __eq__(self, other):
        return type(other) is Opaque

    def __hash__(self):
        return 7


def _bad(k):
    # A list in aux_data: unhashable, a problem in strict mode only.
    return [k, Tagged([k + 1, Tagged([k + 2], ("ok", Opaque()))], ["not", "hashable", k])]


def _good(k):
    return {"a": Tagged([k], ("tag", k, Opaque())), "b": (k + 1, Tagged([], None))}


def _outcome(tree):
    try:
        leaves, td = tu.tree_flatten(tree)
        return ("ok", leaves, td.num_nodes)
    except Exception as e:  # noqa: BLE001 - compared with the single-threaded outcomes
        return ("raised", type(e).__name__, str(e))


def _workload():
    before = fastree.config.aux_checks
    # Set before the threads start and restored after they end: the filters are process-wide.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AuxDataWarning)
        try:
            _run()
        finally:
            fastree.config.aux_checks = before


def _run():
    outcomes = {}
    for mode in ("strict", "off", "warn"):
        fastree.config.aux_checks = mode
        outcomes[mode] = {
            (kind, k): _outcome(make(k))
            for k in range(THREADS)
            for kind, make in (("bad", _bad), ("good", _good))
        }
    # The premise: strict raises for the bad trees only; the other modes agree.
    for key, strict in outcomes["strict"].items():
        check(strict[0], "raised" if key[0] == "bad" else "ok", f"strict {key}")
        check(outcomes["off"][key], outcomes["warn"][key], f"off/warn {key}")
        check(outcomes["off"][key][0], "ok", f"off {key}")
    modes = ["strict", "off", "warn"]

    def switcher():
        # More changes than one walker makes calls: the changes go on while the walks run.
        for i in range(SWITCHES):
            fastree.config.aux_checks = modes[i % len(modes)]
        return ITERATIONS

    def walker(k):
        for i in range(ITERATIONS):
            kind = ("bad", "good")[(i + k) % 2]
            got = _outcome((_bad if kind == "bad" else _good)(k))
            allowed = {repr(outcomes[m][(kind, k)]) for m in modes}
            if repr(got) not in allowed:
                raise AssertionError(f"thread {k} step {i} ({kind}): {got!r} not in {allowed}")
        return ITERATIONS

    check(
        run_threads(lambda k: switcher() if k == 0 else walker(k)),
        [ITERATIONS] * THREADS,
        "iterations",
    )
    # Afterwards, each mode answers as it did before the threads.
    for mode in modes:
        fastree.config.aux_checks = mode
        for key, expected in outcomes[mode].items():
            tree = (_bad if key[0] == "bad" else _good)(key[1])
            check(_outcome(tree), expected, f"{mode} {key} afterwards")


def test_strict_errors_while_the_mode_changes():
    isolated(_workload)
