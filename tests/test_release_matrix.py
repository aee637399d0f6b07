"""scripts/release_matrix.py: its programs, their rows, and how two runs are compared.

The matrix itself installs library releases with pip (CI's "library releases" leg and
docs/testing.md); here its parts run on fake programs, and flax's tree-mode program runs plain
and installed where flax is importable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import script_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def matrix():
    with script_module("release_matrix") as module:
        yield module


def test_every_library_has_its_programs(matrix):
    for library in matrix.LIBRARIES:
        programs = matrix.PROGRAMS_OF.get(library, (f"{library}_program",))
        for program in programs:
            assert (matrix.PROGRAMS / f"{program}.py").is_file(), program
    assert "flax_tree_program" in matrix.PROGRAMS_OF["flax"]


def test_tree_mode_rows_are_labelled(matrix):
    assert matrix._label({"library": "flax", "program": "flax_tree_program"}) == (
        "flax (tree mode)")
    assert matrix._label({"library": "flax", "program": "flax_program"}) == "flax"
    assert matrix._label({"library": "chex"}) == "chex"


def _fake_program(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    return name


def test_compare_names_the_steps_that_differ(matrix, tmp_path, monkeypatch):
    # The installed run (python -m fastree.run) prints another value for one step.
    body = (
        "import json, sys\n"
        "installed = 'fastree' in sys.modules\n"
        "print(json.dumps({'same': 1, 'other': 2 if installed else 1, 'status': None}))\n"
    )
    monkeypatch.setattr(matrix, "PROGRAMS", tmp_path)
    name = _fake_program(tmp_path, "fake_program", body)
    env = dict(os.environ)
    compared = matrix._compare(Path(sys.executable), name, env)
    assert compared["outcome"] == "DIFFERS"
    assert compared["detail"] == "steps differ: other"


def test_compare_reports_a_program_that_does_not_run(matrix, tmp_path, monkeypatch):
    monkeypatch.setattr(matrix, "PROGRAMS", tmp_path)
    name = _fake_program(tmp_path, "broken_program", "raise ImportError('no such library')\n")
    env = dict(os.environ)
    compared = matrix._compare(Path(sys.executable), name, env)
    assert compared["outcome"] == "does not import"
    assert "ImportError" in compared["detail"]
    assert "why" not in compared  # no tests follow such a row


def test_flax_tree_program_is_identical_installed():
    pytest.importorskip("flax.nnx")
    pytest.importorskip("optax")
    script = ROOT / "scripts" / "release_programs" / "flax_tree_program.py"
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    outputs = []
    for runner in ([], ["-m", "fastree.run"]):
        r = subprocess.run([sys.executable, *runner, str(script)], capture_output=True,
                           text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr[-2000:]
        outputs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    plain, installed = outputs
    plain.pop("status")
    status = installed.pop("status")
    assert plain == installed
    assert plain["tree_mode"] is True  # this flax has graph=False: the steps ran in tree mode
    assert all(not str(v).startswith("raises") for v in plain.values())
    assert status["Param"] == "native"
