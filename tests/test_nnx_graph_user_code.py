"""flax.nnx graph mode installed runs a user's node functions exactly as often as flax does.

A first-walk check compares the native walk with flax's own function. Where the graph holds a
node whose functions are the user's (a custom graph node, a jax pytree registered with Python
functions), that comparison would run them a second time: the checks see such nodes first
(``integrations/_flax_nnx_graph_user_code.py``) and leave those calls to flax or to the one
native walk. Each program runs in child processes, plain and under ``python -m fastree.run``; the
counts of every user function, and the results, must be the same, and the split and its check
must still be native (a split's check gives flax's walk the native walk's results,
``integrations/_flax_nnx_graph_replay.py``). Models whose nodes are all library code (an
optimizer's optax states) must still be checked and served natively.
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

class OwnMetadata(nnx.Param):  # its own accessor: a walk fastree leaves to flax
    def get_metadata(self, *args, **kwargs):
        return super().get_metadata(*args, **kwargs)

class Model(nnx.Module):
    def __init__(self, kind):
        self.w = nnx.Param(jnp.ones(2))
        if kind.startswith("box"):
            self.box = nnx.data(Box())
            self.box.items["v"] = nnx.Param(jnp.full(2, 3.0))
        else:
            self.pair = nnx.data(Pair(nnx.Param(jnp.ones(1)), 5))
        if kind.endswith("-unserved"):
            self.z = OwnMetadata(jnp.zeros(1))  # walked after the user's node (sorted keys)

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
try:
    from fastree.integrations import flax_nnx_graph
    status = flax_nnx_graph.status() if flax_nnx_graph._graph is not None else {}
except ImportError:
    status = {}
print(json.dumps({"calls": out, "leaves": leaves, "status": status,
                  "graphdef": repr(graphdef)}))
"""


def _compare(kind: str) -> None:
    plain = run_json_program(_PROGRAM, False, kind)
    installed = run_json_program(_PROGRAM, True, kind)
    assert installed["leaves"] == plain["leaves"]
    assert installed["graphdef"] == plain["graphdef"]
    assert any(counts for _, counts in plain["calls"])  # the program does reach the user's code
    assert installed["calls"] == plain["calls"]
    # The split's check decided (it is no fallback that kept the counts equal).
    assert not [name for name, why in installed["status"].items()
                if why.startswith("flax") and name.endswith((".Box", ".Pair", ".Model"))]
    return installed["status"]


def test_a_custom_graph_node_runs_as_often_as_under_flax():
    assert _compare("box")["flatten"] == "native"


def test_a_python_registered_jax_pytree_runs_as_often_as_under_flax():
    assert _compare("pair")["flatten"] == "native"


def test_a_walk_left_to_flax_after_a_user_node_runs_it_once():
    # The native walk flattens the user's node, then meets a Variable it leaves to flax: flax's
    # whole walk runs, and is given the results of the flattens already made.
    _compare("box-unserved")
    _compare("pair-unserved")


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



# A user's flatten that edits a part of the graph the walk has already passed: flax's walk never
# sees the edit during that split, and the first split's check (flax's walk replayed after the
# native one) must not either: it stops where it would call a user's flatten the native walk
# never called, and the native walk's result, flax's own, stands.
_EDITS_THE_WALKED_PART = r"""
import json, sys
import jax.numpy as jnp
from flax import nnx
from flax.nnx import graphlib

log = []

class Early:
    def __init__(self, tag):
        self.tag = tag
        self.w = nnx.Param(jnp.ones(2))

def early_flatten(e):
    log.append("early.flatten " + e.tag)
    if e.tag == "replacement" and sys.argv[1] == "raises":
        raise RuntimeError("the replacement's flatten")
    return [("w", e.w)], e.tag

class Late:
    def __init__(self):
        self.p = nnx.Param(jnp.zeros(1))

def late_flatten(node):
    log.append("late.flatten")
    model.a_early = Early("replacement")  # walked already: attribute "a_early" sorts first
    return [("p", node.p)], None

for cls, flatten in ((Early, early_flatten), (Late, late_flatten)):
    graphlib.register_graph_node_type(
        cls, flatten, lambda n, k, v: setattr(n, k, v), lambda n, k: n.__dict__.pop(k),
        lambda aux, cls=cls: cls.__new__(cls), lambda n: n.__dict__.clear(),
        lambda n, items: [setattr(n, k, v) for k, v in items])

class Model(nnx.Module):
    def __init__(self):
        self.a_early = nnx.data(Early("original"))
        self.z_late = nnx.data(Late())

model = Model()
out = []
for _ in range(2):
    log.clear()
    try:
        graphdef, _ = nnx.split(model)
        tags = [n.metadata for n in graphdef.nodes if getattr(n, "type", None) is Early]
        out.append(["ok", tags, list(log)])
    except Exception as e:
        out.append(["error", type(e).__name__, str(e), list(log)])
print(json.dumps(out))
"""


def test_a_flatten_editing_the_walked_part_is_seen_as_under_flax():
    for variant in ("plain", "raises"):
        plain = run_json_program(_EDITS_THE_WALKED_PART, False, variant)
        assert plain[0][0] == "ok"  # the program does reach the edit, and flax ignores it
        assert run_json_program(_EDITS_THE_WALKED_PART, True, variant) == plain
