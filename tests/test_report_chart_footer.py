"""Whose report a chart's footer points at (issue 44): a user's chart names its own run (folder,
mode, date); only the published run's charts, written by the publish step, name the published
run.

The charts are drawn for real, with the caption function wrapped so the test reads the text each
chart was given (a PNG's pixels cannot be read back). The runs are made up
(tests/bench_results.py); nothing is timed, and the published folder is a temporary one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from bench_results import synthetic_result

from benchmarks.report import chart, chart_details, write_outputs
from benchmarks.report.chart import caption, own_report
from benchmarks.report.publish import main as report_main
from benchmarks.report.publish import publish

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed"
)
RUN = "quick run of 2026-01-02T03:04:05+00:00"
"""How the footer names synthetic_result()'s run."""


@pytest.fixture
def footers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The last caption line of every chart drawn while the test runs, in order."""
    seen: list[str] = []

    def recording(result, footer):  # type: ignore[no-untyped-def]
        seen.append(footer)
        return caption(result, footer)

    monkeypatch.setattr(chart, "caption", recording)
    monkeypatch.setattr(chart_details, "caption", recording)
    return seen


def test_the_caption_ends_with_its_footer() -> None:
    text = caption(synthetic_result(), own_report(synthetic_result(), Path("bench_out/full")))
    assert text.splitlines()[-1].startswith("Every figure with its interval")
    assert "bench_out/full/" in text and RUN in text and "published" not in text


def test_a_users_charts_name_their_own_run(tmp_path: Path, footers: list[str]) -> None:
    out = tmp_path / "mine"
    assert write_outputs(synthetic_result(), out) == 0
    assert len(footers) == 2  # chart.png and chart_details.png
    for footer in footers:
        assert f"report.md beside this chart, in {out}/ (this {RUN})" in footer
        assert "published" not in footer


def test_charts_rebuilt_from_results_json_name_their_folder(
    tmp_path: Path, footers: list[str]
) -> None:
    source = tmp_path / "run" / "results.json"
    source.parent.mkdir()
    synthetic_result().write(source)
    assert report_main([str(source), "--destination", str(tmp_path / "again")]) == 0
    assert len(footers) == 2
    for footer in footers:
        assert f"in {tmp_path / 'again'}/ (this {RUN})" in footer and "published" not in footer


def test_only_the_published_runs_charts_name_the_published_run(
    tmp_path: Path, footers: list[str]
) -> None:
    publish(synthetic_result(), destination=tmp_path / "published", readme=None)
    assert len(footers) == 2
    for footer in footers:
        assert "the published run's report.md, beside this chart in benchmarks/published/" in footer
        assert RUN in footer
