"""flax's own programs, run plain and with fastree installed, in graph mode and tree mode, compared.

    python scripts/run_flax_programs.py                       # everything, both modes
    python scripts/run_flax_programs.py --mode tree --only '*toy*/0*'
    python scripts/run_flax_programs.py --flax-source ~/src/flax-0.12.12 --workdir /tmp/fp
    python scripts/run_flax_programs.py --list                # the programs, and why any skip

Issue 46 section 3, "exact in tree mode". The programs come from the sdist of the installed flax
version (fetched as scripts/run_third_party_suites.py fetches it, by its ``flax_suite``; or
``--flax-source DIR``, an unpacked sdist or checkout of that version):

* every ``examples/nnx_toy_examples/*.py``, run in place, unchanged. They take no argument or
  variable for their step counts (each trains 2,000 to 10,000 steps), so they run whole;
  ``--timeout`` caps one run's wall time, and a plain run that passes it is reported "timed out"
  and not compared. ``05_vae.py`` needs ``datasets`` (and the network for MNIST).
* the notebooks of ``docs_nnx``: a ``.md`` document that jupytext pairs with a notebook (its
  front matter names jupytext, or an ``.ipynb`` of the same name sits beside it). Its code cells
  (MyST ```` ```{code-cell} ```` blocks; in jupytext's plain markdown format, ```` ```python ````
  blocks) are concatenated into one program, in order, written to the work directory. As a
  notebook runs them: a cell tagged ``skip-execution`` is left out, and so is a cell magic
  (``%%timeit``); a line magic or shell line (``%...``, ``!...``) becomes a comment; a cell's
  last expression, unless it ends with ``;``, is printed as its ``repr`` (IPython's display,
  without IPython: what the guide shows is then compared too); a cell tagged
  ``raises-exception`` prints its error and goes on, and a cell that does not compile is left
  out (a comment says why; ``guides/view`` has one, ``print(noisy_model)s``). ``nnx.display``
  prints outside IPython.

  Run (every one on CPU, seconds to minutes; several stop plainly at a cell that no longer
  works with flax 0.12.12 and jax 0.12, which is compared all the same: docs/testing.md has
  the table): ``key_concepts``, ``nnx_basics``,
  ``hijax/hijax`` and the guides ``bridge_guide``, ``checkpointing`` (orbax, writes
  ``/tmp/my-checkpoints``), ``demo``, ``extracting_intermediates``, ``filters_guide``,
  ``flax_gspmd`` (8 virtual CPU devices), ``optimization_cookbook``, ``performance``,
  ``pytree``, ``randomness``, ``surgery`` (orbax, writes ``/tmp/nnx-surgery-state``),
  ``transforms``, ``view``.

  Skipped, with the reason printed: every document whose cells import a package this
  interpreter lacks (found by reading the cells' imports: ``mnist_tutorial``, ``data_loaders``
  and ``audio`` need datasets, tensorflow, torch, grain, librosa...; every ``examples/*.md``
  needs datasets, grain, torch, kagglehub, tiktoken... and the network for its data or
  weights); documents without code cells (``guides/blog``, ``philosophy``...); and ``flip/``,
  design proposals whose blocks are fragments, not notebooks (no jupytext pairing).
  ``SKIP_DOCUMENTS`` names any further document skipped by hand, with why (none at present).

Each program runs in each mode (``--mode``): graph mode (flax's default) and tree mode
(``flax.nnx.set_graph_mode(False)``: in flax 0.12.12 a class that is a setter when called, the
top of a per-thread stack, and a context manager when entered; the wrapper below calls it once
before the program's first line, so every NNX call of the program's main thread, which is where
these programs make them, defaults to tree mode). In each mode the program runs three times, each
as ``nice -n 10 python WRAPPER program`` from the same (emptied) directory:

* plain, twice: the second run finds the run-to-run noise. A mask from ``NOISE_MASKS``
  (addresses, durations, rates, temporary names, log-line clocks) applies to a program only when
  the two plain runs differ in lines that the mask, with the others, makes equal; lines that
  no mask explains are reported as unstable, and the installed run must then equal one of the
  two plain runs.
* installed: ``python -m fastree.run WRAPPER program`` (fastree installed before anything is
  imported). Exit status, stdout and stderr must equal the plain run's, after that program's
  masks; any difference is a failure, printed with a diff excerpt, and the script exits 1.

Every run gets the same seeds, so that the runs can be compared exactly: ``PYTHONHASHSEED=0``,
and the wrapper seeds Python's and numpy's global generators (the toy examples draw their data
from ``np.random`` unseeded: two plain runs printed different losses), after importing jax:
importing jax draws five numbers from numpy's global generator (a default argument in
``jax/_src/clusters/k8s_cluster.py``), and ``fastree.run`` imports jax before the program, so a
program that seeds numpy before its first ``import jax`` draws other numbers installed than
plain (seeded before the import, the installed toy examples' losses differed from the first
step). ``MPLBACKEND=Agg``, so
``plt.show()`` returns. The wrapper (written to the work directory) runs the program as
``python program`` would:
``sys.argv`` and ``sys.path[0]`` the program's, ``runpy.run_path`` as ``__main__``, and an
uncaught exception printed from the program's first frame (without the wrapper's and runpy's
frames), status 1. A program that fails plainly in tree mode is not run
further in that mode: "skipped: fails plain in tree mode: <error line>". One that fails plainly
in graph mode is still compared (the same failure, the same output up to it).

In the installed runs the wrapper, at exit, records fastree's view:
``fastree.integrations.flax_nnx_graph.status()`` (each graph walk native, or flax's and why) and
the counts of ``fastree.integrations.status`` over the attribute-node classes (native, checking,
library), by the function scripts/run_third_party_suites.py's pytest plugin runs at the end of a
session. The table ends with one status line per installed run. Nothing of flax's is edited.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import fnmatch
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path



def _sibling(name: str):
    # Loaded by path, so that importing this script (as its test does) leaves sys.path alone.
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


third_party = _sibling("run_third_party_suites")  # the sdist fetch, the node report plugin

GRAPH_MODES = ("graph", "tree")
TOY_EXAMPLES = "examples/nnx_toy_examples"
DOCS = "docs_nnx"
# Documents skipped by hand, with why, beyond what the automatic reasons find (missing packages,
# no code cells, not a notebook). Empty at present: every notebook whose packages are here runs.
SKIP_DOCUMENTS: dict[str, str] = {}


# -- the programs ---------------------------------------------------------------------------


@dataclasses.dataclass
class Program:
    name: str  # as under the sdist's root: examples/nnx_toy_examples/01_functional_api.py
    path: Path | None  # the file run; None when skipped
    skip: str = ""  # why the program is not run at all


@dataclasses.dataclass
class Cell:
    source: str
    line: int  # the document's line of the cell's first source line
    tags: tuple[str, ...] = ()


_MYST_FENCE = re.compile(r"^(`{3,}|~{3,})\{code-cell\}\s*(\S*)\s*$")
_PLAIN_FENCE = re.compile(r"^(`{3,}|~{3,})python3?\s*$")
_TAGS = re.compile(r"^\s*:?tags:\s*\[(.*)\]\s*$")


def _front_matter(text: str) -> str:
    if not text.startswith("---\n"):
        return ""
    end = text.find("\n---", 4)
    return text[4:end] if end != -1 else ""


def is_notebook(text: str, paired_ipynb: bool) -> bool:
    """Whether a markdown document is a notebook: jupytext's front matter, or a paired .ipynb."""
    return "jupytext" in _front_matter(text) or paired_ipynb


