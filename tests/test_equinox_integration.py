"""equinox Modules read natively by fastree give the same trees as equinox's own functions.

What this file pins: with fastree installed into JAX before equinox defines its Module classes
(``fastree.install()`` before ``import equinox``), each class is registered, with JAX and fastree,
as a native attribute node (``fastree.integrations.equinox``), and everything observable stays as
in a process where fastree was never installed: the leaves (the very objects, shared ones too),
``str`` of the treedefs, key paths, the objects ``tree_unflatten`` and ``tree_map`` rebuild (their
``__dict__`` names in order and values), equinox's ``partition``/``combine``/``tree_at``/
``tree_flatten_one_level``/``filter_jit`` on them, and what a Module sees when it flattens itself
half-way through its own ``__init__``. That holds for JAX's own functions (which are handed the
node's C functions), for the ``jax.tree_util`` functions install routes to fastree and for
``fastree.tree_util``; and every class the integration took stays native (its status is never
``library: ...``) unless equinox's functions really read an instance differently (a field kept in
a ``__slots__`` slot of a base class, which equinox never sees): then the class falls back to
equinox's functions and the results are still equinox's. A node whose checker is handed other
library functions (``fastree.integrations._checked.attach``) answers with those from the first
difference on. ``fastree.integrations.equinox.accelerate()`` makes classes equinox registered
before install native for fastree, with the same results.

Registration happens when a class is defined, so each side runs in its own child process
(installed, plain, or accelerated), built from one JSON spec of classes and instances: random ones
drawn by hypothesis in the parent (four batches, the same in every run; a failure is shrunk) and a
fixed set that names each case above. Each child writes a JSON summary; the parent compares the
summaries. A child is started once per mode per batch (the plain summary is kept for the next mode
on the same batch), and children run side by side, so the file stays under a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import skip_unless_integration_knows
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

skip_unless_integration_knows("equinox")

pytestmark = pytest.mark.third_party

# ------------------------------------------------------------------------------------------------
# the child: builds the spec's classes and instances and summarises what the tree functions see

CHILD = r'''
import dataclasses, functools, json, re, sys, types, typing, warnings

MODE, SPEC_PATH, OUT_PATH = sys.argv[1:4]
if MODE == "installed":
    import fastree
    fastree.install()  # before equinox: its classes register through fastree
import jax
import jax.numpy as jnp
import numpy as np
import equinox as eqx
from equinox._module._flatten import MISSING
import fastree
import fastree.tree_util as ftu
import fastree.integrations as integrations
import fastree.integrations.equinox as fastree_equinox
from fastree import _core

assert fastree.is_installed() == (MODE == "installed"), MODE

SPEC = json.load(open(SPEC_PATH))
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def norm(text):
    return ADDRESS.sub("0x_", text)


class Marker:
    """A deterministic leaf object, compared by name across processes and by identity within."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Marker({self.name!r})"


def f_plain(x):
    return x


def f_doc(x, y=1):
    """A docstring, copied onto wrappers."""
    return x


def f_annotated(x: int) -> int:
    return x


FUNCS = {"plain": f_plain, "doc": f_doc, "annotated": f_annotated}


def as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


CONVERTERS = {"tuple": tuple, "as_list": as_list}
T = typing.TypeVar("T")


def meth(self, *args):
    return args


# ---- views: the same questions asked of JAX's own functions, of jax.tree_util as it is now
# (routed to fastree when installed) and of fastree.tree_util

NAMES = [
    "tree_leaves", "tree_structure", "tree_flatten", "tree_unflatten", "tree_flatten_with_path",
    "tree_leaves_with_path", "tree_map", "tree_map_with_path", "tree_reduce", "keystr",
    "flatten_one_level", "all_leaves",
]
NAMES = [n for n in NAMES if hasattr(jax.tree_util, n) and hasattr(ftu, n)]
VIEWS = {
    "jax": types.SimpleNamespace(**{n: fastree.original("jax.tree_util." + n) for n in NAMES}),
    "jax.tree_util": types.SimpleNamespace(**{n: getattr(jax.tree_util, n) for n in NAMES}),
    "fastree": types.SimpleNamespace(**{n: getattr(ftu, n) for n in NAMES}),
}

SEEN_TYPES = {}  # qualified name -> Module class met while summarising


