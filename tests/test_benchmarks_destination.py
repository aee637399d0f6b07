"""Where ``python -m benchmarks`` writes, and what it refuses before timing anything (issue 44).

- Every kind of run (mode, --only, --leaves, --device, --baseline) has a default folder of its
  own: a filtered run never lands in the quick run's bench_out/ (the README's example did).
- A folder holding another kind's results is refused, naming the folder and --overwrite; the same
  kind, redone, replaces its own results (the README's main command is rerun that way).
- An --only pattern that matches nothing is refused with the valid names, exit status non-zero.
- --device gpu where JAX sees no GPU is refused, saying what JAX sees.

The end-to-end cases run ``python -m benchmarks`` in a child process, as a user would; the one
that times something times one cheap cell, and no assertion reads a timing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_results import REPO_ROOT, synthetic_result

from benchmarks.cli import parse_args
from benchmarks.destination import default_out, kind_of_args, refusal
from benchmarks.selection import nothing_matched, unmatched

QUICK_RUN = synthetic_result()
"""An unfiltered quick run's results: what the README's main command leaves in bench_out/."""


def _benchmarks(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    paths = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _quick_run_folder(root: Path) -> Path:
    folder = root / "bench_out"
    folder.mkdir()
    QUICK_RUN.write(folder / "results.json")
    (folder / "report.md").write_text("the quick run's report\n")
    return folder


def _kind(*argv: str) -> dict[str, object]:
    return kind_of_args(parse_args(list(argv)))


# ------------------------------------------------------------------------------------------------
# default folders


def test_each_kind_of_run_has_a_default_folder_of_its_own() -> None:
    assert parse_args(["--quick"]).out == Path("bench_out")
    assert parse_args([]).out == Path("bench_out/full")
    assert parse_args(["--only", "flatten/transformer*"]).out == Path(
        "bench_out/full-only-flatten_transformer"
    )
    assert parse_args(["--quick", "--only", "b,a"]).out == Path("bench_out/quick-only-a+b")
    assert parse_args(["--quick", "--leaves", "jax", "--device", "gpu"]).out == Path(
        "bench_out/quick-leaves-jax-gpu"
    )
    assert parse_args(["--quick", "--baseline", "jax"]).out == Path(
        "bench_out/quick-baseline-jax"
    )
    assert parse_args(["--quick", "--only", "x", "--out", "mine"]).out == Path("mine")
    long = parse_args(["--only", ",".join(f"op{i}/tree{i}" for i in range(30))]).out
    assert long.parent == Path("bench_out") and len(long.name) <= 80


def test_help_states_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "bench_out/ for the unfiltered quick run, bench_out/full/ for the unfiltered" in text
    assert "bench_out/full-only-flatten_transformer/ for --only 'flatten/transformer*'" in text
    assert "The run prints where it writes" in text
    assert "--overwrite replace the run files in --out even when they hold another kind" in text
    assert "a pattern that matches nothing in the run is refused, with the valid names" in text
    assert "gpu needs a GPU that JAX sees (jax.devices()): without one the run is refused" in text


def test_the_readme_example_names_the_folder_the_run_writes() -> None:
    text = " ".join((REPO_ROOT / "README.md").read_text().split())
    example = re.search(
        r"`python -m benchmarks ([^`]*--only [^`]*)`[^`]*`(bench_out/[^`]*)/`", text
    )
    assert example, "the README's --only example names the folder its run writes"
    argv = [arg.strip("'") for arg in example.group(1).split()]
    assert str(parse_args(argv).out) == example.group(2)
    assert "--overwrite" in text


# ------------------------------------------------------------------------------------------------
# refusals


def test_another_kind_of_run_is_refused_naming_the_folder_and_the_flag(tmp_path: Path) -> None:
    folder = _quick_run_folder(tmp_path)
    why = refusal(folder, _kind("--only", "flatten/transformer*"), overwrite=False)
    assert why is not None
    assert f"{folder}/ holds another run's results (unfiltered quick run)" in why
    assert "(full run, --only 'flatten/transformer*') would overwrite them" in why
    assert "bench_out/full-only-flatten_transformer/" in why and "--overwrite" in why
    assert refusal(folder, _kind("--only", "flatten/transformer*"), overwrite=True) is None
    for argv in ([], ["--quick", "--leaves", "jax"], ["--quick", "--baseline", "jax"]):
        assert refusal(folder, _kind(*argv), overwrite=False) is not None, argv


def test_the_same_kind_of_run_redone_replaces_its_own_results(tmp_path: Path) -> None:
    folder = _quick_run_folder(tmp_path)
    assert refusal(folder, _kind("--quick"), overwrite=False) is None
    filtered = tmp_path / "filtered"
    filtered.mkdir()
    synthetic_result(only=["b", "a"]).write(filtered / "results.json")
    assert refusal(filtered, _kind("--quick", "--only", "a,b"), overwrite=False) is None


def test_an_empty_or_new_folder_is_written_and_other_files_do_not_count(tmp_path: Path) -> None:
    assert refusal(tmp_path / "new", _kind("--quick"), overwrite=False) is None
    (tmp_path / "notes.txt").write_text("mine")
    assert refusal(tmp_path, _kind("--quick"), overwrite=False) is None


def test_a_folder_whose_run_cannot_be_told_is_refused(tmp_path: Path) -> None:
    (tmp_path / "chart.png").write_bytes(b"png")
    why = refusal(tmp_path, _kind("--quick"), overwrite=False)
    assert why is not None and "holds chart.png but no results.json" in why
    assert "--overwrite" in why
    (tmp_path / "results.json").write_text(json.dumps({"something": "else"}))
    why = refusal(tmp_path, _kind("--quick"), overwrite=False)
    assert why is not None and "is not a results.json this suite can read" in why
    afile = tmp_path / "afile"
    afile.write_text("")
    why = refusal(afile, _kind("--quick"), overwrite=True)
    assert why is not None and "is a file, not a folder" in why


def test_a_filtered_run_leaves_the_quick_runs_folder_alone(tmp_path: Path) -> None:
    folder = _quick_run_folder(tmp_path)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    done = _benchmarks("--quick", "--only", "flatten/tuple3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    own = Path("bench_out/quick-only-flatten_tuple3")
    assert f"writing to {own}/" in done.stderr and f"wrote {own / 'results.json'}" in done.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    charts = ["chart.png", "chart_details.png"] if importlib.util.find_spec("matplotlib") else []
    assert sorted(p.name for p in (tmp_path / own).iterdir()) == [
        *charts,
        "report.md",
        "results.json",
    ]
    # Pointed at the quick run's folder, the same run is refused before it times anything.
    refused = _benchmarks(
        "--quick", "--only", "flatten/tuple3", "--out", "bench_out", cwd=tmp_path
    )
    assert refused.returncode == 2
    assert "refused: bench_out/ holds another run's results" in refused.stderr
    assert "--overwrite" in refused.stderr and "flatten/tuple3 " not in refused.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


# ------------------------------------------------------------------------------------------------
# --only that matches nothing, --device gpu without a GPU


def test_unmatched_patterns_are_named_with_the_valid_names() -> None:
    cases = [("flatten", "tuple3"), ("leaves", "mlp"), ("workload", "optax-adamw-eager")]
    assert unmatched(["flatten/tuple3", "mlp", "workload/optax*"], cases) == []
    typos = ["fltten/tuple3", "flatten/mlp"]
    assert unmatched([*typos, "leaves"], cases) == typos
    text = nothing_matched(["fltten/tuple3"], cases, "workload")
    assert text.startswith("--only 'fltten/tuple3' matched nothing in this run")
    assert "ops: flatten, leaves\n" in text and "trees: tuple3, mlp\n" in text
    assert "workloads (op 'workload'): optax-adamw-eager" in text


def test_an_only_typo_is_refused_before_anything_is_timed(tmp_path: Path) -> None:
    done = _benchmarks("--quick", "--only", "fltten/tuple3", cwd=tmp_path)
    assert done.returncode != 0
    assert "--only 'fltten/tuple3' matched nothing in this run" in done.stderr
    assert "ops: flatten, leaves," in done.stderr and "trees: tuple3, mlp," in done.stderr
    assert "workloads (op 'workload'): equinox-filter-jit," in done.stderr
    assert "no results" not in done.stdout + done.stderr
    assert "did not run alongside" not in done.stdout + done.stderr
    assert not (tmp_path / "bench_out").exists()


def test_gpu_without_a_gpu_is_refused_saying_what_jax_sees(tmp_path: Path) -> None:
    import jax

    try:
        jax.devices("gpu")
    except RuntimeError:
        pass
    else:
        pytest.skip("JAX sees a GPU here")
    done = _benchmarks("--quick", "--device", "gpu", "--only", "flatten/tuple3", cwd=tmp_path)
    assert done.returncode != 0
    assert "--device gpu asked for a GPU, but JAX sees none: jax.devices() is [" in done.stderr
    assert repr(jax.devices()) in done.stderr
    assert not (tmp_path / "bench_out").exists()
