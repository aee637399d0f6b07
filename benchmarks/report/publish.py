"""Where a report goes: beside its run, or, asked for by name, into the published run.

- A run writes results.json, report.md, chart.png and chart_details.png into its ``--out``.
- ``python -m benchmarks.report RESULTS_JSON`` writes report.md and both charts again from a
  results.json, nothing timed again: beside RESULTS_JSON, or into ``--destination DIR``. It
  never writes into the repository's published run unless asked with ``--publish``. Given
  several results.json (runs of one kind, stack and machine, made one after another), it pools
  them first (``benchmarks.measure.pooling``) and writes the pooled run's results.json too.
- Publishing is a step of its own, asked for by ``--publish`` (here, or on ``python -m
  benchmarks``): an unfiltered run becomes ``benchmarks/published/`` under the run's own names
  (results.json, report.md, chart.png, chart_details.png, with a header on report.md saying where
  it came from), and the README's generated blocks (``readme``) are rewritten from that same run.
  A published run carries no path of the machine it ran on (``without_machine_paths``).
  ``tests/test_published_figures.py`` checks the three agree with each other and with the suite.
- ``python -m benchmarks.report --stacks A.json [B.json ...]`` records other stacks' runs in
  ``benchmarks/published/stacks.json`` and rewrites the README's ``stacks`` block
  (``benchmarks.report.stacks``): what to expect on a stack other than the published run's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.measure.environment import without_machine_paths
from benchmarks.measure.pooling import NotPoolable, pool
from benchmarks.measure.results import RunResult
from benchmarks.report.outputs import (
    CHART_PNG,
    DETAILS_PNG,
    REPORT_MD,
    RESULTS_JSON,
    write_report_files,
)
from benchmarks.report import stacks as other_stacks
from benchmarks.report.readme import README, STACKS, render_blocks, replace_blocks

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent
PUBLISHED_DIR = BENCHMARKS_DIR / "published"
"""The published run: the one the README quotes, under the run's own file names."""
PUBLISHED_REPORT = REPORT_MD
PUBLISHED_CHART = CHART_PNG
PUBLISHED_DETAILS = DETAILS_PNG

PUBLISH_COMMAND = "python -m benchmarks --quick --publish --runs 3"
"""The one command that times the shipped code and publishes the run (README, docs/testing.md):
three runs, one after another, pooled, so the published intervals hold between runs."""

HEADER = (
    "<!-- The published run: {mode} run of {date}, written by the publish step (`--publish`, "
    "benchmarks/report/publish.py) from results.json beside this file; do not edit by hand. "
    "-->\n\n"
)
CHART_FOOTER = (
    "Every figure with its interval: the published run's report.md, beside this chart in "
    "benchmarks/published/ ({mode} run of {date})."
)
"""The published charts' last caption line: only they point at the published run."""
REBUILT_HEADER = (
    "<!-- Rebuilt by `python -m benchmarks.report` from {source} ({mode} run of {date}); do not "
    "edit by hand. -->\n\n"
)


class NotPublishable(Exception):
    """A run that must not become the published one, and why."""


def why_not_publishable(result: RunResult) -> str | None:
    """Why this run cannot be the published one (the README quotes it as the suite), or None."""
    settings = result.settings
    if settings.get("only") or settings.get("leaves") not in (None, "default"):
        return "that run was filtered (--only or --leaves): it does not cover the suite"
    if result.baseline != "fastree":
        return f"that run's baseline is {result.baseline}, not fastree"
    if settings.get("device", "cpu") != "cpu":
        # The README's figures are the CPU suite's; a GPU run is kept apart (scripts/gpu_check.sh).
        return f"that run put its jax leaves on {settings['device']}: the published run is on cpu"
    return None


