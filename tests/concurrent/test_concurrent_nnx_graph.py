"""flax.nnx graph-mode walks (split, merge, update) on many threads, fastree installed.

The native walks share one attached graph's kind tables and first-walk checks
(python/fastree/integrations/_flax_nnx_graph_tables.py). One thread at a time walks natively
(``Graph.lock``); a call made meanwhile on another thread is flax's own function, which gives the
same answer. Each thread here also defines classes of its own, so first-walk checks of new types
run while other threads walk: a type one walk met must neither serve another thread's walk
unchecked nor be verified by a walk that never met it. Every result is compared with the
single-threaded one, and afterwards no class has gone back to flax.
"""

from __future__ import annotations

import pytest

pytest.importorskip("flax.nnx")

import fastree  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from concurrency_harness import THREADS, check, isolated, run_threads  # noqa: E402
from flax import nnx  # noqa: E402
from fastree.integrations import flax_nnx_graph  # noqa: E402

ITERATIONS = 40


def _model_class(k: int) -> type:
    # A class per thread: its first walks are checked while other threads walk theirs.
    class Block(nnx.Module):
        def __init__(self, width: int) -> None:
            self.w = nnx.Param(jnp.full((width,), float(k)))
            self.count = nnx.BatchStat(jnp.zeros(()))
            self.items = nnx.List([nnx.Param(jnp.ones((2,)) * i) for i in range(3)])

    Block.__qualname__ = f"Block{k}"
    return Block


def _shape(graphdef, state) -> tuple:
    # What a split gave, comparable across calls: the GraphDef (equal by value) and the leaves'
    # values (each split reads the same arrays).
    leaves = [x.tolist() for x in jnp_leaves(state)]
    return graphdef, leaves


def jnp_leaves(state) -> list:
    return [v for _, v in sorted(nnx.to_flat_state(state), key=lambda kv: str(kv[0]))]


def _round(model) -> tuple:
    graphdef, state = nnx.split(model)
    rebuilt = nnx.merge(graphdef, state)
    nnx.update(model, nnx.state(rebuilt))
    again = nnx.split(model)
    return _shape(graphdef, state), _shape(*again)


def _nnx_workload() -> None:
    was_installed = fastree.is_installed()
    fastree.install()
    try:
        shared = _model_class(THREADS)(3)
        models = [_model_class(k)(k + 1) for k in range(THREADS)]
        expected_shared = _round(shared)
        expected = [_round(m) for m in models]

        def walker(k: int) -> int:
            # Each thread also builds a model of a class no walk has met yet (a new check).
            fresh = _model_class(100 + k)(2)
            for i in range(ITERATIONS):
                if i % 2:
                    got = _round(models[k])
                    check(got[0][0] == expected[k][0][0], True, f"thread {k} graphdef, step {i}")
                    check(got[0][1], expected[k][0][1], f"thread {k} leaves, step {i}")
                    check(got[1][1], expected[k][1][1], f"thread {k} after update, step {i}")
                else:
                    got = _round(shared)
                    check(got[0][1], expected_shared[0][1], f"thread {k} shared, step {i}")
                got = _round(fresh)
                check(got[0][1], got[1][1], f"thread {k} fresh model, step {i}")
            return ITERATIONS

        assert run_threads(walker) == [ITERATIONS] * THREADS
        # No class went back to flax.
        status = flax_nnx_graph.status()
        assert all(v == "native" for v in status.values()), status
    finally:
        if not was_installed:
            fastree.uninstall()


# Both workloads run in a child process on every build: hypothesis, which other tests use,
# leaves a gc callback registered, and while one is the graph walks are flax's own.


def test_nnx_graph_walks_on_many_threads():
    isolated(_nnx_workload, force=True)


def _interleaved_checks_workload() -> None:
    # Thread B's walk is paused mid-walk, with nothing of its own to check, while thread A
    # splits a model of a new class that the native walk reads wrongly (a class's kind forced
    # to "leaf" here, standing for any type the walk would misread), and A's walk is held just
    # after it met that class until B's walk has ended. The check of A's walk must catch it:
    # A's split is flax's answer. Without Graph.lock, A's walk ran while B's was under way;
    # B's end then "verified" A's new class against B's own graph (which never held it), and A
    # returned the misread GraphDef unchecked.
    import threading

    from fastree.integrations import _flax_nnx_graph_kinds as kinds
    from fastree.integrations import _flax_nnx_graph_tables as tables

    class Known(nnx.Module):
        def __init__(self) -> None:
            self.w = nnx.Param(jnp.ones((2,)))

    class Misread(nnx.Module):
        def __init__(self) -> None:
            self.w = nnx.Param(jnp.arange(3.0))

    misread = Misread()
    expected_def, expected_state = nnx.split(misread)  # flax's own: not installed yet
    was_installed = fastree.is_installed()
    fastree.install()
    graph = flax_nnx_graph._graph
    record = tables.CheckTables._record
    kind = graph._kind
    b_paused, a_classified = threading.Event(), threading.Event()
    a_done, b_done = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def forced_kind(cls):
        return (kinds.LEAF, None, None) if cls is Misread else kind(cls)

    def pausing_record(self, cls, *args):
        # B pauses at its first classification (of a verified class: nothing pending) until A
        # has classified its new class or ended; A then pauses until B's walk has ended.
        entry = record(self, cls, *args)
        name = threading.current_thread().name
        if cls is Known and name == "B" and not b_paused.is_set():
            b_paused.set()
            a_classified.wait(30)
        elif cls is Misread and name == "A" and not a_classified.is_set():
            a_classified.set()
            b_done.wait(30)
        return entry

    def thread_b() -> None:
        try:
            results["b"] = nnx.split(known)
        finally:
            b_done.set()

    def thread_a() -> None:
        try:
            b_paused.wait(30)
            results["a"] = nnx.split(misread)
        finally:
            a_classified.set()  # (flax's own split classifies nothing: B goes on)
            a_done.set()

    try:
        known = Known()
        nnx.split(known)  # Known and its leaves checked and verified
        graph._kind = forced_kind
        tables.CheckTables._record = pausing_record
        graph.generation = (-1, -1, -1)  # the next walk starts its tables again: B classifies
        workers = [threading.Thread(target=thread_b, name="B"),
                   threading.Thread(target=thread_a, name="A")]
        for t in workers:
            t.start()
        for t in workers:
            t.join(60)
        assert b_paused.is_set() and a_done.is_set() and b_done.is_set(), results
        got_def, got_state = results["a"]
        assert got_def == expected_def, got_def
        assert jnp_leaves(got_state)[0].tolist() == jnp_leaves(expected_state)[0].tolist()
        assert Misread not in graph.verified
    finally:
        tables.CheckTables._record = record
        graph.__dict__.pop("_kind", None)
        if not was_installed:
            fastree.uninstall()


def test_a_walk_ending_on_another_thread_verifies_nothing_it_did_not_meet():
    isolated(_interleaved_checks_workload, force=True)
