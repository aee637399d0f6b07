"""Checks of custom nodes' aux_data: the static part of a treedef, hence of every jit cache key.

JAX puts aux_data into the treedef without looking at it. An array there is compared by value
each time two treedefs are compared (``ValueError: truth value of an array is ambiguous``) and
baked into compiled code as a constant; a tracer there leaks out of its trace; an object whose
``==`` does not return a bool makes treedef comparison fail. fastree checks every aux_data it
puts into a treedef (``tree_flatten``, ``tree_structure``, ``tree_map``, ... but not
``tree_leaves``, which builds no treedef) and warns, or raises in strict mode, as
``fastree.config.aux_checks`` says (``_config.py``: by default it warns for fastree's own API
and checks nothing while fastree is installed into JAX).

The verdict on a value type comes from the type alone (:func:`_problem_of_type`): the checks
run inside the walk, where JAX runs nothing but the tree's own functions, so they call no user
code (no ``==``, no ``hash``, no attribute hook) that could change the walk. Only
``fastree.audit``, which the user calls, probes ``==``.

Split of the work (the contract is in ``csrc/diagnostics/aux_check.h``):

* the core walks aux_data made of atoms (None, bool, numbers, str, bytes, classes) and the
  built-in containers in C, with no Python call;
* any other value type is shown once to :func:`_classify` here; its verdict is cached by type;
* only aux_data holding a rejected type (or, in strict mode, a list/dict/set) reaches
  :func:`_report`, which finds the node's key path, and warns once per (node type, problem) or,
  in strict mode, raises ``TypeError`` every time.

The key path: the core calls ``_report(node_type, aux, tree)`` with the whole tree only, so the
reporter finds the node with one walk of ``tree`` (``_walk.Walk``: linear, each object once,
cycle-safe), stopping at the first node of that type whose aux_data has the reported problem.
That walk cannot honour an ``is_leaf`` the core does not pass; it never fails on what is_leaf
would have stopped (a cycle, a subtree too deep to flatten, a flatten function that raises),
but in that case it may name the path of an equal problem inside the stopped subtree, or an
unknown path. ``_report`` also accepts ``is_leaf`` and ``key_path``: a core that passes the key
path it is building (or, without one, its ``is_leaf``) makes the walk unnecessary (or exact).

Strict mode is a setting (``fastree.config.strict_aux``, ``_config.py``); the values inside an
aux_data are walked by ``_values.ValueWalk``.

>>> _find_problems(('ok', [1, 2]), strict=True)
[('unhashable', [1, 2])]
>>> _find_problems(('ok', [1, 2]), strict=False)
[]
"""

from __future__ import annotations

import enum
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _core
from .._values import ATOM, ENTER, ValueWalk
from .._walk import Walk, hooks_muted_now
from ..jax_interop import compat as _jax_compat
from ..jax_interop.compat import tree_util as _jtu


class AuxDataWarning(UserWarning):
    """A custom node's aux_data holds a value that does not belong in static metadata."""


# Problem kinds, with the explanation and the fix shown in warnings and errors.
_ADVICE: dict[str, tuple[str, str]] = {
    "array": (
        "an array there is compared by value whenever treedefs are compared and is baked into "
        "compiled code as a constant",
        "move the array into the node's children (return it from the flatten function), or "
        "turn a true constant into a hashable value (a tuple or a Python scalar)",
    ),
    "tracer": (
        "a traced value there escapes its trace",
        "return the value as one of the node's children instead of in aux_data",
    ),
    "partial": (
        "jax.tree_util.Partial is a pytree whose arguments are leaves, and it compares by identity",
        "return it as one of the node's children, or use functools.partial for a static callable",
    ),
    "eq": (
        "its == does not return a bool, so comparing treedefs fails or is meaningless",
        "use a hashable value whose == returns a bool, or wrap it in a class registered with "
        "fastree.tree_util.register_static that defines __eq__ and __hash__",
    ),
    "unhashable": (
        "strict mode requires hashable aux_data",
        "use a hashable value: a tuple instead of a list, a frozenset instead of a set, a tuple "
        "of (key, value) pairs instead of a dict",
    ),
}


def _type_name(tp: type) -> str:
    module = getattr(tp, "__module__", None)
    qualname = getattr(tp, "__qualname__", repr(tp))
    return qualname if module in (None, "builtins") else f"{module}.{qualname}"


# ------------------------------------------------------------------------------------------------
# classification of value types (once per type)

_verdicts: dict[type, str | None] = {}  # type -> problem kind, or None for plain static data


_ABSENT = object()


