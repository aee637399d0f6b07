"""A dict's values are read when the walk reaches their key, as jaxlib reads them.

jaxlib sorts a snapshot of a dict's keys and looks each value up when it gets to that key, so an
``is_leaf`` or a custom node's flatten function that pops or replaces a later key is seen: a key
gone is a ``KeyError``, a replaced value is the new one. fastree gathers the values first (its
fast path) and looks them up again once such code has run. Every
expected result here is JAX's own (``jax_interop.compat.tree_util``), in plain and installed runs.
"""

from __future__ import annotations

from typing import Any

import fastree.tree_util as tu
import pytest
from helpers import TREE_WALKS
from fastree.jax_interop.compat import JAX_REJECTS_A_DICT_GROWN_MID_WALK
from fastree.jax_interop.compat import tree_util as jax_tu

WALKERS = TREE_WALKS

# Each takes the dict and the key maker of the run (str keys, or ints).
MUTATIONS = {
    "pop": lambda d, k: d.pop(k("c"), None),
    "replace": lambda d, k: d.__setitem__(k("c"), 40),
    "replace_with_a_subtree": lambda d, k: d.__setitem__(k("c"), [41, 42]),
    "add_a_key": lambda d, k: d.__setitem__(k("b"), 30),
    "clear": lambda d, k: d.clear(),
}


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the outcome is compared, type and text
        return ("error", type(e).__name__, str(e))


def _run(lib: Any, walker: str, mutation: str, keys: str) -> Any:
    make_key = {"str": str, "int": lambda k: ord(k)}[keys]
    d = {make_key("a"): [1, 2], make_key("c"): 4}

    def is_leaf(x: Any) -> bool:
        if x == 2:
            MUTATIONS[mutation](d, make_key)
        return False

    return _outcome(lambda: WALKERS[walker](lib, d, is_leaf))


# Walks that build a treedef or an output record a dict's size; the others only read values.
TREEDEF_WALKERS = {"flatten", "structure", "with_path", "map", "map_with_path"}


# A dict grown mid-walk under a treedef-building walk: test_a_dict_grown_mid_walk_follows_the_installed_jax.
SAME_AS_JAX = [
    (walker, mutation)
    for walker in sorted(WALKERS)
    for mutation in sorted(MUTATIONS)
    if not (mutation == "add_a_key" and walker in TREEDEF_WALKERS)
]


@pytest.mark.parametrize("keys", ["str", "int"])
@pytest.mark.parametrize(("walker", "mutation"), SAME_AS_JAX)
def test_is_leaf_changing_a_later_key_is_seen_as_jax_sees_it(walker, mutation, keys):
    assert _run(tu, walker, mutation, keys) == _run(jax_tu, walker, mutation, keys)


@pytest.mark.parametrize("keys", ["str", "int"])
@pytest.mark.parametrize("walker", sorted(TREEDEF_WALKERS))
def test_a_dict_grown_mid_walk_follows_the_installed_jax(walker, keys):
    got = _run(tu, walker, "add_a_key", keys)
    jax = _run(jax_tu, walker, "add_a_key", keys)
    if not JAX_REJECTS_A_DICT_GROWN_MID_WALK:
        # jaxlib 0.11+: the structure of the dict as the walk reached it.
        assert got == jax
        return
    # Up to jaxlib 0.10 the dict's size is recorded after its values, so JAX's treedef claims
    # more children than it has: tree_structure and tree_map raise RuntimeError ("Too few
    # elements ..."), while tree_flatten hands out that broken treedef. fastree raises the same
    # type at once, saying why, and never builds the broken treedef.
    assert got[:2] == ("error", "RuntimeError")
    assert "changed size while it was being flattened (2 keys when the walk reached it, 3 now)" in got[2]
    assert jax[0] == "ok" or jax[1] == "RuntimeError"


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_custom_flatten_changing_a_later_key_is_seen_as_jax_sees_it(mutation):
    def run(lib):
        class Meddler:
            pass

        d: dict = {}

        def flatten(node):
            MUTATIONS[mutation](d, str)
            return (), None

        lib.register_pytree_node(Meddler, flatten, lambda _, __: Meddler())
        d.update({"a": Meddler(), "c": 4})
        return _outcome(lambda: lib.tree_leaves(d))

    assert run(tu) == run(jax_tu)


def test_a_dict_with_no_callback_is_read_once():
    # No Python code runs inside: the gathered values are the dict's, nothing is looked up again.
    d = {"b": [1, 2], "a": (3,)}
    assert tu.tree_leaves(d) == jax_tu.tree_leaves(d) == [3, 1, 2]


def _dict_grown_by_a_key_hash() -> dict:
    d: dict = {}
    armed = [False]

    class Key:
        def __init__(self, n):
            self.n = n

        def __hash__(self):
            if self.n < 100 and armed[0] and len(d) < 4:
                armed[0] = False
                d[Key(100 + len(d))] = 0
                armed[0] = True
            return hash(self.n)

        def __eq__(self, other):
            return isinstance(other, Key) and self.n == other.n

        def __lt__(self, other):
            return self.n < other.n

        def __repr__(self):
            return f"Key({self.n})"

    d[Key(1)] = 1
    d[Key(2)] = 2
    armed[0] = True
    return d


@pytest.mark.parametrize(
    "operation",
    [
        "structure",
        "transpose",
    ],
)
def test_a_key_hash_growing_its_dict_follows_the_installed_jax(operation):
    # The lookups of a dict whose keys sort in Python run each
    # key's __hash__; one that adds keys leaves JAX up to 0.10 a treedef it rejects
    # (RuntimeError), and later JAX the dict as the walk reached it.
    def run(lib):
        if operation == "structure":
            # JAX hands out a treedef with more arity than children: its repr raises
            return _outcome(lambda: str(lib.tree_structure(_dict_grown_by_a_key_hash())))
        outer, inner = lib.tree_structure([0, 0]), lib.tree_structure({"a": 0})
        trees = [_dict_grown_by_a_key_hash(), _dict_grown_by_a_key_hash()]
        return _outcome(lambda: lib.tree_transpose(outer, inner, trees))

    got, jax = run(tu), run(jax_tu)
    if not JAX_REJECTS_A_DICT_GROWN_MID_WALK:  # jaxlib 0.11+: the dict as the walk reached it
        assert got == jax
        return
    assert got[:2] == jax[:2] == ("error", "RuntimeError")
    assert "changed size while it was being flattened" in got[2]


@pytest.mark.parametrize("operation", ["leaves", "flatten_up_to"])
def test_a_key_hash_growing_its_dict_reads_as_in_jax(operation):
    def run(lib):
        if operation == "leaves":
            return _outcome(lambda: lib.tree_leaves(_dict_grown_by_a_key_hash()))
        return _outcome(
            lambda: repr(lib.tree_structure({"a": 1}).flatten_up_to({"a": _dict_grown_by_a_key_hash()}))
        )

    assert run(tu) == run(jax_tu)
