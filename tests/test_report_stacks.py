"""What to expect on other stacks, and no machine paths in what is published (issue 44).

``python -m benchmarks.report --stacks A.json ...`` keeps other stacks' per-operation means in
``benchmarks/published/stacks.json`` and writes the README's ``stacks`` block (one row per stack,
the published run's first, one column per operation against jax.tree_util); publishing keeps it.
A published run names no absolute path of the machine it ran on. Made-up runs; nothing is timed;
the README and published folder written here are temporary.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from bench_results import synthetic_result

from benchmarks.measure.environment import MACHINE_PATH, without_machine_paths
from benchmarks.measure.results import RunResult
from benchmarks.report import readme as readme_blocks
from benchmarks.report import stacks
from benchmarks.report.publish import NotPublishable, publish, publish_stacks

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed"
)


def on_stack(python: str, jax: str, ratio: float = 3.0, libpython: str | None = None) -> RunResult:
    ratios = {(tree, op, "jax"): ratio for tree in ("tuple3", "mlp") for op in ("flatten", "copy")}
    run = synthetic_result(ratios=ratios)
    run.environment.update(python=python, jax=jax, flax="0.12.8")
    if libpython is not None:
        run.environment["libpython"] = libpython
    run.libraries["jax"] = jax
    return run


def readme(tmp_path: Path) -> Path:
    path = tmp_path / "README.md"
    begin, end = readme_blocks.BEGIN.format, readme_blocks.END.format
    path.write_text(
        f"# project\n\n{begin(name='summary')}\nold\n{end(name='summary')}\n\n## Install\n\n"
        f"{begin(name='figures')}\nold\n{end(name='figures')}\n"
    )
    return path


@needs_matplotlib
def test_other_stacks_get_a_row_each_after_the_published_run(tmp_path: Path) -> None:
    path = readme(tmp_path)
    published = tmp_path / "published"
    publish(on_stack("3.13.0", "0.12.0.1"), destination=published, readme=path)
    assert readme_blocks.read_block(path.read_text(), "stacks") is None  # none measured yet
    written = publish_stacks(
        [on_stack("3.11.7", "0.10.2", 2.5), on_stack("3.14.0", "0.12.0.1", 2.0)],
        destination=published,
        readme=path,
    )
    assert published / "stacks.json" in written
    text = path.read_text()
    block = readme_blocks.read_block(text, "stacks")
    assert block is not None
    # Right after the first screen's summary, before the rest of the README.
    assert text.index("published:end summary") < text.index("published:begin stacks")
    assert text.index("published:end stacks") < text.index("## Install")
    rows = [line for line in block.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| stack | `flatten` | ")
    home, older, newer = rows[1:]
    assert home.startswith("| **published**: Python 3.13.0, jax 0.12.0.1, flax 0.12.8 (quick, ")
    assert older.startswith("| Python 3.11.7, jax 0.10.2, flax 0.12.8 (quick, 2026-01-02) | 2.50×")
    assert newer.startswith("| Python 3.14.0, jax 0.12.0.1, flax 0.12.8 (quick, ")
    assert "2.00×" in newer
    # A stack measured again replaces its row; the summary points at the table.
    publish_stacks([on_stack("3.11.7", "0.10.2", 2.7)], destination=published, readme=path)
    block = readme_blocks.read_block(path.read_text(), "stacks") or ""
    assert "2.70×" in block and "2.50×" not in block and "Python 3.14.0" in block
    # Publishing again keeps the table, with the new published run's row.
    publish(on_stack("3.13.0", "0.12.0.1", 3.5), destination=published, readme=path)
    text = path.read_text()
    assert text.count("published:begin stacks") == 1
    assert "3.50×" in (readme_blocks.read_block(text, "stacks") or "")
    summary = readme_blocks.read_block(text, "summary") or ""
    assert "per-operation means on other stacks" in summary


@needs_matplotlib
def test_a_stack_run_is_refused_when_it_cannot_stand_for_its_stack(tmp_path: Path) -> None:
    published = tmp_path / "published"
    with pytest.raises(NotPublishable, match="no published run"):
        publish_stacks([on_stack("3.11.7", "0.10.2")], destination=published, readme=None)
    publish(on_stack("3.13.0", "0.12.0.1"), destination=published, readme=None)
    with pytest.raises(NotPublishable, match="published run's own stack"):
        publish_stacks([on_stack("3.13.0", "0.12.0.1")], destination=published, readme=None)
    filtered = on_stack("3.11.7", "0.10.2")
    filtered.settings["only"] = ["flatten/*"]
    with pytest.raises(NotPublishable, match="filtered"):
        publish_stacks([filtered], destination=published, readme=None)
    # Two runs of one stack are pooled into its row.
    first, second = on_stack("3.11.7", "0.10.2", 2.0), on_stack("3.11.7", "0.10.2", 3.0)
    publish_stacks([first, second], destination=published, readme=None)
    (entry,) = stacks.read_entries(published / "stacks.json")
    assert entry["runs"] == 2 and entry["python"] == "3.11.7" and entry["flax"] == "0.12.8"
    assert entry["means"]["flatten"]["value"] == pytest.approx(2.5)


@needs_matplotlib
def test_one_python_linked_two_ways_is_two_stacks(tmp_path: Path) -> None:
    """How libpython is linked moves the ratios (environment.libpython_linkage): a run of the
    published Python with the other linkage gets a row of its own, named by its linkage, and a run
    with the published run's own linkage is still refused. Runs that recorded none keep their
    old names."""
    path = readme(tmp_path)
    published = tmp_path / "published"
    publish(on_stack("3.13.0", "0.12.0.1", libpython="shared"), destination=published, readme=path)
    summary = " ".join((readme_blocks.read_block(path.read_text(), "summary") or "").split())
    assert "Python 3.13.0 (libpython shared), jax 0.12.0.1, flax 0.12.8" in summary
    with pytest.raises(NotPublishable, match="published run's own stack"):
        publish_stacks(
            [on_stack("3.13.0", "0.12.0.1", libpython="shared")], destination=published, readme=None
        )
    publish_stacks(
        [on_stack("3.13.0", "0.12.0.1", 3.3, "static"), on_stack("3.11.7", "0.10.2", 2.5)],
        destination=published,
        readme=path,
    )
    block = readme_blocks.read_block(path.read_text(), "stacks") or ""
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]
    assert rows[0].startswith("| **published**: Python 3.13.0 (libpython shared), jax 0.12.0.1")
    assert rows[1].startswith("| Python 3.13.0 (libpython static), jax 0.12.0.1, flax 0.12.8")
    assert "3.30×" in rows[1]
    assert rows[2].startswith("| Python 3.11.7, jax 0.10.2, flax 0.12.8")
    kept = {stacks.stack_key(item) for item in stacks.read_entries(published / "stacks.json")}
    assert kept == {"Python 3.13.0 (libpython static), jax 0.12.0.1", "Python 3.11.7, jax 0.10.2"}


def test_without_machine_paths() -> None:
    assert not MACHINE_PATH.search("flatten/transformer* vs 1/2, op/tree, https://x.org/a")
    assert without_machine_paths("/nowhere/at/all/fastree/__init__.py") == (
        "elsewhere: fastree/__init__.py"
    )
    said = without_machine_paths("python -m benchmarks --out /tmp/somewhere/run --quick")
    assert "/tmp" not in said and said.endswith("somewhere/run --quick")


@needs_matplotlib
def test_a_published_run_names_no_machine_path(tmp_path: Path) -> None:
    run = synthetic_result()
    run.environment["fastree_location"] = "/home/someone/fastree/python/fastree/__init__.py"
    run.settings["command"] = "python -m benchmarks --quick --out /home/someone/out"
    published = tmp_path / "published"
    publish(run, destination=published, readme=None)
    for name in ("results.json", "report.md"):
        text = (published / name).read_text()
        assert not re.search(r"/home/|/tmp/", text), name
    again = RunResult.from_json((published / "results.json").read_text())
    assert again.environment["fastree_location"] == "elsewhere: fastree/__init__.py"