def publish(
    result: RunResult, *, destination: Path = PUBLISHED_DIR, readme: Path | None = README
) -> list[Path]:
    """Make ``result`` the published run: its files in ``destination``, and the README's generated
    blocks (``readme=None``: left alone). Raises NotPublishable, with nothing written, for a run
    that cannot be the published one, a README without the blocks' markers, or a chart that
    cannot be drawn (the README shows the chart)."""
    why_not = why_not_publishable(result)
    if why_not:
        raise NotPublishable(why_not)
    result = without_paths(result)
    readme_text = None
    if readme is not None:
        try:
            stacks = other_stacks.read_entries(destination / other_stacks.STACKS_JSON)
            readme_text = replace_blocks(
                readme.read_text(), render_blocks(result, readme, destination, stacks)
            )
        except (OSError, ValueError) as error:
            raise NotPublishable(f"{readme}: {error}") from None
    run = {"mode": result.settings.get("mode", "?"), "date": result.environment.get("date", "?")}
    header = HEADER.format(**run)
    destination.mkdir(parents=True, exist_ok=True)
    # Drawn and written beside the published files first, moved in only once all of them are:
    # a failure leaves the published run as it was.
    with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".publishing-") as staging:
        skipped_before = len(result.skipped)
        staged = write_report_files(result, Path(staging), header, CHART_FOOTER.format(**run))
        if len(result.skipped) > skipped_before:
            notes = "; ".join(note.reason for note in result.skipped[skipped_before:])
            del result.skipped[skipped_before:]
            raise NotPublishable(f"a chart could not be drawn ({notes})")
        result.write(Path(staging) / RESULTS_JSON)
        written = []
        for path in [Path(staging) / RESULTS_JSON, *staged]:
            written.append(destination / path.name)
            os.replace(path, destination / path.name)
    if readme is not None and readme_text is not None:
        readme.write_text(readme_text)
        written.append(readme)
    return written


def without_paths(result: RunResult) -> RunResult:
    """A copy of ``result`` whose every text (environment, settings, notes, runs) names no
    absolute path of the machine it ran on (``environment.without_machine_paths``)."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return without_machine_paths(value)
        if isinstance(value, list):
            return [clean(item) for item in value]
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        return value

    return RunResult.from_json(json.dumps(clean(json.loads(result.to_json()))))


def publish_stacks(
    results: list[RunResult],
    *,
    destination: Path = PUBLISHED_DIR,
    readme: Path | None = README,
) -> list[Path]:
    """Record ``results`` (runs on stacks other than the published run's; several runs of one
    stack are pooled) in ``destination``/stacks.json, replacing the entries of the stacks they
    come from, and rewrite the README's stacks block. Raises NotPublishable, with nothing
    written, for a filtered run, runs of one stack that cannot be pooled, a run of the published
    run's own stack, or no published run to put first."""
    published_json = destination / RESULTS_JSON
    try:
        published = RunResult.from_json(published_json.read_text())
    except (OSError, ValueError) as error:
        raise NotPublishable(f"no published run to compare stacks with ({error})") from None
    home = other_stacks.stack_of(published).key
    by_stack: dict[str, list[RunResult]] = {}
    for result in results:
        why_not = why_not_publishable(result)
        if why_not:
            raise NotPublishable(why_not)
        by_stack.setdefault(other_stacks.stack_of(result).key, []).append(result)
    if home in by_stack:
        raise NotPublishable(
            f"a run on the published run's own stack ({home}): its row is the published run's; "
            "publish it with --publish"
        )
    new = []
    for runs in by_stack.values():
        try:
            pooled = runs[0] if len(runs) == 1 else pool(runs)
        except NotPoolable as reason:
            raise NotPublishable(f"runs of one stack that cannot be pooled: {reason}") from None
        new.append(other_stacks.entry(without_paths(pooled)))
    stacks_json = destination / other_stacks.STACKS_JSON
    entries = other_stacks.merged(other_stacks.read_entries(stacks_json), new)
    readme_text = None
    if readme is not None:
        try:
            block = render_blocks(published, readme, destination, entries)[STACKS]
            readme_text = replace_blocks(readme.read_text(), {STACKS: block})
        except (OSError, ValueError) as error:
            raise NotPublishable(f"{readme}: {error}") from None
    other_stacks.write_entries(stacks_json, entries)
    written = [stacks_json]
    if readme is not None and readme_text is not None:
        readme.write_text(readme_text)
        written.append(readme)
    return written


