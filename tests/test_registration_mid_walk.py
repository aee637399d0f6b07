"""Types registered while a walk runs, by code that JAX also runs mid-flatten.

A custom node's flatten function may register a type. JAX's flatten looks each object's type up
when it reaches it, so an object of that type met later in the same walk is a node. fastree's
walks remember the plain leaf type they last met (registry::KnownPlainLeafType, registry_state.h) and
must forget it then. Each case compares every walker with jax.tree_util, after the leaf type has
already been seen as a leaf by an earlier walk (so that fastree's per-type memo holds it).
"""

from __future__ import annotations

import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from helpers import tree_walks

WALKERS = {
    **tree_walks("leaves", "flatten", "structure", "with_path"),
    # the mapped tree holds new Box and Registers objects: compared by its leaves
    "map": lambda lib, t: lib.tree_leaves(lib.tree_map(lambda x: ("m", x), t)),
}


def _walk_with_a_registering_node(lib, walker, shape):
    class Box:
        def __init__(self, v):
            self.v = v

        def __repr__(self):
            return f"Box({self.v})"

    class Registers:
        pass

    registered = []

    def flatten_registers(node):
        if not registered:  # once: a walker may flatten its own output again
            lib.register_pytree_node(Box, lambda b: ((b.v,), None), lambda _, c: Box(c[0]))
            registered.append(Box)
        return (), None

    lib.register_pytree_node(Registers, flatten_registers, lambda _, c: Registers())
    lib.tree_leaves([{"k": Box(0)}, Box(0)])  # Box is now a known leaf type
    if shape == "dicts_of_leaves":
        tree = {"a": {"k": Box(1), "l": Box(2)}, "b": Registers(), "c": {"k": Box(3)}}
    else:
        tree = [Box(1), Box(2), Registers(), Box(3)]
    got = WALKERS[walker](lib, tree)
    return [repr(x) for x in got] if isinstance(got, list) else got


@pytest.mark.parametrize("shape", ["dicts_of_leaves", "list"])
@pytest.mark.parametrize("walker", sorted(WALKERS))
def test_a_leaf_type_registered_by_a_flatten_function_is_a_node_after_it(walker, shape):
    want = _walk_with_a_registering_node(jtu, walker, shape)
    got = _walk_with_a_registering_node(tu, walker, shape)
    assert got == want
    if walker in ("leaves", "flatten"):  # Box(3) was taken apart: its child is the leaf
        assert want[-1] == "3"
