"""The benchmark suite's imports point one way: data -> libraries -> measuring -> reporting.

benchmarks/ is layered (its ``__init__`` draws the layers): the data the benchmarks describe
(``data/``, and ``workloads/``, the program fragments), the libraries under test (``libraries/``),
the measuring (``measure/``), the reporting (``report/``), and on top the run itself (``runner``,
``cli``, ``settings``, ``selection``, ``__main__``, ``scaling``). A module may import from its own
package or from a lower layer, never from a higher one or sideways; and no chain of imports,
function-level and ``TYPE_CHECKING`` ones included, may come back to where it started. Both are
read from the source with ``ast``: nothing is imported, so this runs in milliseconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

LAYERS = {
    "benchmarks.unsupported": 0,
    "benchmarks.data": 1,
    "benchmarks.workloads": 2,
    "benchmarks.libraries": 2,
    "benchmarks.measure": 3,
    "benchmarks.report": 4,
}
"""Package (or module) -> layer; every other module of benchmarks/ is the run, layer 5."""
TOP = 5


def module_name(path: Path, root: Path = BENCHMARKS) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = BENCHMARKS) -> dict[str, set[str]]:
    """module -> the modules of ``root``'s package it imports, anywhere in its source."""
    files = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import sub` imports the submodule sub when there is one.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    for alias in node.names
                ]
            graph[name] |= {target for target in targets if target in files and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer_of(module: str) -> tuple[int, str]:
    """(layer, the package that gives it) for a module of benchmarks/."""
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer, prefix
    return TOP, module


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    root = tmp_path / "benchmarks"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "low.py").write_text("")
    (root / "top.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from benchmarks.sub.low import x\n"
        "def f():\n    from benchmarks.sub import low\n"
    )
    (root / "sub" / "mid.py").write_text("from . import low\nimport benchmarks.top\n")
    graph = import_graph(root)
    assert graph["benchmarks.top"] == {"benchmarks.sub.low"}
    assert graph["benchmarks.sub.mid"] == {"benchmarks.sub.low", "benchmarks.top"}


def test_benchmark_imports_form_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 30, "the suite's modules were not found"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_benchmark_imports_point_down_the_layers() -> None:
    wrong = []
    for module, targets in import_graph().items():
        layer, package = layer_of(module)
        for target in targets:
            target_layer, target_package = layer_of(target)
            if target_package != package and target_layer >= layer and layer != TOP:
                wrong.append(f"{module} (layer {layer}) imports {target} (layer {target_layer})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", [p for p in LAYERS if p != "benchmarks.unsupported"])
def test_every_layer_exists(package: str) -> None:
    assert any(layer_of(module)[1] == package for module in import_graph())
