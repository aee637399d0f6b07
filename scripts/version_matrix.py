"""Run the README's test command in fresh venvs over the supported Python x JAX matrix.

Each combination gets its own venv, made from pyenv's newest patch release of its Python minor
(``$(pyenv root)/versions/3.X.Y/bin/python``; Python 3.14, which pyenv here lacks, from Debian's
own binaries through ``scripts/get_cp314.sh``), upgrades its pip, and runs exactly what the README
and ``.ci/run`` do: a clean, non-editable ``pip install "<repo>[test]"`` (the JAX pin, where the
combination has one, goes into the same pip command, so the resolver picks the test extra's
libraries to match it), then ``python -m pytest`` from the repository root with the venv's python.

Combinations (name: Python, JAX):

    lowest        3.10  jax==0.6.2   jaxlib==0.6.2    (the oldest pyproject.toml allows)
    py311-jax06   3.11  jax==0.6.2   jaxlib==0.6.2
    py311-jax010  3.11  jax==0.10.2  jaxlib==0.10.2
    py312-newest  3.12  newest jax
    newest        3.13  newest jax     (the home stack: .ci/run's first two runs use it)
    py314         3.14  newest jax     (Debian's CPython 3.14, scripts/get_cp314.sh)

Usage:

    python scripts/version_matrix.py                                   # all of them
    python scripts/version_matrix.py --only lowest,newest
    python scripts/version_matrix.py --only lowest --pytest-args "-x -q tests/test_api_surface.py"
    python scripts/version_matrix.py --venv-root /tmp/m --reuse       # keep the venvs between runs
    python scripts/version_matrix.py --print-python home              # the home stack's interpreter

At the end it prints a Markdown table (combination, Python, jax / jaxlib and numpy as installed,
pytest's summary line, minutes) and writes it to ``<venv-root>/matrix.md``; each combination's
full output goes to ``<venv-root>/<name>.log``, whose tail is printed when the combination fails.
Exit status: 0 when every combination that ran passed, 1 otherwise. A combination whose Python is
not installed under pyenv is reported as skipped and fails the run only with ``--strict``. The
first install of each venv compiles the C++ extension (about 3 minutes on a 2-core machine).
Stdlib only; never reads stdin (CI runs it with CI=true and no standard input).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOG_TAIL_LINES = 60


@dataclasses.dataclass(frozen=True)
class Combination:
    name: str
    python: str  # "3.X": the newest pyenv 3.X.Y is used
    pins: tuple[str, ...]  # extra requirements for the same pip command; empty = newest JAX


COMBINATIONS = (
    Combination("lowest", "3.10", ("jax==0.6.2", "jaxlib==0.6.2")),
    Combination("py311-jax06", "3.11", ("jax==0.6.2", "jaxlib==0.6.2")),
    Combination("py311-jax010", "3.11", ("jax==0.10.2", "jaxlib==0.10.2")),
    Combination("py312-newest", "3.12", ()),
    Combination("newest", "3.13", ()),
    Combination("py314", "3.14", ()),
)
# "home": the stack fastree is developed, tested first and published on (README, "Performance").
ALIASES = {
    "all": [c.name for c in COMBINATIONS],
    "oldest": ["lowest"],
    "latest": ["newest"],
    "home": ["newest"],
}
# Pythons pyenv does not have here but a script of this repository makes (a fresh venv with pip, and
# the CPATH a C extension is built with); None when the script fails.
DEBIAN_PYTHONS = {"3.14": REPO / "scripts" / "get_cp314.sh"}


@dataclasses.dataclass
class Row:
    combination: str
    python: str = "-"
    jax: str = "-"
    numpy: str = "-"
    result: str = "not run"
    minutes: str = "-"
    failed: bool = False  # counts against the exit status
    skipped: bool = False


# pytest's last line: "==== 8544 passed, 19 skipped in 301.2s ====", or with -q "3 passed in 0.5s";
# also "no tests ran in 0.01s". The duration may carry "(0:05:01)".
SUMMARY_RE = re.compile(
    r"^=*\s*(?P<summary>(?:\d+ [a-z]+(?:, )?)+|no tests ran) in [\d.]+s(?: \([\d:]+\))?\s*=*$"
)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def pytest_summary(log_text: str) -> str | None:
    """The counts from pytest's final summary line ("8544 passed, 19 skipped"), or None."""
    for line in reversed(log_text.splitlines()):
        match = SUMMARY_RE.match(ANSI_RE.sub("", line).strip())
        if match:
            return match.group("summary").rstrip(", ")
    return None


