"""The README quotes one run, the published one, and nothing else (issue 36).

``python -m benchmarks --quick --publish`` (or ``python -m benchmarks.report --publish
RESULTS_JSON``) writes the published run into benchmarks/published/ and the README's generated
blocks from it. These tests fail when the three drift apart, or from the suite:

- the published run covers the suite as it is: every tree the suite plans, with its operations,
  and every workload, by name, in order (a tree or workload added since: publish again);
- report.md is the one its results.json gives with today's report code (a change to the report:
  ``python -m benchmarks.report --publish benchmarks/published/results.json``, nothing timed);
- the README's blocks are the ones its results.json gives, and every figure in them can be found,
  as written, in report.md; outside the blocks the README quotes no measured figure;
- docs/installing-into-jax.md says which versions its third-party table was measured on.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from bench_results import REPO_ROOT

from benchmarks.measure.results import RunResult
from benchmarks.report import readme as readme_blocks
from benchmarks.report.markdown import render_markdown
from benchmarks.report.outputs import CHART_PNG, DETAILS_PNG, REPORT_MD, RESULTS_JSON
from benchmarks.report import stacks as other_stacks
from benchmarks.report.publish import HEADER, PUBLISHED_DIR, why_not_publishable
from benchmarks.runner import plan
from benchmarks.settings import settings_for
from benchmarks.workloads import WORKLOADS

README = REPO_ROOT / "README.md"
REPUBLISH = (
    "publish again: python -m benchmarks --quick --publish --runs 3 (or, if only the report's "
    "code changed, python -m benchmarks.report --publish benchmarks/published/results.json)"
)
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?×(?: \[[\d.,]+–[\d.,]+\])?")
"""A ratio as the report writes it, with its interval when it has one: ``3.76× [3.39–4.06]``."""
TIME = re.compile(r"\d[\d,]*(?:\.\d+)? (?:ns|µs|ms|s)\b")
UNMEASURED = {"1×", "1.0×"}
"""Ratios the README's prose may name outside the blocks: the line between faster and slower."""


@pytest.fixture(scope="module")
def published() -> RunResult:
    return RunResult.from_json((PUBLISHED_DIR / RESULTS_JSON).read_text())


def test_the_published_run_covers_the_suite(published: RunResult) -> None:
    assert why_not_publishable(published) is None
    planned = plan(settings_for(published.settings["mode"] == "quick"), None, [])
    assert [tree.name for tree in published.trees] == [tree.name for tree in planned], REPUBLISH
    for tree in planned:
        ops = {row.op for row in published.rows if row.tree == tree.name}
        assert ops == set(tree.ops), f"{tree.name}: {REPUBLISH}"
    assert [row.name for row in published.workloads] == [w.name for w in WORKLOADS], REPUBLISH
    not_run = [f"{row.name}: {row.not_run}" for row in published.workloads if row.not_run]
    assert not not_run, f"the published run left workloads out: {not_run}"


def test_the_published_report_is_its_runs(published: RunResult) -> None:
    header = HEADER.format(mode=published.settings["mode"], date=published.environment["date"])
    expected = header + render_markdown(published, CHART_PNG, DETAILS_PNG)
    assert (PUBLISHED_DIR / REPORT_MD).read_text() == expected, REPUBLISH
    for name in (CHART_PNG, DETAILS_PNG):
        assert (PUBLISHED_DIR / name).stat().st_size > 10_000


def test_the_readme_blocks_are_the_published_runs(published: RunResult) -> None:
    text = README.read_text()
    entries = other_stacks.read_entries(PUBLISHED_DIR / other_stacks.STACKS_JSON)
    expected = readme_blocks.render_blocks(published, README, PUBLISHED_DIR, entries)
    for name in readme_blocks.BLOCKS:
        assert readme_blocks.read_block(text, name) == expected[name], f"README {name}: {REPUBLISH}"
    # The other stacks' table: from benchmarks/published/stacks.json, the published run first.
    stacks_block = readme_blocks.read_block(text, readme_blocks.STACKS)
    assert stacks_block == expected.get(readme_blocks.STACKS), (
        "README stacks: python -m benchmarks.report --stacks OTHER_STACK/results.json ..."
    )