def _type_lookup(tp: type, name: str) -> Any:
    """``name`` as the class ``tp`` defines it (itself or the first base that does), read from
    the class dicts: unlike ``getattr``, no metaclass ``__getattr__`` or descriptor runs."""
    for base in type.__dict__["__mro__"].__get__(tp):
        namespace = type.__dict__["__dict__"].__get__(base)
        if name in namespace:
            return namespace[name]
    return _ABSENT


def _type_defines(tp: type, name: str) -> bool:
    return _type_lookup(tp, name) is not _ABSENT


def _problem_of_type(tp: type, example: Any, probe: bool = False) -> str | None:
    """The problem kind of values of type ``tp``, or None.

    The flatten-time checks judge by the type alone: they run while JAX would run nothing but
    the tree's own flatten functions, so no user code (an ``__eq__``, a ``__hash__``, an
    attribute hook) may run there, or a side effect of it could change the walk. ``probe=True``
    (the audit, which the user calls) also calls ``example == example`` to find an ``==`` that
    does not return a bool.
    """
    if issubclass(tp, _jax_compat.Tracer):
        return "tracer"
    if issubclass(tp, np.generic):  # numpy scalars hash and compare like Python numbers
        return None
    if issubclass(tp, (np.ndarray, _jax_compat.Array)):
        return "array"
    if _type_defines(tp, "__array__") or _type_defines(tp, "__jax_array__"):  # torch, ...
        return "array"
    if issubclass(tp, _jtu.Partial):
        return "partial"
    if issubclass(tp, (enum.Enum, types.FunctionType, types.BuiltinFunctionType)):
        return None
    if probe:
        try:
            equal = example == example
        except Exception:
            return "eq"
        if type(equal) not in (bool, np.bool_):
            return "eq"
    # A class that defines __eq__ without __hash__ gets __hash__ = None: unhashable, read from
    # the type without calling anything.
    if _core.strict_aux() and _type_lookup(tp, "__hash__") is None:
        return "unhashable"
    return None


def _problem_of(value: Any) -> str | None:
    tp = type(value)
    try:
        return _verdicts[tp]
    except KeyError:
        pass
    problem = _problem_of_type(tp, value)
    if len(_verdicts) > 1024:
        _verdicts.clear()
    _verdicts[tp] = problem
    return problem


def _classify(tp: type, example: Any) -> bool:
    """The core's classifier: True if instances of ``tp`` are plain static data."""
    return _problem_of(example) is None


# ------------------------------------------------------------------------------------------------
# finding the offending values inside one aux_data

_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_MUTABLE = (list, dict, set)
_SCAN_LIMIT = 100_000  # distinct values looked at per aux_data: never hang on a huge one


_CONTAINERS = (tuple, list, set, frozenset, dict)


def is_container(value: Any, depth: int = 0) -> bool:
    """Whether the aux_data checks look into ``value`` (the built-in containers)."""
    return type(value) in _CONTAINERS


def items(container: Any) -> list[Any]:
    """A container's items in reading order; a dict's keys and values alternate."""
    if type(container) is dict:
        return [x for item in container.items() for x in item]
    return list(container)


def _find_problems(aux: Any, strict: bool) -> list[tuple[str, Any]]:
    """(kind, offending value) for each distinct problem kind found in ``aux``, walk order.

    Each distinct container is looked into once (``_values.ValueWalk``), so shared sub-values
    cost nothing more and a container that holds itself ends the walk.
    """
    found: dict[str, Any] = {}
    walk = ValueWalk(is_container, items, max_containers=_SCAN_LIMIT)
    for event, value, _, _ in walk.events(aux):
        if event == ENTER:
            if strict and type(value) in _MUTABLE:
                found.setdefault("unhashable", value)
        elif event == ATOM and not (type(value) in _ATOMS or isinstance(value, type)):
            problem = _problem_of(value)
            if problem is not None:
                found.setdefault(problem, value)
    if strict and "unhashable" not in found and not _hashable(aux):
        found["unhashable"] = aux
    return list(found.items())


def _is_tuple(value: Any, depth: int) -> bool:
    return type(value) is tuple


def _hashable(aux: Any) -> bool:
    """Whether ``hash(aux)`` succeeds, without computing it.

    A tuple does not cache its hash: hashing one whose items share sub-tuples hashes every
    path through them (2**40 for 40 levels of pairs). Each distinct tuple is checked once here
    instead. A frozenset's elements were hashed when it was built; anything else is hashed.
    """
    for event, value, _, _ in ValueWalk(_is_tuple, list).events(aux):
        if event != ATOM:
            continue
        tp = type(value)
        if tp in _ATOMS or tp is frozenset or isinstance(value, type):
            continue
        try:
            hash(value)
        except Exception:  # noqa: BLE001 - whatever hash raises, the aux_data does not hash
            return False
    return True


