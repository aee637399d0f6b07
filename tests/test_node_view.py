"""PyTreeDef._nodes(): the core's per-node kinds and child keys, checked against JAX's paths."""

import collections
import dataclasses
from typing import NamedTuple

import fastree.tree_util as tu
import pytest
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not


class Point(NamedTuple):
    x: object
    y: object


@tu.register_dataclass
@dataclasses.dataclass
class Cell:
    a: object
    b: object
    meta: int = dataclasses.field(default=0, metadata={"static": True})


class Box:
    def __init__(self, v):
        self.v = v


tu.register_pytree_node(Box, lambda b: ((b.v,), None), lambda _, c: Box(*c))

TREES = [
    1,
    None,
    (1, 2),
    [1, [2, 3]],
    {"b": 1, "a": {"d": 2, "c": 3}},
    Point(1, (2, 3)),
    collections.OrderedDict(z=1, y=2),
    collections.defaultdict(list, {"q": 1, "p": 2}),
    Cell([1, 2], {"k": 3}, meta=5),
    {"box": Box((1, 2))},
]

KINDS = {
    int: "leaf",
    type(None): "none",
    tuple: "tuple",
    list: "list",
    dict: "dict",
    Point: "namedtuple",
    collections.OrderedDict: "ordered_dict",
    collections.defaultdict: "default_dict",
    Cell: "dataclass",
    Box: "custom",
}


def paths_from_records(records):
    """Leaf key paths rebuilt from the records alone (post-order, root last)."""
    stack = []  # (list of leaf paths relative to the subtree)
    for kind, _, _, arity, _, _, keys in records:
        if kind == "leaf":
            stack.append([()])
            continue
        children = stack[len(stack) - arity :] if arity else []
        del stack[len(stack) - arity :]
        stack.append([(k,) + p for k, sub in zip(keys, children) for p in sub])
    (root,) = stack
    return root


@pytest.mark.parametrize("tree", TREES, ids=lambda t: type(t).__name__)
def test_child_keys_rebuild_jax_paths(tree):
    records = tu.tree_structure(tree)._nodes()
    expected = [p for p, _ in jtu.tree_flatten_with_path(tree)[0]]
    if isinstance(tree, dict) and "box" in tree:
        # A custom node registered without keys: JAX numbers its children.
        assert expected == [
            (jtu.DictKey("box"), jtu.FlattenedIndexKey(0), k)
            for k in (jtu.SequenceKey(0), jtu.SequenceKey(1))
        ]
    assert paths_from_records(records) == expected


@pytest.mark.parametrize("tree", TREES, ids=lambda t: type(t).__name__)
def test_root_record(tree):
    td = tu.tree_structure(tree)
    kind, tp, data, arity, num_leaves, ref, keys = td._nodes()[-1]
    assert kind == KINDS[type(tree)]
    assert num_leaves == td.num_leaves and ref == -1 and len(keys) == arity
    if kind == "leaf":
        assert (tp, data) == (None, None) and td.node_data() is None
    else:
        assert (tp, data) == td.node_data()
    assert len(td._nodes()) == td.num_nodes


def test_shared_ref_record():
    class Shared:
        def __init__(self, v):
            self.v = v

    tu.register_pytree_node(
        Shared, lambda s: ((s.v,), None), lambda _, c: Shared(*c), preserve_identity=True
    )
    s = Shared(1)
    records = tu.tree_structure([s, s])._nodes()
    kinds = [r[0] for r in records]
    assert kinds == ["leaf", "custom", "shared_ref", "list"]
    assert records[2][5] == 1 and records[2][1:3] == (None, None)
    assert [r[5] for r in records if r[0] != "shared_ref"] == [-1, -1, -1]