def code_cells(text: str) -> list[Cell]:
    """The code cells of a jupytext document, in order.

    MyST (```` ```{code-cell} ipython3 ````) when the document has such a block, else jupytext's
    markdown format (```` ```python ````). A MyST cell's options (``:tags: [...]`` lines, or a
    ``---`` block) are read for tags and left out of the source.

    >>> doc = "# Title\\n```{code-cell} ipython3\\n:tags: [hide-output]\\nx = 1\\n```\\n"
    >>> [(c.source, c.line, c.tags) for c in code_cells(doc)]
    [('x = 1\\n', 4, ('hide-output',))]
    """
    lines = text.splitlines()
    myst = any(_MYST_FENCE.match(line) for line in lines)
    opening = _MYST_FENCE if myst else _PLAIN_FENCE
    cells: list[Cell] = []
    i = 0
    while i < len(lines):
        match = opening.match(lines[i])
        if match is None or (myst and match.group(2) not in ("", "ipython3", "python3", "python")):
            i += 1
            continue
        fence = match.group(1)
        i += 1
        tags: list[str] = []
        if myst and i < len(lines) and lines[i].strip() == "---":  # a YAML options block
            i += 1
            while i < len(lines) and lines[i].strip() != "---":
                tags += _tag_list(lines[i])
                i += 1
            i += 1
        while myst and i < len(lines) and lines[i].startswith(":"):  # `:key: value` options
            tags += _tag_list(lines[i])
            i += 1
        start = i
        while i < len(lines) and not _closes(lines[i], fence):
            i += 1
        body = "\n".join(lines[start:i]).strip("\n")
        if body.strip():
            cells.append(Cell(body + "\n", start + 1, tuple(tags)))
        i += 1
    return cells


