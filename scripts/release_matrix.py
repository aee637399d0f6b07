"""The release matrix: every release pip offers of the libraries fastree serves natively, each
run plain and with fastree installed, each ending native-and-identical or as a clean fallback.

For each release of flax 0.12.x, equinox 0.13.x and chex 0.1.9x that pip offers for this Python,
in a venv made on top of a base interpreter that has fastree and its test extra installed
(the venv sees the base's site-packages after its own: only the library's release is installed
into the venv, with ``--no-deps``, and shadows the base's copy):

1. the library's program (``scripts/release_programs/<library>_program.py``; for flax also
   ``flax_tree_program.py``, its transforms in tree mode, ``graph=False``: a row of its own)
   runs plainly and under ``python -m fastree.run``; its outputs, every step's value or
   exception type, must be equal;
2. the installed run's status says how fastree served it: ``native`` where the release's code is
   in the integration's ``KNOWN_CODE`` table (``fastree.integrations._known_<library>``), else
   ``fallback`` with the reason (the library's own functions, for every call); for flax, whose
   graph walks are each gated on the code they mirror, ``partly native`` where some walks are;
   the table's "why" column names the walks a release turned off and the function that differs;
3. unless ``--no-tests``, the integration's test files run plain and under ``python -m
   fastree.run`` (on a fallback release they skip themselves: their expectations are for native
   nodes), except for the release the base already has, whose tests the main suite runs.

Outcomes: ``native, identical``, ``partly native, identical``, ``fallback, identical``, ``does not import`` (the release fails
plain too: nothing to compare), and failures: ``DIFFERS`` (installed output differs from plain) or
``tests fail``. Exit status 1 on any failure.

Usage:

    python scripts/release_matrix.py                          # every release, this Python
    python scripts/release_matrix.py --ends                   # oldest that imports, newest (CI)
    python scripts/release_matrix.py --library flax --no-tests
    python scripts/release_matrix.py --python /path/to/venv/bin/python   # another base

docs/testing.md ("Library releases") keeps the whole table, for both bases. Stdlib only; never
reads stdin.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = REPO / "scripts" / "release_programs"
# library -> (distribution, the releases considered: a version prefix, the integration's tests)
LIBRARIES = {
    "flax": ("0.12.", ["tests/test_flax_nnx_integration.py", "tests/test_flax_nnx_graph_mode.py",
                       "tests/test_flax_nnx_graph_checks.py",
                       "tests/test_flax_nnx_variable_rebuild.py"]),
    "equinox": ("0.13.", ["tests/test_equinox_integration.py"]),
    "chex": ("0.1.9", ["tests/test_chex_integration.py"]),
}
# library -> its programs (scripts/release_programs/<name>.py), each a row of the table: flax's
# graph mode (nnx.split, nnx.jit), and its tree mode (the transforms with graph=False).
PROGRAMS_OF = {"flax": ("flax_program", "flax_tree_program")}


def _run(args: list[str], timeout: float, env: dict[str, str] | None = None,
         cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd, stdin=subprocess.DEVNULL, check=False)


def releases(python: str, library: str, prefix: str) -> list[str]:
    """The releases pip offers this Python, oldest first (``pip index versions``)."""
    r = _run([python, "-m", "pip", "index", "versions", library], timeout=300)
    found = re.search(r"Available versions: (.*)", r.stdout)
    if not found:
        raise SystemExit(f"pip index versions {library} failed:\n{r.stdout}{r.stderr}")
    versions = [v.strip() for v in found.group(1).split(",") if v.strip().startswith(prefix)]
    return sorted(versions, key=lambda v: [int(p) for p in re.findall(r"\d+", v)])


def _newer(a: str, b: str) -> bool:
    return [int(p) for p in re.findall(r"\d+", a)] > [int(p) for p in re.findall(r"\d+", b)]


def installed_version(python: str, library: str) -> str | None:
    r = _run([python, "-c", f"from importlib import metadata; print(metadata.version({library!r}))"],
             timeout=120)
    return r.stdout.strip() if r.returncode == 0 else None


def _own_site(python: Path) -> str:
    return _run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                timeout=120).stdout.strip()


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTREE_")}
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _program(python: Path, program: str, installed: bool, env: dict[str, str]) -> tuple:
    script = str(PROGRAMS / f"{program}.py")
    args = [str(python), "-m", "fastree.run", script] if installed else [str(python), script]
    r = _run(args, timeout=600, env=env, cwd=Path(tempfile.gettempdir()))
    if r.returncode != 0:
        errors = [line for line in r.stderr.splitlines() if re.match(r"\w+(Error|Exception)", line)]
        return None, errors[-1:] or r.stderr.strip().splitlines()[-1:] or ["(no output)"]
    # Object addresses in reprs (a sentinel's default repr) differ between any two processes.
    return json.loads(re.sub(r" at 0x[0-9a-f]+", "", r.stdout.strip().splitlines()[-1])), None


def _served(status: dict) -> tuple[str, str]:
    """("native" | "partly native" | "fallback", why) from the installed program's status.

    why names what a release turned off and the reason: for flax's graph walks (each gated on
    the code it mirrors, ``flax_nnx_graph.WALKS``), the walks that are flax's and why
    (``update, unflatten_into_existing: ... differs in ...Variable._check_can_update``)."""
    texts = json.dumps(status)
    if "native" in texts and "flax: " not in texts and "library: " not in texts and (
            "not an attribute node" not in texts):
        return "native", ""
    graph = status.get("graph") if isinstance(status, dict) else None
    if isinstance(graph, dict):
        walks = {k: v for k, v in graph.items() if "." not in k}  # walks; types are dotted
        off: dict[str, list[str]] = {}
        for walk, value in walks.items():
            if value != "native":
                off.setdefault(value, []).append(walk)
        rest = [v for k, v in status.items() if k != "graph" and v not in ("native", "checking")]
        if off and len(off) == 1 and len(next(iter(off.values()))) == len(walks) and not rest:
            return "fallback", next(iter(off))[:200]  # every walk off, for one reason
        why = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in off.items())
        served = "partly native" if off and any(v == "native" for v in walks.values()) else (
            "fallback")
        return served, "; ".join([why] * bool(why) + sorted(set(rest)))[:300]
    reasons = [v for v in _flat_values(status) if v not in ("native", "checking")]
    return "fallback", "; ".join(sorted(set(reasons)))[:200]


def _flat_values(value) -> list[str]:
    if isinstance(value, dict):
        return [v for item in value.values() for v in _flat_values(item)]
    return [str(value)]


def _see_base_packages(base: str, venv: Path) -> None:
    # The base's site-packages (and their .pth files: an editable fastree, the base's pip) after
    # the venv's own, where the release goes. (--system-site-packages would give the site-packages
    # of the Python the base venv was made from, not the base's.)
    probe = "import site, sys; print(repr(site.getsitepackages()))"
    dirs = _run([base, "-c", probe], timeout=120).stdout.strip()
    own = _run([str(venv / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
               timeout=120).stdout.strip()
    Path(own, "_fastree_release_matrix_base.pth").write_text(
        f"import site; list(map(site.addsitedir, {dirs}))\n")


def one_release(base: str, library: str, release: str, root: Path, tests: bool,
                base_release: str | None) -> list[dict]:
    """The release's rows: one per program of the library (PROGRAMS_OF), the integration's test
    files run once, after the first."""
    venv = root / f"{library}-{release}"
    started = time.perf_counter()
    row = {"library": library, "release": release}
    if not (venv / "bin" / "python").exists():
        r = _run([base, "-m", "venv", "--without-pip", str(venv)], timeout=300)
        if r.returncode != 0:
            return [{**row, "outcome": "ERROR: venv", "detail": r.stderr[-300:]}]
        _see_base_packages(base, venv)
    python = venv / "bin" / "python"
    env = _clean_env(venv)
    r = _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
              "--target", _own_site(python), "--upgrade", f"{library}=={release}"],
             timeout=600, env=env)
    if r.returncode != 0:
        return [{**row, "outcome": "ERROR: pip", "detail": r.stderr[-300:]}]
    rows = []
    for program in PROGRAMS_OF.get(library, (f"{library}_program",)):
        row = {**row, "program": program}
        compared = _compare(python, program, env)
        if "why" not in compared:  # a program that could not run: no tests after it
            rows.append({**row, **compared,
                         "minutes": round((time.perf_counter() - started) / 60, 1)})
            continue
        if tests and not rows and compared["outcome"] != "DIFFERS":  # once, after the first
            summaries = _tests(python, library, release, base_release, env)
            if any(s.startswith("FAIL") for s in summaries):
                compared["outcome"] = "tests fail"
            compared["detail"] = "; ".join([compared["detail"]] * bool(compared["detail"])
                                           + ["tests: " + " / ".join(s.removeprefix("FAIL ")
                                                                      for s in summaries)])
        rows.append({**row, **compared,
                     "minutes": round((time.perf_counter() - started) / 60, 1)})
    return rows


def _compare(python: Path, program: str, env: dict[str, str]) -> dict:
    """One program plain and installed: outcome, and (where both ran) why and detail."""
    plain, plain_error = _program(python, program, False, env)
    installed, installed_error = _program(python, program, True, env)
    if plain is None:
        outcome = "does not import" if installed is None else "DIFFERS"
        return {"outcome": outcome, "detail": f"plain: {plain_error[0][:150]}"}
    if installed is None:
        return {"outcome": "DIFFERS",
                "detail": f"installed raises: {installed_error[0][:150]}"}
    status = installed.pop("status")
    plain.pop("status")
    served, why = _served(status)
    differ = sorted(k for k in plain if plain[k] != installed.get(k))
    outcome = f"{served}, identical" if not differ else "DIFFERS"
    detail = "" if not differ else f"steps differ: {', '.join(differ)}"
    return {"outcome": outcome, "why": why, "detail": detail}


def _tests(python: Path, library: str, release: str, base_release: str | None,
           env: dict[str, str]) -> list[str]:
    """The integration's test files plain and installed: their summaries ("FAIL " first where
    they failed); the base's own release is the main suite's."""
    if release == base_release:
        return ["the main suite's"]
    summaries = []
    for runner in ([], ["-m", "fastree.run"]):
        # An older release warns about newer JAX names as it imports (flax 0.12.2:
        # jax.core.Effect): the suite's "error" filter would stop at its import.
        r = _run([str(python), *runner, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  "-W", "ignore::DeprecationWarning", *LIBRARIES[library][1]], timeout=3600,
                 env=env)
        summary = (r.stdout.strip().splitlines() or ["(no output)"])[-1].strip("= ")
        summaries.append(("FAIL " if r.returncode not in (0, 5) else "") + summary)
    return summaries


def _label(row: dict) -> str:
    """The table's library column: the library, and for flax's tree-mode program, the mode."""
    tree = row.get("program", "").endswith("_tree_program")
    return row["library"] + (" (tree mode)" if tree else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="base interpreter, with fastree[test] installed (default: this one)")
    parser.add_argument("--library", action="append", choices=sorted(LIBRARIES),
                        help="only these libraries (repeatable)")
    parser.add_argument("--ends", action="store_true",
                        help="only the oldest release that imports on this Python and the newest, "
                        "of each library (CI)")
    parser.add_argument("--release", action="append", default=[],
                        help="only these releases, e.g. 0.12.6 (repeatable)")
    parser.add_argument("--no-tests", action="store_true",
                        help="the programs only, not the integration's test files")
    parser.add_argument("--venv-root", type=Path, default=None,
                        help="where the venvs go (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    temporary = None
    if args.venv_root is None:
        temporary = tempfile.TemporaryDirectory(prefix="fastree-releases-")
        args.venv_root = Path(temporary.name)
    args.venv_root.mkdir(parents=True, exist_ok=True)
    probe = "import sys, jax; print(sys.version.split()[0], jax.__version__)"
    version = _run([args.python, "-c", probe], timeout=120).stdout.strip()
    print(f"base: {args.python} (Python, jax: {version})", flush=True)
    rows = []
    releases_all: dict[str, list[str]] = {}
    for library in args.library or list(LIBRARIES):
        prefix = LIBRARIES[library][0]
        chosen = releases(args.python, library, prefix)
        releases_all[library] = list(chosen)
        if args.ends and len(chosen) > 2:
            chosen = [chosen[0], chosen[-1]]
        if args.release:
            chosen = [r for r in chosen if r in args.release]
        base_release = installed_version(args.python, library)
        pending = list(chosen)
        while pending:
            release = pending.pop(0)
            these = one_release(args.python, library, release, args.venv_root,
                                not args.no_tests, base_release)
            rows += these
            for row in these:
                print(f"{_label(row)} {release}: {row['outcome']}"
                      + (f" (why: {row['why']})" if row.get("why") else "")
                      + (f" ({row['detail']})" if row.get("detail") else ""), flush=True)
            if args.ends and these[0]["outcome"] == "does not import" and release == chosen[0]:
                # The oldest release that imports on this Python is the end worth running.
                later = [r for r in releases_all[library] if _newer(r, release)
                         and _newer(chosen[-1], r)]
                if later:
                    chosen[0] = later[0]
                    pending.insert(0, later[0])
    print("\n| library | release | Python, jax | outcome | why | detail |\n"
          "|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {_label(row)} | {row['release']} | {version} | {row['outcome']} | "
              f"{row.get('why', '')} | {row.get('detail', '')} |")
    if temporary is not None:
        temporary.cleanup()
    bad = [r for r in rows if r["outcome"] not in ("native, identical", "fallback, identical",
                                                   "partly native, identical", "does not import")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
