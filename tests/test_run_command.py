"""``python -m fastree.run``'s answers to bad arguments and to ``--help``.

As ``python`` answers them: an unknown option, a missing script or nothing to run is one line
naming the problem, then the usage, on stderr, with status 2 and no traceback; a module ``-m``
cannot find is one line with status 1. ``--help`` goes to stdout with status 0 and names the
``FASTREE_INSTALL`` variable. Each case runs in a child process (the command exits).
What the command runs, and how, is pinned in test_install.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROG = "python -m fastree.run"
USAGE_LINE = f"usage: {PROG} script.py [args...]"


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
    env["SKBUILD_EDITABLE_VERBOSE"] = "0"  # an editable install's rebuild says nothing
    return subprocess.run(
        [sys.executable, "-m", "fastree.run", *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=cwd, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--hepl"], "unknown option --hepl"),
        (["-x", "script.py"], "unknown option -x"),
        (["--"], "a script is expected after --"),
        ([], "a script or -m module is expected"),
        (["-m"], "a module name is expected after -m"),
        (["missing.py"], "can't open file {missing!r}: [Errno 2] No such file or directory"),
        (["--", "missing.py"], "can't open file {missing!r}: [Errno 2] No such file or directory"),
    ],
    ids=["mistyped-option", "unknown-option", "bare-dashes", "nothing", "bare-m", "missing-script",
         "missing-script-after-dashes"],
)  # fmt: skip
def test_bad_arguments_are_one_line_and_the_usage(tmp_path, args, problem):
    proc = run(*args, cwd=tmp_path)
    missing = str(tmp_path / "missing.py")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2
    assert lines[0] == f"{PROG}: " + problem.format(missing=missing)
    assert lines[1] == USAGE_LINE
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("module", ["no_such_module_here", "no_such_package.sub"])
def test_missing_module_is_one_line_status_1(tmp_path, module):
    proc = run("-m", module, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"{PROG}: No module named {module}\n"


def test_double_dash_before_a_script_runs_it(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import sys\nprint('ran', sys.argv[1:])\n")
    proc = run("--", str(script), "--flag")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ran ['--flag']\n"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_names_the_environment_variable(flag):
    proc = run(flag)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(USAGE_LINE)
    assert "FASTREE_INSTALL=1" in proc.stdout