def type_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def rep(x, depth=0):
    """A JSON description of x: values by value, markers by name, Modules by their __dict__."""
    if depth > 40:
        return "..."
    if x is MISSING:
        return "MISSING"
    if x is None or isinstance(x, (bool, int, float, str)):
        return [type(x).__name__, repr(x)]
    if isinstance(x, jax.Array):
        return ["jax.Array", str(x.dtype), list(x.shape), np.asarray(x).tolist()]
    if isinstance(x, (np.ndarray, np.generic)):
        return [type(x).__name__, str(x.dtype), list(np.shape(x)), np.asarray(x).tolist()]
    if isinstance(x, Marker):
        return ["Marker", x.name]
    if isinstance(x, eqx.Module):
        SEEN_TYPES[type_name(type(x))] = type(x)
        return ["Module", type_name(type(x)), [[k, rep(v, depth + 1)] for k, v in vars(x).items()]]
    if type(x) in (list, tuple):
        return [type(x).__name__, [rep(v, depth + 1) for v in x]]
    if type(x) is dict:
        return ["dict", [[rep(k, depth + 1), rep(v, depth + 1)] for k, v in x.items()]]
    if isinstance(x, types.FunctionType):
        return ["function", x.__qualname__]
    if isinstance(x, type):
        return ["type", x.__qualname__]
    return ["other", type(x).__qualname__, norm(repr(x))]


def attempt(fn):
    try:
        return fn()
    except Exception as error:
        return ["error", type(error).__name__, norm(str(error))]


def bump(leaf):
    if isinstance(leaf, (jax.Array, np.ndarray)) or type(leaf) is int:
        return leaf + 1
    return leaf


def view_summary(tu, x):
    out = {}
    leaves = tu.tree_leaves(x)
    out["leaves"] = [rep(leaf) for leaf in leaves]
    out["sharing"] = [next(j for j, m in enumerate(leaves) if m is leaf) for leaf in leaves]
    treedef = tu.tree_structure(x)
    out["treedef"] = norm(str(treedef))
    out["sizes"] = [treedef.num_leaves, treedef.num_nodes]

    def flat():
        got, td = tu.tree_flatten(x)
        return [len(got) == len(leaves) and all(a is b for a, b in zip(got, leaves)),
                td == treedef]

    out["tree_flatten"] = attempt(flat)

    def with_path():
        pairs, td = tu.tree_flatten_with_path(x)
        return [[tu.keystr(p), leaf is m] for (p, leaf), m in zip(pairs, leaves)] + [td == treedef]

    out["tree_flatten_with_path"] = attempt(with_path)
    out["tree_leaves_with_path"] = attempt(
        lambda: [[tu.keystr(p), rep(leaf)] for p, leaf in tu.tree_leaves_with_path(x)])

    def rebuild():
        rebuilt = tu.tree_unflatten(treedef, leaves)
        again = tu.tree_leaves(rebuilt)
        return {
            "object": rep(rebuilt),
            "names": list(vars(rebuilt)) if hasattr(rebuilt, "__dict__") else None,
            "same_leaves": len(again) == len(leaves) and all(a is b for a, b in zip(again, leaves)),
            "same_structure": tu.tree_structure(rebuilt) == treedef,
        }

    out["tree_unflatten"] = attempt(rebuild)
    out["tree_map"] = attempt(lambda: rep(tu.tree_map(bump, x)))
    out["tree_map_identity"] = attempt(lambda: rep(tu.tree_map(lambda leaf: leaf, x)))
    if hasattr(tu, "tree_map_with_path"):
        out["tree_map_with_path"] = attempt(
            lambda: rep(tu.tree_map_with_path(lambda p, leaf: Marker(tu.keystr(p)), x)))
    out["tree_reduce"] = attempt(lambda: tu.tree_reduce(lambda n, _: n + 1, x, 0))
    if hasattr(tu, "flatten_one_level"):
        def one_level():
            children, aux = tu.flatten_one_level(x)
            return [rep(list(children)), norm(repr(aux))]

        out["flatten_one_level"] = attempt(one_level)
    if hasattr(tu, "all_leaves"):
        out["all_leaves"] = attempt(lambda: tu.all_leaves(leaves))
    return out


def describe(x):
    """What each view sees of x (each view's whole summary, or the error it raised)."""
    return {name: attempt(lambda: view_summary(tu, x)) for name, tu in VIEWS.items()}


def first_dynamic_field(module):
    for f in dataclasses.fields(module):
        if not f.metadata.get("static", False) and f.name in vars(module):
            return f.name
    return None