def test_the_published_run_says_its_stack_and_names_no_machine_path(published: RunResult) -> None:
    stack = other_stacks.stack_of(published)
    assert stack.flax, "the published run does not say which flax it ran with"
    summary = readme_blocks.read_block(README.read_text(), "summary") or ""
    assert stack.describe() in " ".join(summary.split())
    for path in sorted(PUBLISHED_DIR.iterdir()):
        if path.suffix in (".json", ".md"):
            machine = re.findall(r"(?<![\w:/.~-])/(?:home|work|tmp|root|Users|usr|opt|var)/\S*",
                                 path.read_text())  # fmt: skip
            assert not machine, f"{path.name} names the machine's paths: {machine[:3]}"


def test_every_readme_figure_is_in_the_published_report() -> None:
    text = README.read_text()
    report = (PUBLISHED_DIR / REPORT_MD).read_text()
    for name in readme_blocks.BLOCKS:
        block = readme_blocks.read_block(text, name)
        assert block is not None, f"the README has no {name} block"
        quoted = FIGURE.findall(block) + TIME.findall(block)
        assert quoted, f"the README's {name} block quotes no figure"
        missing = sorted({figure for figure in quoted if figure not in report})
        assert not missing, f"README figures not in the published report: {missing}"
    figures = readme_blocks.read_block(text, "figures") or ""
    # Workloads and operations under the report's names, every one of the suite's workloads.
    quoted_workloads = re.findall(r"^\| `([\w-]+)`: ", figures, re.MULTILINE)
    assert quoted_workloads == [w.name for w in WORKLOADS]
    for name in quoted_workloads:
        assert f"| **{name}**: " in report
    quoted_ops = re.findall(r"^\| `(\w+)` \|", figures, re.MULTILINE)
    assert {"tree_map3", "copy", "treedef_hash"} <= set(quoted_ops)
    for op in quoted_ops:
        assert f"| {op} | " in report


GPU_RUN = REPO_ROOT / "benchmarks" / "gpu_run" / "report.md"
GPU_BLOCK = re.compile(r"<!-- gpu-run:begin[^>]*-->(.*?)<!-- gpu-run:end -->", re.DOTALL)
"""The README's GPU paragraph: figures from the one GPU run kept in benchmarks/gpu_run/ (made by
scripts/gpu_check.sh on a GPU machine; the published run is CPU only)."""


def test_every_gpu_figure_is_in_the_gpu_run() -> None:
    blocks = GPU_BLOCK.findall(README.read_text())
    assert len(blocks) == 1, "the README has one gpu-run block"
    quoted = FIGURE.findall(blocks[0])
    assert quoted, "the gpu-run block quotes no figure"
    report = GPU_RUN.read_text()
    missing = sorted({figure for figure in quoted if figure not in report})
    assert not missing, f"README GPU figures not in {GPU_RUN.name}: {missing}"
    assert "NVIDIA H200" in blocks[0] and "NVIDIA H200" in (GPU_RUN.parent /
                                                              "environment.txt").read_text()


def test_the_readme_quotes_no_figure_outside_the_published_blocks() -> None:
    text = GPU_BLOCK.sub("", README.read_text())
    for name in (*readme_blocks.BLOCKS, readme_blocks.STACKS):
        text = readme_blocks.block_pattern(name).sub("", text)
    stray = sorted(set(FIGURE.findall(text)) - UNMEASURED) + sorted(set(TIME.findall(text)))
    assert not stray, (
        f"the README quotes {stray} outside its published blocks: measured figures belong to the "
        "published run (benchmarks/report/readme.py writes them), older ones to "
        "docs/performance-history.md with the run they came from"
    )


def test_the_third_party_table_says_what_it_was_measured_on() -> None:
    text = (REPO_ROOT / "docs" / "installing-into-jax.md").read_text()
    measured = re.search(r"Measured on (Python [\d.]+ with jax and jaxlib [\d.]+[^|]*?):\n\n", text)
    assert measured, "the third-party table needs a 'Measured on Python X with jax and jaxlib Y'"
    said = " ".join(measured.group(1).split())
    table = text[measured.end() :].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\w+) ([\d.]+) ", table, re.MULTILINE)
    assert rows, "no suite rows under the 'Measured on' line"
    for library, version in rows:
        assert f"{library} {version}" in said, f"{library} {version} is not in: {said}"
    assert re.search(r"\d{4}-\d{2}-\d{2}", said), "say when it was measured"


def test_the_readme_names_the_publish_command() -> None:
    text = " ".join(README.read_text().split())
    assert "python -m benchmarks --quick --publish" in text
    assert Path(PUBLISHED_DIR).relative_to(REPO_ROOT).as_posix() == "benchmarks/published"
