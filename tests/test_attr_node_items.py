"""The items layout of attribute nodes (``AttrNode(cls, (), items_field=name)``,
csrc/attr/attr_items.h): the children are the values of one dict attribute in sorted key order,
the aux data the sorted keys, each child's key ``DictKey(key)``; a rebuild sets a new dict of
key -> child. flax.nnx's State is read this way (tests/test_flax_nnx_state_node.py); here the
layout alone, on a class of the tests' own, registered directly (no library functions behind it).
"""

from __future__ import annotations

import gc
import sys

import fastree.tree_util as ftu
import pytest
from fastree import _core
from fastree.jax_interop import compat


class Bag:
    """A mapping over its `_items` dict (JAX: sorted items, keys as aux)."""

    def __init__(self, items):
        self._items = dict(items)


_NODE = _core.AttrNode(Bag, (), items_field="_items")
_core.register_attribute_node(_NODE)


def _jax_bag():
    # The same layout as a plain JAX registration, for comparison with JAX's own functions.
    class JaxBag(Bag):
        pass

    def flatten_with_keys(b):
        items = sorted(b._items.items())
        return [(compat.tree_util.DictKey(k), v) for k, v in items], tuple(k for k, _ in items)

    compat.tree_util.register_pytree_with_keys(
        JaxBag, flatten_with_keys, lambda keys, children: JaxBag(zip(keys, children)))
    return JaxBag


def test_children_aux_and_keys_are_the_sorted_items():
    inner = {"x": 3}
    bag = Bag({"b": 2, "a": 1, "c": inner})
    children, aux = _NODE.native_flatten(bag)
    assert children == (1, 2, inner) and children[2] is inner
    assert aux == ("a", "b", "c")
    pairs, _ = _NODE.native_flatten_with_keys(bag)
    assert [k for k, _ in pairs] == [compat.tree_util.DictKey(k) for k in "abc"]
    ints = Bag({10: "ten", 2: "two", -1: "minus"})
    assert _NODE.native_flatten(ints) == (("minus", "two", "ten"), (-1, 2, 10))
    assert _NODE.native_flatten(Bag({})) == ((), ())


def test_walks_agree_with_jax_on_the_same_layout():
    JaxBag = _jax_bag()
    ours = {"m": Bag({"w": [1, 2], "b": Bag({"z": 3, "y": (4,)})}), "n": None}
    theirs = {"m": JaxBag({"w": [1, 2], "b": JaxBag({"z": 3, "y": (4,)})}), "n": None}
    assert ftu.tree_leaves(ours) == compat.tree_util.tree_leaves(theirs)
    got = [(compat.tree_util.keystr(p), v) for p, v in ftu.tree_flatten_with_path(ours)[0]]
    want = [(compat.tree_util.keystr(p), v)
            for p, v in compat.tree_util.tree_flatten_with_path(theirs)[0]]
    assert got == want
    rebuilt = ftu.tree_map(lambda v: v * 10, ours)
    assert type(rebuilt["m"]) is Bag and list(vars(rebuilt["m"])) == ["_items"]
    assert rebuilt["m"]._items["w"] == [10, 20]
    assert type(rebuilt["m"]._items["b"]) is Bag
    assert rebuilt["m"]._items["b"]._items == {"y": (40,), "z": 30}


def test_a_rebuild_makes_a_new_dict_without_running_init():
    calls = []

    class Counted(Bag):
        def __init__(self, items):
            calls.append("init")
            super().__init__(items)

    node = _core.AttrNode(Counted, (), items_field="_items")
    a, b = object(), object()
    made = node.native_unflatten(("p", "q"), [a, b])
    assert type(made) is Counted and calls == []
    assert list(made._items) == ["p", "q"] and made._items["p"] is a and made._items["q"] is b
    with pytest.raises(ValueError, match="expected aux data a tuple of 2 keys"):
        node.native_unflatten(("p",), [a, b])


@pytest.mark.parametrize("bad, message", [
    ({1: "a", "b": 2}, "not all exact str or all exact int"),
    ({True: 1}, "not all exact str or all exact int"),
    ({("t",): 1}, "not all exact str or all exact int"),
])
def test_keys_the_layout_cannot_sort_without_python_are_a_clear_error(bad, message):
    with pytest.raises(TypeError, match=f"attribute node of Bag: the dict's keys are {message}"):
        ftu.tree_leaves(Bag(bad))


def test_an_instance_without_the_dict_is_a_clear_error():
    bag = Bag({})
    del bag._items
    with pytest.raises(TypeError, match="has no plain dict attribute to read"):
        ftu.tree_leaves(bag)
    bag._items = [("a", 1)]
    with pytest.raises(TypeError, match="is not an exact dict"):
        ftu.tree_leaves(bag)

    class Sub(dict):
        pass

    bag._items = Sub(a=1)
    with pytest.raises(TypeError, match="is not an exact dict"):
        ftu.tree_leaves(bag)


def test_constructor_refuses_items_field_with_another_layout():
    with pytest.raises(TypeError, match="items_field is an attribute name"):
        _core.AttrNode(Bag, ("x",), items_field="_items")
    with pytest.raises(TypeError, match="items_field is an attribute name"):
        _core.AttrNode(Bag, (), items_field=3)


def test_no_reference_leaks():
    key, value = "k" * 40, object()
    bag = Bag({key: value, "other": [value]})

    def every_walk(rounds):
        for _ in range(rounds):
            leaves, treedef = ftu.tree_flatten(bag)
            ftu.tree_unflatten(treedef, leaves)
            ftu.tree_flatten_with_path(bag)
            ftu.tree_map(lambda x: x, bag)
            _NODE.native_flatten(bag)
            _NODE.native_flatten_with_keys(bag)
            del leaves, treedef
        gc.collect()
        return sys.getrefcount(key), sys.getrefcount(value)

    # The first rounds fill the key caches (a DictKey per key is kept for reuse).
    assert every_walk(10) == every_walk(500)
