"""The C++ core's includes point down: csrc/ is folders by layer (docs/layout.md).

Every ``#include "folder/file.h"`` in ``csrc/<layer>/`` must name a header of the same layer or a
lower one, so that a newcomer can tell from a file's folder what it may include, and no two
folders depend on each other. The order is written once, here, and docs/layout.md must draw the
same one. Read from the source text: nothing is built, so this runs in milliseconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"

LAYERS = ("util", "registry", "diagnostics", "treedef", "attr", "nnx", "binding")
"""csrc/'s folders, lowest first: a file may include its own folder's headers and lower ones."""
RANK = {layer: rank for rank, layer in enumerate(LAYERS)}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def sources(root: Path = CSRC) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in {".h", ".cpp"})


def includes(path: Path) -> list[str]:
    return INCLUDE.findall(path.read_text())


def upward_includes(root: Path = CSRC) -> list[str]:
    """'file -> header' for every include of a header from a higher layer than the file's."""
    found = []
    for path in sources(root):
        layer = path.relative_to(root).parts[0]
        for header in includes(path):
            target = header.split("/")[0]
            if RANK[target] > RANK[layer]:
                found.append(f"{path.relative_to(root)} -> {header}")
    return found


def test_every_folder_is_a_layer() -> None:
    folders = {p.name for p in CSRC.iterdir() if p.is_dir()}
    assert folders == set(LAYERS)
    loose = [p.name for p in CSRC.iterdir() if p.is_file()]
    assert loose == [], "every source file sits in a layer's folder"


def test_includes_name_existing_headers_by_path_from_csrc() -> None:
    bad = [
        f"{path.relative_to(CSRC)} -> {header}"
        for path in sources()
        for header in includes(path)
        if header.split("/")[0] not in RANK or not (CSRC / header).is_file()
    ]
    assert bad == []


def test_no_upward_includes() -> None:
    assert upward_includes() == []


def test_layout_doc_draws_the_same_order() -> None:
    text = (ROOT / "docs" / "layout.md").read_text()
    chain = re.search(r"point down:\s*((?:\w+\s*<-\s*)+\w+)", text)
    assert chain is not None, "docs/layout.md draws the layer order as 'point down: a <- b <- ...'"
    assert tuple(re.split(r"\s*<-\s*", chain.group(1).strip())) == LAYERS
    assert "no upward includes remain" in " ".join(text.split())


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"util/a.h": "", "registry/b.h": '#include "util/a.h"\n'}, []),
        ({"registry/b.h": "", "treedef/c.h": '#include "registry/b.h"'}, []),
        (
            {"treedef/c.h": "", "registry/b.cpp": '  #  include "treedef/c.h"\n'},
            ["registry/b.cpp -> treedef/c.h"],
        ),
    ],
)
def test_the_check_finds_an_upward_include(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert upward_includes(tmp_path) == expected
