"""flax's ``extract.check_no_aliases`` (every tree-mode transform's argument check), served by
fastree once installed (``integrations/_flax_nnx_alias_check.py``).

Each case runs in a child process with fastree installed and compares the served function with
flax's own (kept by the graph walks as ``flax_check_no_aliases``) on the same arguments: the same
dict (paths in the same order, each naming the same object), or the same exception with the same
message. The tree-mode programs themselves run plain and installed in ``test_run_flax_programs``.
"""

from __future__ import annotations

import helpers
import pytest

helpers.skip_unless_integration_knows("flax", "flax_nnx")
helpers.skip_unless_flax_serves("check_no_aliases")

_PRELUDE = """
import json, sys
import jax, jax.numpy as jnp
from flax import nnx
from flax.nnx import extract
from fastree.integrations import flax_nnx_graph, _flax_nnx_graph_tables

graph = flax_nnx_graph._graph
ours, theirs = extract.check_no_aliases, graph.flax_check_no_aliases

def outcome(fn, *args, **kwargs):
    try:
        result = fn(*args, **kwargs)
    except Exception as e:
        return ["raised", type(e).__name__, str(e)]
    return ["dict", [[jax.tree_util.keystr(path), id(leaf)] for path, leaf in result.items()]]

def same(*args, **kwargs):
    a, b = outcome(ours, *args, **kwargs), outcome(theirs, *args, **kwargs)
    return a == b, a

class Model(nnx.Module):
    def __init__(self):
        self.linear = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
        self.norm = nnx.BatchNorm(3, rngs=nnx.Rngs(1))
        self.count = nnx.BatchStat(jnp.zeros(()))
        self.layers = nnx.List([nnx.Linear(3, 3, rngs=nnx.Rngs(2)) for _ in range(2)])
"""

_CASES = _PRELUDE + """
import optax
model = Model()
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
param = nnx.Param(jnp.ones(2))

class LyingClass:  # isinstance asks __class__, as flax's predicate does
    __class__ = property(lambda self: nnx.Param)

cases = {
    "model and optimizer": ((), {"args": (model, optimizer), "kwargs": {}}),
    "kwargs and plain leaves": ((), {"args": (1, "two", None), "kwargs": {"m": model, "x": 3.0}}),
    "bare Variables in containers": ((), {"args": ([param, {"b": nnx.BatchStat(1.0)}],)}),
    "nothing": ((), {"args": (), "kwargs": {}}),
    "an alias": ((), {"args": (model, model.linear), "kwargs": {}}),
    "a Variable twice": ((), {"args": (param, [param])}),
    "a __class__ that says Param": ((), {"args": (LyingClass(), param)}),
    "check out": ((), {"check": ["out"], "args": (model,), "out": (param,)}),
}
results = {}
for name, (extra, kwargs) in cases.items():
    ok, value = same("jit", *extra, **kwargs)
    results[name] = [ok, value[0],
                     f"{value[1]}: {value[2]}" if value[0] == "raised" else len(value[1])]

# Under a trace: a tracer among the arguments is asked about with flax's own isinstance.
traced = {}
@jax.jit
def step(x):
    ok, value = same("jit", args=(x, param), kwargs={})
    traced["ok"], traced["kind"] = ok, value[0]
    return x
step(jnp.ones(2))
results["a tracer"] = [traced["ok"], traced["kind"]]
results["served"] = ours is not theirs and flax_nnx_graph.status()["check_no_aliases"]
print(json.dumps(results))
"""


def test_served_check_gives_flax_result_or_error():
    out = helpers.run_json_program(_CASES, True)
    assert out.pop("served") == "native"
    for name, (ok, kind, *rest) in out.items():
        assert ok, (name, kind, rest)
    assert out["model and optimizer"][1:] == ["dict", 29]
    assert out["kwargs and plain leaves"][1:] == ["dict", 11]
    assert out["bare Variables in containers"][1:] == ["dict", 2]
    assert out["nothing"][1:] == ["dict", 0]
    assert out["a __class__ that says Param"][1:] == ["dict", 2]
    for alias in ("an alias", "a Variable twice"):
        assert out[alias][1] == "raised", out[alias]
        assert out[alias][2].startswith("ValueError: Duplicate"), out[alias]
    assert out["check out"][1:] == ["dict", 12]
    assert out["a tracer"] == [True, "dict"]