def _closes(line: str, fence: str) -> bool:
    # A run of the fence's character, at least as long as the opening one, alone on its line.
    text = line.strip()
    return len(text) >= len(fence) and text == fence[0] * len(text) and line.startswith(fence[0])


def _tag_list(line: str) -> list[str]:
    match = _TAGS.match(line)
    if match is None:
        return []
    return [t.strip().strip("'\"") for t in match.group(1).split(",") if t.strip()]


_DISPLAY_HELPERS = '''\
def _notebook_display_(value):  # a notebook shows a cell's last expression (IPython's displayhook)
    if value is not None:
        print(repr(value))


def _notebook_cell_may_raise_(source, filename):  # a cell tagged raises-exception
    try:
        exec(compile(source, filename, "exec"), globals())
    except Exception as error:
        print(f"{type(error).__name__}: {error}")
'''


def _displayed(source: str) -> str:
    """``source`` with its last statement, if an expression not ended by ``;``, displayed."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # left as it is: the program's run reports it
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return source
    last = tree.body[-1]
    lines = source.splitlines()
    # ast's columns count UTF-8 bytes.
    after = lines[last.end_lineno - 1].encode()[last.end_col_offset:].decode()
    tail = "\n".join([after, *lines[last.end_lineno:]])
    if tail.split("#", 1)[0].strip().startswith(";"):
        return source
    segment = ast.get_source_segment(source, last)
    before = lines[last.lineno - 1].encode()[: last.col_offset].decode()
    head = "\n".join([*lines[: last.lineno - 1], before])
    # `head` ends where the expression starts (after `a = 1; ` when it shares its first line).
    return f"{head}_notebook_display_(\n{segment}\n){tail}\n"


def program_text(cells: list[Cell], name: str) -> str:
    """One program of a document's cells, run as a notebook runs them (the module docstring).

    >>> cells = [Cell("%matplotlib inline\\nx = 2\\nx * 3\\n", 5), Cell("%%timeit\\nx\\n", 9),
    ...          Cell("y = 1\\n", 12, ("skip-execution",)), Cell("x;\\n", 15)]
    >>> exec(program_text(cells, "doc.md"))
    6
    """
    parts = [f"# The code cells of flax's {name}, as scripts/run_flax_programs.py runs them.\n",
             _DISPLAY_HELPERS]
    for number, cell in enumerate(cells, 1):
        header = f"\n# %% cell {number} ({name}, line {cell.line})"
        first = cell.source.lstrip().split("\n", 1)[0]
        if first.startswith("%%"):
            parts.append(f"{header}: left out, a cell magic ({first})\n")
            continue
        if "skip-execution" in cell.tags:
            parts.append(f"{header}: left out, tagged skip-execution\n")
            continue
        source = "\n".join(
            f"# {line}  (a magic, left out)" if line.lstrip().startswith(("%", "!")) else line
            for line in cell.source.splitlines()
        ) + "\n"
        try:
            compile(source, name, "exec")
        except SyntaxError as error:  # a notebook reports it and runs the next cell
            parts.append(f"{header}: left out, does not compile (SyntaxError: {error.msg}, "
                         f"cell line {error.lineno})\n")
            continue
        if "raises-exception" in cell.tags or "raises-exceptions" in cell.tags:
            parts.append(f"{header}\n_notebook_cell_may_raise_({_displayed(source)!r}, "
                         f"{f'{name}, cell {number}'!r})\n")
        else:
            parts.append(f"{header}\n{_displayed(source)}")
    return "\n".join(parts)


def missing_modules(source: str) -> list[str]:
    """The top-level modules ``source`` imports (anywhere in it) that this interpreter lacks.

    >>> missing_modules("import os\\ndef f():\\n    from no_such_module_here.sub import x\\n")
    ['no_such_module_here']
    """
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    missing = []
    for module in sorted(names):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


def document_programs(root: Path, out: Path) -> list[Program]:
    programs = []
    for doc in sorted((root / DOCS).rglob("*.md")):
        name = str(doc.relative_to(root))
        text = doc.read_text(encoding="utf-8")
        if not is_notebook(text, doc.with_suffix(".ipynb").exists()):
            programs.append(Program(name, None, "not a notebook (no jupytext pairing)"))
            continue
        cells = code_cells(text)
        if not cells:
            programs.append(Program(name, None, "no code cells"))
            continue
        source = program_text(cells, name)
        missing = missing_modules(source)
        if missing:
            programs.append(Program(name, None, f"needs {', '.join(missing)}, not installed"))
            continue
        if name in SKIP_DOCUMENTS:
            programs.append(Program(name, None, SKIP_DOCUMENTS[name]))
            continue
        path = out / Path(name).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
        programs.append(Program(name, path))
    return programs


def toy_programs(root: Path) -> list[Program]:
    programs = []
    for path in sorted((root / TOY_EXAMPLES).glob("*.py")):
        name = str(path.relative_to(root))
        missing = missing_modules(path.read_text(encoding="utf-8"))
        skip = f"needs {', '.join(missing)}, not installed" if missing else ""
        programs.append(Program(name, None if skip else path, skip))
    return programs


def flax_source(args: argparse.Namespace, workdir: Path) -> Path:
    """The unpacked sdist of the installed flax: ``--flax-source``, or fetched as the suites are."""
    version = importlib.metadata.version("flax")
    if args.flax_source is not None:
        root = args.flax_source.expanduser().resolve()
        if not (root / TOY_EXAMPLES).is_dir() or not (root / DOCS).is_dir():
            raise SystemExit(f"--flax-source {root}: no {TOY_EXAMPLES} or {DOCS} there")
        text = (root / "PKG-INFO").read_text() if (root / "PKG-INFO").exists() else ""
        given = re.search(r"^Version: (\S+)", text, re.MULTILINE)
        if given and given.group(1) != version:
            print(f"note: flax source of {given.group(1)}, installed flax {version}")
        return root
    return third_party.flax_suite(workdir, argparse.Namespace(max_files=None)).cwd


# -- masks for run-to-run noise ----------------------------------------------------------------

# Each applies to a program only where its two plain runs show it is needed (verified_masks).
NOISE_MASKS: dict[str, tuple[str, str]] = {
    "address": (r"0x[0-9a-fA-F]{6,}", "0x<address>"),
    "duration": (r"\d+(?:\.\d+)?(?:e-?\d+)?\s?(?:ns|us|µs|ms|s|sec|secs|seconds|min)\b",
                 "<duration>"),
    "rate": (r"\d+(?:\.\d+)?\s?(?:it|steps|samples|examples)/s\b", "<rate>"),
    "temporary name": (r"\btmp[a-z0-9_]{8}\b", "tmp<name>"),  # tempfile's names
    "log clock": (r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+", r"\1<clock> <thread>"),  # absl
    "progress bar": (r"^.*\r(?!\n)", ""),
}


def apply_masks(text: str, masks: list[str]) -> str:
    """``text`` with the named masks applied, line by line.

    >>> apply_masks("at 0x7f3a9c2b10d0 took 1.25 s\\n", ["address", "duration"])
    'at 0x<address> took <duration>\\n'
    """
    for name in masks:
        pattern, replacement = NOISE_MASKS[name]
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def verified_masks(first: str, second: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The masks two plain runs' outputs need, and the differing line pairs none explains.

    A mask is needed when some differing pair is equal with every mask applied and is not with
    every mask but that one. Lines one run has and the other lacks are unexplained.

    >>> verified_masks("a 0x7f00aa00\\nloss 1.0\\n", "a 0x7f11bb11\\nloss 1.0\\n")
    (['address'], [])
    >>> verified_masks("loss 1.0\\n", "loss 2.0\\n")
    ([], [('loss 1.0', 'loss 2.0')])
    """
    a, b = first.split("\n"), second.split("\n")  # not splitlines(): it splits at a bare \r
    needed: set[str] = set()
    unexplained: list[tuple[str, str]] = []
    everything = list(NOISE_MASKS)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i2 - i1 != j2 - j1:
            # Unequal runs of lines: a progress bar or a timing line may still explain them
            # once masked (empty lines drop out of the comparison below).
            left = apply_masks("\n".join(a[i1:i2]), everything)
            right = apply_masks("\n".join(b[j1:j2]), everything)
            if left == right:
                needed.update(_needed_for(a[i1:i2], b[j1:j2]))
            else:
                unexplained.append(("\n".join(a[i1:i2]), "\n".join(b[j1:j2])))
            continue
        for x, y in zip(a[i1:i2], b[j1:j2]):
            if apply_masks(x, everything) != apply_masks(y, everything):
                unexplained.append((x, y))
            else:
                needed.update(_needed_for([x], [y]))
    return [m for m in NOISE_MASKS if m in needed], unexplained


