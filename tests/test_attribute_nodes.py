"""Attribute nodes (``fastree.register_attribute_node``, ``fastree._core.AttrNode``).

Pins: children read from instance storage (``__dict__`` or slots, never class attributes),
``GetAttrKey`` paths, the aux data layout (meta values; the extra-fields item), absent fields
(``missing`` or an AttributeError), rebuilding without ``__init__``, the same answers from JAX's
functions (which run the node's C callables) and fastree's, the checker protocol integrations use
(first instances checked, fallback to the library's functions), every bad input's error, and
references (no leak, GC-visible).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import weakref

import fastree
import fastree.tree_util as ftu
import jax
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from fastree import _core
from fastree.diagnostics import aux as _aux

# The aux_data checks are under test here: on in installed runs too (conftest.py).
AUX_CHECKS = "warn"

MISSING = type("Missing", (), {"__repr__": lambda self: "MISSING"})()


def _plain_class(name="Plain"):
    class Plain:
        def __init__(self, **kwargs):
            self.inits = getattr(self, "inits", 0) + 1
            for k, v in kwargs.items():
                setattr(self, k, v)

        def __eq__(self, other):
            return type(self) is type(other) and vars(self) == vars(other)

    Plain.__name__ = Plain.__qualname__ = name
    return Plain


@dataclasses.dataclass(frozen=True)
class Dense:
    weight: object
    bias: object
    activation: str


fastree.register_attribute_node(Dense, ["weight", "bias"], ["activation"])


def test_flatten_agrees_between_fastree_and_jax():
    layer = Dense([1.0, 2.0], 3.0, "relu")
    for flatten in (ftu.tree_flatten, jtu.tree_flatten):
        leaves, treedef = flatten(layer)
        assert leaves == [1.0, 2.0, 3.0]
        assert treedef.node_data() == (Dense, ("relu",))
    assert str(ftu.tree_structure(layer)) == str(jtu.tree_structure(layer))
    fpaths = [(p, x) for p, x in ftu.tree_flatten_with_path(layer)[0]]
    jpaths = [(p, x) for p, x in jtu.tree_flatten_with_path(layer)[0]]
    assert fpaths == jpaths
    assert fpaths[0][0] == (jtu.GetAttrKey("weight"), jtu.SequenceKey(0))


def test_rebuild_skips_init_and_frozen_setattr():
    layer = Dense(1.0, 2.0, "tanh")
    for unflatten, flatten in ((ftu.tree_unflatten, ftu.tree_flatten),
                               (jtu.tree_unflatten, jtu.tree_flatten)):
        leaves, treedef = flatten(layer)
        rebuilt = unflatten(treedef, [10.0, 20.0])
        assert rebuilt == Dense(10.0, 20.0, "tanh")
        assert list(vars(rebuilt)) == ["weight", "bias", "activation"]
    assert ftu.tree_map(lambda x: -x, layer) == Dense(-1.0, -2.0, "tanh")
    assert jtu.tree_map(lambda x: -x, layer) == Dense(-1.0, -2.0, "tanh")
    cls = _plain_class()
    fastree.register_attribute_node(cls, ["a"])
    rebuilt = ftu.tree_map(lambda x: x, cls(a=1))
    assert "inits" not in vars(rebuilt)  # __init__ did not run


def test_meta_values_decide_treedef_equality():
    a, b, c = Dense(1, 2, "relu"), Dense(3, 4, "relu"), Dense(1, 2, "gelu")
    assert ftu.tree_structure(a) == ftu.tree_structure(b)
    assert ftu.tree_structure(a) != ftu.tree_structure(c)
    assert jtu.tree_structure(a) == jtu.tree_structure(b)
    assert jtu.tree_structure(a) != jtu.tree_structure(c)


def test_reads_instance_storage_not_class_attributes():
    cls = _plain_class()
    cls.b = "class default"
    fastree.register_attribute_node(cls, ["a", "b"], missing=MISSING)
    obj = cls(a=1)
    assert ftu.tree_leaves(obj) == jtu.tree_leaves(obj) == [1, MISSING]  # the class's b unread
    children, aux = _core.attribute_node(cls).flatten(obj)
    assert children == (1, MISSING)
    rebuilt = ftu.tree_unflatten(ftu.tree_structure(obj), ftu.tree_leaves(obj))
    assert "b" not in vars(rebuilt) and rebuilt.b == "class default"


def test_absent_field_without_missing_is_an_attribute_error():
    cls = _plain_class("NoMissing")
    fastree.register_attribute_node(cls, ["a", "b"])
    for flatten in (ftu.tree_leaves, jtu.tree_leaves):
        with pytest.raises(AttributeError, match=r"NoMissing instance has no attribute 'b'"):
            flatten(cls(a=1))


def test_extra_fields_item():
    cls = _plain_class("Wrapped")
    fastree.register_attribute_node(cls, ["a"], ["s"], missing=MISSING,
                                    extra_fields=("__doc__", "__wrapped__"))
    node = _core.attribute_node(cls)
    regular = cls.__new__(cls)
    object.__setattr__(regular, "a", 1)
    object.__setattr__(regular, "s", "x")
    assert node.flatten(regular) == ((1,), (MISSING, "x"))
    wrapped = cls.__new__(cls)
    vars(wrapped).update(a=1, s="x", __wrapped__=len)
    assert node.flatten(wrapped) == ((1,), ((MISSING, len), "x"))
    rebuilt = node.unflatten(((MISSING, len), "x"), (2,))
    assert vars(rebuilt) == {"a": 2, "__doc__": MISSING, "__wrapped__": len, "s": "x"}
    assert jtu.tree_structure(wrapped) != jtu.tree_structure(regular)
    with pytest.raises(ValueError, match="extra fields' aux item"):
        node.unflatten(((1,), "x"), (2,))


def test_slots():
    class Slotted:
        __slots__ = ("a", "b", "meta")

    fastree.register_attribute_node(Slotted, ["a", "b"], ["meta"], missing=None)
    obj = Slotted()
    obj.a, obj.meta = [1, 2], "m"
    assert ftu.tree_leaves(obj) == [1, 2]
    assert jtu.tree_leaves(obj) == [1, 2]
    rebuilt = ftu.tree_map(lambda x: x + 1, obj)
    assert rebuilt.a == [2, 3] and rebuilt.meta == "m" and not hasattr(rebuilt, "b")


def test_class_with_its_own_new_goes_through_object_new():
    class WithNew:
        def __new__(cls, *args):
            return super().__new__(cls)

    fastree.register_attribute_node(WithNew, ["x"])
    obj = WithNew()
    obj.x = 5
    assert ftu.tree_map(lambda v: v * 2, obj).x == 10

    class IntBased(int):
        pass

    fastree.register_attribute_node(IntBased, ["x"])
    node = _core.attribute_node(IntBased)
    with pytest.raises(TypeError, match=r"object\.__new__\(IntBased\) is not safe"):
        node.unflatten((), (1,))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((1, ["a"]), {}, TypeError, "expected a class"),
        ((object, [1]), {}, TypeError, "data_fields must be str"),
        ((object, ["a"], ["a"]), {}, ValueError, "named twice"),
        ((object, ["a"]), {"extra_fields": ["b"]}, TypeError, "needs a `missing`"),
        ((object, 5), {}, TypeError, "not iterable"),
    ],
)
def test_bad_layouts(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        _core.AttrNode(*args, **kwargs)


def test_bad_calls_of_the_callables():
    node = _core.attribute_node(Dense)
    with pytest.raises(TypeError, match="expected an instance of it, got int"):
        node.flatten(3)
    with pytest.raises(ValueError, match="expected 2 children, got 1"):
        node.unflatten(("relu",), (1,))
    with pytest.raises(ValueError, match="aux data a tuple of 1 items"):
        node.unflatten(("relu", "extra"), (1, 2))
    with pytest.raises(ValueError, match="aux data a tuple of 1 items"):
        node.unflatten("relu", (1, 2))
    with pytest.raises(TypeError, match="children must be a sequence"):
        node.unflatten(("relu",), 5)
    with pytest.raises(TypeError, match="got 1 arguments"):
        node.unflatten(("relu",))
    leaf = ftu.tree_structure(1)
    build = _core.PyTreeDef.from_node_data_and_children
    with pytest.raises(ValueError, match="expects 2 children, got 1"):
        build((Dense, ("relu",)), [leaf])
    with pytest.raises(ValueError, match="aux data a tuple of 1 items"):
        build((Dense, ()), [leaf, leaf])
    assert build((Dense, ("relu",)), [leaf, leaf]) == ftu.tree_structure(Dense(1, 2, "relu"))


def test_flatten_up_to_and_one_level_match_jax():
    layer = Dense([1, 2], 3, "relu")
    treedef = jtu.tree_structure(Dense(0, 0, "relu"))
    assert ftu.tree_structure(Dense(0, 0, "relu")).flatten_up_to(layer) == [[1, 2], 3]
    assert treedef.flatten_up_to(layer) == [[1, 2], 3]
    with pytest.raises(ValueError, match="Mismatch custom node data"):
        ftu.tree_structure(Dense(0, 0, "gelu")).flatten_up_to(layer)
    assert ftu.flatten_one_level(layer) == ((([1, 2], 3)), ("relu",))
    if hasattr(jtu, "flatten_one_level"):  # (JAX 0.7+)
        assert jtu.flatten_one_level(layer)[1] == ("relu",)


def test_values_are_read_before_children_are_visited():
    # The library functions read every field, then JAX walks; the native node does the same.
    cls = _plain_class("Mutated")
    fastree.register_attribute_node(cls, ["a", "b"])

    def is_leaf(x):
        if x == "first":
            obj.b = "changed"
        return False

    for leaves in (ftu.tree_leaves, jtu.tree_leaves):
        obj = cls(a="first", b="second")
        assert leaves(obj, is_leaf=is_leaf) == ["first", "second"]


def test_checker_protocol_and_fallback():
    cls = _plain_class("Checked")
    node = _core.AttrNode(cls, ["a"])
    calls = []

    def library_flatten(obj):
        return (obj.a,), ()

    def library_flatten_with_keys(obj):
        return ((jtu.GetAttrKey("a"), obj.a),), ()

    def library_unflatten(aux, children):
        out = cls.__new__(cls)
        out.a = children[0]
        out.via_library = True
        return out

    verdicts = iter([True, False])

    def checker(obj):
        calls.append(obj)
        return next(verdicts)

    node.check_with(checker, library_flatten, library_flatten_with_keys, library_unflatten,
                    checks=3)
    jtu.register_pytree_with_keys(cls, node.flatten_with_keys, node.unflatten, node.flatten)
    _core.register_attribute_node(node)
    first, second, third = cls(a=1), cls(a=2), cls(a=3)
    assert ftu.tree_leaves(first) == [1] and node.checks_left == 2
    assert not node.use_library
    assert ftu.tree_leaves(second) == [2]  # checker says "differs": library from now on
    assert node.use_library and node.checks_left == 0
    assert len(calls) == 2
    assert _core.attribute_node(cls) is None  # fastree's registry now holds the library's
    assert getattr(ftu.tree_map(lambda x: x, third), "via_library", False)
    assert getattr(jtu.tree_map(lambda x: x, third), "via_library", False)
    assert len(calls) == 2


def test_checker_interrupt_propagates():
    cls = _plain_class("Interrupted")
    node = _core.AttrNode(cls, ["a"])

    def checker(obj):
        raise KeyboardInterrupt

    node.check_with(checker, node.native_flatten, node.native_flatten_with_keys,
                    node.native_unflatten)
    _core.register_attribute_node(node)
    with pytest.raises(KeyboardInterrupt):
        ftu.tree_leaves(cls(a=1))
    assert not node.use_library


def test_use_library_needs_library_functions():
    node = _core.AttrNode(_plain_class(), ["a"])
    with pytest.raises(ValueError, match="no library functions"):
        node.use_library = True


def test_no_reference_leaks():
    leaf = object()
    layer = Dense(leaf, leaf, "relu")
    for _ in range(10):
        jtu.tree_unflatten(*reversed(jtu.tree_flatten(layer)))
    before = sys.getrefcount(leaf)
    for _ in range(1000):
        leaves, treedef = ftu.tree_flatten(layer)
        ftu.tree_unflatten(treedef, leaves)
        jtu.tree_unflatten(*reversed(jtu.tree_flatten(layer)))
        ftu.tree_map(lambda x: x, layer)
        ftu.tree_flatten_with_path(layer)
        del leaves, treedef
    assert sys.getrefcount(leaf) == before


def test_node_in_a_cycle_is_collected():
    class Holder:
        pass

    holder = Holder()
    node = _core.AttrNode(Holder, ["a"], missing=holder)
    holder.node = node  # node -> holder -> node
    dead = weakref.ref(holder)
    del holder, node
    gc.collect()
    assert dead() is None


def test_jit_accepts_attribute_nodes():
    layer = Dense(jax.numpy.ones(2), jax.numpy.zeros(2), "relu")
    out = jax.jit(lambda d: jtu.tree_map(lambda x: x + 1, d))(layer)
    assert isinstance(out, Dense) and out.activation == "relu"
    assert out.weight.tolist() == [2.0, 2.0]


def test_treedef_converts_to_jax_and_back():
    layer = Dense([1, 2], 3, "relu")
    treedef = ftu.tree_structure(layer)
    assert treedef.to_jax() == jtu.tree_structure(layer)
    assert fastree.from_jax(jtu.tree_structure(layer)) == treedef


def test_audit_lists_attribute_nodes():
    report = fastree.audit(Dense([1, 2], 3, "relu"))
    assert [entry.node_type for entry in report.entries] == [Dense]


def test_children_given_as_a_list_are_copied_first():
    cls = _plain_class("Listed")
    node = _core.AttrNode(cls, ["a", "b"])
    children = [1, 2]

    class Shrinking:
        def __set_name__(self, owner, name):
            self.name = name

        def __get__(self, obj, owner=None):
            return self if obj is None else obj.__dict__[self.name]

        def __set__(self, obj, value):
            children.clear()  # the list the caller passed, emptied mid-rebuild
            obj.__dict__[self.name] = value

    cls.a = Shrinking()
    cls.a.__set_name__(cls, "a")
    rebuilt = node.unflatten((), children)
    assert (rebuilt.a, rebuilt.b) == (1, 2)


def test_aux_checks_see_a_shared_aux_tuple_change_inside():
    # The node hands out one aux tuple while the static values are the same objects, and checks
    # it once per epoch only when nothing inside can change: a list inside is walked every time.
    import numpy as np

    class Static:
        def __init__(self, a, config):
            self.a, self.config = a, config

    cls = Static
    fastree.register_attribute_node(cls, ["a"], ["config"])
    config = [1, 2]
    obj = cls(a=1.0, config=config)
    ftu.tree_flatten(obj)
    assert ftu.tree_structure(obj).node_data()[1] is ftu.tree_structure(obj).node_data()[1]
    config.append(np.ones(2))
    _aux._reset_warnings()  # (it warns once per node type and problem)
    with pytest.warns(fastree.AuxDataWarning):
        ftu.tree_flatten(obj)
    frozen = cls(a=1.0, config=(1, np.ones(2)))
    for _ in range(2):  # a report never stamps the tuple: it is looked at again
        _aux._reset_warnings()
        with pytest.warns(fastree.AuxDataWarning):
            ftu.tree_flatten(frozen)
    _aux._reset_warnings()
    plain = cls(a=1.0, config=(1, "x"))
    ftu.tree_flatten(plain)
    with fastree.strict_aux(), pytest.raises(TypeError, match="ndarray"):
        ftu.tree_flatten(cls(a=1.0, config=(1, np.ones(2))))


def test_preserve_identity():
    cls = _plain_class("Shared")
    fastree.register_attribute_node(cls, ["a"], preserve_identity=True)
    inner = cls(a=[1])
    tree = [inner, inner]
    rebuilt = ftu.tree_map(lambda x: x + 1, tree)
    assert rebuilt[0] is rebuilt[1] and rebuilt[0].a == [2]
    assert ftu.tree_leaves(tree) == [1]
    jax_leaves = fastree.original("jax.tree_util.tree_leaves")  # JAX's, installed or not
    assert jax_leaves(tree) == [1, 1]  # JAX sees one node per path, each over the leaves
