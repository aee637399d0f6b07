"""Other projects' own test suites, run plain and with fastree installed into JAX, compared.

optax, flax (nnx), equinox and chex.

    python scripts/run_third_party_suites.py                 # all four projects, both modes
    python scripts/run_third_party_suites.py --project optax -k adam --max-files 5
    python scripts/run_third_party_suites.py --project equinox --equinox-tests ~/src/equinox

* optax, chex: the tests their wheels ship (``site-packages/optax/**/*_test.py``, likewise
  chex), run from an empty directory with an empty pytest config (so this repository's settings
  do not apply). chex's tests also need cloudpickle and dm-tree (chex's ``test`` extra);
  flax's module_test.py needs cloudpickle. The script warns of any of these missing.
* flax: ``tests/nnx`` of the sdist of the installed flax version, fetched with
  ``pip download --no-binary :all: --no-deps flax==<version>`` into a temporary directory and
  run from the sdist's root under flax's own pytest settings.
* equinox: ``tests/`` of the equinox repository (neither its wheel nor its sdist ships them):
  ``--equinox-tests DIR`` names a checkout (or any directory holding its ``tests/``), else the
  script clones tag ``v<installed version>`` (``git clone --depth 1``) into the work directory;
  without network it says so and skips equinox. ``tests/`` and ``pyproject.toml`` are copied into
  the work directory (so that ``import equinox`` finds the installed package, not a checkout's
  source) and run from there under equinox's own pytest settings (its ``pyproject.toml``: the
  jaxtyping/beartype import hook on ``equinox``, warnings as errors). Extra packages its tests
  use: beartype, optax (and tqdm, else three progress-meter tests skip).

Each suite runs twice, as ``python -m pytest ...`` and as ``python -m fastree.run -m pytest ...``
(fastree installed before anything is imported), each writing a JUnit report. The script
prints the counts per mode and every test whose outcome differs, with the failure text, and exits
1 if any outcome differs. The installed runs also load a small pytest plugin (written to the work
directory) that reports, at the end, how fastree reads the classes an integration made attribute
nodes (``fastree.integrations.status``: native, checking, or back to the library and why).
Nothing is copied into this repository.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("plain", "installed")

# Modules a project's own tests import that neither the project nor fastree's `test` extra
# brings. Without one, the files importing it fail to collect in both modes alike, and
# "differences: 0" would not show that they never ran (flax's module_test.py: 86 tests).
TEST_ONLY_IMPORTS = {
    "chex": ("cloudpickle", "tree"),
    "flax": ("cloudpickle",),
    "equinox": ("beartype", "optax"),
}
# Where the module name is not the name pip installs.
PIP_NAMES = {"tree": "dm-tree"}


def missing_test_imports(name: str) -> list[str]:
    """What `name`'s tests import that this environment lacks (pip's names)."""
    return [
        PIP_NAMES.get(module, module)
        for module in TEST_ONLY_IMPORTS.get(name, ())
        if importlib.util.find_spec(module) is None
    ]


@dataclass
class Suite:
    name: str
    cwd: Path
    paths: list[str]
    extra_args: list[str] = field(default_factory=list)


class SkipProject(Exception):
    """A project whose tests cannot be had here (the message says why and what to do)."""


@dataclass
class Outcome:
    status: str  # passed, failed, error, skipped
    message: str = ""


def _wheel_tests_suite(name: str, module: Any, workdir: Path, args: argparse.Namespace) -> Suite:
    # The *_test.py files a wheel ships, run from an empty directory under an empty pytest config.
    root = Path(module.__file__).parent
    paths = sorted(glob.glob(str(root / "**" / "*_test.py"), recursive=True))
    if args.max_files:
        paths = paths[: args.max_files]
    cwd = workdir / f"{name}_run"
    cwd.mkdir(parents=True, exist_ok=True)
    config = cwd / "pytest.ini"
    config.write_text("[pytest]\n")
    return Suite(name, cwd, paths, ["-c", str(config), "--rootdir", str(cwd)])


def optax_suite(workdir: Path, args: argparse.Namespace) -> Suite:
    import optax

    return _wheel_tests_suite("optax", optax, workdir, args)


def chex_suite(workdir: Path, args: argparse.Namespace) -> Suite:
    try:
        import chex
    except ImportError as error:
        raise SkipProject(f"chex is not installed ({error})") from None
    return _wheel_tests_suite("chex", chex, workdir, args)


def flax_suite(workdir: Path, args: argparse.Namespace) -> Suite:
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
    if args.max_files:
        paths = paths[: args.max_files]
    return Suite("flax", sdist_root, paths)


EQUINOX_REPOSITORY = "https://github.com/patrick-kidger/equinox"


def _equinox_source(workdir: Path, given: Path | None, version: str) -> Path:
    """A directory holding equinox's ``tests/``: the one given, or a clone of the version's tag."""
    if given is not None:
        given = given.expanduser().resolve()
        if given.name == "tests" and not (given / "tests").is_dir():
            given = given.parent  # the tests directory itself was given
        if not (given / "tests" / "conftest.py").is_file():
            raise SystemExit(f"--equinox-tests {given}: no tests/conftest.py there")
        return given
    clone = workdir / f"equinox-v{version}-clone"
    if (clone / "tests" / "conftest.py").is_file():
        return clone
    shutil.rmtree(clone, ignore_errors=True)
    command = [
        "git",
        "clone",
        "-q",
        "--depth",
        "1",
        "--branch",
        f"v{version}",
        EQUINOX_REPOSITORY,
        str(clone),
    ]
    try:
        proc = subprocess.run(
            command,
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
        failure = proc.stderr.strip().splitlines()[-1:] if proc.returncode else None
    except (OSError, subprocess.TimeoutExpired) as error:
        failure = [f"{type(error).__name__}: {error}"]
    if failure is not None:
        raise SkipProject(
            f"could not clone {EQUINOX_REPOSITORY} at tag v{version} "
            f"({' '.join(failure) or 'git failed'}; no network?). "
            f"Pass --equinox-tests DIR, a checkout of equinox v{version}."
        )
    return clone


def equinox_suite(workdir: Path, args: argparse.Namespace) -> Suite:
    try:
        version = importlib.metadata.version("equinox")
    except importlib.metadata.PackageNotFoundError:
        raise SkipProject("equinox is not installed") from None
    source = _equinox_source(workdir, args.equinox_tests, version)
    config = source / "pyproject.toml"
    if not config.is_file():
        raise SystemExit(
            f"{source}: no pyproject.toml next to tests/ (equinox's pytest settings live there)"
        )
    for line in config.read_text().splitlines():
        if line.startswith("version = "):
            tests_version = line.split("=", 1)[1].strip().strip('"')
            if tests_version != version:
                print(f"note: equinox tests of {tests_version}, installed equinox {version}")
            break
    # A copy of only tests/ and pyproject.toml: run from a checkout's root, `import equinox` would
    # load the checkout's source (the current directory comes first on sys.path) instead of the
    # installed package that fastree's integration checks the version of.
    run_root = workdir / "equinox_run"
    shutil.rmtree(run_root, ignore_errors=True)
    shutil.copytree(
        source / "tests", run_root / "tests", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy2(config, run_root / "pyproject.toml")
    paths = sorted(str(p.relative_to(run_root)) for p in (run_root / "tests").glob("test_*.py"))
    if args.max_files:
        paths = paths[: args.max_files]
    return Suite(
        "equinox",
        run_root,
        paths,
        ["-c", str(run_root / "pyproject.toml"), "--rootdir", str(run_root)],
    )


SUITES = {
    "optax": optax_suite,
    "flax": flax_suite,
    "equinox": equinox_suite,
    "chex": chex_suite,
}


# Loaded (-p) into the installed runs: at the end of the session, how fastree reads each class
# an integration made an attribute node (fastree.integrations.status), written as JSON.
_NODE_REPORT_PLUGIN = """\
import collections, json, os