_TREE_MODE_CALLS = _PRELUDE + """
calls = {"ours": 0, "theirs": 0}
def counting(fn, key):
    def wrapper(*a, **k):
        calls[key] += 1
        return fn(*a, **k)
    return wrapper
graph.flax_check_no_aliases = counting(theirs, "theirs")
import fastree.integrations._flax_nnx_alias_check as alias_check
extract.check_no_aliases = counting(alias_check.make_check_no_aliases(
    graph, extract, sys.modules["flax.nnx.variablelib"]), "ours")
model = Model()
@nnx.jit(graph=False)
def forward(m, x):
    return m.linear(x)
outs = [forward(model, jnp.ones((1, 2))).tolist() for _ in range(6)]
print(json.dumps({"calls": calls, "outs": outs}))
"""


def test_tree_mode_jit_calls_the_served_check_and_flax_only_on_the_first_calls():
    out = helpers.run_json_program(_TREE_MODE_CALLS, True)
    # Six calls: each is the served check; flax's runs beside it on the first three (compared),
    # and again where the traced function checks its outputs (check=['out'], the first call).
    assert out["calls"]["ours"] >= 6, out
    assert out["calls"]["theirs"] <= 3 + (out["calls"]["ours"] - 6), out
    assert len({str(o) for o in out["outs"]}) == 1


_DIFFERENCE = _PRELUDE + """
# flax's function answering otherwise on a checked call: its result is returned, and the check
# is flax's from then on.
import fastree.integrations._flax_nnx_alias_check as alias_check
model = Model()
def other(fn_name, /, *, check=(), **kwargs):
    return {}
graph.flax_check_no_aliases = other
check = alias_check.make_check_no_aliases(graph, extract, sys.modules["flax.nnx.variablelib"])
first = check("jit", args=(model,), kwargs={})
print(json.dumps({"first": len(first), "status": flax_nnx_graph.status()["check_no_aliases"]}))
"""


def test_a_difference_returns_flax_result_and_falls_back():
    out = helpers.run_json_program(_DIFFERENCE, True)
    assert out["first"] == 0
    assert out["status"] == "flax: its result differed from flax's on a checked call"


_REPLACED = _PRELUDE + """
# A user's patch of what the check mirrors, after the install: flax's own check from then on.
calls = [0]
labeled = extract.labeled
def patched(**kwargs):
    calls[0] += 1
    return labeled(**kwargs)
extract.labeled = patched
ok, _ = same("jit", args=(Model(),), kwargs={})
print(json.dumps({"ok": ok, "status": flax_nnx_graph.status()["check_no_aliases"],
                  "patched_calls": calls[0]}))
"""


def test_a_patched_name_gives_the_check_back_to_flax():
    out = helpers.run_json_program(_REPLACED, True)
    assert out["ok"]
    assert out["status"].startswith("flax: flax.nnx.extract:labeled"), out["status"]
    assert out["patched_calls"] == 2  # flax's check runs the user's labeled, once per call


_PLAIN = """
import json
from flax import nnx
from flax.nnx import extract
print(json.dumps({"file": extract.check_no_aliases.__code__.co_filename}))
"""


@pytest.mark.parametrize("installed", [False, True])
def test_flax_keeps_its_check_unless_installed(installed):
    out = helpers.run_json_program(_PLAIN, installed)
    expected = "_flax_nnx_alias_check.py" if installed else "extract.py"
    assert out["file"].endswith(expected), out


def test_uninstall_gives_flax_its_check_back_and_install_serves_it_again():
    served, back, again = helpers.served_and_given_back("flax.nnx.extract", "check_no_aliases")
    assert served.endswith("_flax_nnx_alias_check.py")
    assert back.endswith("extract.py")
    assert again.endswith("_flax_nnx_alias_check.py")
