"""Every repository path the prose names exists: README.md, docs/, and the header comments of the C++
sources and the Python modules (a file's opening comment block or module docstring).

A path is named by its top folder (``csrc/``, ``python/``, ``tests/``, ``docs/``, ``scripts/``,
``benchmarks/``, ``.ci/``), or, in a C++ header comment, by a layer folder under csrc/ as the
includes name it (``nnx/nnx_graph.h``), or as ``fastree/...py`` for the package's own modules.
``{a,b}`` names each file; ``*`` names a pattern that must match one file at least. A rename that
leaves prose pointing at the old name fails here. docs/performance-history.md is left out: a
record of past runs, naming files as they were then (as its opening paragraph says).
"""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_TOP = r"(?:csrc|python|tests|docs|scripts|benchmarks|\.ci)"
# A path: a top folder, then name characters, slashes, dots, a {a,b} group or a * pattern; it
# ends at a name character (a sentence's full stop or comma is not part of it).
_PATH = re.compile(r"(?<![\w./-])(" + _TOP + r"/(?:[\w.*-]|/|\{[\w.,]+\})*(?:[\w*]|\{[\w.,]+\}))")
_PACKAGE_PATH = re.compile(r"(?<![\w./-])(fastree/(?:[\w]+/)*[\w]+\.py)\b")
# A path of another project's (flax's own `tests/nnx`, flax 0.12.8 `tests/nnx`): not ours.
_THEIRS = re.compile(r"\b(?:flax|jax|jaxlib|equinox|chex|optax|optree|pybind11|numpy)"
                     r"(?:'s(?:\s+own)?|\s+\d+(?:\.\d+)+)\s*`?$")
# Pages that record past runs and name files as they were then (each says so at its top).
_RECORDS = frozenset({"performance-history.md"})
_CSRC_LAYERS = ("binding", "registry", "treedef", "attr", "nnx", "diagnostics", "util")
_CSRC_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(_CSRC_LAYERS) + r")/[\w.{},*]*\.(?:h|cpp))")


def _expand(path: str) -> list[str]:
    group = re.search(r"\{([^}]*)\}", path)
    if group is None:
        return [path]
    return [expanded for choice in group.group(1).split(",")
            for expanded in _expand(path[:group.start()] + choice + path[group.end():])]


def _exists(path: str, base: Path) -> bool:
    if "*" in path:
        return any(base.glob(path))
    return (base / path).exists()


def _cpp_header(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("//") or (not stripped and not lines):
            lines.append(stripped)
        else:
            break
    return "\n".join(lines)


def _python_header(path: Path) -> str:
    # The module docstring and the comments before the first statement.
    text = []
    with path.open() as handle:
        for token in tokenize.generate_tokens(handle.readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING):
                text.append(token.string)
            elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.ENCODING):
                break
    return "\n".join(text)


def _sources() -> list[tuple[str, str, bool]]:
    # (where, text, whether csrc-relative include paths count)
    out = [("README.md", (ROOT / "README.md").read_text(), False)]
    out += [(str(p.relative_to(ROOT)), p.read_text(), False)
            for p in sorted((ROOT / "docs").rglob("*.md")) if p.name not in _RECORDS]
    out += [(str(p.relative_to(ROOT)), _cpp_header(p), True)
            for p in sorted((ROOT / "csrc").rglob("*")) if p.suffix in (".h", ".cpp")]
    out += [(str(p.relative_to(ROOT)), _python_header(p), False)
            for p in sorted((ROOT / "python" / "fastree").rglob("*.py"))]
    return out


def _missing(text: str, csrc_relative: bool) -> list[str]:
    missing = []
    named = [(m, ROOT) for m in _PATH.finditer(text)]
    named += [(m, ROOT / "python") for m in _PACKAGE_PATH.finditer(text)]
    if csrc_relative:
        named += [(m, ROOT / "csrc") for m in _CSRC_PATH.finditer(text)]
    for match, base in named:
        if _THEIRS.search(" ".join(text[max(0, match.start() - 40):match.start()].split())):
            continue
        path = match.group(1)
        for one in _expand(path.rstrip(".")):
            if not _exists(one, base):
                missing.append(one)
    return missing


@pytest.mark.parametrize("where, text, csrc_relative", _sources(), ids=lambda v: v
                         if isinstance(v, str) and len(v) < 80 and "\n" not in v else "")
def test_every_named_path_exists(where, text, csrc_relative):
    assert _missing(text, csrc_relative) == [], where


def test_the_check_fails_on_a_missing_path():
    assert _missing("see csrc/nnx/nnx_graph.h and docs/{testing,library-nodes}.md", False) == []
    assert _missing("see csrc/attr_mapping.{h,cpp}.", False) == ["csrc/attr_mapping.h",
                                                                  "csrc/attr_mapping.cpp"]
    assert _missing("fastree/_jax_bridge.py is gone", False) == ["fastree/_jax_bridge.py"]
    assert _missing("csrc/nnx/nnx_graph_*.cpp", False) == []
    assert _missing("csrc/nnx_graph_*.cpp", False) == ["csrc/nnx_graph_*.cpp"]
    assert _missing("// nnx/missing.h", True) == ["nnx/missing.h"]
    assert _missing("// nnx/missing.h", False) == []
    assert _missing("flax's own `tests/nnx` and flax 0.12.8 `tests/nnx`", False) == []
    assert _missing("the job's `tests/nnx`", False) == ["tests/nnx"]


_HISTORY_TAG = re.compile(r"red-team round|\brepro_\d+|\bfinding \d+\b|\bissue #?\d+, (?:finding|section)",
                          re.IGNORECASE)


def _code_files() -> list[Path]:
    files = [*ROOT.glob("csrc/**/*.h"), *ROOT.glob("csrc/**/*.cpp"),
             *ROOT.glob("python/fastree/**/*.py"), *ROOT.glob("python/fastree/**/*.pyi"),
             *ROOT.glob("tests/*.py")]
    return sorted(path for path in files if path.name != Path(__file__).name)


def test_code_and_tests_say_what_they_guard_not_when_it_was_found():
    # A comment or test names the behaviour it keeps; when a round of review found it belongs in
    # the history docs (docs/performance-history.md, docs/reliability.md).
    tagged = [f"{path.relative_to(ROOT)}:{number}"
              for path in _code_files()
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if _HISTORY_TAG.search(line)]
    assert not tagged, tagged
    outside = [f"{path.relative_to(ROOT)}:{number}"
               for path in _code_files()
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"\.\./(?:shared|\.library)\b", line)]
    assert not outside, f"names a file outside the repository: {outside}"
    assert not [path for path in _code_files()
                if re.search(r"redteam|round\d|repro_?\d", path.name, re.IGNORECASE)]


def test_the_history_check_catches_a_tag():
    assert _HISTORY_TAG.search("// a walk (red-team round 3, repro_15)")
    assert _HISTORY_TAG.search("# equal fingerprints (issue 12, finding 6)")
    assert not _HISTORY_TAG.search("# the first finding of the check")
