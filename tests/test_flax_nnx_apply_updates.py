"""flax's ``extract.apply_updates`` (every tree-mode transform's write-back of the Variables its
function changed), served by fastree once installed (``integrations/_flax_nnx_apply_updates.py``,
``csrc/nnx/nnx_tree_variables.cpp``).

Each case runs in a child process with fastree installed: the served function and flax's own
(kept by the graph walks as ``flax_apply_updates``) each update one of two equal models, and the
two models' Variables (values, metadata, types) and the outcomes (None, or the same exception
with the same message) must be equal. The tree-mode programs themselves run plain and installed
in ``test_run_flax_programs``.
"""

from __future__ import annotations

import helpers
import pytest

helpers.skip_unless_integration_knows("flax", "flax_nnx")
helpers.skip_unless_flax_serves("apply_updates")

_PRELUDE = """
import json
import jax, jax.numpy as jnp
from flax import nnx
from flax.nnx import extract
from fastree.integrations import flax_nnx_graph

graph = flax_nnx_graph._graph
ours, theirs = extract.apply_updates, graph.flax_apply_updates

class Model(nnx.Module):
    def __init__(self):
        self.linear = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
        self.count = nnx.BatchStat(jnp.zeros(()))
        self.cache = nnx.Cache(jnp.zeros(2))

def state_of(model):
    return [[jax.tree_util.keystr(path), type(v).__name__, v.get_raw_value().tolist(),
             sorted((k, repr(x)) for k, x in v.get_metadata().items())]
            for path, v in extract.check_no_aliases("jit", args=(model,)).items()]

def outcome(fn, model, make_updates):
    variables = extract.check_no_aliases("jit", args=(model,))
    try:
        result = fn(variables, make_updates(variables))
    except Exception as e:
        return ["raised", type(e).__name__, str(e), state_of(model)]
    return ["done", result, state_of(model)]

def same(make_updates, make_model=Model):
    a = outcome(ours, make_model(), make_updates)
    b = outcome(theirs, make_model(), make_updates)
    return a == b, a
"""

_CASES = _PRELUDE + """
def path_of(variables, name):
    return next(p for p in variables if jax.tree_util.keystr(p).endswith(name))

def new_values(variables):
    u = extract.Updates.create()
    u.append(path_of(variables, ".count"), nnx.BatchStat(jnp.ones(())))
    u.append(path_of(variables, ".cache"), nnx.Cache(jnp.full(2, 7.0)))
    return [u, extract.Updates.create([(path_of(variables, ".kernel"),
                                        nnx.Param(jnp.full((2, 3), 2.0)))])]

def new_metadata(variables):
    return [extract.Updates.create([(path_of(variables, ".count"),
                                     nnx.BatchStat(jnp.ones(()), tag="moved"))])]

def a_missing_path(variables):
    u = extract.Updates.create([(path_of(variables, ".count"), nnx.BatchStat(jnp.ones(())))])
    u.append((jax.tree_util.GetAttrKey("args"), jax.tree_util.GetAttrKey("nowhere")),
             nnx.BatchStat(jnp.ones(())))
    return [u]

def unequal_lists(variables):
    u = new_values(variables)[0]
    u._values.pop()  # Updates iterates zip(_keys, _values)
    return [u]

def not_a_list(variables):
    return tuple(new_values(variables))

calls = []
class Counted(nnx.Variable):
    def update_from_state(self, other):
        calls.append(type(self).__name__)
        super().update_from_state(other)

class CountedModel(Model):
    def __init__(self):
        super().__init__()
        self.counted = Counted(jnp.zeros(()))

def a_subclass_update(variables):
    return [extract.Updates.create([(path_of(variables, ".counted"), Counted(jnp.ones(())))])]

results = {}
for name, make in [("new values", new_values), ("new metadata", new_metadata),
                   ("a missing path", a_missing_path), ("unequal lists", unequal_lists),
                   ("not a list", not_a_list), ("nothing", lambda v: [])]:
    ok, value = same(make)
    results[name] = [ok, value[0], value[1:3] if value[0] == "raised" else value[1]]
ok, value = same(a_subclass_update, CountedModel)
results["a subclass's own update_from_state"] = [ok, value[0], calls]

# A Variable of the outer trace, updated inside a jit: flax's TraceContextError both ways.
def under_jit(fn):
    model = Model()
    variables = extract.check_no_aliases("jit", args=(model,))
    raised = []
    @jax.jit
    def f(x):
        try:
            fn(variables, [extract.Updates.create(
                [(next(iter(variables)), nnx.BatchStat(x))])])
        except Exception as e:
            raised.append((type(e).__name__, str(e)))
        return x
    f(jnp.ones(()))
    return raised[0] if raised else None
results["another trace"] = [under_jit(ours) == under_jit(theirs), under_jit(ours)[0]]
results["status"] = flax_nnx_graph.status()["apply_updates"]

# The core's answer itself: applied natively, or nothing applied and flax's function to run.
from fastree import _core
def native(make, make_model=Model):
    model = make_model()
    variables = extract.check_no_aliases("jit", args=(model,))
    before = state_of(model)
    applied = _core.nnx_apply_updates(variables, make(variables), extract.Updates,
                                      graph.unflatten_context)
    return [applied, state_of(model) == before]
results["native"] = {"new values": native(new_values), "a missing path": native(a_missing_path),
                     "a subclass": native(a_subclass_update, CountedModel),
                     "not a list": native(not_a_list)}
print(json.dumps(results))
"""