def equinox_summary(x):
    out = {}

    def part():
        params, static = eqx.partition(x, eqx.is_array)
        combined = eqx.combine(params, static)
        return [rep(params), rep(static), rep(combined), bool(eqx.tree_equal(combined, x))]

    out["partition_combine"] = attempt(part)
    out["tree_equal"] = attempt(lambda: bool(eqx.tree_equal(x, x)))
    out["filter"] = attempt(lambda: rep(eqx.filter(x, eqx.is_inexact_array)))

    def one_level():
        children, treedef = eqx.tree_flatten_one_level(x)
        return [rep(children), norm(str(treedef))]

    out["tree_flatten_one_level"] = attempt(one_level)
    if isinstance(x, eqx.Module):
        name = first_dynamic_field(x)
        if name is not None:
            out["tree_at"] = attempt(lambda: rep(
                eqx.tree_at(lambda m: getattr(m, name), x, Marker("replaced"))))
    out["filter_jit"] = attempt(lambda: rep(eqx.filter_jit(lambda t: t)(x)))
    return out


# ---- building the spec's classes and values

PROBES = []  # what Modules with a probing __init__ saw of themselves, for the current case


def make_init(order, probe_at):
    def __init__(self, **kwargs):
        for k, name in enumerate(order):
            if k == probe_at:
                PROBES.append(describe(self))
            if name in kwargs:
                setattr(self, name, kwargs[name])
        if probe_at >= len(order):
            PROBES.append(describe(self))

    return __init__


def make_class(spec, classes):
    bases = [classes[spec["parent"]] if spec.get("parent") is not None else eqx.Module]
    if spec.get("generic"):
        bases.append(typing.Generic[T])
    if spec.get("slotted"):
        bases.append(type("SlotBase", (), {"__slots__": tuple(spec["slotted"])}))

    def body(ns):
        annotations = {}
        for f in spec["fields"]:
            annotations[f["name"]] = typing.Any
            options = {}
            if f.get("static"):
                options["static"] = True
            if f.get("converter"):
                options["converter"] = CONVERTERS[f["converter"]]
            if "default" in f:
                options["default"] = build(f["default"], [])
            if options:
                ns[f["name"]] = eqx.field(**options)
        ns["__annotations__"] = annotations
        ns["__module__"] = "__main__"
        ns["__qualname__"] = spec["name"]
        if spec.get("parent") is None:
            ns["meth"] = meth
        if spec.get("init") == "custom":
            ns["__init__"] = make_init(spec["order"], spec["probe_at"])

    return types.new_class(spec["name"], tuple(bases), {}, body)


class Wrapper(eqx.Module):
    """A user's wrapper Module, as equinox.module_update_wrapper documents it."""

    fn: typing.Any

    def __call__(self, *args):
        return self.fn(*args)

    @property
    def __wrapped__(self):
        return self.fn


def build(v, pool, classes=None, specs=None):
    tag = v[0]
    if tag in ("int", "float", "str", "bool"):
        return v[1]
    if tag == "none":
        return None
    if tag == "array":
        return jnp.asarray(v[1], dtype=v[2])
    if tag == "numpy":
        return np.asarray(v[1], dtype=v[2])
    if tag == "marker":
        return Marker(v[1])
    sub = lambda w: build(w, pool, classes, specs)
    if tag == "list":
        return [sub(w) for w in v[1]]
    if tag == "tuple":
        return tuple(sub(w) for w in v[1])
    if tag == "dict":
        return {k: sub(w) for k, w in v[1]}
    if tag == "shared":
        return pool[v[1]]
    if tag == "module":
        cls = classes[v[1]]
        if specs[v[1]].get("generic"):
            cls = cls[int]
        return cls(**{k: sub(w) for k, w in v[2]})
    if tag == "hacked":  # an attribute that is no field, set behind equinox's back
        module = sub(v[1])
        object.__setattr__(module, v[2], Marker(v[2]))
        return module
    if tag == "method":
        return sub(v[1]).meth
    if tag == "partial":
        return eqx.Partial(FUNCS[v[1]], *[sub(w) for w in v[2]], **{k: sub(w) for k, w in v[3]})
    if tag == "lambda":
        return eqx.nn.Lambda(FUNCS[v[1]])
    if tag == "jit":
        return eqx.filter_jit(FUNCS[v[1]])
    if tag == "grad":
        return eqx.filter_grad(FUNCS[v[1]])
    if tag == "vmap":
        return eqx.filter_vmap(FUNCS[v[1]])
    if tag == "wrapper":
        return eqx.module_update_wrapper(Wrapper(FUNCS[v[1]]))
    raise ValueError(f"unknown value tag {tag!r}")


# Every class is defined first: in the accelerate mode, all of them before install.
CASE_CLASSES = []
for case in SPEC["cases"]:
    classes = []
    try:
        for spec in case["classes"]:
            classes.append(make_class(spec, classes))
    except Exception as error:
        CASE_CLASSES.append(["error", type(error).__name__, norm(str(error))])
    else:
        CASE_CLASSES.append(classes)

