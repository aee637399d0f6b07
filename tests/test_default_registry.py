"""``tree_util.default_registry`` and ``PyTreeDef.(de)serialize_using_proto``, against JAX's."""

import collections
import dataclasses
import pickle

import fastree
import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import numpy as np
import pytest
from helpers import (
    NT,
    PREDICATES,
    TREES,
    TREE_DICT,
    TREE_IDS,
    assert_leaves_identical,
    assert_same_error,
    assert_same_treedef,
    is_leaf_grid,
    requires_jax,
    stable_id,
)

REG = tu.default_registry
JREG = jtu.default_registry

# JAX's registry keys a namedtuple's children all with the first field's name; fastree gives
# each child its own field name, as JAX's tree_flatten_with_path does (tested in test_paths).
NAMEDTUPLE_IDS = {i for i in TREE_IDS if i.startswith("namedtuple") and i != "namedtuple_empty"}


def _one_level_equal(got, expected):
    if expected is None:
        assert got is None
        return
    (g_children, g_data), (e_children, e_data) = got, expected
    assert_leaves_identical(list(g_children), list(e_children))
    assert g_data == e_data


@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_flatten_one_level_matches_jax_registry(tree):
    _one_level_equal(REG.flatten_one_level(tree), JREG.flatten_one_level(tree))


@requires_jax("default_registry.flatten_one_level_with_keys")
@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_flatten_one_level_with_keys_matches_jax_registry(tree, request):
    got, expected = REG.flatten_one_level_with_keys(tree), JREG.flatten_one_level_with_keys(tree)
    if expected is None:
        assert got is None
        return
    (g_pairs, g_data), (e_pairs, e_data) = got, expected
    g_pairs, e_pairs = list(g_pairs), list(e_pairs)
    assert_leaves_identical([c for _, c in g_pairs], [c for _, c in e_pairs])
    assert g_data == e_data
    if request.node.callspec.id not in NAMEDTUPLE_IDS:
        assert [k for k, _ in g_pairs] == [k for k, _ in e_pairs]


def test_namedtuple_keys_name_each_field():
    pairs, _ = REG.flatten_one_level_with_keys(NT(1, 2))
    assert [k for k, _ in pairs] == [jtu.GetAttrKey("a"), jtu.GetAttrKey("b")]


@pytest.mark.parametrize("tree", [1, "s", np.zeros(2), object()], ids=stable_id)
def test_flatten_one_level_of_a_leaf_is_none_not_an_error(tree):
    assert JREG.flatten_one_level(tree) is None
    assert REG.flatten_one_level(tree) is None
    assert REG.flatten_one_level_with_keys(tree) is None
    with pytest.raises(ValueError, match="can't tree-flatten type"):
        tu.flatten_one_level(tree)


# is_leaf_grid leaves out the items whose predicate is False wherever `never` is asked: the
# tree's `never` item covers their code path (tests/helpers.py says why).
@is_leaf_grid(dict(zip(TREE_IDS, TREES)), PREDICATES, names=("tree", "pred"))
def test_flatten_matches_jax_registry(tree, pred):
    leaves, treedef = REG.flatten(tree, pred)
    j_leaves, j_treedef = JREG.flatten(tree, pred)
    assert_leaves_identical(leaves, j_leaves)
    assert_same_treedef(treedef, j_treedef)
    assert isinstance(treedef, fastree.PyTreeDef)


@requires_jax("default_registry.flatten_with_path")
@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_flatten_with_path_calls_the_predicate_as_jax_does(tree):
    def recorder(calls, answer):
        def predicate(path, x):
            calls.append((path, x))
            return answer(path, x)

        return predicate

    def answer(path, x):
        return len(path) == 1  # stop one level down

    got_calls, jax_calls = [], []
    got, treedef = REG.flatten_with_path(tree, recorder(got_calls, answer))
    expected, j_treedef = JREG.flatten_with_path(tree, recorder(jax_calls, answer))
    assert [p for p, _ in got_calls] == [p for p, _ in jax_calls]
    assert_leaves_identical([x for _, x in got_calls], [x for _, x in jax_calls])
    assert [p for p, _ in got] == [p for p, _ in expected]
    assert_leaves_identical([x for _, x in got], [x for _, x in expected])
    assert_same_treedef(treedef, j_treedef)


def test_flatten_with_path_without_predicate():
    tree = {"a": (1, [2]), "b": None}
    assert REG.flatten_with_path(tree)[0] == JREG.flatten_with_path(tree)[0]


@requires_jax("default_registry.is_node")
@pytest.mark.parametrize(
    "typ",
    [
        int,
        str,
        tuple,
        list,
        dict,
        type(None),
        NT,
        collections.OrderedDict,
        collections.defaultdict,
        jtu.Partial,
        np.ndarray,
        object,
    ],
    ids=lambda t: t.__name__,
)
def test_is_node_matches_jax_registry(typ):
    assert REG.is_node(typ) is JREG.is_node(typ)


