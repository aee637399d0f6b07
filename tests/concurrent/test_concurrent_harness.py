"""The folder's own machinery, and the free-threading declaration.

The child-process path of ``concurrency_harness.isolated`` is what every test here takes where
the GIL is off; it is run here on every build (``force=True``), with a workload that passes, one
that fails and one that crashes, so a GIL-only CI still proves it reports each of them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import fastree.tree_util as tu
import pytest
from concurrency_harness import FREE_THREADED_BUILD, THREADS, check, isolated, run_threads


def _passing_workload():
    tree = {"a": [1, (2, None)], "b": 3}
    expected = tu.tree_flatten(tree)

    def work(k):
        for _ in range(20):
            leaves, td = tu.tree_flatten(tree)
            check((leaves, td), expected, "flatten")
        return k

    assert run_threads(work) == list(range(THREADS))


def _failing_workload():
    def work(k):
        check(tu.tree_leaves([k]), [0], "leaves")  # wrong for every thread but the first

    run_threads(work)


def _crashing_workload():
    os.abort()


def test_child_process_passes_a_passing_workload():
    isolated(_passing_workload, force=True)


def test_child_process_reports_a_mismatch():
    with pytest.raises(pytest.fail.Exception, match=r"failed \(exit status 1\)(.|\n)*Mismatch"):
        isolated(_failing_workload, force=True)


def test_child_process_reports_a_crash():
    with pytest.raises(pytest.fail.Exception, match=re.escape("crashed the interpreter (SIGABRT)")):
        isolated(_crashing_workload, force=True)


@pytest.mark.skipif(not FREE_THREADED_BUILD, reason="needs a free-threaded interpreter")
def test_import_leaves_the_gil_as_it_was():
    """On a free-threaded interpreter, with the GIL left to its default (off), importing fastree
    keeps it off, with no warning even under -W error: the module declares Py_mod_gil
    (docs/threads.md, plan step 8)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = (
        "import sys\n"
        "before = sys._is_gil_enabled()\n"
        "import fastree, fastree.tree_util, fastree.tree\n"
        "print(before, sys._is_gil_enabled())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert proc.stdout.split() == ["False", "False"], proc.stdout + proc.stderr
    assert "GIL" not in proc.stderr, proc.stderr
