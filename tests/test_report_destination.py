"""Where the benchmark suite's reports go (issue 36): beside the run, never into the repository
unasked; publishing is one explicit step that writes the published run and the README's blocks.

Nothing is timed: the runs are made up (tests/bench_results.py), and the published directory and
README these tests write are temporary copies.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from bench_results import REPO_ROOT, synthetic_result

from benchmarks.cli import parse_args
from benchmarks.measure.results import RunResult
from benchmarks.report import readme as readme_blocks
from benchmarks.report.publish import PUBLISHED_DIR, NotPublishable, main, publish

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed"
)
RUN_FILES = ("report.md", "chart.png", "chart_details.png")

README_TEMPLATE = """# a project

{summary_begin}
old summary
{summary_end}

## Performance

hand-written text stays

{figures_begin}
old figures
{figures_end}

more hand-written text
"""


def _template() -> str:
    return README_TEMPLATE.format(
        summary_begin=readme_blocks.BEGIN.format(name="summary"),
        summary_end=readme_blocks.END.format(name="summary"),
        figures_begin=readme_blocks.BEGIN.format(name="figures"),
        figures_end=readme_blocks.END.format(name="figures"),
    )


def _repository_state() -> dict[str, str]:
    """Digest of every file a report could write into the repository by mistake."""
    paths = [REPO_ROOT / "README.md", *sorted(REPO_ROOT.glob("benchmarks/*.md"))]
    paths += sorted(REPO_ROOT.glob("benchmarks/*.png"))
    if PUBLISHED_DIR.exists():
        paths += sorted(PUBLISHED_DIR.iterdir())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


@needs_matplotlib
def test_report_is_written_beside_its_results_json(tmp_path: Path) -> None:
    source = tmp_path / "run" / "results.json"
    source.parent.mkdir()
    synthetic_result().write(source)
    before = _repository_state()
    assert main([str(source)]) == 0
    assert _repository_state() == before, "python -m benchmarks.report wrote into the repository"
    for name in RUN_FILES:
        assert (source.parent / name).stat().st_size > 0
    report = (source.parent / "report.md").read_text()
    assert report.startswith("<!-- Rebuilt by `python -m benchmarks.report` from ")
    assert "](chart.png)" in report and "](chart_details.png)" in report


@needs_matplotlib
def test_destination_takes_the_report_elsewhere(tmp_path: Path) -> None:
    source = tmp_path / "results.json"
    synthetic_result().write(source)
    assert main([str(source), "--destination", str(tmp_path / "elsewhere")]) == 0
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == sorted(RUN_FILES)
    assert not (tmp_path / "report.md").exists()


@needs_matplotlib
def test_a_filtered_run_is_rebuilt_but_not_published(tmp_path: Path) -> None:
    filtered = synthetic_result(only=["flatten/tuple3"])
    source = tmp_path / "results.json"
    filtered.write(source)
    assert main([str(source)]) == 0
    assert (tmp_path / "report.md").exists()
    with pytest.raises(NotPublishable, match="filtered"):
        publish(filtered, destination=tmp_path / "published", readme=None)
    with pytest.raises(NotPublishable, match="on cpu"):
        publish(synthetic_result(device="gpu"), destination=tmp_path / "published", readme=None)
    assert not (tmp_path / "published").exists()


def test_the_published_directory_is_written_only_by_publish(tmp_path: Path) -> None:
    source = tmp_path / "results.json"
    synthetic_result().write(source)
    with pytest.raises(SystemExit):
        main([str(source), "--destination", str(PUBLISHED_DIR)])
    with pytest.raises(SystemExit):  # publishing goes to one place: the two do not mix
        main([str(source), "--destination", str(tmp_path), "--publish"])


def test_help_says_where_output_goes() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.report", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    text = " ".join(completed.stdout.split())
    assert "beside RESULTS_JSON" in text
    assert "Nothing is written into the repository unless --publish is given" in text
    assert "python -m benchmarks --quick --publish" in text


@needs_matplotlib
def test_publish_writes_the_run_under_its_own_names_and_the_readme_blocks(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(_template())
    published = tmp_path / "benchmarks" / "published"
    result = synthetic_result()
    written = publish(result, destination=published, readme=readme)
    assert sorted(p.name for p in published.iterdir()) == sorted(["results.json", *RUN_FILES])
    assert readme in written
    again = RunResult.from_json((published / "results.json").read_text())
    assert again.rows == result.rows and again.workloads == result.workloads
    report = (published / "report.md").read_text()
    assert report.startswith("<!-- The published run: quick run of 2026-01-02T03:04:05+00:00")
    text = readme.read_text()
    assert "old summary" not in text and "old figures" not in text
    assert "hand-written text stays" in text and "more hand-written text" in text
    figures = readme_blocks.read_block(text, "figures")
    assert figures is not None
    # Links are relative to the README, and name the run's own files.
    assert "](benchmarks/published/chart.png)" in figures
    assert "](benchmarks/published/report.md)" in figures
    # Names as the report writes them, and the run's date and environment.
    for name in ("`tree_map3`", "`copy`", "`treedef_hash`", "`eqx-train-step`", "`nnx-split`"):
        assert name in figures
    assert "2026-01-02T03:04:05+00:00" in figures and "test cpu, 2 cores" in figures
    assert "load average 1.50 at the start, 2.25 at the end" in figures
    assert "3.00× [2.85–3.15]" in figures and "3.00× [2.85–3.15]" in report
    # Publishing twice gives the same README: the blocks are replaced, not added to.
    publish(result, destination=published, readme=readme)
    assert readme.read_text() == text


def test_a_readme_without_markers_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n")
    published = tmp_path / "published"
    with pytest.raises(NotPublishable, match="published:begin summary"):
        publish(synthetic_result(), destination=published, readme=readme)
    assert readme.read_text() == "# no markers here\n"
    assert not published.exists()


@needs_matplotlib
def test_a_chart_that_cannot_be_drawn_leaves_the_published_run_alone(tmp_path: Path) -> None:
    published = tmp_path / "published"
    publish(synthetic_result(), destination=published, readme=None)
    before = {path.name: path.read_bytes() for path in published.iterdir()}
    nothing_to_draw = synthetic_result()
    nothing_to_draw.rows, nothing_to_draw.workloads = [], []
    with pytest.raises(NotPublishable, match="a chart could not be drawn"):
        publish(nothing_to_draw, destination=published, readme=None)
    assert {path.name: path.read_bytes() for path in published.iterdir()} == before
    assert not nothing_to_draw.skipped
    assert [p.name for p in tmp_path.iterdir()] == ["published"]  # no staging folder left


def test_summary_names_the_range_and_the_workloads() -> None:
    result = synthetic_result(
        ratios={(tree, "flatten", "jax"): 1.5 for tree in ("tuple3", "mlp")}
        | {(tree, "treedef_hash", "jax"): 90.0 for tree in ("tuple3", "mlp")},
    )
    summary = " ".join(readme_blocks.render_summary(result).split())
    assert "1.50× (`flatten`) to 3.00× (`tree_map3`) faster than `jax.tree_util`" in summary
    assert "`treedef_hash` 90.00×" in summary
    assert "`eqx-train-step` 2.00×" in summary and "`nnx-split` 8.00×" in summary
    assert "`jit-trace-lower` the same (1.00×)" in summary
    assert "These are CPU figures, with the leaves in host memory" in summary


def test_cli_publish_needs_an_unfiltered_run() -> None:
    assert parse_args(["--quick", "--publish"]).publish
    assert parse_args(["--quick", "--write-results"]).publish  # the earlier name
    for extra in (["--only", "a"], ["--leaves", "jax"], ["--baseline", "jax"], ["--device", "gpu"]):
        with pytest.raises(SystemExit):
            parse_args(["--quick", "--publish", *extra])