def _needed_for(x: list[str], y: list[str]) -> set[str]:
    everything = list(NOISE_MASKS)
    left, right = "\n".join(x), "\n".join(y)
    return {
        name for name in everything
        if apply_masks(left, [m for m in everything if m != name])
        != apply_masks(right, [m for m in everything if m != name])
    }  # fmt: skip


# -- running ---------------------------------------------------------------------------------

# Run as `python WRAPPER program`: the program runs as `python program` would. FASTREE_FLAX_TREE
# =1: nnx.set_graph_mode(False) first. FASTREE_FLAX_REPORT=path (installed runs): fastree's view
# written there at exit.
_WRAPPER = '''\
"""Runs a flax program as `python program` runs it, in the graph mode the environment names."""
import atexit, json, os, random, runpy, sys

_program = os.path.abspath(sys.argv[1])


def _report():
    # At exit, last (registered first): fastree's view of the run.
    report = {"flax imported": "flax.nnx" in sys.modules}
    if report["flax imported"]:
        from fastree.integrations import flax_nnx_graph
        report["graph walks"] = flax_nnx_graph.status()
    node_plugin = runpy.run_path(os.environ["FASTREE_FLAX_NODE_PLUGIN"])
    os.environ["FASTREE_NODE_REPORT"] = os.environ["FASTREE_FLAX_REPORT"] + ".nodes"
    node_plugin["pytest_sessionfinish"](None)  # run_third_party_suites.py's end-of-session report
    with open(os.environ["FASTREE_NODE_REPORT"]) as nodes:
        report["nodes"] = json.load(nodes)
    import fastree
    report["installed functions"] = len(fastree.installed_functions())
    with open(os.environ["FASTREE_FLAX_REPORT"], "w") as out:
        json.dump(report, out, indent=1, sort_keys=True)


if os.environ.get("FASTREE_FLAX_REPORT"):
    atexit.register(_report)
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(_program)
if os.environ.get("FASTREE_FLAX_TREE") == "1":
    from flax import nnx
    nnx.set_graph_mode(False)  # a setter when called: the top of this thread's stack
# The same numbers in every run: the toy examples draw their data from numpy's global generator
# unseeded. Seeded after `import jax`, which draws five numbers from it (jax/_src/clusters/
# k8s_cluster.py) and which `python -m fastree.run` imports before this file runs.
# (PYTHONHASHSEED is fixed in the environment.)
try:
    import jax, numpy
except ImportError:
    pass
else:
    numpy.random.seed(0)
random.seed(0)
try:
    runpy.run_path(_program, run_name="__main__")
except (SystemExit, KeyboardInterrupt):
    raise
except BaseException as error:
    # As the interpreter prints it, from the program's first frame: the frames of this wrapper
    # and of runpy are no part of the program (the excepthook reads error.__traceback__).
    tb = error.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != _program:
        tb = tb.tb_next
    error = error.with_traceback(tb or error.__traceback__)
    sys.excepthook(type(error), error, error.__traceback__)
    sys.exit(1)
'''