def read_results(paths: list[Path], command: str | None = None) -> RunResult:
    """The run in one results.json, or several runs' pooled (ValueError: why not)."""
    results = [RunResult.from_json(path.read_text()) for path in paths]
    if len(results) == 1:
        return results[0]
    try:
        return pool(results, [path.as_posix() for path in paths], command)
    except NotPoolable as reason:
        raise ValueError(f"these runs cannot be pooled: {reason}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description="Write a run's report.md, chart.png and chart_details.png again from its "
        "results.json, timing nothing again (after a change to the report or the charts, say).",
        epilog="Where output goes: beside RESULTS_JSON (report.md, chart.png, chart_details.png "
        "in the same folder), or into --destination DIR. Nothing is written into the repository "
        "unless --publish is given: then the run, if unfiltered, becomes benchmarks/published/ "
        "(results.json, report.md, chart.png, chart_details.png) and the README's generated "
        "performance blocks are rewritten from it. To time the shipped code and publish in one "
        f"step: {PUBLISH_COMMAND}.",
    )
    parser.add_argument(
        "results",
        type=Path,
        nargs="+",
        metavar="RESULTS_JSON",
        help="a run's results.json; several runs' (of one kind, stack and machine, made one after "
        "another in separate processes) are pooled into one, whose intervals cover the spread "
        "between runs (benchmarks/measure/pooling.py)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--destination",
        type=Path,
        metavar="DIR",
        help="write the report and charts into DIR instead of beside RESULTS_JSON",
    )
    where.add_argument(
        "--publish",
        action="store_true",
        help="make this run (or these runs, pooled) the published one: benchmarks/published/ "
        "and the README's blocks",
    )
    where.add_argument(
        "--stacks",
        action="store_true",
        help="record these runs, made on stacks other than the published run's (Python, jax), "
        "in benchmarks/published/stacks.json, replacing those stacks' earlier entries, and "
        "rewrite the README's table of what to expect on other stacks (runs of one stack are "
        "pooled)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.stacks:
        try:
            runs = [RunResult.from_json(path.read_text()) for path in args.results]
            written = publish_stacks(runs)
        except (OSError, ValueError) as error:
            parser.error(f"cannot read {' '.join(map(str, args.results))}: {error}")
        except NotPublishable as reason:
            parser.error(f"not published: {reason}")
        print(f"published {', '.join(map(str, written))}", file=sys.stderr)
        return 0
    pooled = len(args.results) > 1
    try:
        # Pooled, the run keeps the command that made its runs (the first's), which it quotes.
        result = read_results(args.results)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read {' '.join(map(str, args.results))}: {error}")
    if args.publish:
        try:
            written = publish(result)
        except NotPublishable as reason:
            parser.error(f"not published: {reason}")
        print(f"published {', '.join(map(str, written))}", file=sys.stderr)
        return 0
    if pooled and args.destination is None:
        parser.error("several runs are pooled into a run of their own: name its --destination")
    destination = args.destination or args.results[0].resolve().parent
    if destination.resolve() == PUBLISHED_DIR.resolve():
        parser.error(
            f"{destination} holds the published run, which the README quotes: rewrite it with "
            "--publish, or name another --destination"
        )
    header = REBUILT_HEADER.format(
        source=" + ".join(map(str, args.results)),
        mode=result.settings.get("mode", "?"),
        date=result.environment.get("date", "?"),
    )
    written = write_report_files(result, destination, header)
    if pooled:
        result.write(destination / RESULTS_JSON)
        written.insert(0, destination / RESULTS_JSON)
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0
