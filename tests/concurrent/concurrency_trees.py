"""The trees the concurrency tests walk: every node kind, and each walk's results in a form that
compares exactly (shared by the walk, registration and install tests in this folder).

Importing this module registers its node classes (once per process: a child process of
``concurrency_harness.isolated`` registers them again, in itself).
"""

from __future__ import annotations

import collections
import dataclasses
import typing

import fastree.tree_util as tu

Point = collections.namedtuple("Point", ["x", "y"])


class Typed(typing.NamedTuple):
    a: object
    b: object


class Box:
    """A custom node (register_pytree_node); its flatten runs Python code."""

    def __init__(self, items, label):
        self.items, self.label = list(items), label

    def __eq__(self, other):
        return type(other) is Box and (self.items, self.label) == (other.items, other.label)


tu.register_pytree_node(Box, lambda b: (b.items, b.label), lambda label, items: Box(items, label))


class Keyed:
    """A custom node with keys (register_pytree_with_keys)."""

    def __init__(self, left, right):
        self.left, self.right = left, right

    def __eq__(self, other):
        return type(other) is Keyed and (self.left, self.right) == (other.left, other.right)


tu.register_pytree_with_keys(
    Keyed,
    lambda k: (((tu.GetAttrKey("left"), k.left), (tu.GetAttrKey("right"), k.right)), None),
    lambda _, children: Keyed(*children),
    flatten_func=lambda k: ((k.left, k.right), None),
)


@tu.register_dataclass
@dataclasses.dataclass
class Layer:
    w: object
    b: object
    name: str = dataclasses.field(default="layer", metadata={"static": True})


def make_tree(k: int):
    """A tree of every node kind, with leaves depending on k."""
    return {
        "dict": {"z": k, "a": [k + 1, (k + 2, None)], "3": "three"},
        "point": Point(k + 3, Typed(k + 4, [k + 5])),
        "box": Box([k + 6, {"in": Box([], "empty")}], label=("lbl", k % 3)),
        "keyed": Keyed(Layer(k + 7, [k + 8, k + 9], name=f"n{k % 2}"), None),
        "ordered": collections.OrderedDict(second=k + 10, first=(k + 11,)),
        "default": collections.defaultdict(list, {"d": [k + 12, k + 13]}),
        "layers": [Layer(i, (i, k), name="deep") for i in range(6)],
        "none": None,
        "floats": [float(k) / 7, -0.0, 1e300],
        "strs": ["s" * (k % 4), b"bytes"],
    }


SHARED = [make_tree(100 * i) for i in range(3)]


def _double(x):
    return x * 2


def results_of(tree) -> dict:
    """Every operation's result on `tree`, in a form that compares exactly."""
    leaves, td = tu.tree_flatten(tree)
    with_path = tu.tree_leaves_with_path(tree)
    return {
        "leaves": leaves,
        "treedef": td,
        "repr": repr(td),
        "hash": hash(td),
        "unflatten": tu.tree_unflatten(td, leaves),
        "map": tu.tree_map(_double, tree),
        "with_path": with_path,
        "keystr": [tu.keystr(p) for p, _ in with_path],
        "structure": tu.tree_structure(tree),
        "is_leaf": tu.tree_leaves(tree, is_leaf=lambda x: isinstance(x, (Layer, Point))),
        "map_with_path": tu.tree_map_with_path(lambda p, x: (len(p), x), tree),
    }