# ------------------------------------------------------------------------------------------------
# locating a node in the tree being flattened (error path only)


def _same_aux(candidate: Any, aux: Any) -> bool:
    # Identity, never ==: the aux may hold arrays. register_dataclass nodes report a fresh
    # tuple of their meta values each time, so compare those element by element.
    if candidate is aux:
        return True
    return (
        type(candidate) is tuple
        and type(aux) is tuple
        and len(candidate) == len(aux)
        and all(a is b for a, b in zip(candidate, aux))
    )


def _locate(
    tree: Any,
    node_type: type,
    aux: Any,
    kind: str,
    strict: bool,
    is_leaf: Callable[[Any], Any] | None = None,
) -> tuple[Any, ...] | None:
    """The key path of the node being reported: the first node of type ``node_type`` (in
    flatten order) whose aux_data is ``aux`` or has the problem ``kind``; None if none is found.

    Why the first with the problem, not only the one holding this very ``aux`` object: a
    flatten function may build its aux_data anew on each call (``np.zeros(1)``), so the walk's
    own call returns another object. Flatten warns for the first node with an unwarned
    problem and raises (strict) at the first node with any, so with deterministic flatten
    functions the first node with the problem is the one flatten is at. The walk stops there:
    is_leaf aside, it covers no more of the tree than flatten already did.
    """
    walk = Walk(tree, is_leaf, strict=False)
    for occurrence in walk:
        if occurrence.node is None or type(occurrence.obj) is not node_type:
            continue
        node_aux = occurrence.node[1]
        if _same_aux(node_aux, aux) or any(k == kind for k, _ in _find_problems(node_aux, strict)):
            return walk.path(occurrence.index)
    return None


def _message(node_type: type, path: tuple[Any, ...] | None, kind: str, value: Any) -> str:
    where = "an unknown key path" if path is None else f"key path {_jtu.keystr(path) or '()'}"
    why, fix = _ADVICE[kind]
    what = f"a {_type_name(type(value))}"
    if kind == "unhashable":
        what = f"an unhashable {_type_name(type(value))}"
    return (
        f"aux_data of the {_type_name(node_type)} node at {where} holds {what}. aux_data is "
        f"static (part of the treedef and of every jit cache key); {why}. Fix: {fix}."
    )


_warned: set[tuple[type, str]] = set()
_warned_lock = threading.Lock()  # never held while a warning is issued (a filter runs code)

_UNKNOWN = object()  # no key path given


def _report(
    node_type: type,
    aux: Any,
    tree: Any,
    is_leaf: Callable[[Any], Any] | None = None,
    key_path: Any = _UNKNOWN,
) -> None:
    """The core's reporter: warns once per (node type, problem), or raises in strict mode.

    ``tree`` is the whole tree being flattened. ``key_path`` (the node's key path, if the
    caller has it) spares the walk that finds it; ``is_leaf`` (the flatten's) makes that walk
    stop where flatten stopped.
    """
    if hooks_muted_now():  # a helper walker's own one-level flatten: not the user's call
        return
    strict = _core.strict_aux()
    problems = _find_problems(aux, strict)
    if not strict:
        problems = [(k, v) for k, v in problems if (node_type, k) not in _warned]
    if not problems:
        return
    kind, value = problems[0]
    path = key_path
    if path is _UNKNOWN:
        path = _locate(tree, node_type, aux, kind, strict, is_leaf)
    if strict:
        raise TypeError(_message(node_type, path, kind, value))
    with _warned_lock:  # check-then-add: two threads must not both warn (free-threaded builds)
        problems = [(k, v) for k, v in problems if (node_type, k) not in _warned]
        _warned.update((node_type, k) for k, _ in problems)
    for kind, value in problems:
        # stacklevel=2: the core calls this with no Python frame of its own in between.
        warnings.warn(_message(node_type, path, kind, value), AuxDataWarning, stacklevel=2)


def _reset_warnings() -> None:
    """Forgets which (node type, problem) pairs have been warned about (for tests)."""
    _warned.clear()


# ------------------------------------------------------------------------------------------------
# installation (by _config, at import and whenever strict mode changes)


def _install() -> None:
    # Re-installing also empties the core's verdict cache: strict mode changes the verdicts.
    _verdicts.clear()
    _core.set_aux_hooks(_classify, _report)