@dataclasses.dataclass
class Run:
    status: str  # "exit N" or "timed out"
    stdout: str
    stderr: str
    seconds: float
    report: dict | None = None

    @property
    def ok(self) -> bool:
        return self.status == "exit 0"

    def outcome(self) -> str:
        if self.status != "exit 0" and self.status != "timed out":
            return f"{self.status}: {error_line(self.stderr)}"
        return self.status


def error_line(stderr: str) -> str:
    """The line naming a failure: the last one that reads ``SomeError: ...``, else the last.

    >>> error_line("Traceback ...\\nValueError: bad\\n--------\\nFor simplicity, JAX ...\\n")
    'ValueError: bad'
    """
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b.*", line):
            return re.sub(r"\s*\(https?://[^)]*\)$", "", line)[:200]  # flax's errors end in a link
    return lines[-1][:200] if lines else ""


def prepare(workdir: Path) -> None:
    """Writes the wrapper and the node-report plugin the runs load into ``workdir``."""
    (workdir / "_fastree_flax_program.py").write_text(_WRAPPER)
    (workdir / "_fastree_node_report.py").write_text(third_party._NODE_REPORT_PLUGIN)


def run_program(program: Program, graph_mode: str, label: str, workdir: Path, timeout: float,
                report: Path | None = None) -> Run:
    """One run: ``label`` is plain, plain2 (the noise run) or installed (``fastree.run``)."""
    installed = label == "installed"
    cwd = workdir / "cwd" / re.sub(r"[^\w.-]", "_", program.name)
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("FASTREE_INSTALL", "FASTREE_FLAX_TREE", "FASTREE_FLAX_REPORT")}
    env["SKBUILD_EDITABLE_VERBOSE"] = "0"  # an editable install's rebuild says nothing
    env["MPLBACKEND"] = "Agg"  # plt.show() returns instead of waiting for a window
    env["PYTHONHASHSEED"] = "0"  # set and dict orders of str keys alike in every run
    env["FASTREE_FLAX_NODE_PLUGIN"] = str(workdir / "_fastree_node_report.py")
    if graph_mode == "tree":
        env["FASTREE_FLAX_TREE"] = "1"
    if report is not None:
        report.unlink(missing_ok=True)
        env["FASTREE_FLAX_REPORT"] = str(report)
    launcher = ["-m", "fastree.run"] if installed else []
    wrapper = workdir / "_fastree_flax_program.py"
    command = ["nice", "-n", "10", sys.executable, *launcher, str(wrapper), str(program.path)]
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        status = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the program and any process it started
        out, err = proc.communicate()
        status = "timed out"
    seconds = time.perf_counter() - start
    kept = workdir / "outputs" / f"{cwd.name}-{graph_mode}-{label}"
    kept.parent.mkdir(exist_ok=True)
    for suffix, text in ((".out", out), (".err", err)):  # kept, to read
        kept.with_suffix(kept.suffix + suffix).write_text(text)
    data = None
    if report is not None and report.exists():
        data = json.loads(report.read_text())
    return Run(status, out, err, seconds, data)


