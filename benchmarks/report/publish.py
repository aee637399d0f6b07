"""Where a report goes: beside its run, or, asked for by name, into the published run.

- A run writes results.json, report.md, chart.png and chart_details.png into its ``--out``.
- ``python -m benchmarks.report RESULTS_JSON`` writes report.md and both charts again from a
  results.json, nothing timed again: beside RESULTS_JSON, or into ``--destination DIR``. It
  never writes into the repository's published run unless asked with ``--publish``.
- Publishing is a step of its own, asked for by ``--publish`` (here, or on ``python -m
  benchmarks``): an unfiltered run becomes ``benchmarks/published/`` under the run's own names
  (results.json, report.md, chart.png, chart_details.png, with a header on report.md saying where
  it came from), and the README's generated blocks (``readme``) are rewritten from that same run.
  ``tests/test_published_figures.py`` checks the three agree with each other and with the suite.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.measure.results import RunResult
from benchmarks.report.outputs import (
    CHART_PNG,
    DETAILS_PNG,
    REPORT_MD,
    RESULTS_JSON,
    write_report_files,
)
from benchmarks.report.readme import README, render_blocks, replace_blocks

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent
PUBLISHED_DIR = BENCHMARKS_DIR / "published"
"""The published run: the one the README quotes, under the run's own file names."""
PUBLISHED_REPORT = REPORT_MD
PUBLISHED_CHART = CHART_PNG
PUBLISHED_DETAILS = DETAILS_PNG

PUBLISH_COMMAND = "python -m benchmarks --quick --publish"
"""The one command that times the shipped code and publishes the run (README, docs/testing.md)."""

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
    readme_text = None
    if readme is not None:
        try:
            readme_text = replace_blocks(
                readme.read_text(), render_blocks(result, readme, destination)
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
    parser.add_argument("results", type=Path, metavar="RESULTS_JSON", help="a run's results.json")
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
        help="make this run the published one: benchmarks/published/ and the README's blocks",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result = RunResult.from_json(args.results.read_text())
    except (OSError, ValueError) as error:
        parser.error(f"cannot read {args.results}: {error}")
    if args.publish:
        try:
            written = publish(result)
        except NotPublishable as reason:
            parser.error(f"not published: {reason}")
        print(f"published {', '.join(map(str, written))}", file=sys.stderr)
        return 0
    destination = args.destination or args.results.resolve().parent
    if destination.resolve() == PUBLISHED_DIR.resolve():
        parser.error(
            f"{destination} holds the published run, which the README quotes: rewrite it with "
            "--publish, or name another --destination"
        )
    header = REBUILT_HEADER.format(
        source=args.results,
        mode=result.settings.get("mode", "?"),
        date=result.environment.get("date", "?"),
    )
    written = write_report_files(result, destination, header)
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0
