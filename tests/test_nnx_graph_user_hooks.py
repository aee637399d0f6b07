"""flax.nnx graph mode installed calls a user's hooks as often as flax does, beyond node functions.

``test_nnx_graph_user_code.py`` covers a user's graph-node and pytree functions. These are the
other places a graph walk runs user code:

- ``getattr``: a Module whose ``__getattribute__`` is the user's. flax's walks read a Pytree's
  ``__dict__`` and ``_pytree__*`` flags, and its ``isinstance`` checks read ``__class__``,
  through it; such classes are flax's in every walk (``attribute_hooks_run_user_code``).
- ``accessors``: a Variable subclass with its own accessors, which the native walks leave to flax.
  A check that copied and compared such a graph called them again, and a merge into the caller's
  objects that was not served left its types pending, so every other ``nnx.jit`` call checked
  again.
- ``keys``: a dict whose keys are a user's class, whose ``__hash__``, ``__eq__`` and ``__lt__``
  flax's merge runs; the native merge, which runs none, leaves such states to flax.

Each program runs in child processes, plain and under ``python -m fastree.run``; the counts per
step, and the results, must be the same.
"""

from __future__ import annotations

import pytest
from helpers import run_json_program, skip_unless_integration_knows

skip_unless_integration_knows("flax", "flax_nnx")

_PROGRAM = r"""
import collections, json, re, sys
import jax, jax.numpy as jnp
from flax import nnx

calls = collections.Counter()
kind = sys.argv[1]

class Logged(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones(2))

    def __getattribute__(self, name):
        calls["get " + name] += 1
        return super().__getattribute__(name)

class Counted(nnx.Param):
    def get_metadata(self, *args, **kwargs):
        calls["get_metadata"] += 1
        return super().get_metadata(*args, **kwargs)

    def get_raw_value(self):
        calls["get_raw_value"] += 1
        return super().get_raw_value()

    def set_raw_value(self, *args, **kwargs):
        calls["set_raw_value"] += 1
        return super().set_raw_value(*args, **kwargs)

    def update_from_state(self, *args, **kwargs):
        calls["update_from_state"] += 1
        return super().update_from_state(*args, **kwargs)

class Key:
    def __init__(self, n):
        self.n = n
    def __hash__(self):
        calls["hash"] += 1
        return hash(self.n)
    def __eq__(self, other):
        calls["eq"] += 1
        return isinstance(other, Key) and self.n == other.n
    def __lt__(self, other):
        calls["lt"] += 1
        return self.n < other.n
    def __repr__(self):
        return f"Key({self.n})"

class Model(nnx.Module):
    def __init__(self):
        self.linear = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        if kind == "getattr":
            self.inner = Logged()
        elif kind == "accessors":
            self.counted = Counted(jnp.full(2, 3.0))
        else:
            self.table = nnx.data({Key(2): nnx.Param(jnp.ones(1)), Key(1): nnx.Param(jnp.zeros(1))})

model = Model()

@nnx.jit
def step(m):
    return None

out = []
for name in ("split", "split", "merge", "merge", "update", "update", "state",
             "jit", "jit", "jit", "jit", "jit"):
    calls.clear()
    if name == "split":
        graphdef, state = nnx.split(model)
    elif name == "merge":
        rebuilt = nnx.merge(graphdef, state)
    elif name == "update":
        nnx.update(model, state)
    elif name == "state":
        state = nnx.state(model)
    else:
        step(model)
    out.append([name, dict(sorted(calls.items()))])
leaves = [float(jnp.sum(x)) for x in jax.tree_util.tree_leaves(nnx.state(rebuilt))]
graphdef_text = re.sub(r" at 0x[0-9a-f]+", "", repr(graphdef))  # nnx.Linear's functions
print(json.dumps({"calls": out, "leaves": leaves, "graphdef": graphdef_text}))
"""


@pytest.mark.parametrize("kind", ["getattr", "accessors", "keys"])
def test_user_hooks_run_as_often_as_under_flax(kind):
    plain = run_json_program(_PROGRAM, False, kind)
    installed = run_json_program(_PROGRAM, True, kind)
    assert any(counts for _, counts in plain["calls"])  # the program does reach the user's code
    assert installed["calls"] == plain["calls"]
    assert installed["leaves"] == plain["leaves"]
    assert installed["graphdef"] == plain["graphdef"]


_SPLIT_AFTER_UNDECIDED_UPDATES = r"""
import json
import jax.numpy as jnp
from flax import nnx
from fastree.integrations import flax_nnx_graph

class Counted(nnx.Param):  # its own accessor: a user's class the native walks leave to flax
    def update_from_state(self, *args, **kwargs):
        return super().update_from_state(*args, **kwargs)

class Model(nnx.Module):
    def __init__(self):
        self.a = Counted(jnp.ones(2))
        self.b = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

model = Model()
state = nnx.state(model)
for _ in range(5):
    nnx.update(model, state)
graph = flax_nnx_graph._graph
print(json.dumps({"status": flax_nnx_graph.status(),
                  "fallbacks": sorted(c.__qualname__ for c in graph.fallbacks),
                  "update_fallbacks": sorted(c.__qualname__ for c in graph.update_fallbacks)}))
"""


def test_undecided_updates_leave_only_updates_to_flax():
    # Updates that could not be checked leave the root type's updates to flax; its splits and
    # merges, which those checks say nothing about, are still served (and checked) natively.
    result = run_json_program(_SPLIT_AFTER_UNDECIDED_UPDATES, True)
    assert result["update_fallbacks"] == ["Model"]
    assert result["fallbacks"] == []
    assert result["status"]["flatten"] == "native"
    assert any(why.startswith("flax (updates): ") for name, why in result["status"].items()
               if name.endswith(".Model"))
