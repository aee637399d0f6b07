"""What an attribute node keeps between reads, and that it never changes an answer.

Two layouts remember their last read (csrc/attr): a meta_items node (flax.nnx's Variable) hands
out its last aux tuple again while a metadata dict holds the very same keys and immortal values,
and a mapping node (flax.nnx's Pytree) reuses the sorted order and name tuples of the last
instance whose ``__dict__`` held the same names with the same flags. Each read must still give
what a fresh read gives, follow every change of the instance, and keep alive no value the
instance itself would let go.
"""

from __future__ import annotations

import gc
import random
import weakref

from fastree import _core


class Flags:
    def __init__(self, mapping):
        self._mapping = dict(mapping)


class Holder:
    _pytree__has_int_keys = False


class Var:
    __slots__ = ("_raw_value", "_var_metadata")

    @classmethod
    def _new(cls, value, metadata):
        obj = object.__new__(cls)
        obj._raw_value, obj._var_metadata = value, metadata
        return obj


class Big:
    """A value worth noticing if it were kept alive."""


def _var_node():
    return _core.AttrNode(
        Var, ("_raw_value",), ("_var_metadata",), meta_items=True, key_names=("value",),
        rebuild_with="_new",
    )


def _mapping_node():
    return _core.AttrNode(
        Holder, (), mapping=("_pytree__nodes", Flags, "_mapping", "_pytree__has_int_keys")
    )


def _holder(flags, attrs):
    obj = object.__new__(Holder)
    obj.__dict__["_pytree__nodes"] = Flags(flags)
    obj.__dict__.update(attrs)
    return obj


def _expected_mapping(obj):
    # flax.nnx's Pytree flatten for str names: sorted names, split by the flags.
    names = sorted(vars(obj))
    flags = vars(obj)["_pytree__nodes"]._mapping
    data = [n for n in names if flags.get(n) is True]
    static = [n for n in names if flags.get(n) is not True]
    return tuple(vars(obj)[n] for n in data), (
        tuple(data), tuple(static), tuple(vars(obj)[n] for n in static))


def test_equal_immortal_metadata_gives_one_aux_tuple_in_any_insertion_order():
    node = _var_node()
    first = node.flatten(Var._new(1, {"ref": False, "hijax": False, "tag": None, "n": 3}))[1]
    second = node.flatten(Var._new(2, {"n": 3, "tag": None, "hijax": False, "ref": False}))[1]
    assert first == (("hijax", False), ("n", 3), ("ref", False), ("tag", None))
    assert second is first


def test_the_aux_follows_every_change_of_the_metadata():
    node = _var_node()
    meta = {"b": True, "a": None}
    v = Var._new(0, meta)
    assert node.flatten(v)[1] == (("a", None), ("b", True))
    meta["b"] = False
    assert node.flatten(v)[1] == (("a", None), ("b", False))
    meta["c"] = 7
    assert node.flatten(v)[1] == (("a", None), ("b", False), ("c", 7))
    del meta["a"]
    assert node.flatten(v)[1] == (("b", False), ("c", 7))
    meta["c"] = 10**30  # not a cached int: read, not kept
    big_aux = node.flatten(v)[1]
    assert big_aux == (("b", False), ("c", 10**30))
    assert node.flatten(v)[1] is not big_aux
    meta["c"] = 7
    assert node.flatten(v)[1] == (("b", False), ("c", 7))


def test_metadata_values_other_than_immortal_ones_are_not_kept_alive():
    node = _var_node()
    value = Big()
    dead = weakref.ref(value)
    v = Var._new(0, {"config": value, "flag": True})
    children, aux = node.flatten(v)
    assert aux == (("config", value), ("flag", True))
    del v, children, aux, value
    gc.collect()
    assert dead() is None


def test_a_rebuild_reads_metadata_pairs_as_dict_does():
    node = _var_node()
    rebuilt = node.unflatten((("a", 1), ("a", 2), ("b", 3)), (9,))
    assert rebuilt._var_metadata == {"a": 2, "b": 3}  # as dict() reads pairs: the last wins
    rebuilt = node.unflatten((["a", 1], ["b", 2]), (9,))  # not the node's own pairs
    assert rebuilt._var_metadata == {"a": 1, "b": 2}


def test_mapping_reads_follow_each_instance_layout():
    # A seeded walk through layouts that share names, flip flags, add, drop and reorder
    # attributes: each read must be what a fresh read gives.
    rng = random.Random(37)
    node = _mapping_node()
    names = ["w", "b", "name", "size", "extra"]
    for _ in range(300):
        chosen = rng.sample(names, rng.randint(0, len(names)))
        flags = {n: rng.random() < 0.5 for n in chosen if rng.random() < 0.9}
        obj = _holder(flags, {n: object() for n in chosen})
        children, aux = node.flatten(obj)
        assert (children, aux) == _expected_mapping(obj)


def test_a_flag_changed_on_the_same_layout_is_seen():
    node = _mapping_node()
    obj = _holder({"a": True, "b": True}, {"a": 1, "b": 2})
    assert node.flatten(obj) == ((1, 2), (("a", "b"), ("_pytree__nodes",), (obj._pytree__nodes,)))
    obj._pytree__nodes._mapping["b"] = False
    assert node.flatten(obj) == ((1,), (("a",), ("_pytree__nodes", "b"),
                                        (obj._pytree__nodes, 2)))


def test_instances_laid_out_alike_are_split_by_their_own_flags():
    # The memo also keeps the flags dict it was read with: an instance whose flags dict holds
    # the same names in the same order with the same flags is split without a lookup per name.
    # Any difference in that dict (a flag, the order, an extra or a missing name, an equal name
    # that is another str object) must still be read from the instance's own flags.
    node = _mapping_node()
    runtime_wt = "".join(["w", "t"])  # equal to "wt", another object
    variants = [
        {"wt": True, "bias": True, "size": False},
        {"wt": True, "bias": True, "size": False},
        {"wt": True, "bias": False, "size": False},
        {"bias": True, "wt": True, "size": False},
        {"wt": True, "bias": True, "size": False, "other": True},
        {"wt": True, "bias": True},
        {runtime_wt: False, "bias": True, "size": False},
        {runtime_wt: True, "bias": True, "size": False},
        {"wt": True, "bias": True, "size": True},
    ]
    for _ in range(3):
        for flags in variants:
            obj = _holder(flags, {"wt": object(), "bias": object(), "size": 3})
            assert node.flatten(obj) == _expected_mapping(obj)
            assert node.flatten_with_keys(obj)[1] == _expected_mapping(obj)[1]


def test_the_mapping_memo_keeps_no_value_alive():
    node = _mapping_node()
    value = Big()
    dead = weakref.ref(value)
    obj = _holder({"a": True}, {"a": 1, "config": value})
    children, aux = node.flatten(obj)
    assert aux[2][1] is value
    del obj, children, aux, value
    gc.collect()
    assert dead() is None
