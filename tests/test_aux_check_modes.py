"""``fastree.config.aux_checks``: installed means identical to JAX, and no user code mid-walk.

* ``"auto"`` (the default) warns for fastree's own API and checks nothing while fastree is
  installed into JAX: a routed ``jax.tree.map`` must not warn where JAX does not, or
  ``python -W error`` breaks.
* ``"off"`` is the one-line switch for the direct API; ``FASTREE_AUX_CHECKS`` sets the first
  value; asking for ``"warn"`` or ``"strict"`` brings the checks back while installed.
* The flatten-time checks judge a value by its type: no ``__eq__`` (nor ``hash``) of the user's
  runs inside a walk, so side effects cannot change it and a KeyboardInterrupt from one cannot
  stop it. ``fastree.audit``, which the user calls, still probes ``==``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import fastree
import fastree.tree_util as tu
import numpy as np
import pytest

PROGRAM = textwrap.dedent(
    """
    import jax, numpy as np
    class Box:
        def __init__(self, meta, x): self.meta, self.x = meta, x
    jax.tree_util.register_pytree_node(
        Box, lambda b: ((b.x,), b.meta), lambda meta, xs: Box(meta, xs[0]))
    out = jax.tree.map(lambda v: v + 1, Box(np.zeros(3), 1.0))
    print("ran", out.x)
    """
)


def _run(args, env_extra=None, tmp_path=None):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTREE_")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-W", "error", *args, str(script)],
        capture_output=True, text=True, timeout=300, env=env,
    )


def test_plain_program_runs_under_w_error(tmp_path):
    r = _run([], tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ran 2.0"


def test_installed_program_runs_under_w_error_as_plainly(tmp_path):
    r = _run(["-m", "fastree.run"], tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ran 2.0"


def test_installed_program_asking_for_checks_gets_them(tmp_path):
    r = _run(["-m", "fastree.run"], {"FASTREE_AUX_CHECKS": "warn"}, tmp_path=tmp_path)
    assert r.returncode != 0
    assert "AuxDataWarning" in r.stderr


class _Meta:
    def __init__(self, value):
        self.value = value


def _box_type():
    class Box:
        def __init__(self, meta):
            self.meta = meta

    tu.register_pytree_node(Box, lambda b: ((), b.meta), lambda meta, _: Box(meta))
    return Box


@pytest.fixture
def mode():
    before = fastree.config.aux_checks
    yield lambda m: setattr(fastree.config, "aux_checks", m)
    fastree.config.aux_checks = before


def test_auto_warns_on_the_direct_api_and_is_silent_installed(mode):
    mode("auto")
    box = _box_type()
    with fastree.installed(), warnings.catch_warnings():
        warnings.simplefilter("error")
        tu.tree_structure(box(np.zeros(2)))
    fastree.diagnostics.aux._reset_warnings()
    if fastree.is_installed():  # this session runs installed: auto is off throughout
        return
    with pytest.warns(fastree.AuxDataWarning, match="holds a numpy.ndarray"):
        tu.tree_structure(box(np.zeros(2)))


def test_off_is_a_one_line_switch(mode):
    mode("off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tu.tree_structure(_box_type()(np.zeros(2)))
    assert fastree.config.strict_aux is False


def test_warn_and_strict_apply_while_installed(mode):
    fastree.diagnostics.aux._reset_warnings()
    with fastree.installed():
        mode("warn")
        with pytest.warns(fastree.AuxDataWarning):
            tu.tree_structure(_box_type()(np.zeros(2)))
        mode("strict")
        with pytest.raises(TypeError, match="aux_data of the"):
            tu.tree_structure(_box_type()([1]))


def test_an_unknown_mode_is_a_clear_error(mode):
    with pytest.raises(ValueError, match="aux_checks must be one of 'auto', 'off'"):
        mode("loud")


def test_strict_aux_block_restores_the_mode(mode):
    mode("off")
    with fastree.strict_aux():
        assert fastree.config.aux_checks == "strict"
    assert fastree.config.aux_checks == "off"


class _CountingEq:
    calls = 0

    def __eq__(self, other):
        type(self).calls += 1
        return self is other

    __hash__ = object.__hash__


class _InterruptingEq:
    def __eq__(self, other):
        raise KeyboardInterrupt

    __hash__ = object.__hash__


@pytest.mark.parametrize(
    "tree", [(1.0, 2.0), [1.0], [1.0] * 20, {"a": 1.0}, ((1.0,), 2.0)],
    ids=["flat-tuple", "flat-list", "long-list", "dict", "nested"],
)
def test_a_report_from_fs_own_call_fails_the_map_whatever_the_tree(mode, tree):
    # tree_map on a tuple or list of plain leaves opens no report scope (nothing in it can be
    # reported, csrc/binding/entry_points.cpp), so f's own call makes its report when it ends and
    # f sees the error; on other trees the walk's scope makes it after the walk. Either way the
    # strict error is tree_map's, and no result comes back.
    mode("strict")
    box = _box_type()

    def f(x):
        tu.tree_structure(box(np.zeros(2)))
        return x

    with pytest.raises(TypeError, match="holds a numpy.ndarray"):
        tu.tree_map(f, tree)
    mode("warn")
    fastree.diagnostics.aux._reset_warnings()
    with pytest.warns(fastree.AuxDataWarning, match="holds a numpy.ndarray"):
        assert tu.tree_map(f, tree) == tree


@pytest.mark.parametrize("checks", ["warn", "strict"])
def test_no_user_eq_runs_during_a_walk(mode, checks):
    mode(checks)
    box = _box_type()
    _CountingEq.calls = 0
    tree = [box(_CountingEq()), box((_CountingEq(), 1))]
    tu.tree_map(lambda x: x, tree)
    tu.tree_flatten(tree)
    tu.tree_structure(tree)
    assert _CountingEq.calls == 0


def test_an_interrupting_eq_in_aux_data_does_not_stop_a_walk(mode):
    mode("warn")
    box = _box_type()
    leaves, _ = tu.tree_flatten({"a": box(_InterruptingEq()), "b": 1})
    assert leaves == [1]


def test_the_audit_still_probes_eq():
    class NotBool:
        def __eq__(self, other):
            return np.array([True, False])

        __hash__ = object.__hash__

    box = _box_type()
    report = fastree.audit({"b": box(NotBool())})
    assert any("eq" in problem for entry in report.entries for problem in entry.problems)


def test_the_report_runs_after_the_walk_so_a_stateful_is_leaf_sees_what_jax_sees(mode):
    # The reporter walks the tree again (with is_leaf) to name the node: made after the walk, an
    # is_leaf whose answers depend on how often it ran answers the walk as under JAX.
    from fastree.jax_interop.compat import tree_util as jax_tu

    mode("warn")
    fastree.diagnostics.aux._reset_warnings()

    def run(lib):
        class Box:
            def __init__(self, meta, x):
                self.meta, self.x = meta, x

        lib.register_pytree_node(Box, lambda b: ((b.x,), b.meta), lambda m, xs: Box(m, xs[0]))
        calls = []

        def is_leaf(x):
            calls.append(1)
            return len(calls) == 6  # the sixth object the walk asks about stays a leaf

        tree = [Box(np.zeros(2), [1, 2]), [3, [4, 5]], (6, 7)]
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            leaves, treedef = lib.tree_flatten(tree, is_leaf=is_leaf)
        return [repr(x) for x in leaves], treedef.num_nodes, len(record)

    got, jax = run(tu), run(jax_tu)
    assert got[:2] == jax[:2]
    assert got[2] == 1 and jax[2] == 0  # fastree warned, after the walk
