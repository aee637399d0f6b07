"""The README's figures, generated from the published run so they cannot drift from it.

The README holds generated blocks, each between ``<!-- published:begin NAME -->`` and
``<!-- published:end NAME -->``: ``summary`` (the few figures on its first screen, and the stack
they come from: Python, JAX, flax) and ``figures`` (the Performance section: the run's provenance,
the chart, the tree operations, the cells where fastree is not faster, every workload, treedef
memory). Publishing rewrites both from the run it publishes. A third, ``stacks`` (what to expect
on other stacks: ``benchmarks.report.stacks``), follows the summary once other stacks have been
measured; its markers are put there the first time, by the code, and it is rewritten with the
others. Everything around the blocks is hand-written and quotes no figure. Every figure is
formatted by the same functions as report.md, under the names report.md uses (``tree_map3``,
``copy``, ``treedef_hash``, the workloads' names), so each can be found there as written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from benchmarks.data.operations import MEMORY_OP, OPERATIONS
from benchmarks.measure.results import MEMORY_UNIT, Row, RunResult, WorkloadRow
from benchmarks.report import floor
from benchmarks.report.format import format_interval, format_value
from benchmarks.report.grid import MeanRatio, library_columns, mean_ratios, slower_cells
from benchmarks.report.markdown import interval_scope, interval_widths, load_text
from benchmarks.report.outputs import CHART_PNG, REPORT_MD, RESULTS_JSON
from benchmarks.report.palette import HEADLINE_COMPETITORS, label_of
from benchmarks.report.stacks import stack_lines, stack_of
from benchmarks.workloads.base import FLOOR

README = Path(__file__).resolve().parent.parent.parent / "README.md"
BLOCKS = ("summary", "figures")
"""The published run's own blocks: every figure in them is in its report.md."""
STACKS = "stacks"
"""The other stacks' block (``benchmarks.report.stacks``), right after the summary."""
BEGIN = "<!-- published:begin {name} (written by --publish: benchmarks/report/readme.py) -->"
END = "<!-- published:end {name} -->"

SUMMARY_WORKLOADS = (
    "eqx-train-step",
    "nnx-jit-train-step",
    "nnx-split",
    "checkpoint-paths",
    "optax-adamw-eager",
    "jit-trace-lower",
)
"""The workloads the README's first screen names (those in the run, in this order)."""
FAR_MORE_OPS = ("treedef_hash", "treedef_eq")
"""Operations left out of the first screen's range and named on their own: their ratios are
tens to hundreds, and would hide the others' range."""
GROUP_TITLES = {
    "program": "Programs",
    "equinox model": "Operations on an equinox model",
    "nnx model": "Operations on a flax.nnx model",
}


def block_pattern(name: str) -> re.Pattern[str]:
    begin = re.escape(BEGIN.format(name=name))
    return re.compile(f"{begin}\n(.*?){re.escape(END.format(name=name))}", re.DOTALL)


def read_block(text: str, name: str) -> str | None:
    """The generated text between block ``name``'s markers in ``text``, or None."""
    found = block_pattern(name).search(text)
    return found.group(1) if found else None


