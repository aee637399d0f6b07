"""The thread rows' script (benchmarks/threads.py) runs end to end, and its tables say what it ran.

No assertion depends on a timing: the runs are 10 ms long, and only the outputs' shape, that every
thread's calls were counted, and the comparison's arithmetic (over made-up figures) are checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import threads  # noqa: E402


def test_each_thread_walks_a_tree_of_its_own():
    a, b = threads.make_tree(0), threads.make_tree(1)
    assert a == threads.make_tree(0) and a != b
    assert a["layer000"]["w"] is not b["layer000"]["w"]


def test_a_short_run_counts_every_library_call_and_thread_count():
    data = threads.measure((1, 2), seconds=0.01, repeats=1)
    assert set(data["libraries"]) >= {"fastree", "jax.tree_util"}
    for rows in data["libraries"].values():
        assert set(rows) == {"flatten", "unflatten", "map"}
        for row in rows.values():
            assert set(row) == {"1", "2"}
            assert all(runs and all(r > 0 for r in runs) for runs in row.values())
    table = threads.markdown(data)
    assert "| flatten | 1 threads | 2 threads |" in table
    assert "| fastree |" in table and "×)" in table


def test_a_failing_call_is_raised_not_lost():
    def prepare(tree):
        def call():
            raise LookupError("broken call")

        return call

    try:
        threads.throughput(prepare, 2, 0.01)
    except LookupError as e:
        assert "broken call" in str(e)
    else:
        raise AssertionError("the error was lost")


def test_compare_divides_the_second_run_by_the_first():
    def run(python, free_threaded, speed):
        rows = {c: {"1": [speed, speed * 2, speed / 2]} for c in ("flatten", "unflatten", "map")}
        return {"python": python, "free_threaded": free_threaded, "libraries": {"fastree": rows}}

    text = threads.compare(run("3.13.0", False, 100.0), run("3.13.15", True, 80.0))
    assert "3.13.15 free-threaded over 3.13.0 GIL build" in text
    assert "| fastree | 0.80 | 0.80 | 0.80 |" in text
