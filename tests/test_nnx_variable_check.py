"""The core's tree-mode Variable check and walk (``csrc/nnx/nnx_tree_variables.cpp``), which the
served ``check_no_aliases`` uses (``integrations/_flax_nnx_alias_check.py``), checked against
flax's own functions in this process (fastree is not installed here: ``extract`` is flax's).

- ``nnx_variable_check`` answers as ``isinstance(x, nnx.Variable)`` does, and reads a lying
  ``__class__`` no more often than flax's metaclass does;
- ``nnx_variables_by_path`` gives flax's dict (the same paths, in order, each the same object),
  None for an alias, the error of a failing ``__class__``, and leaves every reference count as it
  was.
"""

from __future__ import annotations

import gc
import sys

import pytest

pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from flax.nnx import extract, variablelib  # noqa: E402

from fastree import _core  # noqa: E402
from fastree.jax_interop import compat  # noqa: E402


def _check():
    return _core.nnx_variable_check(
        variablelib.Variable, compat.Tracer, getattr(variablelib, "HijaxVariable", None))


class _Claims:
    """An object whose ``__class__`` property says it is ``claim`` and counts its reads."""

    reads = 0

    def __init__(self, claim):
        self._claim = claim

    @property
    def __class__(self):  # noqa: PLE0241 (isinstance reads it)
        type(self).reads += 1
        return self._claim


class _BrokenClass:
    """An object whose ``__class__`` read raises a new ``error(*args)``: the object holds no
    exception, whose traceback would hold the frames that hold the object."""

    def __init__(self, error, *args):
        self._error, self._args = error, args

    @property
    def __class__(self):
        raise self._error(*self._args)


class _MyVariable(nnx.Variable):
    pass


class _Model(nnx.Module):
    def __init__(self):
        self.linear = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
        self.count = nnx.BatchStat(jnp.zeros(()))
        self.layers = nnx.List([nnx.Linear(3, 3, rngs=nnx.Rngs(1)) for _ in range(2)])


def _corpus():
    model = _Model()
    return [
        nnx.Param(jnp.ones(2)), nnx.BatchStat(1.0), nnx.Cache(jnp.zeros(3)), _MyVariable(2),
        jnp.ones(2), 1, "text", None, (), {"a": 1}, model, model.layers, nnx.Param,
        _Claims(nnx.Param), _Claims(int), _Claims(_MyVariable), _BrokenClass(AttributeError, "x"),
    ]


@pytest.mark.parametrize("index", range(len(_corpus())))
def test_check_answers_as_flax_isinstance(index):
    x = _corpus()[index]
    assert _check()(x) is isinstance(x, nnx.Variable)


def test_a_lying_class_is_read_no_more_than_flax_reads_it():
    for claim in (nnx.Param, int, _MyVariable):
        x = _Claims(claim)
        _Claims.reads = 0
        flax_answer = isinstance(x, nnx.Variable)
        flax_reads = _Claims.reads
        _Claims.reads = 0
        assert _check()(x) is flax_answer
        assert 1 <= _Claims.reads <= flax_reads, (claim, _Claims.reads, flax_reads)


class _Spy:
    """Counts the attribute reads its own ``__getattribute__`` serves."""

    reads: list = []

    def __getattribute__(self, name):
        type(self).reads.append(name)
        return object.__getattribute__(self, name)


class _SpyWithFallback:
    """A ``__getattr__`` of its own (not called for ``__class__``, which is never missing)."""

    def __getattr__(self, name):
        raise AssertionError(f"__getattr__({name!r})")


def test_a_class_read_through_user_code_is_made_as_flax_makes_it():
    # Where reading __class__ goes through a class's own __getattribute__, the check reads it
    # (as flax's isinstance does); with object's own, nothing of the class's runs either way.
    _Spy.reads = []
    flax_answer = isinstance(_Spy(), nnx.Variable)
    flax_reads = _Spy.reads.count("__class__")
    _Spy.reads = []
    assert _check()(_Spy()) is flax_answer is False
    assert 1 <= _Spy.reads.count("__class__") <= flax_reads
    assert _check()(_SpyWithFallback()) is isinstance(_SpyWithFallback(), nnx.Variable) is False


def test_check_passes_on_a_failing_class_read():
    with pytest.raises(RuntimeError, match="class read failed"):
        isinstance(_BrokenClass(RuntimeError, "class read failed"), nnx.Variable)
    with pytest.raises(RuntimeError, match="class read failed"):
        _check()(_BrokenClass(RuntimeError, "class read failed"))
    with pytest.raises(KeyboardInterrupt):
        _check()(_BrokenClass(KeyboardInterrupt))


def test_check_answers_as_flax_for_a_tracer():
    seen = {}

    @jax.jit
    def f(x):
        seen["ours"], seen["flax"] = _check()(x), isinstance(x, nnx.Variable)
        return x

    f(jnp.ones(2))
    assert seen["ours"] is seen["flax"] is False


def test_check_refuses_what_is_not_a_class():
    with pytest.raises(TypeError, match="expected a class, got 1"):
        _core.nnx_variable_check(1, compat.Tracer, None)
    with pytest.raises(TypeError, match="expected a class or None, got 'x'"):
        _core.nnx_variable_check(nnx.Variable, compat.Tracer, "x")


def _flax_dict(**kwargs):
    return extract.check_no_aliases("jit", **kwargs)


def _ours(**kwargs):
    return _core.nnx_variables_by_path(_check(), extract.labeled(**kwargs))


# The walk reproduces flax's check as 0.12.8 and later write it (extract.labeled).
_needs_labeled = pytest.mark.skipif(not hasattr(extract, "labeled"),
                                    reason="this flax's check_no_aliases is older code")


def _same(a, b):
    return list(a) == list(b) and all(a[path] is b[path] for path in a)


@_needs_labeled
def test_walk_gives_flax_dict():
    model = _Model()
    param = nnx.Param(jnp.ones(2))
    cases = [
        {"args": (model, jnp.ones(2)), "kwargs": {}},
        {"args": (1, "two", None), "kwargs": {"m": model, "x": 3.0}},
        {"args": ([param, {"b": nnx.BatchStat(1.0)}],)},
        {"args": (), "kwargs": {}},
        {"args": (_Claims(nnx.Param), param)},
    ]
    for kwargs in cases:
        ours, flax = _ours(**kwargs), _flax_dict(**kwargs)
        assert type(ours) is dict and _same(ours, flax), kwargs


@_needs_labeled
def test_walk_says_none_for_an_alias_and_flax_raises():
    model = _Model()
    for kwargs in ({"args": (model, model.linear)}, {"args": (model.count, [model.count])}):
        assert _ours(**kwargs) is None
        with pytest.raises(ValueError, match="Duplicate"):
            _flax_dict(**kwargs)


@_needs_labeled
def test_walk_leaves_reference_counts_as_they_were():
    model = _Model()
    param = nnx.Param(jnp.ones(2))
    objects = [model, model.linear, model.count, param]
    before = [sys.getrefcount(o) for o in objects]
    for _ in range(3):
        result = _ours(args=(model, param))
        del result
        assert _ours(args=(model, model.count)) is None
        with pytest.raises(RuntimeError):
            _ours(args=(model, _BrokenClass(RuntimeError, "no")))
    assert [sys.getrefcount(o) for o in objects] == before


def test_walk_refuses_another_predicate():
    with pytest.raises(TypeError, match="expected fastree's Variable check"):
        _core.nnx_variables_by_path(lambda x: False, ())
    with pytest.raises(TypeError, match="missing required argument 'tree'"):
        _core.nnx_variables_by_path(_check())