def pyenv_root() -> Path:
    pyenv = shutil.which("pyenv")
    if pyenv:
        out = subprocess.run(
            [pyenv, "root"], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    return Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))


def find_python(minor: str) -> Path | None:
    """The newest pyenv CPython 3.X.Y for minor "3.X" (final releases only), or None."""
    versions = pyenv_root() / "versions"
    pattern = re.compile(rf"^{re.escape(minor)}\.(\d+)$")
    found = []
    for entry in versions.glob(f"{minor}.*") if versions.is_dir() else ():
        match = pattern.match(entry.name)
        if match and (entry / "bin" / "python").exists():
            found.append((int(match.group(1)), entry / "bin" / "python"))
    return max(found)[1] if found else None


def child_env(venv: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV", "PIP_USER"):
        env.pop(var, None)
    env.update(
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PYTHONUNBUFFERED="1",
        PY_COLORS="0",  # plain text in the logs, and a summary line the parser can read
    )
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    return env


def run_logged(cmd: list[str], log, *, cwd: Path, env: dict[str, str], echo: bool) -> int:
    """Runs cmd with stdout and stderr into the open log (and the terminal if echo); its status."""
    log.write(f"\n$ {shlex.join(cmd)}    (in {cwd})\n")
    log.flush()
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.write(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
    finally:
        proc.stdout.close()
        returncode = proc.wait()
    log.write(f"[exit status {returncode} after {time.monotonic() - start:.0f}s]\n")
    log.flush()
    return returncode


def installed_versions(python: Path) -> dict[str, str]:
    script = (
        "import importlib.metadata as m, json, platform\n"
        "v = {'python': platform.python_version()}\n"
        "for d in ('jax', 'jaxlib', 'numpy'):\n"
        "    try:\n"
        "        v[d] = m.version(d)\n"
        "    except m.PackageNotFoundError:\n"
        "        v[d] = '-'\n"
        "print(json.dumps(v))\n"
    )
    out = subprocess.run(
        [str(python), "-c", script],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=child_env(),
        check=False,
    )
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {}


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_combination(combo: Combination, args: argparse.Namespace) -> Row:
    row = Row(combo.name)
    base_python = find_python(combo.python)
    script = DEBIAN_PYTHONS.get(combo.python) if base_python is None else None
    if script is not None:
        base_python = script
    if base_python is None:
        row.result = f"skipped: no python{combo.python}"
        row.skipped = True
        row.failed = args.strict
        print(f"[{combo.name}] {row.result} under {pyenv_root() / 'versions'}", flush=True)
        return row

    venv = args.venv_root / combo.name
    log_path = args.venv_root / f"{combo.name}.log"
    venv_python = venv / "bin" / "python"
    env = child_env(venv)
    start = time.monotonic()
    print(f"[{combo.name}] {base_python} {' '.join(combo.pins) or '(newest jax)'}", flush=True)
    print(f"[{combo.name}] log: {log_path}", flush=True)
    with log_path.open("w") as log:
        log.write(f"combination {combo.name}: {base_python}, pins {list(combo.pins)}\n")
        step = "venv"
        if venv.exists() and not (args.reuse and venv_python.exists()):
            shutil.rmtree(venv)
        if script is not None:
            # The script makes the venv itself (Debian's interpreter has no ensurepip), and keeps
            # the unpacked interpreter under the venv root for the next run.
            root = args.venv_root / f"cp{combo.python.replace('.', '')}-root"
            env["CPATH"] = os.pathsep.join(filter(None, [str(root / "usr" / "include"),
                                                         env.get("CPATH")]))
            status = run_logged(
                ["bash", str(script)],
                log,
                cwd=args.venv_root,
                env={**child_env(), "ROOT": str(root), "VENV": str(venv)},
                echo=args.verbose,
            )
        elif not venv.exists():
            status = run_logged(
                [str(base_python), "-m", "venv", str(venv)],
                log,
                cwd=args.venv_root,
                env=child_env(),
                echo=args.verbose,
            )
        else:
            log.write(f"reusing {venv}\n")
            status = 0
        if status == 0:
            # The pip that ensurepip bundles can be old (3.10.13: pip 23.0.1, whose resolver has
            # no backjumping and spent minutes trying every humanize, protobuf and orbax release
            # before settling flax for jax 0.4.36); a current pip is what a fresh CI venv gets.
            step = "pip upgrade"
            status = run_logged(
                [str(venv_python), "-m", "pip", "install", "--upgrade", "pip"],
                log,
                cwd=args.repo,
                env=env,
                echo=args.verbose,
            )
        if status == 0:
            step = "install"
            print(f"[{combo.name}] pip install (builds the extension) ...", flush=True)
            install = [str(venv_python), "-m", "pip", "install", f"{args.repo}[test]"]
            status = run_logged(
                [*install, *combo.pins], log, cwd=args.repo, env=env, echo=args.verbose
            )
        if status == 0:
            step = "pytest"
            versions = installed_versions(venv_python)
            row.python = versions.get("python", "-")
            row.jax = f"{versions.get('jax', '-')} / {versions.get('jaxlib', '-')}"
            row.numpy = versions.get("numpy", "-")
            print(f"[{combo.name}] installed jax / jaxlib {row.jax}, numpy {row.numpy}", flush=True)
            print(f"[{combo.name}] pytest {' '.join(args.pytest_args)} ...", flush=True)
            status = run_logged(
                [str(venv_python), "-m", "pytest", *args.pytest_args],
                log,
                cwd=args.repo,
                env=env,
                echo=args.verbose,
            )
    row.minutes = f"{(time.monotonic() - start) / 60:.1f}"

    if step == "pytest":
        summary = pytest_summary(log_path.read_text(errors="replace"))
        row.result = summary or "no summary line"
        if status != 0 and (summary is None or not re.search(r"failed|error", summary)):
            row.result += f" (pytest exit {status})"
    else:
        row.result = f"{step} failed (exit {status})"
    row.failed = status != 0
    print(f"[{combo.name}] {row.result} ({row.minutes} min)", flush=True)
    if row.failed:
        print(f"----- last {LOG_TAIL_LINES} lines of {log_path} -----", flush=True)
        print(tail(log_path), flush=True)
        print("-----", flush=True)
    return row


def markdown_table(rows: list[Row]) -> str:
    header = ["combination", "Python", "jax / jaxlib", "numpy", "result", "minutes"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        cells = [r.combination, r.python, r.jax, r.numpy, r.result, r.minutes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def select(only: str | None) -> list[Combination]:
    if not only:
        return list(COMBINATIONS)
    by_name = {c.name: c for c in COMBINATIONS}
    wanted: list[str] = []
    for token in (t.strip() for t in only.split(",")):
        if not token:
            continue
        names = ALIASES.get(token, [token])
        unknown = [n for n in names if n not in by_name]
        if unknown:
            valid = ", ".join([*by_name, *ALIASES])
            raise SystemExit(f"unknown combination {token!r}; choose from: {valid}")
        wanted.extend(n for n in names if n not in wanted)
    return [c for c in COMBINATIONS if c.name in wanted]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Combinations: " + ", ".join(c.name for c in COMBINATIONS),
    )
    parser.add_argument(
        "--only", metavar="NAME[,NAME...]", help="run only these combinations (or 'all')"
    )
    parser.add_argument(
        "--venv-root",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fastree-matrix",
        help="where the venvs and logs go (default: %(default)s)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="reuse an existing venv of the same name"
    )
    parser.add_argument(
        "--pytest-args",
        default="",
        help='extra arguments for pytest, one shell-quoted string, e.g. "-x -q -k flatten" '
        "(a single option needs the = form: --pytest-args=-x)",
    )
    parser.add_argument(
        "--keep-going",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after a failing combination, run the rest (default: on)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="a combination whose Python is missing fails the run"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also stream pip's and pytest's output"
    )
    parser.add_argument(
        "--print-python",
        metavar="NAME",
        help="print the pyenv interpreter a combination (or alias, e.g. 'home') uses, and exit",
    )
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.pytest_args = shlex.split(args.pytest_args)
    args.venv_root = args.venv_root.resolve()
    args.repo = args.repo.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_python:
        chosen = select(args.print_python)
        found = find_python(chosen[0].python) if len(chosen) == 1 else None
        if found is None:
            print(f"no pyenv python for {args.print_python!r}", file=sys.stderr)
            return 1
        print(found)
        return 0
    combos = select(args.only)
    args.venv_root.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for index, combo in enumerate(combos):
        try:
            rows.append(run_combination(combo, args))
        except KeyboardInterrupt:
            rows.append(Row(combo.name, result="interrupted", failed=True))
            rows.extend(Row(c.name) for c in combos[index + 1 :])
            break
        if rows[-1].failed and not rows[-1].skipped and not args.keep_going:
            rows.extend(Row(c.name) for c in combos[index + 1 :])
            break
    table = markdown_table(rows)
    (args.venv_root / "matrix.md").write_text(table + "\n")
    print()
    print(table)
    if args.pytest_args:
        print(f"\n(pytest run with: {shlex.join(args.pytest_args)})")
    incomplete = any(r.result == "not run" for r in rows)
    return 1 if incomplete or any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
