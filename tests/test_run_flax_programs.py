"""scripts/run_flax_programs.py's own logic, without the network or flax's programs.

What it pins: a noise mask applies only where two plain runs need it, and a difference no mask
explains stays a difference; a notebook's code cells are read from MyST and from jupytext's
markdown format, with their options and tags, and become one program that runs them as a
notebook would (magics, skip-execution, a cell's last expression shown, a cell that does not
compile left out); the wrapper runs a program as ``python program`` would, so a failure's
traceback is the same plain and under ``python -m fastree.run``; and, where flax is importable,
a two-line program in tree mode runs both ways, identical, with fastree's view reported.
"""

from __future__ import annotations

import textwrap

import pytest
from helpers import script_module


@pytest.fixture(scope="module")
def rfp():
    with script_module("run_flax_programs", "run_third_party_suites") as module:
        yield module


# -- masks -----------------------------------------------------------------------------------


def test_a_mask_applies_only_where_the_plain_runs_need_it(rfp):
    first = "model at 0x7f3a9c2b10d0\nstep 0 took 1.25 s\nloss 0.5\n"
    second = "model at 0x7f11aa22bb30\nstep 0 took 1.31 s\nloss 0.5\n"
    assert rfp.verified_masks(first, second) == (["address", "duration"], [])
    # Equal addresses in both runs: nothing to mask, so an installed run's other address differs.
    assert rfp.verified_masks(first, first) == ([], [])


def test_a_difference_no_mask_explains_is_reported(rfp):
    masks, unexplained = rfp.verified_masks("a\nloss 0.5\nb\n", "a\nloss 0.6\nb\n")
    assert masks == [] and unexplained == [("loss 0.5", "loss 0.6")]
    masks, unexplained = rfp.verified_masks("a\nb\n", "a\nextra\nb\n")
    assert masks == [] and unexplained == [("", "extra")]


def test_progress_bars_and_log_clocks(rfp):
    first = "10%|#   \r100%|##########\nW1128 14:09:53.123456  12345 cpu.cc:1] note\n"
    second = "20%|##  \r100%|##########\nW1128 14:09:54.654321  12399 cpu.cc:1] note\n"
    assert rfp.verified_masks(first, second) == (["log clock", "progress bar"], [])
    assert rfp.apply_masks(first, ["log clock", "progress bar"]) == (
        "100%|##########\nW<clock> <thread> cpu.cc:1] note\n")


def _run(rfp, status="exit 0", stdout="", stderr=""):
    return rfp.Run(status, stdout, stderr, 0.0)


def test_compare(rfp):
    plain = _run(rfp, stdout="at 0x7f0000aaaa00\nloss 1\n")
    plain2 = _run(rfp, stdout="at 0x7f0000bbbb00\nloss 1\n")
    same = _run(rfp, stdout="at 0x7f0000cccc00\nloss 1\n")
    verdict, masks, unstable, diff = rfp.compare(plain, plain2, same)
    assert (verdict, masks, unstable, diff) == ("identical", ["address"], 0, "")
    other = _run(rfp, stdout="at 0x7f0000cccc00\nloss 2\n")
    verdict, _, _, diff = rfp.compare(plain, plain2, other)
    assert verdict == "DIFFERS in stdout"
    assert "-loss 1" in diff and "+loss 2" in diff
    verdict, _, _, _ = rfp.compare(plain, plain2, _run(rfp, "exit 1", plain.stdout, "ValueError"))
    assert verdict == "DIFFERS: exit 0 plain, exit 1 installed"


def test_unstable_output_must_equal_one_plain_run(rfp):
    plain, plain2 = _run(rfp, stdout="seed 1\n"), _run(rfp, stdout="seed 2\n")
    assert rfp.compare(plain, plain2, _run(rfp, stdout="seed 2\n"))[:3] == ("identical", [], 1)
    assert rfp.compare(plain, plain2, _run(rfp, stdout="seed 3\n"))[0] == "DIFFERS in stdout"


def test_error_line(rfp):
    stderr = (
        "Traceback (most recent call last):\n  File \"p.py\", line 1, in <module>\n"
        "flax.errors.TraceContextError: Cannot mutate Count (https://flax.readthedocs.io/x)\n"
        "--------------------\nFor simplicity, JAX has removed its internal frames.\n"
    )
    assert rfp.error_line(stderr) == "flax.errors.TraceContextError: Cannot mutate Count"


# -- code cells ------------------------------------------------------------------------------

MYST = textwrap.dedent(
    """\
    ---
    jupytext:
      text_representation:
        format_name: myst
    ---
    # A guide

    ```python
    not_a_cell = True
    ```

    ```{code-cell} ipython3
    :outputId: 1234
    x = 1
    ```

    ````{code-cell} ipython3
    ---
    tags: [skip-execution, hide-output]
    ---
    s = '''
    ```
    '''
    ````

    ```{code-cell} bash
    ls
    ```
    """
)

PLAIN = textwrap.dedent(
    """\
    ---
    jupyter:
      jupytext:
        text_representation:
          format_name: markdown
    ---
    Text.

    ```python
    y = 2
    ```

    ```bash
    echo not python
    ```
    """
)


def test_myst_cells_with_options_and_nested_fences(rfp):
    cells = rfp.code_cells(MYST)
    assert [(c.source, c.line, c.tags) for c in cells] == [
        ("x = 1\n", 14, ()),
        ("s = '''\n```\n'''\n", 21, ("skip-execution", "hide-output")),
    ]
    assert rfp.is_notebook(MYST, paired_ipynb=False)


