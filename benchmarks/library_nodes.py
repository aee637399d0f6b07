"""Library nodes where users are: an equinox model, plain JAX vs fastree installed first.

An equinox Module class is registered when it is defined, so "plain" and "installed" cannot share
a process: each runs in a child process of its own, ``python -m benchmarks.library_nodes --child``
(plain) and ``python -m fastree.run -m benchmarks.library_nodes --child`` (fastree installed before
equinox is imported, so every Module class is a native attribute node in JAX and fastree). The
children alternate, ``rounds`` times each, and every operation keeps its best time; the ratios in
one table come from one run.

The model: 12 blocks of ``eqx.nn.MultiheadAttention`` + ``eqx.nn.MLP`` + two ``eqx.nn.LayerNorm``,
an ``eqx.nn.Embedding`` and an ``eqx.nn.Linear`` head (the equinox-filter-jit workload's model);
the training step is an ``optax.adamw`` update of it under ``eqx.filter_jit``.

    python -m benchmarks.library_nodes [--rounds 3] [--out bench_out]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

BLOCKS = 12
# (operation, what is timed, target installed/plain from issue #25)
OPERATIONS = (
    ("flatten", "jax.tree_util.tree_flatten(model)", 4.0),
    ("leaves", "jax.tree_util.tree_leaves(model)", 4.0),
    ("tree_map", "jax.tree_util.tree_map(f, model)", 3.0),
    ("flatten_with_path", "jax.tree_util.tree_flatten_with_path(model)", 3.0),
    ("unflatten", "jax.tree_util.tree_unflatten(treedef, leaves)", 2.5),
    ("partition_combine", "eqx.combine(*eqx.partition(model, eqx.is_array))", 2.0),
    ("filter_jit_call", "one call of an eqx.filter_jit function of the model", 1.3),
    ("train_step", "one eqx.filter_jit optax.adamw training step", None),
)
# fastree's own flatten in the installed child against JAX's in the plain child.
FASTREE_FLATTEN = ("fastree_flatten", "fastree.tree_util.tree_flatten(model) vs plain JAX", 10.0)
JSON_NAME = "library_nodes.json"
CHART_NAME = "library_nodes.png"


def _best_seconds(fn: Callable[[], Any], repeats: int = 5) -> float:
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=repeats, number=number)) / number


def _measure() -> dict[str, float]:
    """Per-call seconds of every operation, in this process as it was started."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    from benchmarks.workloads.equinox_jit import TOKENS, VOCAB, _classes

    model = _classes().Model(BLOCKS, jax.random.key(0))
    tokens = jnp.arange(TOKENS) % VOCAB
    leaves, treedef = jax.tree_util.tree_flatten(model)
    forward = eqx.filter_jit(lambda m, x: m(x))
    optimiser = optax.adamw(1e-3)
    opt_state = optimiser.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model: Any, opt_state: Any, tokens: Any) -> Any:
        def loss(m: Any) -> Any:
            return jnp.mean(m(tokens) ** 2)

        grads = eqx.filter_grad(loss)(model)
        updates, opt_state = optimiser.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state

    state = {"model": model, "opt": opt_state}

    def train_step() -> Any:
        state["model"], state["opt"] = step(state["model"], state["opt"], tokens)
        return jax.block_until_ready(state["opt"])

    def identity(x: Any) -> Any:
        return x

    calls: dict[str, Callable[[], Any]] = {
        "flatten": lambda: jax.tree_util.tree_flatten(model),
        "leaves": lambda: jax.tree_util.tree_leaves(model),
        "tree_map": lambda: jax.tree_util.tree_map(identity, model),
        "flatten_with_path": lambda: jax.tree_util.tree_flatten_with_path(model),
        "unflatten": lambda: jax.tree_util.tree_unflatten(treedef, leaves),
        "partition_combine": lambda: eqx.combine(*eqx.partition(model, eqx.is_array)),
        "filter_jit_call": lambda: jax.block_until_ready(forward(model, tokens)),
        "train_step": train_step,
    }
    if "fastree" in sys.modules and os.environ.get("FASTREE_INSTALL") == "1":
        import fastree.tree_util

        calls[FASTREE_FLATTEN[0]] = lambda: fastree.tree_util.tree_flatten(model)
    for call in calls.values():  # compile, and let every class pass its first-instance checks
        call()
        call()
    out = {name: _best_seconds(call) for name, call in calls.items()}
    out["_leaves"] = len(leaves)
    return out


def _child(installed: bool) -> dict[str, float]:
    prefix = ["-m", "fastree.run"] if installed else []
    env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
    done = subprocess.run(
        [sys.executable, *prefix, "-m", "benchmarks.library_nodes", "--child"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"library-nodes child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(rounds: int, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Best times of both modes over ``rounds`` alternating child pairs, and their ratios."""
    best: dict[str, dict[str, float]] = {"plain": {}, "installed": {}}
    for index in range(rounds):
        for mode in ("plain", "installed"):
            for name, seconds in _child(mode == "installed").items():
                held = best[mode].get(name)
                best[mode][name] = seconds if held is None else min(held, seconds)
        progress(f"  library nodes: round {index + 1}/{rounds} done")
    rows = []
    for name, what, target in (*OPERATIONS, FASTREE_FLATTEN):
        plain_key = "flatten" if name == FASTREE_FLATTEN[0] else name
        plain, installed = best["plain"].get(plain_key), best["installed"].get(name)
        if plain is None or installed is None:
            continue
        rows.append(
            {
                "op": name,
                "what": what,
                "plain_us": plain * 1e6,
                "installed_us": installed * 1e6,
                "speedup": plain / installed,
                "target": target,
            }
        )
    return {"rounds": rounds, "leaves": best["plain"].get("_leaves"), "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"equinox model, {BLOCKS} blocks, {result['leaves']} leaves; best of {result['rounds']} "
        "rounds per mode",
        f"{'operation':<20} {'plain us':>10} {'installed us':>13} {'speedup':>8} {'target':>7}",
    ]
    for row in result["rows"]:
        target = f"{row['target']:.1f}x" if row["target"] else "-"
        lines.append(
            f"{row['op']:<20} {row['plain_us']:>10.1f} {row['installed_us']:>13.1f} "
            f"{row['speedup']:>7.2f}x {target:>7}"
        )
    return "\n".join(lines) + "\n"


def write_chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks.report.plotting import pyplot, speedup_label

    plt = pyplot()
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    names = [row["op"] for row in rows]
    values = [row["speedup"] for row in rows]
    ax.barh(names, values, color="#4C72B0")
    for y, row in enumerate(rows):
        ax.text(row["speedup"], y, " " + speedup_label(row["speedup"]), va="center")
        if row["target"]:
            ax.plot([row["target"]] * 2, [y - 0.4, y + 0.4], color="#C44E52", linewidth=2)
    ax.axvline(1.0, color="black", linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlim(right=max(values + [1.0]) * 1.8)  # room for the largest label
    ax.invert_yaxis()
    ax.set_xlabel("installed / plain speedup (red: target)")
    ax.set_title(f"equinox model ({BLOCKS} blocks): fastree installed first vs plain JAX")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_NAME).write_text(json.dumps(result, indent=2))
    written = [out / JSON_NAME]
    try:
        write_chart(result, out / CHART_NAME)
        written.append(out / CHART_NAME)
    except Exception as error:  # noqa: BLE001 - no matplotlib: the table and JSON still stand
        print(f"library-nodes chart skipped: {error}", file=sys.stderr)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure()))
        return 0
    result = run(args.rounds)
    sys.stdout.write(render(result))
    written = write_outputs(result, args.out)
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