out = {"mode": MODE, "cases": []}
if MODE == "accelerate":
    fastree.install()
    changed = fastree_equinox.accelerate()
    out["accelerated"] = sorted(type_name(c) for c in changed)
    out["not_attribute_nodes"] = sorted(
        type_name(c) for classes in CASE_CLASSES if isinstance(classes, list)
        for c in classes if not isinstance(c, str) and _core.attribute_node(c) is None)

for case, classes in zip(SPEC["cases"], CASE_CLASSES):
    if classes and classes[0] == "error":
        out["cases"].append({"class_error": classes})
        continue
    PROBES.clear()
    summary = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pool = []
            for v in case["pool"]:
                pool.append(build(v, pool, classes, case["classes"]))
            roots = [build(v, pool, classes, case["classes"]) for v in case["roots"]]
        except Exception as error:
            summary["build_error"] = [type(error).__name__, norm(str(error))]
            roots = []
        summary["roots"] = [
            {"value": rep(x), "views": describe(x), "equinox": equinox_summary(x)} for x in roots
        ]
        for c in classes:
            SEEN_TYPES[type_name(c)] = c
    summary["probes"] = list(PROBES)
    summary["warnings"] = [[w.category.__name__, norm(str(w.message))] for w in caught]
    out["cases"].append(summary)

if MODE != "plain":
    # After every instance was flattened many times over: how fastree reads each class.
    out["status"] = {name: integrations.status(cls) for name, cls in sorted(SEEN_TYPES.items())}