def replace_blocks(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each named block's contents replaced; ValueError when a marker is missing
    (the README decides where the figures go, publishing only fills them in), except the
    ``stacks`` block's, which are put after the summary block the first time."""
    if STACKS in blocks and read_block(text, STACKS) is None:
        text = _with_stacks_markers(text)
    for name, body in blocks.items():
        pattern = block_pattern(name)
        if len(pattern.findall(text)) != 1:
            raise ValueError(
                f"the README needs exactly one pair of markers {BEGIN.format(name=name)!r} ... "
                f"{END.format(name=name)!r}"
            )
        replacement = f"{BEGIN.format(name=name)}\n{body}{END.format(name=name)}"
        text = pattern.sub(lambda _match, r=replacement: r, text)
    return text


def _with_stacks_markers(text: str) -> str:
    end = END.format(name="summary")
    if text.count(end) != 1:
        raise ValueError(f"the README needs exactly one {end!r} to put the stacks block after")
    markers = f"{BEGIN.format(name=STACKS)}\n{END.format(name=STACKS)}"
    return text.replace(end, f"{end}\n\n{markers}", 1)


def render_blocks(
    result: RunResult,
    readme: Path,
    published: Path,
    stacks: list[dict[str, object]] | None = None,
) -> dict[str, str]:
    """Each block's text for ``readme``, quoting ``result`` published into ``published``; with
    ``stacks`` (``benchmarks/published/stacks.json``'s entries), the stacks block too."""
    where = Path(os.path.relpath(published.resolve(), readme.resolve().parent)).as_posix()
    blocks = {
        "summary": render_summary(result, bool(stacks)),
        "figures": render_figures(result, where),
    }
    if stacks:
        blocks[STACKS] = render_stacks(result, stacks)
    return blocks


def render_stacks(result: RunResult, stacks: list[dict[str, object]]) -> str:
    lines = stack_lines(result, stacks)  # type: ignore[arg-type]
    return "\n".join(_wrap(line) if not line.startswith("|") else line for line in lines) + "\n"


# ------------------------------------------------------------------------------------------------
# the first screen


def render_summary(result: RunResult, other_stacks: bool = False) -> str:
    env = result.environment
    means = mean_ratios(result)
    jax_means = {
        op: by_library["jax"]
        for op, by_library in means.items()
        if "jax" in by_library and op != MEMORY_OP
    }
    ranged = {op: mean for op, mean in jax_means.items() if op not in FAR_MORE_OPS}
    runs = result.pooled_runs
    parts = [
        f"What to expect, from the published run (\"Performance\": {result.settings['mode']} "
        f"mode, {_day(env)}"
        + (f", {runs} runs pooled" if runs > 1 else "")
        + f", {stack_of(result).describe()}, {env.get('cpu_count', '?')} shared CPU cores):"
    ]
    if ranged:
        low = min(ranged, key=lambda op: ranged[op].value)
        high = max(ranged, key=lambda op: ranged[op].value)
        far = [op for op in FAR_MORE_OPS if op in jax_means]
        parts.append(
            f"per operation, fastree's tree functions run {_mean_text(ranged[low])} "
            f"(`{low}`) to {_mean_text(ranged[high])} (`{high}`) faster than `jax.tree_util` "
            "on average over the trees"
            + "".join(f", `{op}` {_mean_text(jax_means[op])}" for op in far)
            + ";"
        )
    named = [row for name in SUMMARY_WORKLOADS for row in result.workloads if row.name == name]
    if named:
        parts.append(
            "a whole program gains what its tree work is worth, plain JAX against fastree "
            "installed first: " + ", ".join(_workload_text(row) for row in named) + "."
        )
    parts.append(
        "These are CPU figures, with the leaves in host memory (\"Performance\" says what is "
        "known of GPU-backed trees)."
    )
    if other_stacks:
        parts.append("The table below gives the per-operation means on other stacks.")
    return _wrap(" ".join(parts)) + "\n"


def _mean_text(mean: MeanRatio) -> str:
    return f"{mean.value:.2f}×"


def _workload_text(row: WorkloadRow) -> str:
    if row.not_run or row.speedup is None:
        return f"`{row.name}` not run"
    if row.verdict == "same":
        return f"`{row.name}` the same ({row.speedup:.2f}×)"
    if row.verdict == "slower":
        return f"`{row.name}` slower ({row.speedup:.2f}×)"
    return f"`{row.name}` {row.speedup:.2f}×"


# ------------------------------------------------------------------------------------------------
# the Performance section


def render_figures(result: RunResult, published: str) -> str:
    parts = [
        *_provenance(result, published),
        f"![fastree speedup per operation, end-to-end workloads and treedef memory]"
        f"({published}/{CHART_PNG})",
        "",
        *_precision(result),
        *_operations(result),
        *_not_faster(result),
        *_workloads(result),
        *_memory(result),
    ]
    return "\n".join(_wrap(line) if not line.startswith(("|", "!")) else line for line in parts)


def _provenance(result: RunResult, published: str) -> list[str]:
    env = result.environment
    versions = ", ".join(f"{name} {version}" for name, version in result.libraries.items())
    workload_libraries = env.get("workload_libraries")
    revision = env.get("source_revision")
    runs = result.pooled_runs
    return [
        f"**The published run**: `{result.settings.get('command', '?')}` on {env.get('date', '?')}"
        + (f", {runs} runs pooled, one after another" if runs > 1 else "")
        + f", {result.duration_s / 60:.1f} minutes"
        + (" in all" if runs > 1 else "")
        + (f", fastree at {revision}" if revision else "")
        + f". Python {env.get('python', '?')}; {versions}"
        + (f"; the workloads used {workload_libraries}" if workload_libraries else "")
        + f". Machine: {env.get('cpu', '?')}, {env.get('cpu_count', '?')} cores"
        + (f", {load_text(env)}" if load_text(env) else "")
        + f"; device {env.get('device', '?')}. Every figure below is in its report, "
        f"[`{published}/{REPORT_MD}`]({published}/{REPORT_MD}), under the same name and with its "
        f"interval; the measurements are in `{published}/{RESULTS_JSON}`.",
        "",
    ]


def _precision(result: RunResult) -> list[str]:
    widths = interval_widths(result)
    if not widths:
        return []
    tolerance = result.settings.get("tolerance", 0)
    within = sum(width <= tolerance for width in widths)
    if result.pooled_runs > 1:
        return [
            f"**Precision.** A ratio is the median of {result.pooled_runs} runs' ratios, each the "
            "median over rounds in which both libraries were timed back to back, and "
            "`[low–high]` its interval; an interval that includes 1.0× reads \"same\". The "
            f"median interval is ±{_median(widths):.1%}.",
            "",
            interval_scope(result),
            "",
        ]
    return [
        f"**Precision.** A ratio is the median over rounds in which both libraries were timed "
        f"back to back, and `[low–high]` its interval; an interval that includes 1.0× reads "
        f"\"same\". The median interval is ±{_median(widths):.1%}; {within} of {len(widths)} "
        f"ratios reached the ±{tolerance:.0%} this mode asks for, the rest stopped at its round "
        "or time limit and say so through a wider interval.",
        "",
        interval_scope(result),
        "",
    ]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _operations(result: RunResult) -> list[str]:
    means = mean_ratios(result)
    competitors = [
        name for name in HEADLINE_COMPETITORS if any(name in by_lib for by_lib in means.values())
    ]
    if not competitors:
        return []
    variants = [tree.name for tree in result.trees if tree.variant_of]
    in_table = {
        row.tree for row in result.rows if row.library in competitors and row.op != MEMORY_OP
    }
    trees = [tree.name for tree in result.trees if not tree.variant_of and tree.name in in_table]
    lines = [
        f"**Tree operations**: per operation, the geometric mean over the trees of (peer time / "
        f"fastree time), its interval, and in parentheses how many trees read faster / same / "
        f"slower (n = trees; the {len(trees)} trees: "
        + ", ".join(f"`{name}`" for name in trees)
        + (f"; its {len(variants)} dict-order variants are left out" if variants else "")
        + ").",
        "",
        "| operation | " + " | ".join(f"vs {_peer(result, name)}" for name in competitors) + " |",
        "|---|" + "---:|" * len(competitors),
    ]
    for op in OPERATIONS:
        if op == MEMORY_OP or not any(name in means.get(op, {}) for name in competitors):
            continue
        cells = []
        for name in competitors:
            mean = means[op].get(name)
            cells.append(_mean_cell(mean) if mean else "–")
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    lines.append("")
    others = _other_peers(result, means, competitors)
    if others:
        lines += [others, ""]
    return lines


def _peer(result: RunResult, name: str) -> str:
    return f"{label_of(name)} {result.libraries.get(name, '')}".strip()


def _mean_cell(mean: MeanRatio) -> str:
    verdicts = mean.verdicts
    return (
        f"{format_interval(mean.value, mean.low, mean.high, '×')} "
        f"({verdicts['faster']}/{verdicts['same']}/{verdicts['slower']} of n={mean.trees})"
    )


def _other_peers(
    result: RunResult, means: dict[str, dict[str, MeanRatio]], shown: list[str]
) -> str:
    """One sentence on the peers outside the table: their range of per-operation means."""
    texts = []
    for name in library_columns(result):
        if name == result.baseline or name in shown:
            continue
        by_op = {op: by_lib[name] for op, by_lib in means.items() if name in by_lib}
        if not by_op:
            continue
        if len(by_op) == 1:
            ((op, mean),) = by_op.items()
            texts.append(f"against {label_of(name)}, `{op}` {_mean_cell(mean)}")
            continue
        low = min(by_op, key=lambda op: by_op[op].value)
        high = max(by_op, key=lambda op: by_op[op].value)
        texts.append(
            f"against {label_of(name)}, {_mean_text(by_op[low])} (`{low}`) to "
            f"{_mean_text(by_op[high])} (`{high}`)"
        )
    if not texts:
        return ""
    return "Per-operation means " + "; ".join(texts) + " (every cell is in the report)."


def _not_faster(result: RunResult) -> list[str]:
    timed = [
        row
        for row in result.rows
        if row.library != result.baseline and row.ratio and row.unit != MEMORY_UNIT
    ]
    slower = slower_cells(result)
    same = [row for row in timed if row.verdict == "same"]
    lines = [
        f"**Where fastree is not faster.** Of {len(timed)} timed cells, {len(slower)} read "
        f"slower (the whole interval below 1×) and {len(same)} the same (the interval includes "
        "1×)" + (":" if slower or same else ".")
    ]
    if slower:
        lines.append("Slower: " + "; ".join(_cell(row) for row in slower) + ".")
    if same:
        lines.append("The same: " + "; ".join(_cell(row) for row in same) + ".")
    return [" ".join(lines), ""]


def _cell(row: Row) -> str:
    ratio = format_interval(row.ratio, row.ratio_low, row.ratio_high, "×")
    return f"`{row.op}/{row.tree}` vs {label_of(row.library)} {ratio}"


def _workloads(result: RunResult) -> list[str]:
    workloads = [row for row in result.workloads if row.group != FLOOR]  # floor.readme_lines
    if not workloads:
        return floor.readme_lines(result)
    timed = next((row for row in workloads if row.rounds), None)
    lines = [
        "**Whole programs**: each workload timed in a plain JAX process and in one with fastree "
        "installed first (`python -m fastree.run`), the two taking turns"
        + (
            f", {timed.rounds} rounds in {result.settings.get('workload_pairs')} pairs of "
            f"processes; intervals with {timed.confidence:.1%} confidence"
            if timed and timed.confidence
            else ""
        )
        + ". speedup = plain / installed.",
        "",
        "| workload | plain | installed | speedup [interval] |",
        "|---|---:|---:|---:|",
    ]
    for group in dict.fromkeys(row.group for row in workloads):
        lines.append(f"| *{GROUP_TITLES.get(group, group)}* | | | |")
        for row in (r for r in workloads if r.group == group):
            lines.append(_workload_line(row))
    return [*lines, "", *floor.readme_lines(result)]


def _workload_line(row: WorkloadRow) -> str:
    name = f"`{row.name}`: {row.description}"
    if row.not_run or row.speedup is None:
        return f"| {name} | – | – | not run: {row.not_run} |"
    speedup = format_interval(row.speedup, row.speedup_low, row.speedup_high, "×")
    if row.verdict in ("same", "slower"):
        speedup = f"{row.verdict}: {speedup}"
    return (
        f"| {name} | {format_value(row.plain, 'ns', micro='µs')} | "
        f"{format_value(row.installed, 'ns', micro='µs')} | {speedup} |"
    )


def _memory(result: RunResult) -> list[str]:
    rows = [row for row in result.rows if row.op == MEMORY_OP]
    if not rows:
        return []
    trees = list(dict.fromkeys(row.tree for row in rows))
    texts = []
    for name in library_columns(result):
        values = [row.median for row in rows if row.library == name]
        if values:
            texts.append(f"{label_of(name)} {_range(values)}")
    return [
        "**Treedef memory** (`treedef_memory`, bytes held per treedef node, on "
        + ", ".join(f"`{tree}`" for tree in trees)
        + "): "
        + ", ".join(texts)
        + ".",
        "",
    ]


def _range(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"


def _day(env: dict[str, object]) -> str:
    return str(env.get("date", "?"))[:10]


def _wrap(text: str, width: int = 100) -> str:
    """Markdown prose wrapped at the README's width; backquoted spans are never split."""
    words = re.findall(r"(?:`[^`]*`|\S)+", text)
    lines: list[str] = []
    current = ""
    for word in words:
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return "\n".join(lines)
