"""aux_data checks: warnings, strict mode, audit (fastree.diagnostics.aux, fastree.diagnostics.audit)."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import enum
import functools
import os
import re
import subprocess
import sys
import warnings

import fastree
import fastree.tree_util as tu
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fastree.diagnostics import aux as _aux
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
from helpers import stable_id

# The aux_data checks are under test here: on in installed runs too (conftest.py).
AUX_CHECKS = "warn"


class AuxNode:
    """A custom node whose aux_data is whatever the test puts there."""

    def __init__(self, child, aux):
        self.child, self.aux = child, aux


tu.register_pytree_node(AuxNode, lambda n: ((n.child,), n.aux), lambda a, c: AuxNode(c[0], a))


class OtherNode(AuxNode):
    pass


tu.register_pytree_node(OtherNode, lambda n: ((n.child,), n.aux), lambda a, c: OtherNode(c[0], a))


@tu.register_dataclass
@dataclasses.dataclass
class Layer:
    w: object
    meta: object = dataclasses.field(default="m", metadata={"static": True})


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    sizes: tuple


class WeirdEq:
    """== returns neither a bool nor something numpy-like."""

    def __eq__(self, other):
        return object()

    __hash__ = object.__hash__


class NoHash:
    def __eq__(self, other):
        return isinstance(other, NoHash)

    __hash__ = None  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def _fresh_state():
    _aux._reset_warnings()
    assert not fastree.config.strict_aux
    yield
    fastree.config.strict_aux = False
    _aux._reset_warnings()


def _recorded(fn):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn()
    return [w for w in record if issubclass(w.category, fastree.AuxDataWarning)]


# ------------------------------------------------------------------------------------------------
# warnings


def test_ndarray_warns_with_type_path_and_fix():
    with pytest.warns(fastree.AuxDataWarning) as record:
        tu.tree_structure({"p": [0, AuxNode(1, np.zeros(2))]})
    (w,) = record
    text = str(w.message)
    assert "AuxNode node at key path ['p'][1]" in text
    assert "holds a numpy.ndarray" in text
    assert "move the array into the node's children" in text
    assert w.filename == __file__  # attributed to the caller of the flatten


def test_jax_array_warns():
    with pytest.warns(fastree.AuxDataWarning, match=r"ArrayImpl"):
        tu.tree_flatten(AuxNode(1, ("tag", jnp.ones(2))))


def test_tracer_warns_inside_jit():
    @jax.jit
    def f(x):
        return tu.tree_map(lambda v: v, {"n": AuxNode(x, x)})["n"].child

    with pytest.warns(fastree.AuxDataWarning, match=r"Tracer.*escapes its trace"):
        f(1.0)


def test_partial_warns_and_a_bad_eq_is_left_to_the_audit():
    with pytest.warns(fastree.AuxDataWarning, match=r"Partial is a pytree"):
        tu.tree_structure(AuxNode(1, tu.Partial(max, 1)))
    # The flatten-time checks call no user code (no ==): a broken == is the audit's to find.
    assert _recorded(lambda: tu.tree_structure(AuxNode(1, WeirdEq()))) == []
    report = fastree.audit(AuxNode(1, WeirdEq()))
    assert any(p.startswith("eq: ") for e in report.entries for p in e.problems)


def test_dataclass_meta_field_located():
    with pytest.warns(fastree.AuxDataWarning, match=re.escape("Layer node at key path ['x']")):
        tu.tree_flatten_with_path({"x": Layer(1.0, meta=np.arange(3))})


def test_warned_once_per_type_and_problem():
    tree = AuxNode(1, np.zeros(2))
    assert len(_recorded(lambda: tu.tree_structure(tree))) == 1
    assert _recorded(lambda: tu.tree_flatten(tree)) == []
    assert _recorded(lambda: tu.tree_structure(AuxNode(2, np.ones(3)))) == []
    # another problem kind on the same type, and the same kind on another type, warn again
    assert len(_recorded(lambda: tu.tree_structure(AuxNode(1, tu.Partial(max, 1))))) == 1
    assert len(_recorded(lambda: tu.tree_structure(OtherNode(1, np.zeros(2))))) == 1


def test_tree_leaves_builds_no_treedef_and_does_not_check():
    assert _recorded(lambda: tu.tree_leaves(AuxNode(1, np.zeros(2)))) == []


@pytest.mark.parametrize(
    "aux",
    [
        None,
        "s",
        ("a", 1, 2.5, None),
        Color.RED,
        max,
        functools.partial(max, 1),
        Frozen("f", (1,)),
        np.float32(1.0),
        int,
        b"x",
        1 + 2j,
        frozenset({1, "a"}),
        [1, 2],
        {"k": (1, 2)},
        {3, 4},
    ],
    ids=stable_id,
)
def test_well_formed_aux_is_silent(aux):
    # No warning of any kind, and each call's answer is JAX's own (as in a session where the
    # checks did not exist).
    tree = {"a": AuxNode(1, aux), "b": Layer(2.0, meta=aux)}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        leaves, treedef = tu.tree_flatten(tree)
        structure = tu.tree_structure(tree)
        with_path, path_treedef = tu.tree_flatten_with_path(tree)
        mapped = tu.tree_map(lambda x: x, tree)
    assert [str(w.message) for w in record] == []
    jax_leaves, jax_treedef = jtu.tree_flatten(tree)
    assert leaves == jax_leaves == [1, 2.0]
    assert treedef.to_jax() == structure.to_jax() == path_treedef.to_jax() == jax_treedef
    assert with_path == jtu.tree_flatten_with_path(tree)[0]
    assert mapped["a"].aux is aux and mapped["b"].meta is aux


def test_unhashable_aux_works_by_default_and_hashes():
    a = tu.tree_structure(AuxNode(1, {"k": [1, 2]}))
    b = tu.tree_structure(AuxNode(2, {"k": [1, 2]}))
    assert a == b and hash(a) == hash(b)
    assert a != tu.tree_structure(AuxNode(1, {"k": [1, 3]}))
    assert {a: 1}[b] == 1


# ------------------------------------------------------------------------------------------------
# strict mode


def test_strict_config_raises_every_time():
    fastree.config.strict_aux = True
    assert fastree._core.strict_aux()
    for _ in range(2):
        with pytest.raises(TypeError, match=re.escape("AuxNode node at key path ['q']")):
            tu.tree_structure({"q": AuxNode(1, np.zeros(2))})
    fastree.config.strict_aux = False
    assert not fastree._core.strict_aux()


@pytest.mark.parametrize("aux", [[1, 2], {"a": 1}, {1}, (1, [2]), NoHash()], ids=stable_id)
def test_strict_rejects_unhashable(aux):
    tu.tree_structure(AuxNode(1, aux))  # fine by default
    with fastree.strict_aux():
        with pytest.raises(TypeError, match=r"holds an unhashable .*strict mode requires"):
            tu.tree_structure({"u": AuxNode(1, aux)})
    tu.tree_structure(AuxNode(1, aux))  # the verdicts of strict mode do not outlive it


def test_strict_context_manager_nests_and_restores_on_exception():
    with pytest.raises(RuntimeError):
        with fastree.strict_aux():
            assert fastree.config.strict_aux
            with fastree.strict_aux(False):
                assert not fastree.config.strict_aux
                tu.tree_structure(AuxNode(1, [1]))
            assert fastree.config.strict_aux
            raise RuntimeError("boom")
    assert not fastree.config.strict_aux


def test_strict_env_var_in_subprocess():
    code = (
        "import numpy as np, fastree, fastree.tree_util as tu\n"
        "class N:\n    pass\n"
        "tu.register_pytree_node(N, lambda n: ((), np.zeros(1)), lambda a, c: N())\n"
        "print(fastree.config.strict_aux)\n"
        "try:\n    tu.tree_structure([N()])\nexcept TypeError as e:\n    print('raised', e)\n"
    )
    env = dict(os.environ, FASTREE_STRICT_AUX="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "True" in out and "raised aux_data of the __main__.N node at key path [0]" in out


# ------------------------------------------------------------------------------------------------
# audit


def test_audit_report():
    tree = {
        "a": AuxNode(1, ("ok", 2)),
        "b": [AuxNode(2, np.zeros(2)), Layer(3.0, meta=0.1)],
        "c": AuxNode(3, [1, {"x": float("nan")}]),
        "d": (1, 2),
    }
    report = fastree.audit(tree)
    assert [tu.keystr(e.path) for e in report] == ["['a']", "['b'][0]", "['b'][1]", "['c']"]
    assert [e.node_type for e in report] == [AuxNode, AuxNode, Layer, AuxNode]
    a, b0, b1, c = report.entries
    assert a.problems == () and a.aux_repr == "('ok', 2)"
    assert b0.problems[0].startswith("array: numpy.ndarray")
    assert b1.problems == ("float: 0.1 changes the jit cache key whenever the value changes",)
    assert any(p.startswith("mutable container: list") for p in c.problems)
    assert any(p.startswith("mutable container: dict") for p in c.problems)
    assert any("NaN never equals" in p for p in c.problems)
    assert any(p.startswith("unhashable") for p in c.problems)
    assert not report.ok and len(report.problems) == 3
    text = str(report)
    assert text.splitlines()[0] == "aux_data audit: 4 custom node(s), 3 with problems"
    assert "  ['a']: " in text and "('ok', 2): ok" in text


def test_audit_is_silent_and_flags_identity_objects():
    class Opaque:
        pass

    report = fastree.audit([AuxNode(1, np.zeros(2)), AuxNode(1, Opaque()), AuxNode(1, Color.RED)])
    assert report.entries[1].problems[0].startswith("identity:")
    assert report.entries[2].problems == ()
    assert fastree.audit({"x": [1, (2,)]}).entries == ()


# ------------------------------------------------------------------------------------------------
# the docstrings' examples run


@pytest.mark.parametrize(
    "module",
    ["diagnostics.aux", "diagnostics.audit", "diagnostics.diff", "_serialize"],
)
def test_docstring_examples(module):
    mod = importlib.import_module(f"fastree.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
