"""Trees that user code changes while a walk reads them: one rule, JAX's.

The rule (docs/reliability.md): containers are read as jaxlib reads them wherever that is
memory-safe. A list's length when the walk reaches it is its number of children, and child i is
the item at position i when the walk gets there; a dict's keys are taken and sorted, then each
value is looked up in the dict as it is then (a key removed meanwhile raises JAX's KeyError).
Where jaxlib reads past the end of a list that shrank, fastree raises a RuntimeError. Every
walker (tree_leaves, tree_flatten, tree_structure, the key-path walks, tree_map's single pass
and its general path) follows it, so fastree's functions agree with JAX and with each other.

Each case below is differential against jax.tree_util: a custom node whose flatten function
changes the list that holds it (or a dict key whose comparison changes its dict), run through
every walker of both libraries.
"""

from __future__ import annotations

import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from helpers import TREE_WALKS, tree_walks


def _outcome(call):
    try:
        return "ok", call()
    except Exception as e:  # noqa: BLE001 - compared with JAX's outcome
        return type(e).__name__, str(e)


WALKERS = {
    **tree_walks("leaves", "flatten", "structure", "with_path", "map", "map_with_path"),
    "leaves_is_leaf": lambda lib, t: TREE_WALKS["leaves"](lib, t, lambda x: False),
    "map_is_leaf": lambda lib, t: TREE_WALKS["map"](lib, t, lambda x: False),
}

# Changes to the enclosing list that jaxlib reads safely (no shrinking below the walk).
MUTATIONS = {
    "rewrite_same_size": lambda lst: lst.__setitem__(slice(None), [100, 101, 102, 103]),
    "rewrite_larger": lambda lst: lst.__setitem__(slice(None), list(range(200, 260))),
    "append": lambda lst: lst.extend([7, 8, 9]),
    "replace_ahead": lambda lst: lst.__setitem__(2, "replaced"),
    "insert_front": lambda lst: lst.insert(0, "front"),
}


def _tree_with_a_meddler(lib, mutate):
    class Meddler:
        def __init__(self, owner):
            self.owner = owner

    def flatten(node):
        if node.owner is not None:
            mutate(node.owner)
            node.owner = None  # once per tree: the rebuilt tree is not changed again
        return (), None

    lib.register_pytree_node(Meddler, flatten, lambda _, children: Meddler(None))
    tree = [1, 2, 3]
    tree.insert(0, Meddler(tree))
    return [tree, {"k": 5}], Meddler


def _normalise(result, meddler_type):
    # Rebuilt Meddler nodes are fresh objects: compare them by type.
    if isinstance(result, (list, tuple)):
        return type(result)(_normalise(x, meddler_type) for x in result)
    if isinstance(result, dict):
        return {k: _normalise(v, meddler_type) for k, v in result.items()}
    if isinstance(result, meddler_type):
        return "Meddler"
    return result


@pytest.mark.parametrize("walker", sorted(WALKERS))
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_list_changed_by_a_callback_reads_as_in_jax(walker, mutation):
    jax_tree, jax_type = _tree_with_a_meddler(jtu, MUTATIONS[mutation])
    tree, fastree_type = _tree_with_a_meddler(tu, MUTATIONS[mutation])
    expected = _outcome(lambda: WALKERS[walker](jtu, jax_tree))
    got = _outcome(lambda: WALKERS[walker](tu, tree))
    assert _normalise(got, fastree_type) == _normalise(expected, jax_type)


@pytest.mark.parametrize("walker", sorted(WALKERS))
def test_every_walker_agrees_on_a_changed_list(walker):
    # fastree's walkers with one another (the rewrite case, where reading a snapshot and reading
    # live give different answers).
    results = set()
    for name in ("leaves", walker):
        tree, meddler = _tree_with_a_meddler(tu, MUTATIONS["rewrite_same_size"])
        out = WALKERS[name](tu, tree)
        if name.startswith("map"):
            out = [x[1] for x in tu.tree_leaves(out, is_leaf=lambda x: isinstance(x, tuple))]
        elif name == "with_path":
            out = [x for _, x in out]
        elif name == "structure":
            continue
        results.add(repr(_normalise(out, meddler)))
    assert len(results) == 1, results


@pytest.mark.parametrize("walker", sorted(set(WALKERS) - {"map"}))
def test_a_list_shrunk_below_the_walk_is_a_runtime_error(walker):
    # jaxlib reads past the end of the list here (undefined behaviour); fastree stops cleanly.
    tree, _ = _tree_with_a_meddler(tu, lambda lst: lst.clear())
    with pytest.raises(RuntimeError, match="changed size while it was being flattened"):
        WALKERS[walker](tu, tree)


def test_single_pass_map_takes_a_shrunk_lists_items_as_first_read():
    # tree_map(f, tree)'s single pass runs f inside the walk, and f may empty its input (JAX
    # flattens it first, so f's change is not seen there): the items left are the ones the walk
    # saw when it reached the list.
    tree, meddler = _tree_with_a_meddler(tu, lambda lst: lst.clear())
    out = _normalise(WALKERS["map"](tu, tree), meddler)
    assert out == [["Meddler", ("m", 1), ("m", 2), ("m", 3)], {"k": ("m", 5)}]
    items = [1, 2, 3]
    assert tu.tree_map(lambda x: items.clear() or x, [items]) == [[1, 2, 3]]
    assert jtu.tree_map(lambda x: x, [[1, 2, 3]]) == [[1, 2, 3]]


class _Key:
    """A dict key whose comparison replaces the dict's contents."""

    def __init__(self, v, d=None):
        self.v, self.d = v, d

    def __hash__(self):
        return hash(self.v)

    def __eq__(self, other):
        return isinstance(other, _Key) and other.v == self.v

    def __lt__(self, other):
        if self.d is not None:
            self.d.clear()
            self.d.update({_Key(i): i for i in range(20, 40)})
        return self.v < other.v

    def __repr__(self):
        return f"_Key({self.v})"


def _self_rewriting_dict():
    d = {}
    for i in range(3):
        d[_Key(2 - i, d)] = i
    return d


@pytest.mark.parametrize("walker", sorted(WALKERS))
def test_dict_changed_by_its_key_comparisons_reads_as_in_jax(walker):
    expected = _outcome(lambda: WALKERS[walker](jtu, [_self_rewriting_dict()]))
    got = _outcome(lambda: WALKERS[walker](tu, [_self_rewriting_dict()]))
    assert got == expected
    assert got[0] == "KeyError"


def test_mismatch_explanation_of_trees_changed_meanwhile_is_a_value_error():
    # tree_map(f, x, y) whose prefix tree grows while the explanation walks it: the explainer
    # raises a ValueError (JAX's explanation, or a plain one), never an IndexError of its own.
    class Grower:
        def __init__(self, owner):
            self.owner = owner

    def flatten(node):
        node.owner.append(len(node.owner))
        return (), None

    tu.register_pytree_node(Grower, flatten, lambda _, c: Grower([]))
    for _ in range(5):
        inner = [1, 2]
        inner.insert(0, Grower(inner))
        with pytest.raises(ValueError):
            tu.tree_map(lambda *xs: None, [inner], [[0, 1, 2, 3, 4, 5, 6, 7]])
