"""flax.nnx graph mode installed runs a user's node functions exactly as often as flax does.

A first-walk check compares the native walk with flax's own function. Where the graph holds a
node whose functions are the user's (a custom graph node, a jax pytree registered with Python
functions), that comparison would run them a second time: the checks see such nodes first
(``integrations/_flax_nnx_graph_user_code.py``) and leave those calls to flax or to the one
native walk. Each program runs in child processes, plain and under ``python -m fastree.run``; the
counts of every user function, and the results, must be the same (but on a split's first check:
see _compare). Models whose nodes are all library code (an optimizer's optax states) must still
be checked and served natively.
"""

from __future__ import annotations

from helpers import run_json_program, skip_unless_integration_knows

skip_unless_integration_knows("flax", "flax_nnx")

_PROGRAM = r"""
import dataclasses, json, sys
import jax, jax.numpy as jnp
from flax import nnx
from flax.nnx import graphlib

calls = {}
def bump(k):
    calls[k] = calls.get(k, 0) + 1

class Box:
    def __init__(self):
        self.items = {}

graphlib.register_graph_node_type(
    Box,
    flatten=lambda b: (bump("box.flatten"), (sorted(b.items.items()), None))[1],
    set_key=lambda b, k, v: (bump("box.set_key"), b.items.__setitem__(k, v)),
    pop_key=lambda b, k: (bump("box.pop_key"), b.items.pop(k))[1],
    create_empty=lambda aux: (bump("box.create_empty"), Box())[1],
    clear=lambda b: (bump("box.clear"), b.items.clear()),
    init=lambda b, it: (bump("box.init"), b.items.update(it)),
)

@dataclasses.dataclass
class Pair:
    a: object
    b: object

jax.tree_util.register_pytree_node(
    Pair,
    lambda p: (bump("pair.flatten"), ((p.a, p.b), "tag"))[1],
    lambda aux, c: (bump("pair.unflatten"), Pair(*c))[1],
)

class Model(nnx.Module):
    def __init__(self, kind):
        self.w = nnx.Param(jnp.ones(2))
        if kind == "box":
            self.box = nnx.data(Box())
            self.box.items["v"] = nnx.Param(jnp.full(2, 3.0))
        else:
            self.pair = nnx.data(Pair(nnx.Param(jnp.ones(1)), 5))

model = Model(sys.argv[1])
out = []
for step in ("split", "split", "merge", "merge", "update", "update", "state"):
    calls.clear()
    if step == "split":
        graphdef, state = nnx.split(model)
    elif step == "merge":
        rebuilt = nnx.merge(graphdef, state)
    elif step == "update":
        nnx.update(model, state)
    else:
        state = nnx.state(model)
    out.append([step, dict(sorted(calls.items()))])
leaves = [float(jnp.sum(x)) for x in jax.tree_util.tree_leaves(nnx.state(rebuilt))]
print(json.dumps({"calls": out, "leaves": leaves}))
"""


def _compare(kind: str) -> None:
    plain = run_json_program(_PROGRAM, False, kind)
    installed = run_json_program(_PROGRAM, True, kind)
    assert installed["leaves"] == plain["leaves"]
    assert any(counts for _, counts in plain["calls"])  # the program does reach the user's code
    # The first split is the one call still apart: its check runs flax's walk beside the native
    # one (a result left unchecked could be wrong), so each user flatten runs once more there.
    (_, first_plain), *rest_plain = plain["calls"]
    (_, first_installed), *rest_installed = installed["calls"]
    assert rest_installed == rest_plain
    assert first_installed == {name: 2 * n for name, n in first_plain.items()}


def test_a_custom_graph_node_runs_as_often_as_under_flax():
    _compare("box")


def test_a_python_registered_jax_pytree_runs_as_often_as_under_flax():
    _compare("pair")


_LIBRARY_ONLY = r"""
import json
import jax.numpy as jnp, optax
from flax import nnx
from fastree.integrations import flax_nnx_graph

class Model(nnx.Module):
    def __init__(self):
        self.linear = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

model = Model()
opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
graphdef, state = nnx.split((model, opt))
nnx.merge(graphdef, state)
nnx.update((model, opt), state)
graph = flax_nnx_graph._graph
print(json.dumps({"status": flax_nnx_graph.status(),
                  "fallbacks": sorted(c.__qualname__ for c in graph.fallbacks),
                  "verified_updates": len(graph.verified_updates)}))
"""


def test_library_only_graphs_are_still_checked_and_native():
    # An optimizer's state holds optax's namedtuples (jax pytrees of no user code): its checks
    # run, and graph mode stays native.
    result = run_json_program(_LIBRARY_ONLY, True)
    assert result["fallbacks"] == []
    assert result["verified_updates"] >= 1
    assert all(v == "native" for v in result["status"].values()), result["status"]