# -- comparing -------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    program: str
    mode: str
    plain: str
    installed: str
    verdict: str  # identical, DIFFERS, timed out, skipped: ...
    masks: list[str] = dataclasses.field(default_factory=list)
    unstable: int = 0  # differing line pairs between the plain runs that no mask explains
    diff: str = ""
    status: str = ""
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    report: dict | None = None  # the installed run's, as the wrapper wrote it

    @property
    def failed(self) -> bool:
        return self.verdict.startswith("DIFFERS")


# The modules of JAX's tree functions that installing routes to fastree's C functions: a
# traceback through one of them shows its Python frames plainly and none installed. Those frames
# (their "File" line and the source and caret lines under it) are left out of both runs' stderr.
ROUTED_FRAME_FILES = re.compile(r'^  File ".*/jax/_src/(tree|tree_util)\.py", line \d+, in ')


def without_routed_frames(text: str) -> str:
    r"""``text`` without the traceback frames of JAX's routed tree functions.

    >>> frames = ['  File "/x/prog.py", line 3, in <module>', '    jax.tree.map(f, t)',
    ...           '  File "/y/jax/_src/tree.py", line 156, in map',
    ...           '    return tree_util.tree_map(f, tree)', '           ^^^^^^^^^^^^^^^',
    ...           '  File "/x/prog.py", line 3, in <lambda>', 'TypeError: boom']
    >>> without_routed_frames("\n".join(frames)).split("\n")[2:]
    ['  File "/x/prog.py", line 3, in <lambda>', 'TypeError: boom']
    """
    kept, skipping = [], False
    for line in text.split("\n"):
        if ROUTED_FRAME_FILES.match(line):
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        kept.append(line)
    return "\n".join(kept)