json.dump(out, open(OUT_PATH, "w"))
'''


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("FASTREE_INSTALL", None)  # each child decides for itself whether fastree is installed
    return env


# Each spec's summaries by mode: the parametrized tests below draw the same batches, and the first
# of them starts every mode's child at once (side by side) for the others to find here.
_SUMMARIES: dict[str, dict[str, dict]] = {}
ALL_MODES = ("plain", "installed", "accelerate")


def run_children(tmp_path, cases: list, modes: tuple[str, ...] = ALL_MODES) -> dict[str, dict]:
    """Each mode's summary of the cases: the children not run before run side by side."""
    spec_text = json.dumps({"cases": cases}, sort_keys=True)
    results = _SUMMARIES.setdefault(spec_text, {})
    missing = [mode for mode in modes if mode not in results]
    if not missing:
        return results
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    spec = tmp_path / "spec.json"
    spec.write_text(spec_text)
    procs = {}
    for mode in missing:
        out = tmp_path / f"{mode}.json"
        procs[mode] = (
            out,
            subprocess.Popen(
                [sys.executable, str(script), mode, str(spec), str(out)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_child_env(),
                cwd=str(tmp_path),
            ),
        )
    for mode, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{mode} child failed:\n{stdout}\n{stderr[-6000:]}"
        results[mode] = json.loads(out.read_text())
    return results


# ------------------------------------------------------------------------------------------------
# comparing summaries


def first_difference(a, b, path="") -> str | None:
    """Where two JSON values first differ, with both sides (shortened), or None."""
    if type(a) is not type(b):
        return f"{path}: {_short(a)} != {_short(b)}"
    if isinstance(a, dict):
        for key in b:
            if key not in a:
                return f"{path}.{key}: only in the second: {_short(b[key])}"
        for key in a:
            if key not in b:
                return f"{path}.{key}: only in the first: {_short(a[key])}"
        for key in a:
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}: {_short(a)} != {_short(b)}"
        return None
    return None if a == b else f"{path}: {_short(a)} != {_short(b)}"


def _short(x) -> str:
    text = json.dumps(x)
    return text if len(text) < 600 else text[:600] + "..."


def assert_views_agree(summary: dict, cases: list) -> None:
    """Within one child: JAX, jax.tree_util as it is and fastree.tree_util see the same."""
    for i, case in enumerate(summary["cases"]):
        described = [root["views"] for root in case.get("roots", [])] + case.get("probes", [])
        for views in described:
            reference = views["jax"]
            for name, seen in views.items():
                diff = first_difference(reference, seen)
                assert diff is None, (
                    f"{summary['mode']} child, case {i}: {name} differs from JAX's own functions "
                    f"at {diff}\ncase: {json.dumps(cases[i])}"
                )


def assert_same_cases(expected: dict, got: dict, cases: list) -> None:
    """The cases of two children, case by case (the first difference shown with its case; "the
    first" is ``expected``)."""
    assert len(expected["cases"]) == len(got["cases"])
    for i, (a, b) in enumerate(zip(expected["cases"], got["cases"])):
        diff = first_difference(a, b)
        assert diff is None, (
            f"case {i}: {got['mode']} (second) differs from {expected['mode']} (first) at {diff}\n"
            f"case: {json.dumps(cases[i])}"
        )


def assert_native(
    summary: dict, cases: list, library: frozenset = frozenset(), own: frozenset = frozenset()
) -> None:
    """Every Module class is read natively, except those expected to fall back to equinox's
    (``library``) or never to be taken from it (``own``)."""
    status = summary["status"]
    defined = [f"__main__.{c['name']}" for case in cases for c in case["classes"]]
    for name in defined:
        assert name in status, f"{summary['mode']}: no status for {name}"
    for name, state in status.items():
        if name.split(".")[-1] in library:
            assert state.startswith("library: "), f"{summary['mode']}: {name} is {state!r}"
        elif name.split(".")[-1] in own:
            assert state == "not an attribute node", f"{summary['mode']}: {name} is {state!r}"
        else:
            assert state in ("native", "checking"), f"{summary['mode']}: {name} is {state!r}"


def check_batch(
    tmp_path,
    cases: list,
    mode: str,
    library: frozenset = frozenset(),
    modes=ALL_MODES,
    own: frozenset = frozenset(),
) -> dict:
    """Checks the cases' summary in ``mode`` against the plain one; returns the mode's summary."""
    results = run_children(tmp_path, cases, modes)
    plain, got = results["plain"], results[mode]
    assert_views_agree(plain, cases)
    assert_views_agree(got, cases)
    assert_same_cases(plain, got, cases)
    if mode == "accelerate":
        defined = sorted(f"__main__.{c['name']}" for case in cases for c in case["classes"])
        assert got["not_attribute_nodes"] == [], "accelerate() left these to equinox's functions"
        assert set(defined) <= set(got["accelerated"])
    assert_native(got, cases, library, own)
    return got


MODES = pytest.mark.parametrize("mode", ["installed", "accelerate"])


# ------------------------------------------------------------------------------------------------
# hypothesis: random classes and instances


STATIC_VALUES = st.one_of(
    st.integers(-3, 300).map(lambda n: ["int", n]),
    st.sampled_from(["", "a", "bb"]).map(lambda s: ["str", s]),
    st.just(["none"]),
    st.lists(st.integers(0, 5), max_size=3).map(lambda xs: ["tuple", [["int", x] for x in xs]]),
    st.sampled_from(["s1", "s2"]).map(lambda s: ["marker", s]),
)


def _array(draw):
    dtype = draw(st.sampled_from(["int32", "float32"]))
    values = draw(st.lists(st.integers(-4, 4), max_size=3))
    return [draw(st.sampled_from(["array", "numpy"])), values, dtype]


@st.composite
def case_strategy(draw):
    """One case: up to four Module classes (some subclassing earlier ones), a pool of shared
    objects and the root objects to examine."""
    specs: list[dict] = []
    all_fields: list[list[dict]] = []  # each class's fields, inherited first
    n_classes = draw(st.integers(1, 4))
    for i in range(n_classes):
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        inherited = all_fields[parent] if parent is not None else []
        own = []
        for j in range(draw(st.integers(0, 4))):
            own.append(
                {
                    "name": f"c{i}f{j}",
                    "static": draw(st.integers(0, 3)) == 0,
                    "converter": draw(st.sampled_from([None, None, None, "tuple", "as_list"])),
                }
            )
        n_defaults = draw(st.integers(0, len(own)))
        for f in own[len(own) - n_defaults :]:
            f["default"] = (
                ["tuple", [["int", 1]]] if f["converter"] == "tuple" else draw(STATIC_VALUES)
            )
        fields = inherited + own
        parent_spec = specs[parent] if parent is not None else None
        must_be_custom = parent_spec is not None and (
            parent_spec["init"] == "custom" or any("default" in f for f in inherited)
        )
        init = "custom" if must_be_custom else draw(st.sampled_from(["dataclass", "custom"]))
        spec = {
            "name": f"M_{i}",
            "fields": own,
            "parent": parent,
            "init": init,
            "generic": parent is None and draw(st.integers(0, 4)) == 0,
        }
        if init == "custom":
            spec["order"] = draw(st.permutations([f["name"] for f in fields]))
            spec["probe_at"] = draw(st.integers(0, len(fields)))
        specs.append(spec)
        all_fields.append(fields)

    def value(depth: int, pool_size: int):
        kinds = ["int", "str", "none", "array", "marker", "bool", "float"]
        if depth > 0:
            kinds += ["list", "tuple", "dict", "module", "module", "partial", "method"]
            if pool_size:
                kinds += ["shared", "shared"]
        kinds += ["lambda", "jit", "wrapper", "grad", "vmap"]
        kind = draw(st.sampled_from(kinds))
        if kind == "int":
            return ["int", draw(st.integers(-3, 300))]
        if kind == "float":
            return ["float", draw(st.sampled_from([0.5, -2.0]))]
        if kind == "bool":
            return ["bool", draw(st.booleans())]
        if kind == "str":
            return ["str", draw(st.sampled_from(["x", "yy"]))]
        if kind == "none":
            return ["none"]
        if kind == "array":
            return _array(draw)
        if kind == "marker":
            return ["marker", f"m{draw(st.integers(0, 99))}"]
        if kind in ("list", "tuple"):
            return [kind, [value(depth - 1, pool_size) for _ in range(draw(st.integers(0, 3)))]]
        if kind == "dict":
            keys = draw(st.lists(st.sampled_from(["k", "a", "z", "b"]), unique=True, max_size=3))
            return ["dict", [[k, value(depth - 1, pool_size)] for k in keys]]
        if kind == "module":
            return module(draw(st.integers(0, n_classes - 1)), depth - 1, pool_size)
        if kind == "method":
            return ["method", module(draw(st.integers(0, n_classes - 1)), depth - 1, pool_size)]
        if kind == "shared":
            return ["shared", draw(st.integers(0, pool_size - 1))]
        if kind == "partial":
            args = [value(depth - 1, pool_size) for _ in range(draw(st.integers(0, 2)))]
            return ["partial", "doc", args, [["y", value(depth - 1, pool_size)]]]
        return [kind, draw(st.sampled_from(["plain", "doc", "annotated"]))]

    def module(index: int, depth: int, pool_size: int):
        items = []
        for f in all_fields[index]:
            if "default" in f and draw(st.booleans()):
                continue  # left to its default (or, with a custom __init__, never set)
            if f["converter"] == "tuple":
                items.append(
                    [
                        f["name"],
                        [
                            "list",
                            [
                                value(max(depth, 0), pool_size)
                                for _ in range(draw(st.integers(0, 2)))
                            ],
                        ],
                    ]
                )
            elif f["static"]:
                items.append([f["name"], draw(STATIC_VALUES)])
            else:
                items.append([f["name"], value(max(depth, 0), pool_size)])
        built = ["module", index, items]
        if draw(st.integers(0, 9)) == 0:
            built = ["hacked", built, "not_a_field"]
        return built

    pool: list = []
    for _ in range(draw(st.integers(0, 2))):
        pool.append(module(draw(st.integers(0, n_classes - 1)), 1, len(pool)))
    roots = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 3)):
            roots.append(module(draw(st.integers(0, n_classes - 1)), 2, len(pool)))
        else:
            roots.append(value(2, len(pool)))
    return {"classes": specs, "pool": pool, "roots": roots}


@settings(
    # Each example is a batch of 8 to 12 cases run by three children side by side (about ten
    # seconds on two cores: the children's start-up, not the cases, is the cost), so there are
    # few examples of many cases each; derandomize: the same batches every run, so the test
    # cannot fail by chance. A failure is shrunk to a smaller batch (hypothesis bounds the time
    # it spends shrinking).
    max_examples=4,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(cases=st.lists(case_strategy(), min_size=8, max_size=12))
@pytest.mark.filterwarnings(
    # hypothesis's failure report imports libcst, which warns (mypy_extensions); keep the report
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)
def test_random_modules_match_plain(tmp_path_factory, cases):
    # Not the all-minimal batch hypothesis tries first (every child costs seconds to start).
    assume(sum(len(spec["fields"]) for case in cases for spec in case["classes"]) >= 8)
    for k, case in enumerate(cases):  # class names unique across the batch
        for i, spec in enumerate(case["classes"]):
            spec["name"] = f"M{k}_{i}"
    batch = tmp_path_factory.mktemp("batch")
    for mode in ("installed", "accelerate"):  # one start of the three children serves both
        check_batch(batch, cases, mode)


# ------------------------------------------------------------------------------------------------
# fixed cases: each named situation at least once


def _field(name, **options):
    return {"name": name, **options}


def _mod(index, **items):
    return ["module", index, [[k, v] for k, v in items.items()]]


ARRAY = ["array", [1, 2, 3], "float32"]
FIXED_CASES = [
    {  # static and converted fields, defaults, nesting, a submodule shared by two fields
        "classes": [
            {
                "name": "Leafy",
                "fields": [_field("w"), _field("tag", static=True, default=["str", "t"])],
                "init": "dataclass",
            },
            {
                "name": "Holder",
                "fields": [
                    _field("first"),
                    _field("second"),
                    _field("items", converter="tuple"),
                    _field("named", converter="as_list"),
                    _field("mode", static=True),
                    _field("extra", default=["none"]),
                ],
                "init": "dataclass",
            },
        ],
        "pool": [_mod(0, w=ARRAY)],
        "roots": [
            _mod(
                1,
                first=["shared", 0],
                second=["shared", 0],
                items=["list", [["int", 1], ["shared", 0], ["marker", "m"]]],
                named=["dict", [["a", ["none"]], ["b", ["int", 300]]]],
                mode=["tuple", [["int", 1], ["str", "s"]]],
            ),
            ["list", [["shared", 0], _mod(0, w=["list", []], tag=["marker", "static"])]],
        ],
    },
    {  # partly initialised: __init__ flattens itself before (and after) setting its fields
        "classes": [
            {
                "name": "Early",
                "fields": [_field("a"), _field("s", static=True), _field("b")],
                "init": "custom",
                "order": ["b", "s", "a"],
                "probe_at": 1,
            },
            {
                "name": "Late",
                "fields": [_field("a"), _field("s", static=True)],
                "init": "custom",
                "order": ["a", "s"],
                "probe_at": 2,
            },
            {
                "name": "First",
                "fields": [_field("a"), _field("d", default=["int", 4])],
                "init": "custom",
                "order": ["d", "a"],
                "probe_at": 0,
            },
        ],
        "pool": [],
        "roots": [
            _mod(0, a=ARRAY, s=["str", "s"], b=["list", [["int", 2]]]),
            _mod(1, a=_mod(0, a=["none"], s=["int", 1], b=["marker", "b"]), s=["int", 7]),
            _mod(2, a=["int", 1]),  # its default never set on the instance
        ],
    },
    {  # wrapped functions: eqx.Partial, eqx.nn.Lambda, bound methods, filter_jit & co.
        "classes": [
            {
                "name": "WithMethod",
                "fields": [_field("x"), _field("k", static=True)],
                "init": "dataclass",
            }
        ],
        "pool": [],
        "roots": [
            ["partial", "doc", [ARRAY, ["marker", "p"]], [["y", ["int", 3]]]],
            ["lambda", "annotated"],
            ["method", _mod(0, x=ARRAY, k=["str", "k"])],
            ["jit", "doc"],
            ["grad", "plain"],
            ["vmap", "annotated"],
            ["wrapper", "doc"],
            ["list", [["method", _mod(0, x=["int", 1], k=["int", 2])], ["lambda", "plain"]]],
        ],
    },
    {  # instances whose __dict__ holds more than the fields; a generic Module; subclasses
        "classes": [
            {
                "name": "Gen",
                "fields": [_field("x"), _field("s", static=True)],
                "init": "dataclass",
                "generic": True,
            },
            {"name": "Sub", "fields": [_field("y")], "init": "dataclass", "parent": 0},
            {
                "name": "CustomSub",
                "fields": [_field("z", static=True)],
                "init": "custom",
                "parent": 1,
                "order": ["z", "y", "x", "s"],
                "probe_at": 3,
            },
            {"name": "Empty", "fields": [], "init": "dataclass"},
        ],
        "pool": [],
        "roots": [
            _mod(0, x=ARRAY, s=["int", 1]),
            ["hacked", _mod(1, x=["int", 1], s=["int", 2], y=ARRAY), "not_a_field"],
            _mod(2, x=["none"], s=["str", "s"], y=["marker", "y"], z=["int", 5]),
            _mod(3),
            ["hacked", _mod(3), "__name__"],
        ],
    },
    {  # a field kept in a base class's __slots__ slot: equinox never sees it, the node would
        # read it, so the check finds the difference and the class falls back to equinox
        "classes": [
            {
                "name": "Slotted",
                "fields": [_field("x"), _field("y")],
                "init": "dataclass",
                "slotted": ["x"],
            }
        ],
        "pool": [],
        "roots": [_mod(0, x=ARRAY, y=["int", 2]), _mod(0, x=["int", 1], y=ARRAY)],
    },
]


@MODES
def test_fixed_modules_match_plain(tmp_path, mode):
    got = check_batch(tmp_path, FIXED_CASES, mode, library=frozenset({"Slotted"}))
    assert got["status"]["__main__.Slotted"] == "library: flatten: the children differ"
    # equinox's own classes went through the integration too
    for name in (
        "equinox._module._prebuilt.Partial",
        "equinox._module._prebuilt.BoundMethod",
        "equinox.nn._sequential.Lambda",
        "equinox._jit._JitWrapper",
    ):
        assert got["status"][name] in ("native", "checking"), name
    # the cases did what they are for: the probes saw partly built instances, ...
    probes = got["cases"][1]["probes"]
    assert len(probes) == 4  # Early twice (one nested), Late, First
    assert "Missing" in probes[0]["jax"]["treedef"]
    # ... and the slotted field is invisible to equinox (so to fastree, after the fallback)
    slotted = got["cases"][4]["roots"][0]["views"]["fastree"]
    assert slotted["leaves"] == [["int", "2"]]


def test_field_named_like_a_wrapper_attribute_installed_matches_plain(tmp_path):
    # equinox puts no restriction on field names; a field called like one of the attributes
    # functools.wraps copies (equinox's WRAPPER_FIELD_NAMES) is fine for it. The node's layout
    # cannot hold one name twice, so such a class stays equinox's (and defining it works).
    cases = [
        {
            "classes": [
                {
                    "name": "Named",
                    "fields": [_field("x"), _field("__name__", default=["str", "n"])],
                    "init": "dataclass",
                }
            ],
            "pool": [],
            "roots": [_mod(0, x=ARRAY), _mod(0, x=["int", 1], __name__=["str", "given"])],
        }
    ]
    check_batch(tmp_path, cases, "installed", modes=("plain", "installed"),
                own=frozenset({"Named"}))


# ------------------------------------------------------------------------------------------------
# a node whose checker finds a difference answers with the library functions from then on

FALLBACK = r"""
import dataclasses, functools, json, sys
import fastree
fastree.install()
import jax
import equinox as eqx
from equinox._module._flatten import generate_flatten_functions
import fastree.tree_util as ftu
from fastree import _core, integrations
from fastree.integrations import _checked

class Pair(eqx.Module):
    a: object
    b: object
    s: object = eqx.field(static=True, default="s")

a, b = object(), object()
pair = Pair(a, b)
node = _core.attribute_node(Pair)
out = {"before": integrations.status(Pair)}
# Library functions that read the fields the other way round: the first check must find that.
fields = dataclasses.fields(Pair)
flat, flat_keys, unflat = generate_flatten_functions(Pair, (fields[1], fields[0], fields[2]))
_checked.attach(node, flat, flat_keys, functools.partial(unflat, Pair))
out["attached"] = integrations.status(Pair)
views = {"jax": lambda n: fastree.original("jax.tree_util." + n),
         "jax.tree_util": lambda n: getattr(jax.tree_util, n),
         "fastree": lambda n: getattr(ftu, n)}
for name, get in views.items():
    leaves = get("tree_leaves")(pair)
    paths = [get("keystr")(p) for p, _ in get("tree_flatten_with_path")(pair)[0]]
    rebuilt = get("tree_unflatten")(get("tree_structure")(pair), leaves)
    mapped = get("tree_map")(lambda x: x, pair)
    out[name] = {
        "leaves": [leaf is a for leaf in leaves] + [leaf is b for leaf in leaves],
        "paths": paths,
        "rebuilt": [type(rebuilt).__name__, list(vars(rebuilt)), rebuilt.a is a, rebuilt.b is b],
        "mapped": [list(vars(mapped)), mapped.a is a, mapped.b is b],
    }
lib_children, lib_aux = flat(pair)
out["library"] = [list(lib_children) == [b, a], node.flatten(pair)[0] == (b, a)]
out["after"] = integrations.status(Pair)
out["use_library"] = node.use_library
json.dump(out, open(sys.argv[1], "w"))
"""


def test_checker_difference_switches_the_class_to_the_library_functions(tmp_path):
    script = tmp_path / "fallback.py"
    script.write_text(FALLBACK)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_child_env(),
        cwd=str(tmp_path),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["before"] == "checking"
    assert out["attached"] == "checking"
    expected = {
        "leaves": [False, True, True, False],  # b, then a: the library's order
        "paths": [".b", ".a"],
        "rebuilt": ["Pair", ["b", "a", "s"], True, True],
        "mapped": [["b", "a", "s"], True, True],
    }
    for name in ("jax", "jax.tree_util", "fastree"):
        assert out[name] == expected, name
    assert out["library"] == [True, True]
    assert out["after"] == "library: flatten: the children differ"
    assert out["use_library"] is True
