"""The public names and signatures of fastree.tree_util / fastree.tree match JAX's."""

import dataclasses
import inspect
import subprocess
import sys

import fastree
import fastree.tree as ft
import fastree.tree_util as tu
import pytest
from fastree.jax_interop.compat import tree as jt  # JAX's own objects, also with fastree installed
from fastree.jax_interop.compat import tree_util as jtu
from helpers import requires_jax, skip_unless_classes_are_collectable

JAX_TREE_UTIL_NAMES = sorted(n for n in dir(jtu) if not n.startswith("_"))
JAX_TREE_NAMES = sorted(n for n in dir(jt) if not n.startswith("_"))

# names whose object must be JAX's very own (users isinstance them or pass them to JAX)
SHARED_OBJECTS = ["DictKey", "SequenceKey", "GetAttrKey", "FlattenedIndexKey", "Partial"]


def _callables(module, names):
    return [n for n in names if inspect.isfunction(getattr(module, n))]


def test_jax_names_nonempty():
    # guards the parametrizations below against silently testing nothing
    assert "tree_flatten" in JAX_TREE_UTIL_NAMES
    assert "flatten" in JAX_TREE_NAMES


def test_tree_util_covers_jax_names():
    missing = [n for n in JAX_TREE_UTIL_NAMES if not hasattr(tu, n)]
    assert missing == []


def test_tree_covers_jax_names():
    missing = [n for n in JAX_TREE_NAMES if not hasattr(ft, n)]
    assert missing == []


@pytest.mark.parametrize("name", SHARED_OBJECTS)
def test_shared_objects_are_jax_objects(name):
    assert getattr(tu, name) is getattr(jtu, name)


@pytest.mark.parametrize("name", ["KeyEntry", "KeyPath"])
def test_type_aliases_match(name):
    assert getattr(tu, name) == getattr(jtu, name)


def test_pytreedef_is_fastree_class():
    td = tu.tree_structure({"a": 1})
    assert isinstance(td, fastree.PyTreeDef)
    assert isinstance(td, tu.PyTreeDef)
    assert not isinstance(td, jtu.PyTreeDef)
    assert isinstance(ft.structure([1]), fastree.PyTreeDef)


@pytest.mark.parametrize(
    "method",
    [
        "children",
        "unflatten",
        "flatten_up_to",
        "compose",
        "walk",
        "node_data",
        "from_node_data_and_children",
        "from_iterable_tree",
        "to_jax",
        "serialize_using_proto",
        "deserialize_using_proto",
    ],
)
def test_pytreedef_methods_present(method):
    assert callable(getattr(fastree.PyTreeDef, method))


def test_pytreedef_has_every_public_jax_pytreedef_attribute():
    missing = [
        n for n in dir(jtu.PyTreeDef) if not n.startswith("_") and not hasattr(fastree.PyTreeDef, n)
    ]
    assert missing == []


def test_from_jax_present():
    assert callable(fastree.from_jax)


def _default_matches(got, expected):
    if expected is inspect.Parameter.empty or isinstance(
        expected, (type(None), bool, int, str, tuple)
    ):
        return got == expected and type(got) is type(expected)
    # sentinels such as jax's ``Unspecified()``: the same kind of sentinel
    return type(got).__name__ == type(expected).__name__


# fastree's documented extensions of JAX's signatures: the identity-preserving opt-in, a
# keyword-only flag whose default keeps JAX's semantics, and (for the class decorators and
# register_dataclass) a first argument that may be omitted to use the function as a decorator
# factory, e.g. ``@register_dataclass(preserve_identity=True)``.
EXTRA_KEYWORDS = {
    "register_pytree_node": {"preserve_identity": False},
    "register_pytree_with_keys": {"preserve_identity": False},
    "register_pytree_node_class": {"preserve_identity": False},
    "register_pytree_with_keys_class": {"preserve_identity": False},
    "register_dataclass": {"preserve_identity": False},
}
FACTORY_FIRST_ARG = {"register_pytree_node_class", "register_pytree_with_keys_class",
                     "register_dataclass"}


def _assert_same_parameters(fast_fn, jax_fn):
    fp = dict(inspect.signature(fast_fn).parameters)
    jp = inspect.signature(jax_fn).parameters
    name = getattr(jax_fn, "__name__", "")
    for extra, default in EXTRA_KEYWORDS.get(name, {}).items():
        param = fp.pop(extra)
        assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is default
    assert list(fp) == list(jp)
    for i, pname in enumerate(jp):
        assert fp[pname].kind == jp[pname].kind, pname
        if i == 0 and name in FACTORY_FIRST_ARG:
            assert fp[pname].default is None
            continue
        assert _default_matches(fp[pname].default, jp[pname].default), (
            pname,
            fp[pname].default,
            jp[pname].default,
        )


@pytest.mark.parametrize("name", _callables(jtu, JAX_TREE_UTIL_NAMES))
def test_tree_util_signature(name):
    _assert_same_parameters(getattr(tu, name), getattr(jtu, name))


@pytest.mark.parametrize("name", _callables(jt, JAX_TREE_NAMES))
def test_tree_signature(name):
    _assert_same_parameters(getattr(ft, name), getattr(jt, name))


@requires_jax("tree.static")
def test_static_field():
    fj, ff = jt.static(default=3), ft.static(default=3)
    assert isinstance(ff, dataclasses.Field)
    assert dict(ff.metadata) == dict(fj.metadata) == {"static": True}
    assert ff.default == fj.default == 3
    fj, ff = jt.static(metadata={"doc": "x"}), ft.static(metadata={"doc": "x"})
    assert dict(ff.metadata) == dict(fj.metadata)


@pytest.mark.parametrize(
    "stmt",
    [
        "import fastree",
        "import fastree.tree_util",
        "import fastree.tree",
        "import fastree, jax; fastree.tree_util.tree_flatten({'a': (1, None)})",
    ],
)
def test_import_is_warning_free(stmt):
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", stmt],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "module",
    [
        "fastree",
        "fastree.tree_util",
        "fastree.tree",
        "fastree._registration",
        "fastree.jax_interop.default_registry",
        "fastree.jax_interop.bridge",
        "fastree._identity",
        "fastree._jit",
        "fastree._argument_checks",
        "fastree.integrations",
        "fastree.integrations._flax_nnx_graph_replay",
        "fastree.integrations._flax_nnx_graph_user_code",
        "fastree.integrations._flax_nnx_graph_kinds",
    ],
)
def test_docstring_examples(module):
    import doctest
    import importlib

    if module.endswith("_flax_nnx_graph_kinds"):
        skip_unless_classes_are_collectable()  # its TypeTable example prunes a class that died
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
