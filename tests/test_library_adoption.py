"""Classes a library registered with JAX while fastree was not installed are read natively by
fastree's own functions from the first walk that meets them (``fastree.integrations._adopt``).

flax registers its Variables with JAX when ``flax.nnx`` is imported; a program that then calls
``fastree.tree_util`` directly, not installed, used to read every Variable through flax's Python
functions, and its ``tree_flatten_with_path`` of an ``nnx.State`` ran no faster than JAX's. The
core now offers each class it adopts from JAX's registry to the loaded integrations once.

The adoption runs inside a walk, which cannot fail, so an error in the hook must neither be lost
nor break the walk: a KeyboardInterrupt is raised again after it, anything else goes to
``sys.unraisablehook`` and the class is read with JAX's functions.
"""

from __future__ import annotations

import sys

import pytest

from fastree import _core, integrations
import fastree.tree_util as ftu
from fastree.jax_interop import compat
from fastree.jax_interop.compat import tree_util as jax_tree_util
from helpers import run_json_program, skip_unless_integration_knows


class Box:
    """A node registered with JAX only (JAX's own function, as a library would)."""

    def __init__(self, *items):
        self.items = items

    def __eq__(self, other):
        return type(other) is type(self) and self.items == other.items

    __hash__ = None


def _register_box_with_jax(cls):
    jax_tree_util.register_pytree_node(
        cls, lambda b: (b.items, len(b.items)), lambda n, items: cls(*items))


@pytest.fixture
def adopter():
    """Replaces the core's library adopter for one test; gives back fastree's own after."""
    yield _core.set_library_adopter
    _core.set_library_adopter(integrations._adopt)


def _fresh_box_class():
    # Each test its own class: a class is offered to the adopter once (the answer is memoised).
    return type("Box", (Box,), {})


def test_the_adopter_is_offered_a_jax_registered_class_once_with_jaxs_functions(adopter):
    seen = []

    def record(cls, flatten, unflatten):
        seen.append((cls, flatten, unflatten))
        return False

    adopter(record)
    cls = _fresh_box_class()
    _register_box_with_jax(cls)
    tree = [cls(1, cls(2, 3)), cls(4)]
    for _ in range(3):
        assert ftu.tree_leaves(tree) == [1, 2, 3, 4]
    entry = compat.jax_registry_entry(cls)
    assert seen == [(cls, entry.to_iter, entry.from_iter)]
    leaves, treedef = ftu.tree_flatten(tree)
    assert ftu.tree_unflatten(treedef, leaves) == tree


def test_an_error_in_the_adopter_is_reported_and_the_class_read_with_jaxs_functions(
    adopter, monkeypatch
):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def broken(cls, flatten, unflatten):
        raise ValueError("adopter bug")

    adopter(broken)
    cls = _fresh_box_class()
    _register_box_with_jax(cls)
    tree = {"a": cls(1, 2), "b": [cls()]}
    leaves, treedef = ftu.tree_flatten(tree)
    jax_leaves, jax_treedef = jax_tree_util.tree_flatten(tree)
    assert leaves == jax_leaves == [1, 2]
    assert ftu.tree_unflatten(treedef, leaves) == tree
    assert len(reported) == 1
    assert type(reported[0].exc_value) is ValueError
    assert str(reported[0].exc_value) == "adopter bug"
    assert reported[0].object is broken


# The start of the child programs below: a node registered with JAX only, then fastree imported.
_BOX_PROGRAM = """
import json
import jax
import fastree.tree_util as ftu

class Box:
    def __init__(self, *items):
        self.items = items

jax.tree_util.register_pytree_node(
    Box, lambda b: (b.items, None), lambda _, items: Box(*items))
"""


def test_a_keyboard_interrupt_in_the_adopter_is_raised_again_after_the_walk():
    # Its own process: the interrupt is re-armed as a signal, which the main thread raises at its
    # next check, as the walk returns.
    seen = run_json_program(_BOX_PROGRAM + """
from fastree import _core

def interrupted(cls, flatten, unflatten):
    raise KeyboardInterrupt

_core.set_library_adopter(interrupted)
leaves = None
try:
    leaves = ftu.tree_leaves([Box(1, 2), 3])
    for _ in range(1000):  # the next checks of the eval loop
        pass
    outcome = "lost"
except KeyboardInterrupt:
    outcome = "raised"
print(json.dumps({"outcome": outcome, "leaves": leaves}))
""", False)
    assert seen == {"outcome": "raised", "leaves": None}


def test_without_a_loaded_library_no_integration_is_imported():
    seen = run_json_program(_BOX_PROGRAM + """
import sys
leaves = ftu.tree_leaves([Box(1, Box(2)), 3])
loaded = sorted(m for m in sys.modules
                if m.split(".")[0] in ("flax", "equinox", "chex")
                or m.startswith("fastree.integrations.") and not m.endswith(("_checked", "_library")))
print(json.dumps({"leaves": leaves, "loaded": loaded}))
""", False)
    assert seen == {"leaves": [1, 2, 3], "loaded": []}


# flax.nnx: Variables and Modules registered with JAX before fastree is imported, not installed.
_NNX_PROGRAM = """
import json
import jax
from flax import nnx
import fastree.tree_util as ftu
from fastree import integrations

class Block(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(3, 4, rngs=rngs)
        self.cache = nnx.Cache(jax.numpy.zeros(2))
        self.count = nnx.BatchStat(jax.numpy.ones(()))

model = Block(nnx.Rngs(0))
state = nnx.state(model)

def show(walk):
    leaves_with_paths, treedef = walk.tree_flatten_with_path(state)
    return {"paths": [walk.keystr(path) for path, _ in leaves_with_paths],
            "leaves": [leaf.tolist() for _, leaf in leaves_with_paths],
            "treedef": str(treedef)}

mine = [show(ftu) for _ in range(6)]  # past the checks of the first instances
theirs = show(jax.tree_util)
leaves, treedef = ftu.tree_flatten(state)
rebuilt = ftu.tree_unflatten(treedef, leaves)
print(json.dumps({
    "same": all(m == theirs for m in mine),
    "rebuilt": type(rebuilt).__name__ == "State"
               and jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(state),
    "status": {c.__name__: integrations.status(c)
               for c in (nnx.Param, nnx.Cache, nnx.BatchStat, Block)},
    "treedef_kinds": str(treedef).count("CustomNode(Param"),
}))
"""


def test_nnx_variables_are_native_for_fastree_without_an_install():
    skip_unless_integration_knows("flax", "flax_nnx")
    seen = run_json_program(_NNX_PROGRAM, False)
    assert seen["same"] and seen["rebuilt"]
    # Variables met by the walks: checked against flax's functions, then native. The Module was
    # never met by a walk (the State holds its Variables): status asks, and it is being checked.
    assert seen["status"] == {"Param": "native", "Cache": "native", "BatchStat": "native",
                              "Block": "checking"}
    assert seen["treedef_kinds"] == 2
