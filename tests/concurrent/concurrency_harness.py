"""Running a workload on many threads at once, and in a child process where a crash is possible.

Each test in this folder has the same shape: compute the expected results single-threaded, start
``THREADS`` threads that wait at one ``threading.Barrier`` so they begin together, run a fixed
number of iterations each (never a duration: the outcome must not depend on the machine's
speed), compare every result with the expected one exactly, and report the first difference.

Where the GIL is off (a free-threaded interpreter run with ``PYTHON_GIL=0`` or ``-X gil=0``),
fastree is not yet safe (docs/threads.md, issue 45) and a workload may crash the interpreter.
:func:`isolated` then runs it in a child process, so a crash or a deadlock fails that one test
and names the signal, instead of ending the pytest run. With the GIL on, the workload runs in
this process (no interpreter start per test); ``force=True`` takes the child path anyway, which
``test_concurrent_harness.py`` uses so that path is tested on every build.

Nothing here measures time. The only clocks are the liveness limits (``JOIN_TIMEOUT_S``,
``CHILD_TIMEOUT_S``): a run that reaches one is a deadlock, reported as such.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

THREADS = 8
JOIN_TIMEOUT_S = 300.0  # liveness only: a worker still running then is a deadlock
CHILD_TIMEOUT_S = 600.0
HERE = Path(__file__).resolve().parent

FREE_THREADED_BUILD = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def gil_enabled() -> bool:
    """Whether this interpreter runs with the GIL (always, on a GIL build)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


@contextlib.contextmanager
def fast_switching() -> Iterator[None]:
    """With the GIL, hand it between threads as often as the interpreter can, so that walks
    interleave at every Python callback (custom flatten functions, is_leaf, mapped functions)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


class Mismatch(AssertionError):
    """A threaded result differs from the single-threaded one."""


def check(got: Any, expected: Any, what: str) -> None:
    """Exact comparison; the message names the step."""
    if not (type(got) is type(expected) and got == expected):
        raise Mismatch(f"{what}: got {got!r:.300}, expected {expected!r:.300}")


def run_threads(work: Callable[[int], Any], threads: int = THREADS) -> list[Any]:
    """Runs ``work(k)`` for k in range(threads), all released together by one barrier.

    Returns the results in thread order; raises the first worker's exception (with its thread
    and traceback in the message) if any raised.
    """
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads
    errors: list[tuple[int, BaseException, str]] = []

    def target(k: int) -> None:
        try:
            barrier.wait()
            results[k] = work(k)
        except BaseException as e:  # noqa: BLE001 - reported by the calling thread
            errors.append((k, e, traceback.format_exc()))
            barrier.abort()  # a worker that never reached the barrier must not hold the rest

    workers = [threading.Thread(target=target, args=(k,), daemon=True) for k in range(threads)]
    with fast_switching():
        for t in workers:
            t.start()
        for t in workers:
            t.join(JOIN_TIMEOUT_S)
    alive = [t.name for t in workers if t.is_alive()]
    if alive:
        raise AssertionError(f"threads still running after {JOIN_TIMEOUT_S} s (deadlock?): {alive}")
    if errors:
        # A worker that raised breaks the barrier for those still waiting: report its error.
        real = [e for e in errors if not isinstance(e[1], threading.BrokenBarrierError)]
        k, e, tb = (real or errors)[0]
        raise AssertionError(f"thread {k} of {threads}: {type(e).__name__}: {e}\n{tb}") from e
    return results


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def isolated(workload: Callable[[], None], *, force: bool = False) -> None:
    """Runs ``workload()`` (a module-level function of a test module in this folder): here
    while the GIL is on, else in a child process, where a crash fails the test with its signal.

    The child is the same interpreter with the GIL as here, warnings as errors, and
    faulthandler on (a crash prints every thread's stack).
    """
    if gil_enabled() and not force:
        workload()
        return
    module, name = workload.__module__, workload.__qualname__
    if "." in name or "<" in name:
        raise ValueError(f"{name}: an isolated workload must be a module-level function")
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]\n"
        f"import {module}\n"
        f"{module}.{name}()\n"
        "print('workload done')\n"
    )
    args = [sys.executable, "-X", "faulthandler", "-W", "error"]
    if FREE_THREADED_BUILD and not gil_enabled():
        args += ["-X", "gil=0"]
    try:
        proc = subprocess.run(
            [*args, "-c", code],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            cwd=HERE,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{module}.{name}: no end after {CHILD_TIMEOUT_S} s (deadlock?)\n{e.stderr}")
    out = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode < 0:
        crash = _signal_name(proc.returncode)
        pytest.fail(f"{module}.{name} crashed the interpreter ({crash}):\n{out}")
    if proc.returncode != 0 or "workload done" not in proc.stdout:
        pytest.fail(f"{module}.{name} failed (exit status {proc.returncode}):\n{out}")
