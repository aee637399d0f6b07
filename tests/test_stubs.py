"""python/fastree/_core.pyi against the runtime, both ways.

The stub is hand-written: whoever adds a function to the core, or a Python method to
``PyTreeDef`` (``fastree._treedef_methods``), must declare it there. So:

* every function, method and property the stub declares exists at runtime, of the same sort
  (property, static method, method), with the stub's parameters (names, kinds, defaults) where
  the runtime states them: ``inspect.signature`` (the C functions' text signatures, Python
  functions) or, for pybind11 functions, the signature line of their docstring. Overloads: one
  of them matches;
* every attribute the runtime has on the module, on ``PyTreeDef`` and on the module state
  object's type is declared (dunders aside).
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import types
from typing import Any

import fastree
import pytest
from fastree import _core, _treedef_methods

STUB = pathlib.Path(fastree.__file__).with_name("_core.pyi")
Parameter = inspect.Parameter


def _decorators(fn: ast.FunctionDef) -> set[str]:
    return {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}


def _default(node: ast.expr | None) -> Any:
    if node is None:
        return Parameter.empty
    return ast.literal_eval(node)


def _signature(fn: ast.FunctionDef) -> inspect.Signature:
    """The stub's signature of ``fn`` (annotations left out: they are the stub's own)."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [
        Parameter(
            a.arg,
            Parameter.POSITIONAL_ONLY
            if n < len(args.posonlyargs)
            else Parameter.POSITIONAL_OR_KEYWORD,
            default=_default(d),
        )
        for n, (a, d) in enumerate(zip(positional, defaults))
    ]
    if args.vararg:
        params.append(Parameter(args.vararg.arg, Parameter.VAR_POSITIONAL))
    params += [
        Parameter(a.arg, Parameter.KEYWORD_ONLY, default=_default(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults)
    ]
    if args.kwarg:
        params.append(Parameter(args.kwarg.arg, Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def _runtime_signature(obj: Any) -> inspect.Signature | None:
    """What the runtime states about ``obj``'s parameters, or None if it states nothing."""
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        pass
    # pybind11 writes "name(a: T, b: T = default) -> R" as the docstring's first line.
    first = (getattr(obj, "__doc__", None) or "").split("\n", 1)[0]
    head, _, _ = first.partition(" -> ")
    try:
        (fn,) = ast.parse(f"def {head}: ...").body
    except SyntaxError:
        return None
    return _signature(fn) if isinstance(fn, ast.FunctionDef) else None


def _shape(sig: inspect.Signature, drop_first: bool) -> list[tuple[str, Any, Any]]:
    params = list(sig.parameters.values())[1 if drop_first else 0 :]
    return [(p.name, p.kind, p.default) for p in params]


class Stub:
    """The declarations of _core.pyi: module functions, classes and annotated attributes."""

    def __init__(self, source: str) -> None:
        module = ast.parse(source)
        self.functions: dict[str, list[ast.FunctionDef]] = {}
        self.classes: dict[str, dict[str, list[ast.FunctionDef]]] = {}
        self.attributes: set[str] = set()
        for node in module.body:
            if isinstance(node, ast.FunctionDef):
                self.functions.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.ClassDef):
                members: dict[str, list[ast.FunctionDef]] = {}
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        members.setdefault(item.name, []).append(item)
                self.classes[node.name] = members
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                self.attributes.add(node.target.id)


STUB_DECLARED = Stub(STUB.read_text())
# The runtime class behind each stub class (ModuleState is only the type of `_module_state`).
RUNTIME_CLASSES = {
    "PyTreeDef": _core.PyTreeDef,
    "ModuleState": type(_core._module_state),
    "AttrNode": _core.AttrNode,
}


def _check_against(runtime: Any, declared: list[ast.FunctionDef], drop_first: bool) -> None:
    got = _runtime_signature(runtime)
    if got is None:
        return  # the runtime states nothing to compare with
    shapes = [_shape(_signature(fn), drop_first) for fn in declared]
    assert _shape(got, drop_first) in shapes, (got, shapes)


@pytest.mark.parametrize("name", sorted(STUB_DECLARED.functions))
def test_declared_function_exists_with_its_signature(name):
    runtime = getattr(_core, name, None)
    assert callable(runtime) and not isinstance(runtime, type), name
    _check_against(runtime, STUB_DECLARED.functions[name], drop_first=False)


MEMBERS = [
    (cls, name)
    for cls, members in sorted(STUB_DECLARED.classes.items())
    for name in sorted(members)
]


@pytest.mark.parametrize(("cls", "name"), MEMBERS, ids=[f"{c}.{n}" for c, n in MEMBERS])
def test_declared_member_exists_with_its_sort_and_signature(cls, name):
    owner = RUNTIME_CLASSES[cls]
    declared = STUB_DECLARED.classes[cls][name]
    assert hasattr(owner, name), f"{cls}.{name}"
    if name.startswith("__") and name.endswith("__"):
        return  # the slots' parameter names are CPython's
    static = inspect.getattr_static(owner, name)
    decorators = set().union(*map(_decorators, declared))
    if "property" in decorators:
        assert inspect.isdatadescriptor(static), f"{cls}.{name} is not a property"
        return
    if "staticmethod" in decorators:
        assert isinstance(static, (staticmethod, types.BuiltinFunctionType)), f"{cls}.{name}"
        _check_against(getattr(owner, name), declared, drop_first=False)
        return
    assert callable(static) and not isinstance(static, (staticmethod, classmethod))
    _check_against(static, declared, drop_first=True)


def _undeclared(runtime_names: set[str], declared: set[str]) -> set[str]:
    return {n for n in runtime_names - declared if not (n.startswith("__") and n.endswith("__"))}


def test_every_module_attribute_is_declared():
    declared = set(STUB_DECLARED.functions) | set(STUB_DECLARED.classes) | STUB_DECLARED.attributes
    assert _undeclared(set(vars(_core)), declared) == set()


@pytest.mark.parametrize("cls", sorted(RUNTIME_CLASSES))
def test_every_class_attribute_is_declared(cls):
    runtime_names = {n for n in dir(RUNTIME_CLASSES[cls]) if not hasattr(object, n)}
    assert _undeclared(runtime_names, set(STUB_DECLARED.classes[cls])) == set()


def test_python_methods_are_attached_in_one_place_and_declared():
    for name, method in _treedef_methods.METHODS.items():
        assert inspect.getattr_static(_core.PyTreeDef, name) is method
        assert name in STUB_DECLARED.classes["PyTreeDef"]


def test_the_comparison_sees_a_mismatch():
    (fn,) = ast.parse("def f(self, tree, /): ...").body
    with pytest.raises(AssertionError):
        _check_against(_core.PyTreeDef.flatten_up_to, [fn], drop_first=True)  # takes a keyword
    (fn,) = ast.parse("def register_node(type, flatten, unflatten): ...").body
    with pytest.raises(AssertionError):
        _check_against(_core.register_node, [fn], drop_first=False)  # a pybind11 docstring