def _comparable(run: Run, stream: str, masks: list[str]) -> str:
    text = apply_masks(getattr(run, stream), masks)
    return without_routed_frames(text) if stream == "stderr" else text


def compare(first: Run, second: Run, installed: Run) -> tuple[str, list[str], int, str]:
    """The verdict on an installed run against two plain runs: (verdict, masks, unstable, diff)."""
    masks: set[str] = set()
    unstable = 0
    for stream in ("stdout", "stderr"):
        needed, unexplained = verified_masks(getattr(first, stream), getattr(second, stream))
        masks.update(needed)
        unstable += len(unexplained)
    ordered = [m for m in NOISE_MASKS if m in masks]
    if installed.status != first.status:
        verdict = f"DIFFERS: {first.status} plain, {installed.status} installed"
        return verdict, ordered, unstable, _diff(first, installed, ordered)
    for stream in ("stdout", "stderr"):
        mine = _comparable(installed, stream, ordered)
        if all(mine != _comparable(run, stream, ordered) for run in (first, second)):
            return f"DIFFERS in {stream}", ordered, unstable, _diff(first, installed, ordered)
    return "identical", ordered, unstable, ""


def _diff(plain: Run, installed: Run, masks: list[str], limit: int = 40) -> str:
    lines = []
    for stream in ("stdout", "stderr"):
        lines += difflib.unified_diff(
            _comparable(plain, stream, masks).split("\n"),
            _comparable(installed, stream, masks).split("\n"),
            f"plain {stream}", f"installed {stream}", n=2, lineterm="",
        )
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more diff lines)"]
    return "\n".join(lines)


def status_line(report: dict | None) -> str:
    """fastree's view at the installed run's exit, in one line."""
    if report is None:
        return "no report (the run did not reach its exit hooks)"
    parts = []
    walks = report.get("graph walks")
    if walks is None:
        parts.append("flax.nnx not imported")
    else:
        native = sorted(k for k, v in walks.items() if v == "native")
        other = {k: v for k, v in walks.items() if v != "native"}
        parts.append(f"graph walks: {len(native)} native"
                     + "".join(f"; {k}: {v}" for k, v in sorted(other.items())))
    nodes = report.get("nodes", {})
    counts = ", ".join(f"{k} {v}" for k, v in sorted(nodes.get("counts", {}).items())) or "none"
    parts.append(f"attribute nodes: {counts}")
    for cls, text in sorted(nodes.get("library", {}).items()):
        parts.append(f"{cls}: {text.split(',')[0]}")  # the reason's first clause
    return " | ".join(parts)


