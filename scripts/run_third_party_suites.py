"""Other projects' own test suites, run plain and with fastree installed into JAX, compared.

    python scripts/run_third_party_suites.py                 # optax and flax nnx, both modes
    python scripts/run_third_party_suites.py --project optax -k adam --max-files 5

* optax: the tests its wheel ships (``site-packages/optax/**/*_test.py``), run from an empty
  directory with an empty pytest config (so this repository's settings do not apply).
* flax: ``tests/nnx`` of the sdist of the installed flax version, fetched with
  ``pip download --no-binary :all: --no-deps flax==<version>`` into a temporary directory and
  run from the sdist's root under flax's own pytest settings.

Each suite runs twice, as ``python -m pytest ...`` and as ``python -m fastree.run -m pytest ...``
(fastree installed before anything is imported), each writing a JUnit report. The script
prints the counts per mode and every test whose outcome differs, with the failure text, and exits
1 if any outcome differs. Nothing is copied into this repository.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("plain", "installed")


@dataclass
class Suite:
    name: str
    cwd: Path
    paths: list[str]
    extra_args: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    status: str  # passed, failed, error, skipped
    message: str = ""


def optax_suite(workdir: Path, max_files: int | None) -> Suite:
    import optax

    root = Path(optax.__file__).parent
    paths = sorted(glob.glob(str(root / "**" / "*_test.py"), recursive=True))
    if max_files:
        paths = paths[:max_files]
    cwd = workdir / "optax_run"
    cwd.mkdir(parents=True, exist_ok=True)
    config = cwd / "pytest.ini"
    config.write_text("[pytest]\n")
    return Suite("optax", cwd, paths, ["-c", str(config), "--rootdir", str(cwd)])


def flax_suite(workdir: Path, max_files: int | None) -> Suite:
    version = importlib.metadata.version("flax")
    sdist_root = workdir / f"flax-{version}"
    if not (sdist_root / "tests" / "nnx").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"flax=={version}",
                "-d",
                str(workdir),
            ],
            check=True,
        )
        with tarfile.open(workdir / f"flax-{version}.tar.gz") as archive:
            archive.extractall(workdir, filter="data")
    paths = sorted(
        str(p.relative_to(sdist_root))
        for p in (sdist_root / "tests" / "nnx").rglob("*.py")
        if p.name.endswith("_test.py") or p.name.startswith("test_")
    )
    if max_files:
        paths = paths[:max_files]
    return Suite("flax", sdist_root, paths)


SUITES = {"optax": optax_suite, "flax": flax_suite}


def run_suite(suite: Suite, mode: str, report: Path, pytest_args: list[str], log: Path) -> float:
    launcher = ["-m", "fastree.run"] if mode == "installed" else []
    command = [
        sys.executable,
        *launcher,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        f"--junitxml={report}",
        "-o",
        "junit_family=xunit1",  # testcases carry their file: class names repeat across files
        *suite.extra_args,
        *pytest_args,
        *suite.paths,
    ]
    env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
    env.setdefault("SKBUILD_EDITABLE_VERBOSE", "0")
    start = time.perf_counter()
    with log.open("w") as out:
        subprocess.run(command, cwd=suite.cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return time.perf_counter() - start


_PROBE = (
    "import jax, fastree\n"
    "assert jax.tree.map is fastree.tree.map, 'python -m fastree.run did not install'\n"
    "print(len(fastree.installed_functions()))\n"
)


def check_installed_mode(workdir: Path) -> int:
    """How many functions ``python -m fastree.run`` routes (fails loudly if it routes none)."""
    probe = workdir / "installed_probe.py"
    probe.write_text(_PROBE)
    out = subprocess.run(
        [sys.executable, "-m", "fastree.run", str(probe)],
        check=True,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"},
    )
    return int(out.stdout.split()[-1])


def parse_junit(report: Path) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    if not report.exists():
        return outcomes
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('file')}::{case.get('classname')}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "") + "\n" + (child.text or "")
                break
        if test_id in outcomes:  # never merge two tests into one entry
            raise ValueError(f"{report}: test id {test_id} appears twice")
        outcomes[test_id] = Outcome(status, message.strip())
    return outcomes


def counts(outcomes: dict[str, Outcome]) -> dict[str, int]:
    totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome in outcomes.values():
        totals[outcome.status] += 1
    return totals


def compare(name: str, results: dict[str, dict[str, Outcome]], times: dict[str, float]) -> int:
    plain, installed = results["plain"], results["installed"]
    print(f"\n== {name}")
    for mode in MODES:
        line = ", ".join(f"{k} {v}" for k, v in counts(results[mode]).items())
        print(f"  {mode:9s} {line}  ({times[mode]:.0f} s)")
    differences = sorted(
        test_id
        for test_id in plain.keys() | installed.keys()
        if (plain.get(test_id) or Outcome("absent")).status
        != (installed.get(test_id) or Outcome("absent")).status
    )
    print(f"  differences: {len(differences)}")
    for test_id in differences:
        a = plain.get(test_id) or Outcome("absent")
        b = installed.get(test_id) or Outcome("absent")
        print(f"  - {test_id}: plain {a.status}, installed {b.status}")
        message = b.message if b.status in ("failed", "error") else a.message
        for line in message.splitlines()[-12:]:
            print(f"      {line}")
    return len(differences)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", action="append", choices=sorted(SUITES))
    parser.add_argument(
        "--mode",
        action="append",
        choices=MODES,
        help="run only these modes (the comparison needs both)",
    )
    parser.add_argument("--workdir", type=Path, help="keep downloads and reports here")
    parser.add_argument("--max-files", type=int, help="only the first N test files (a smoke run)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    projects = args.project or list(SUITES)
    modes = args.mode or list(MODES)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fastree-third-party-"))
    workdir.mkdir(parents=True, exist_ok=True)
    pytest_args = list(args.pytest_args) + (["-k", args.keyword] if args.keyword else [])
    print(f"workdir: {workdir}")
    if "installed" in modes:
        print(f"python -m fastree.run routes {check_installed_mode(workdir)} functions")
    differing = 0
    for name in projects:
        suite = SUITES[name](workdir, args.max_files)
        results, times = {}, {}
        for mode in modes:
            report = workdir / f"{name}-{mode}.xml"
            log = workdir / f"{name}-{mode}.log"
            print(f"running {name} ({len(suite.paths)} files), {mode}; log {log}", flush=True)
            times[mode] = run_suite(suite, mode, report, pytest_args, log)
            results[mode] = parse_junit(report)
        if len(modes) == len(MODES):
            differing += compare(name, results, times)
        else:
            for mode in modes:
                print(f"{name} {mode}: {counts(results[mode])} ({times[mode]:.0f} s)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