def test_served_write_back_equals_flax():
    out = helpers.run_json_program(_CASES, True)
    assert out.pop("status") == "native"
    # Served natively where it can be; elsewhere nothing applied, and flax's function runs.
    assert out.pop("native") == {"new values": [True, False], "a missing path": [False, True],
                                 "a subclass": [False, True], "not a list": [False, True]}
    for name, (ok, *rest) in out.items():
        assert ok, (name, rest)
    assert out["new values"][1:] == ["done", None]
    assert out["new metadata"][1:] == ["done", None]
    assert out["nothing"][1:] == ["done", None]
    assert out["unequal lists"][1:] == ["done", None]
    kind, (error, message) = out["a missing path"][1:]
    assert kind == "raised" and error == "RuntimeError", out["a missing path"]
    assert message.startswith("Variable not found at path .args.nowhere"), message
    # flax's function iterates any sequence of Updates: served the same, by flax's own.
    assert out["not a list"][1:] == ["done", None]
    # A Variable subclass's own method runs, once per way of updating.
    assert out["a subclass's own update_from_state"][1:] == ["done", ["Counted", "Counted"]]
    assert out["another trace"] == [True, "TraceContextError"]


_TREE_MODE = """
import json
import jax.numpy as jnp
from flax import nnx

class Counter(nnx.Module):
    def __init__(self):
        self.count = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.total = nnx.Cache(jnp.zeros(2))

@nnx.jit(graph=False)
def step(m, x):
    m.count[...] += 1
    m.total[...] = m.total[...] + x
    return m.count[...]

m = Counter()
outs = [int(step(m, jnp.full(2, float(i)))) for i in range(5)]
from fastree.integrations import flax_nnx_graph
status = flax_nnx_graph.status()["apply_updates"]
print(json.dumps({"outs": outs, "count": int(m.count[...]), "total": m.total[...].tolist(),
                  "status": status}))
"""


@pytest.mark.parametrize("installed", [False, True])
def test_tree_mode_jit_writes_back_the_same(installed):
    out = helpers.run_json_program(_TREE_MODE, installed)
    assert out["outs"] == [1, 2, 3, 4, 5]
    assert out["count"] == 5 and out["total"] == [10.0, 10.0]
    assert out["status"] == "native" if installed else out["status"].startswith("flax: not")


def test_uninstall_gives_flax_its_write_back_and_install_serves_it_again():
    served, back, again = helpers.served_and_given_back("flax.nnx.extract", "apply_updates")
    assert served.endswith("_flax_nnx_apply_updates.py"), served
    assert back.endswith("extract.py"), back
    assert again.endswith("_flax_nnx_apply_updates.py"), again