def run_one(program: Program, mode: str, workdir: Path, timeout: float) -> Result:
    if program.skip:
        return Result(program.name, mode, "-", "-", f"skipped: {program.skip}")
    safe_name = re.sub(r"[^\w.-]", "_", program.name)  # (no backslash in an f-string: 3.10, 3.11)
    report = workdir / "reports" / f"{safe_name}-{mode}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    first = run_program(program, mode, "plain", workdir, timeout)
    seconds = {"plain": first.seconds}
    if first.status == "timed out":
        return Result(program.name, mode, f"timed out ({timeout:.0f} s)", "-",
                      "timed out (plain; not compared)", seconds=seconds)
    if mode == "tree" and not first.ok:
        return Result(program.name, mode, first.outcome(), "-",
                      f"skipped: fails plain in tree mode: {error_line(first.stderr)}",
                      seconds=seconds)
    second = run_program(program, mode, "plain2", workdir, timeout)
    installed = run_program(program, mode, "installed", workdir, timeout, report)
    seconds.update(plain2=second.seconds, installed=installed.seconds)
    if second.status != first.status:
        verdict = f"plain runs disagree: {first.status}, then {second.status}"
        return Result(program.name, mode, first.outcome(), installed.outcome(), verdict,
                      status=status_line(installed.report), seconds=seconds)
    verdict, masks, unstable, diff = compare(first, second, installed)
    return Result(program.name, mode, first.outcome(), installed.outcome(), verdict, masks,
                  unstable, diff, status_line(installed.report), seconds, installed.report)


def print_table(results: list[Result]) -> None:
    rows = [("program", "mode", "plain", "installed", "verdict")]
    for r in results:
        verdict = r.verdict
        if r.masks:
            verdict += f" (masked: {', '.join(r.masks)})"
        if r.unstable:
            verdict += f" ({r.unstable} lines differ between plain runs)"
        rows.append((r.program, r.mode, _short(r.plain), _short(r.installed), verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=(*GRAPH_MODES, "both"), default="both")
    parser.add_argument("--only", metavar="GLOB", action="append",
                        help="only programs whose name (as under the sdist's root, e.g. "
                        "'docs_nnx/guides/pytree.md') matches; may repeat")
    parser.add_argument("--workdir", type=Path, help="keep the sdist, programs and reports here")
    parser.add_argument("--flax-source", type=Path, metavar="DIR",
                        help="an unpacked sdist (or checkout) of the installed flax version")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one run may take (default 900); a plain run past it is "
                        "reported 'timed out' and not compared")
    parser.add_argument("--list", action="store_true", help="list the programs and exit")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="fastree-flax-programs-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    root = flax_source(args, workdir)
    programs = toy_programs(root) + document_programs(root, workdir / "programs")
    if args.only:
        programs = [p for p in programs if any(fnmatch.fnmatch(p.name, g) for g in args.only)]
    if args.list:
        for p in programs:
            print(f"{p.name}: {'skipped, ' + p.skip if p.skip else 'runs'}")
        return 0
    modes = GRAPH_MODES if args.mode == "both" else (args.mode,)
    print(f"workdir: {workdir}\nflax {importlib.metadata.version('flax')} programs from {root}")
    prepare(workdir)
    print(f"python -m fastree.run routes {third_party.check_installed_mode(workdir)} functions",
          flush=True)
    start = time.perf_counter()
    results = []
    for program in programs:
        for mode in modes:
            result = run_one(program, mode, workdir, args.timeout)
            took = sum(result.seconds.values())
            print(f"  {program.name} [{mode}]: {result.verdict} ({took:.0f} s)", flush=True)
            results.append(result)
    minutes = (time.perf_counter() - start) / 60
    print()
    print_table(results)
    print("\nfastree at the installed runs' exit:")
    for r in results:
        if r.status:
            print(f"  {r.program} [{r.mode}]: {r.status}")
    reasons = {text for r in results if r.report for text in r.report.get("nodes", {})
               .get("library", {}).values()}
    for text in sorted(reasons):
        print(f"  (in full: {text})")
    failed = [r for r in results if r.failed]
    for r in failed:
        print(f"\n== {r.program} [{r.mode}]: {r.verdict}\n{r.diff}")
    counted = {}
    for r in results:
        key = r.verdict.split(":")[0].split(" (")[0]
        counted[key] = counted.get(key, 0) + 1
    print(f"\n{', '.join(f'{k} {v}' for k, v in sorted(counted.items()))}; {minutes:.1f} minutes")
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
