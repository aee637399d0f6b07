"""nnx.Optimizer and ModelAndOptimizer as native Pytree nodes (tree mode).

flax's Optimizer has a ``__getattribute__`` of its own (it refuses ``model``, gone since flax 0.11,
and passes every other name to ``object``'s). The tree-mode node reads an Optimizer's ``__dict__``
natively only while the class finds that very function, with the code a known release has
(``_known_flax.CODE``'s ``Optimizer.__getattribute__`` line), and nothing after it on the MRO
defines another. Anything else (a subclass's own ``__getattribute__``, a mixin's that its
``super()`` reaches, the function replaced or its ``__code__`` patched in place) is read by flax's
functions, so the user's code runs as often as it does plainly.

Each case runs in a child process, plainly and with fastree installed, and compares the two:
leaves (the same objects as JAX's own ``tree_leaves``), structure, rebuilt class, the names each
user ``__getattribute__`` was asked for, and errors.
"""

from __future__ import annotations

import helpers
import pytest

helpers.skip_unless_integration_knows("flax", "flax_nnx")

_PROGRAM = """
import json, sys
import jax, jax.numpy as jnp, optax
from flax import nnx
from fastree import integrations, _core
from fastree.jax_interop import compat

asked = []

class Mixin:
    def __getattribute__(self, name):
        asked.append(("mixin", name))
        return super().__getattribute__(name)

class OwnLookup(nnx.Optimizer):  # a user's subclass with its own lookup
    def __getattribute__(self, name):
        asked.append(("own", name))
        return super().__getattribute__(name)

class MixedIn(nnx.Optimizer, Mixin):  # Optimizer's super() reaches the mixin's lookup
    pass

class Patch:  # code to patch into Optimizer.__getattribute__ (one free variable, as it has;
    def __getattribute__(self, name):  # run with the optimizer module's globals)
        __import__("sys").modules["__main__"].asked.append(("patched", name))
        return super().__getattribute__(name)

def counting(self, name):  # a function to put in its place
    asked.append(("replaced", name))
    return object.__getattribute__(self, name)

model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
def make(cls):
    return cls(model, optax.adam(1e-3), wrt=nnx.Param)

def outcome(tree):
    del asked[:]
    walks = [jax.tree_util.tree_structure(tree) for _ in range(4)]
    leaves = jax.tree_util.tree_leaves(tree)
    theirs = compat.tree_util.tree_leaves(tree)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    rebuilt = jax.tree_util.tree_unflatten(walks[-1], leaves)
    names = sorted(set(asked))
    status = integrations.status(type(tree))
    return {
        "read": "library" if status.startswith("library") else status,
        "node": _core.attribute_node(type(tree)) is not None,
        "same_leaves": len(leaves) == len(theirs) and all(a is b for a, b in zip(leaves, theirs)),
        "num_leaves": walks[-1].num_leaves, "paths": paths,
        "rebuilt": type(rebuilt).__name__,
        "rebuilt_leaves_same": all(a is b for a, b in zip(jax.tree_util.tree_leaves(rebuilt),
                                                           leaves)),
        "asked": [list(n) for n in names], "asked_count": len(asked),
    }

def error(fn):
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None

out = {}
out["optimizer"] = outcome(make(nnx.Optimizer))
out["model_error"] = error(lambda: make(nnx.Optimizer).model)
both = nnx.ModelAndOptimizer(model, optax.sgd(0.1), wrt=nnx.Param)
out["model_and_optimizer"] = outcome(both)
out["model_of_both"] = both.model is model
out["own_lookup"] = outcome(make(OwnLookup))
out["mixed_in"] = outcome(make(MixedIn))

# Optimizer's function patched in place, then replaced: read by flax from then on.
optimizer = make(nnx.Optimizer)
outcome(optimizer)
vars(nnx.Optimizer)["__getattribute__"].__code__ = vars(Patch)["__getattribute__"].__code__
out["patched"] = outcome(optimizer)
nnx.Optimizer.__getattribute__ = counting
out["replaced"] = outcome(optimizer)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return (helpers.run_json_program(_PROGRAM, installed=False),
            helpers.run_json_program(_PROGRAM, installed=True))


def _same_tree(plain, installed, case):
    got, want = installed[case], plain[case]
    assert got["same_leaves"] and want["same_leaves"], case
    for key in ("num_leaves", "paths", "rebuilt", "rebuilt_leaves_same", "asked", "asked_count"):
        assert got[key] == want[key], (case, key)
    assert got["rebuilt_leaves_same"]


def test_optimizer_and_model_and_optimizer_are_read_natively(runs):
    plain, installed = runs
    for case in ("optimizer", "model_and_optimizer"):
        _same_tree(plain, installed, case)
        assert installed[case]["node"] and installed[case]["read"] in ("native", "checking")
        assert installed[case]["num_leaves"] > 0
    # flax's own refusal of `model` stands, and ModelAndOptimizer's model is its own.
    assert installed["model_error"] == plain["model_error"]
    assert plain["model_error"][0] == "AttributeError"
    assert "does not have attribute 'model'" in plain["model_error"][1]
    assert installed["model_of_both"] and plain["model_of_both"]


@pytest.mark.parametrize("case, who", [("own_lookup", "own"), ("mixed_in", "mixin"),
                                       ("patched", "patched"), ("replaced", "replaced")])
def test_a_lookup_that_is_not_flaxs_is_asked_as_often_as_plainly(runs, case, who):
    # A subclass's own __getattribute__, a mixin's behind Optimizer's super(), and Optimizer's
    # own patched in place or replaced: flax's functions read each instance, and the user's
    # function is asked for the same names as without fastree.
    plain, installed = runs
    _same_tree(plain, installed, case)
    assert any(name[0] == who for name in plain[case]["asked"]), plain[case]["asked"]
    if case in ("own_lookup", "mixed_in"):
        assert installed[case]["read"] == "library"