def test_jupytext_markdown_cells(rfp):
    assert [(c.source, c.line) for c in rfp.code_cells(PLAIN)] == [("y = 2\n", 10)]
    assert rfp.is_notebook(PLAIN, paired_ipynb=False)
    assert not rfp.is_notebook("# Design\n```python\nx\n```\n", paired_ipynb=False)
    assert rfp.is_notebook("# Design\n```python\nx\n```\n", paired_ipynb=True)


def test_program_runs_cells_as_a_notebook_does(rfp, capsys):
    cells = [
        rfp.Cell("%matplotlib inline\nimport math\nmath.floor(\n  2.5\n)  # shown\n", 3),
        rfp.Cell("%%timeit\nmath.pi\n", 10),
        rfp.Cell("never = 1\n", 12, ("skip-execution",)),
        rfp.Cell("math.e;\n", 15),
        rfp.Cell("print(math.tau)s\n", 17),  # a typo, as flax's view guide has one
        rfp.Cell("raise KeyError('k')\n", 19, ("raises-exception",)),
        rfp.Cell("x = [1]; x\n", 21),
        rfp.Cell("'last'\n", 23),
    ]
    text = rfp.program_text(cells, "guide.md")
    assert "left out, a cell magic (%%timeit)" in text
    assert "left out, tagged skip-execution" in text
    assert "left out, does not compile (SyntaxError" in text
    namespace: dict = {}
    exec(compile(text, "guide.py", "exec"), namespace)
    assert capsys.readouterr().out == "2\nKeyError: 'k'\n[1]\n'last'\n"
    assert "never" not in namespace and namespace["x"] == [1]


def test_missing_modules(rfp):
    source = "import os, no_such_module_a.b\ntry:\n    from no_such_module_b import c\nexcept: x\n"
    assert rfp.missing_modules(source) == ["no_such_module_a", "no_such_module_b"]


def test_documents_are_found_and_classified(rfp, tmp_path):
    root = tmp_path / "flax"
    (root / "docs_nnx" / "guides").mkdir(parents=True)
    (root / "docs_nnx" / "guides" / "ok.md").write_text(PLAIN)
    (root / "docs_nnx" / "guides" / "needs.md").write_text(
        PLAIN.replace("y = 2", "import no_such_module_here"))
    (root / "docs_nnx" / "guides" / "empty.md").write_text(PLAIN.split("Text.")[0])
    (root / "docs_nnx" / "design.md").write_text("```python\nfragment(\n```\n")
    found = {p.name: p for p in rfp.document_programs(root, tmp_path / "out")}
    assert found["docs_nnx/guides/ok.md"].skip == ""
    assert found["docs_nnx/guides/ok.md"].path.read_text().endswith("y = 2\n")
    assert found["docs_nnx/guides/needs.md"].skip == "needs no_such_module_here, not installed"
    assert found["docs_nnx/guides/empty.md"].skip == "no code cells"
    assert found["docs_nnx/design.md"].skip == "not a notebook (no jupytext pairing)"


# -- runs, plain and installed ---------------------------------------------------------------


def _program(rfp, tmp_path, source: str):
    rfp.prepare(tmp_path)
    path = tmp_path / "prog" / "prog.py"
    path.parent.mkdir()
    path.write_text(source)
    return rfp.Program("prog.py", path)


def test_a_failure_reads_the_same_plain_and_installed(rfp, tmp_path):
    # Without flax: graph mode leaves flax alone. The installed run starts under more frames of
    # the launcher's; the wrapper prints the traceback from the program's first frame.
    source = ("import sys\nprint(sys.argv[0].endswith('prog.py'))\n"
              "def f():\n    raise ValueError('x')\nf()\n")
    program = _program(rfp, tmp_path, source)
    result = rfp.run_one(program, "graph", tmp_path, timeout=600)
    assert result.verdict == "identical", result.diff
    assert result.plain == result.installed == "exit 1: ValueError: x"
    err = (tmp_path / "outputs" / "prog.py-graph-installed.err").read_text()
    assert err.splitlines()[:2] == ["Traceback (most recent call last):",
                                    f'  File "{program.path}", line 5, in <module>']
    assert (tmp_path / "outputs" / "prog.py-graph-installed.out").read_text() == "True\n"
    assert result.status.startswith("flax.nnx not imported | attribute nodes:")


def test_a_tree_mode_program_runs_both_ways(rfp, tmp_path):
    pytest.importorskip("flax.nnx")
    source = ("from flax import nnx\n"
              "print(nnx.set_graph_mode.current_value(), "
              "nnx.split(nnx.Linear(2, 3, rngs=nnx.Rngs(0))))\n")
    program = _program(rfp, tmp_path, source)
    result = rfp.run_one(program, "tree", tmp_path, timeout=600)
    assert result.verdict == "identical", result.diff
    out = (tmp_path / "outputs" / "prog.py-tree-installed.out").read_text()
    assert out.startswith("False ")  # tree mode from the program's first line
    from fastree.integrations import flax_nnx_graph

    assert set(result.report["graph walks"]) >= set(flax_nnx_graph.WALKS)
    assert result.report["installed functions"] > 0
    assert result.status.startswith("graph walks: ")


def test_a_program_failing_plainly_in_tree_mode_is_skipped(rfp, tmp_path):
    pytest.importorskip("flax.nnx")
    source = "from flax import nnx\nassert nnx.set_graph_mode.current_value(), 'graph mode only'\n"
    result = rfp.run_one(_program(rfp, tmp_path, source), "tree", tmp_path, timeout=600)
    assert result.verdict == "skipped: fails plain in tree mode: AssertionError: graph mode only"
    assert result.installed == "-" and not result.failed
