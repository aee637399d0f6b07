"""flatten_one_level(_with_keys) on custom nodes: JAX's checks of the flatten output, JAX's shapes."""

import dataclasses

import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from helpers import assert_same_error, requires_jax

pytestmark = requires_jax("tree_util.flatten_one_level", "tree_util.flatten_one_level_with_keys")

KEY = jtu.GetAttrKey("a")

# name -> (keyless flatten or None, with-keys flatten or None)
MALFORMED = {
    "children_not_iterable": (lambda o: (5, None), None),
    "a_list_not_a_tuple": (lambda o: [[1], None], None),
    "three_items": (lambda o: ((1,), None, 3), None),
    "pairs_not_iterable": (None, lambda o: (5, None)),
    "keyed_list_not_a_tuple": (None, lambda o: [((KEY, 1),), None]),
}
WELL_FORMED = {
    "tuple_children": (lambda o: ((1, 2), "aux"), None),
    "list_children": (lambda o: ([1, 2], "aux"), None),
    "tuple_of_pairs": (None, lambda o: (((KEY, 1),), None)),
    "generator_of_pairs": (None, lambda o: (((KEY, c) for c in [1]), None)),
    "both_functions": (lambda o: ((1,), None), lambda o: (((KEY, 1),), None)),
}


def _register(name, flatten, flatten_with_keys):
    cls = type(name, (), {})
    if flatten_with_keys is None:
        tu.register_pytree_node(cls, flatten, lambda aux, children: cls())
    else:
        tu.register_pytree_with_keys(cls, flatten_with_keys, lambda aux, ch: cls(), flatten)
    return cls


MALFORMED_TYPES = {name: _register(name, *fns) for name, fns in MALFORMED.items()}
WELL_FORMED_TYPES = {name: _register(name, *fns) for name, fns in WELL_FORMED.items()}


@pytest.mark.parametrize("fn", ["flatten_one_level", "flatten_one_level_with_keys"])
@pytest.mark.parametrize("name", MALFORMED_TYPES)
def test_malformed_flatten_output_raises_jax_error(name, fn):
    if name == "keyed_list_not_a_tuple" and fn == "flatten_one_level":
        # the keyless flatten derived from it unpacks the list and so accepts it, in both
        obj = MALFORMED_TYPES[name]()
        assert tu.flatten_one_level(obj) == jtu.flatten_one_level(obj) == ([1], None)
        return
    obj = MALFORMED_TYPES[name]()
    assert_same_error(lambda: getattr(jtu, fn)(obj), lambda: getattr(tu, fn)(obj))
    assert_same_error(
        lambda: getattr(jtu.default_registry, fn)(obj),
        lambda: getattr(tu.default_registry, fn)(obj),
    )


def test_key_pair_that_is_not_a_pair():
    # JAX's text here is garbled ("... tuple where 'child1"); fastree keeps JAX's type and
    # prefix and says what is wrong.
    bad = _register("bad_pairs", None, lambda o: ((1, 2), None))
    with pytest.raises(ValueError) as jax_error:
        jtu.flatten_one_level_with_keys(bad())
    with pytest.raises(ValueError, match=r"holds \(key, child\) pairs, got 1") as error:
        tu.flatten_one_level_with_keys(bad())
    prefix = "The to_iterable_with_keys function for a custom PyTree node should return a"
    assert str(jax_error.value).startswith(prefix) and str(error.value).startswith(prefix)


@pytest.mark.parametrize("fn", ["flatten_one_level", "flatten_one_level_with_keys"])
@pytest.mark.parametrize("cls", WELL_FORMED_TYPES.values(), ids=WELL_FORMED_TYPES.keys())
def test_well_formed_output_has_jax_shape(cls, fn):
    obj = cls()
    got, expected = getattr(tu, fn)(obj), getattr(jtu, fn)(obj)
    assert type(got[0]) is type(expected[0])  # e.g. pairs always come back as a list
    assert list(got[0]) == list(expected[0])
    assert got[1] == expected[1]


def test_register_static_children_are_a_list_as_in_jax():
    @tu.register_static
    class Mode(str):
        pass

    for fn in ("flatten_one_level", "flatten_one_level_with_keys"):
        assert getattr(tu, fn)(Mode("a")) == getattr(jtu, fn)(Mode("a")) == ([], "a")


def test_jax_only_dataclass_answers_as_jax_does():
    @dataclasses.dataclass
    class OnlyJax:
        x: int
        s: str

    jtu.register_dataclass(OnlyJax, data_fields=["x"], meta_fields=["s"])
    obj = OnlyJax(1, "s")
    for fn in ("flatten_one_level", "flatten_one_level_with_keys"):
        assert getattr(tu, fn)(obj) == getattr(jtu, fn)(obj)
        assert type(getattr(tu, fn)(obj)[0]) is list