@requires_jax("default_registry.is_node")
@pytest.mark.parametrize("obj", [1, (1, 2), "a", {}], ids=stable_id)
def test_is_node_of_a_non_type_is_false(obj):
    assert REG.is_node(obj) is JREG.is_node(obj) is False


@requires_jax("default_registry.is_node")
def test_is_node_of_none_is_a_type_error():
    with pytest.raises(TypeError):
        JREG.is_node(None)
    with pytest.raises(TypeError, match="expects a type"):
        REG.is_node(None)


@requires_jax("default_registry.is_node")
def test_register_node_works_in_fastree_and_in_jax():
    class Cell:
        def __init__(self, a, b):
            self.a, self.b = a, b

    assert not REG.is_node(Cell)
    REG.register_node(
        Cell,
        lambda c: ((c.a, c.b), "cell"),
        lambda aux, ch: Cell(*ch),
        lambda c: (((jtu.GetAttrKey("a"), c.a), (jtu.GetAttrKey("b"), c.b)), "cell"),
    )
    assert REG.is_node(Cell) and JREG.is_node(Cell) and tu.is_tree_node(Cell)
    tree = [Cell(1, {"x": 2}), 3]
    leaves, treedef = tu.tree_flatten(tree)
    j_leaves, j_treedef = jtu.tree_flatten(tree)
    assert leaves == j_leaves == [1, 2, 3]
    assert_same_treedef(treedef, j_treedef)
    rebuilt = tu.tree_unflatten(treedef, [10, 20, 30])
    assert isinstance(rebuilt[0], Cell) and rebuilt[0].a == 10 and rebuilt[0].b == {"x": 20}
    assert [p for p, _ in tu.tree_flatten_with_path(tree)[0]] == [
        p for p, _ in jtu.tree_flatten_with_path(tree)[0]
    ]


def test_register_node_twice_raises_jax_error():
    class Twice:
        pass

    REG.register_node(Twice, lambda t: ((), None), lambda aux, ch: Twice())
    with pytest.raises(ValueError, match="Duplicate custom PyTreeDef type registration"):
        REG.register_node(Twice, lambda t: ((), None), lambda aux, ch: Twice())


def test_register_dataclass_node():
    @dataclasses.dataclass
    class Layer:
        w: object
        name: str

    REG.register_dataclass_node(Layer, ["w"], ["name"])
    tree = {"l": Layer(np.ones(2), "dense")}
    leaves, treedef = tu.tree_flatten(tree)
    j_leaves, j_treedef = jtu.tree_flatten(tree)
    assert_leaves_identical(leaves, j_leaves)
    assert_same_treedef(treedef, j_treedef)
    rebuilt = tu.tree_unflatten(treedef, [5])
    assert rebuilt == {"l": Layer(5, "dense")}


def test_registry_is_usable_where_jax_takes_a_registry():
    treedef = tu.tree_structure({"a": (1, 2)})
    rebuilt = fastree.PyTreeDef.from_node_data_and_children(
        REG, treedef.node_data(), treedef.children()
    )
    assert rebuilt == treedef


def test_registry_pickles_as_the_one_instance_and_has_a_readable_repr():
    assert pickle.loads(pickle.dumps(REG)) is REG
    assert repr(REG) == "fastree.tree_util.default_registry"


# ---- PyTreeDef.serialize_using_proto / deserialize_using_proto

PROTO_TREES = {
    "leaf": 1,
    "none": None,
    "nested": {"a": (1, None, [2, 3]), "b": {"x": 1}, "c": []},
    "empty_dict": {},
    "tuple": (1, (2, (3,))),
}


@pytest.mark.parametrize("tree", list(PROTO_TREES.values()), ids=list(PROTO_TREES))
def test_proto_bytes_are_jax_bytes_and_round_trip(tree):
    treedef = tu.tree_structure(tree)
    data = treedef.serialize_using_proto()
    assert data == jtu.tree_structure(tree).serialize_using_proto()
    for registry in (REG, JREG):
        back = fastree.PyTreeDef.deserialize_using_proto(registry, data)
        assert isinstance(back, fastree.PyTreeDef)
        assert back == treedef


@pytest.mark.parametrize(
    "tree",
    [
        TREE_DICT["namedtuple"],
        TREE_DICT["ordered_dict"],
        TREE_DICT["pair"],
        {1: 2},
        {(1, 2): 3},
    ],
    ids=["namedtuple", "ordered_dict", "custom", "int_key", "tuple_key"],
)
def test_proto_rejects_what_jax_rejects(tree):
    assert_same_error(
        lambda: jtu.tree_structure(tree).serialize_using_proto(),
        lambda: tu.tree_structure(tree).serialize_using_proto(),
    )


def test_proto_garbage_raises_jax_error():
    assert_same_error(
        lambda: jtu.PyTreeDef.deserialize_using_proto(JREG, b"\xff not a proto"),
        lambda: fastree.PyTreeDef.deserialize_using_proto(REG, b"\xff not a proto"),
    )