def pytest_sessionfinish(session):
    from fastree import integrations
    from fastree.jax_interop import compat as _jax_compat
    from fastree.integrations import _checked

    classes = set(_jax_compat.jax_registered_types()) | set(_checked.fallbacks)
    status = collections.Counter()
    library = {}
    for cls in classes:
        text = integrations.status(cls)
        if text == "not an attribute node":
            continue
        kind = text.split(":")[0]
        status[kind] += 1
        if kind == "library" or "graph mode" in kind:
            library[f"{cls.__module__}.{cls.__qualname__}"] = text
    graph = getattr(__import__("sys").modules.get("fastree.integrations.flax_nnx_graph"), "_graph", None)
    for cls, reason in (getattr(graph, "fallbacks", None) or {}).items():
        library.setdefault(f"{cls.__module__}.{cls.__qualname__}", f"graph mode: flax: {reason}")
    with open(os.environ["FASTREE_NODE_REPORT"], "w") as out:
        json.dump({"counts": dict(status), "library": library}, out, indent=1, sort_keys=True)
"""


def run_suite(suite: Suite, mode: str, report: Path, pytest_args: list[str], log: Path) -> float:
    launcher = ["-m", "fastree.run"] if mode == "installed" else []
    env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
    env.setdefault("SKBUILD_EDITABLE_VERBOSE", "0")
    plugin = []
    if mode == "installed":
        (report.parent / "_fastree_node_report.py").write_text(_NODE_REPORT_PLUGIN)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(report.parent), env.get("PYTHONPATH")])
        )
        env["FASTREE_NODE_REPORT"] = str(report.with_suffix(".nodes.json"))
        plugin = ["-p", "_fastree_node_report"]
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
        *plugin,
        *suite.extra_args,
        *pytest_args,
        *suite.paths,
    ]
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


def print_node_report(name: str, report: Path) -> None:
    """The installed run's attribute nodes: how many native, still checking, back to the library;
    and each class the library or flax's graph mode answers for, with the reason."""
    nodes = report.with_suffix(".nodes.json")
    if not nodes.exists():
        print(f"  {name}: no attribute-node report ({nodes} missing: the run did not finish?)")
        return
    data = json.loads(nodes.read_text())
    line = ", ".join(f"{k} {v}" for k, v in sorted(data["counts"].items())) or "none"
    print(f"  attribute nodes at the end of the installed run: {line}")
    for cls, text in sorted(data["library"].items()):
        print(f"    {cls}: {text}")


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
    parser.add_argument(
        "--equinox-tests",
        type=Path,
        metavar="DIR",
        help="a directory holding equinox's tests/ and pyproject.toml (a checkout of the "
        "installed version); default: git clone of tag v<installed version>",
    )
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
    differing, skipped = 0, []
    for name in projects:
        try:
            suite = SUITES[name](workdir, args)
        except SkipProject as reason:
            print(f"\n== {name}: SKIPPED, {reason}", flush=True)
            skipped.append(name)
            continue
        missing = missing_test_imports(name)
        if missing:
            print(
                f"\n== {name}: WARNING, its tests import {', '.join(missing)}, not installed here "
                f"(pip install {' '.join(missing)}): the files that import them will not collect",
                flush=True,
            )
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
        if "installed" in modes:
            print_node_report(name, workdir / f"{name}-installed.xml")
    if skipped:
        print(f"\nskipped (their tests could not be had): {', '.join(skipped)}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
