"""nnx.State as a native attribute node (the items layout, csrc/attr/attr_items.h).

flax registers ``State`` (and each subclass) with ``_state_flatten_with_keys`` / ``_state_flatten``
(the values of ``sorted(x._mapping.items())``, the sorted keys as aux data) and
``partial(_state_unflatten, cls)`` (``cls(zip(keys, children))``). The flax integration gives a
class the items layout only where those are the functions, their code is a known release's
(``_known_flax.CODE``), and ``cls(...)`` runs State's own ``__init__`` alone; anything else, and
any instance the layout cannot read (keys of mixed types, a ``_mapping`` that is not a dict), is
flax's.

Each case runs in a child process, plainly and with fastree installed, and compares the two:
leaves (the same objects as JAX's own ``tree_leaves``), key paths, the rebuilt State's class and
items, errors; and says how fastree reads each class.
"""

from __future__ import annotations

import helpers
import pytest

helpers.skip_unless_integration_knows("flax", "flax_nnx")

_PROGRAM = """
import json
import jax, jax.numpy as jnp, optax
from flax import nnx
from flax.nnx import statelib
from fastree import integrations, _core
from fastree.jax_interop import compat

class Model(nnx.Module):
    def __init__(self):
        self.linear = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
        self.layers = nnx.List([nnx.Linear(3, 3, rngs=nnx.Rngs(1)) for _ in range(2)])
        self.count = nnx.BatchStat(jnp.zeros(()))

class OwnInit(nnx.State):  # a subclass whose construction is its own
    def __init__(self, mapping, /, *, _copy=True):
        super().__init__(mapping, _copy=_copy)
        self._made = True

class SetterMixin:
    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)

class MixedIn(nnx.State, SetterMixin):  # State's super().__setattr__ reaches the mixin's
    pass

class Plain(nnx.State):  # a subclass that changes nothing
    pass

model = Model()
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

def describe(tree):
    walks = [jax.tree_util.tree_structure(tree) for _ in range(6)]
    leaves = jax.tree_util.tree_leaves(tree)
    theirs = compat.tree_util.tree_leaves(tree)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    rebuilt = jax.tree_util.tree_unflatten(walks[-1], leaves)
    own = getattr(rebuilt, "__dict__", {})
    items = [[repr(k), type(v).__name__] for k, v in own.get("_mapping", {}).items()]
    return {
        "same_leaves": len(leaves) == len(theirs) and all(a is b for a, b in zip(leaves, theirs)),
        "num_leaves": walks[-1].num_leaves, "paths": paths,
        "rebuilt": type(rebuilt).__name__, "items": items,
        "rebuilt_leaves_same": all(a is b for a, b in zip(jax.tree_util.tree_leaves(rebuilt),
                                                           leaves)),
        "init_ran": own.get("_made", False),
    }

def read(cls):
    status = integrations.status(cls)
    return "library" if status.startswith("library") or status == "not an attribute node" \\
        else status

def error(fn):
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None

state = nnx.state(model)
out = {"state": describe(state), "int_keys": describe(state["layers"]),
       "model_and_optimizer": describe((model, optimizer))}
raw = state.raw_mapping
out["own_init"] = describe(OwnInit(raw))
out["mixed_in"] = describe(MixedIn(raw))
out["plain_subclass"] = describe(Plain(raw))
out["reads"] = {name: read(cls) for name, cls in
                (("State", nnx.State), ("OwnInit", OwnInit), ("MixedIn", MixedIn),
                 ("Plain", Plain))}
out["mixed_keys"] = error(lambda: jax.tree_util.tree_leaves(nnx.State({1: 2.0, "a": 3.0})))
odd = nnx.State({"a": 1.0})
class SubDict(dict):  # a `_mapping` that is not an exact dict: flax reads that instance
    pass
object.__setattr__(odd, "_mapping", SubDict(b=2.0, a=jnp.ones(1)))
out["replaced_mapping"] = describe(odd)
# flax's unflatten pairs keys and children with zip(): a shorter aux pairs fewer.
node = _core.attribute_node(nnx.State)
unflatten = node.unflatten if node is not None else None
short = (statelib._state_unflatten(nnx.State, ("a",), [1.0, 2.0]).raw_mapping if unflatten is None
         else unflatten(("a",), [1.0, 2.0]).raw_mapping)
out["short_aux"] = sorted(short.items())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return (helpers.run_json_program(_PROGRAM, installed=False),
            helpers.run_json_program(_PROGRAM, installed=True))


_CASES = ("state", "int_keys", "model_and_optimizer", "own_init", "mixed_in", "plain_subclass",
          "replaced_mapping")


@pytest.mark.parametrize("case", _CASES)
def test_installed_reads_and_rebuilds_as_flax(runs, case):
    plain, installed = runs
    got, want = installed[case], plain[case]
    assert got["same_leaves"] and want["same_leaves"]
    assert got["num_leaves"] > 0
    for key in ("num_leaves", "paths", "rebuilt", "items", "rebuilt_leaves_same", "init_ran"):
        assert got[key] == want[key], key
    assert got["rebuilt_leaves_same"]


def test_which_classes_are_native(runs):
    _, installed = runs
    reads = installed["reads"]
    assert reads["State"] in ("native", "checking")
    assert reads["Plain"] in ("native", "checking")
    # A subclass whose construction is its own, or whose State.__init__ would reach a mixin's
    # __setattr__: flax's functions.
    assert reads["OwnInit"] == "library" and reads["MixedIn"] == "library"


def test_errors_and_odd_aux_are_flaxs(runs):
    plain, installed = runs
    assert installed["mixed_keys"] == plain["mixed_keys"]
    assert plain["mixed_keys"][0] == "TypeError"
    assert installed["short_aux"] == plain["short_aux"] == [["a", 1.0]]
