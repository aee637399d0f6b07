"""What changed between JAX releases, followed: fastree behaves as the installed JAX does.

Each behaviour below differs between supported JAX releases; fastree decides each one in
``fastree.jax_interop.compat`` (a probe of the installed JAX, or its version where nothing can be asked)
and these tests compare fastree with the installed JAX directly, so they pass on every JAX in the
supported range and fail wherever the two disagree:

* the DeprecationWarning jaxlib 0.10.1+ gives for iterable leaves (iterators, generators,
  ``dict_values``), per type and per entry point, silenced by ``is_leaf`` as in JAX;
* ``register_dataclass``'s derived fields with ``drop_fields`` (jax 0.11.1+ leaves them out);
* the child keys printed by tree_map's "different numbers of pytree children" explanation;
* the version parsing and probes themselves (a probe that JAX answers with an unexpected
  exception must not break ``import fastree``: jax 0.4.36-0.6.1);
* key-path entries past the key cache are made without jaxlib's flatten route (which crashes
  when memory runs out), and a failed memory probe is a ``MemoryError``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import fastree.tree as ftree
import fastree.tree_util as tu
import jax
import pytest
from fastree.jax_interop import compat as _jax_compat
from fastree.jax_interop import key_makers as _key_makers
from fastree.jax_interop.compat import tree_util as jtu
from helpers import assert_same_error

# ------------------------------------------------------------------------------------------------
# iterable leaves


def _candidates() -> dict[str, Any]:
    # Fresh objects per call: iterators are consumed by nothing here, but each entry point gets
    # its own to keep the cases independent.
    mapping = {"a": 1}

    def generator():
        yield 1

    class MapSubclass(map):
        pass

    return {
        "list_iterator": iter([1]),
        "set_iterator": iter({1}),
        "dict_keyiterator": iter(mapping),
        "dict_values": mapping.values(),
        "odict_values": collections.OrderedDict(mapping).values(),
        "generator": generator(),
        "zip": zip([1]),
        "map_subclass": MapSubclass(int, []),
        "enumerate": enumerate([]),
        "reversed_tuple": reversed((1,)),
        "reversed_list": reversed([1]),
        "range": range(3),
        "range_iterator": iter(range(3)),
        "dict_keys": mapping.keys(),
        "dict_items": mapping.items(),
        "set": {1},
        "str": "ab",
        "str_iterator": iter("ab"),
        "float": 1.5,
    }


CANDIDATES = sorted(_candidates())


def _recorded(fn) -> tuple[list[tuple[type, str]], BaseException | None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
            error = None
        except Exception as e:  # noqa: BLE001 - compared with JAX's outcome
            error = e
    return [(w.category, str(w.message)) for w in caught], error


def _entry_points(lib, tree_lib):
    # (name, call(leaf)) for every entry point that flattens a tree.
    return {
        "leaves": lambda x: lib.tree_leaves([1, x]),
        "flatten": lambda x: lib.tree_flatten({"a": x}),
        "structure": lambda x: lib.tree_structure((x, None)),
        "flatten_with_path": lambda x: lib.tree_flatten_with_path([x]),
        "leaves_with_path": lambda x: lib.tree_leaves_with_path([x]),
        "map": lambda x: lib.tree_map(lambda y: y, [x]),
        "map_is_leaf_false": lambda x: lib.tree_map(lambda y: y, [x], is_leaf=lambda y: False),
        "map_two_trees": lambda x: lib.tree_map(lambda y, z: y, [x], [x]),
        "map_with_path": lambda x: lib.tree_map_with_path(lambda p, y: y, [x]),
        "flatten_up_to": lambda x: lib.tree_structure([0]).flatten_up_to([x]),
        "all_leaves": lambda x: lib.all_leaves([x]),
        "is_leaf_true": lambda x: lib.tree_leaves([x], is_leaf=lambda y: y is x),
        "registry_flatten": lambda x: lib.default_registry.flatten([x]),
        "reduce": lambda x: lib.tree_reduce(lambda a, b: a, [x, 1]),
        "broadcast": lambda x: tree_lib.broadcast([1], [[x]]),
        "top_level": lambda x: lib.tree_leaves(x),
        "custom_node_child": lambda x: lib.tree_leaves(jtu.Partial(print, x)),
    }


ENTRY_POINTS = sorted(_entry_points(tu, ftree))


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("candidate", CANDIDATES)
def test_iterable_leaf_warnings_match_jax(entry, candidate):
    if entry == "broadcast" and not hasattr(jax.tree, "broadcast"):
        pytest.skip(f"jax {jax.__version__} has no jax.tree.broadcast")
    jax_call = _entry_points(jtu, jax.tree)[entry]
    fastree_call = _entry_points(tu, ftree)[entry]
    expected, jax_error = _recorded(lambda: jax_call(_candidates()[candidate]))
    got, fastree_error = _recorded(lambda: fastree_call(_candidates()[candidate]))
    assert got == expected
    assert type(fastree_error) is type(jax_error)


def test_iterable_leaf_types_are_asked_of_the_installed_jax():
    expected, _ = _recorded(lambda: jtu.tree_leaves([{"a": 1}.values()]))
    assert bool(expected) == bool(_jax_compat.JAX_ITERABLE_LEAF_TYPES)
    if expected:
        assert type({}.values()) in _jax_compat.JAX_ITERABLE_LEAF_TYPES
        assert type(range(1)) not in _jax_compat.JAX_ITERABLE_LEAF_TYPES
        assert "{}" in _jax_compat.JAX_ITERABLE_LEAF_WARNING


@pytest.mark.skipif(
    not _jax_compat.JAX_ITERABLE_LEAF_TYPES, reason=f"jax {jax.__version__} does not warn"
)
def test_iterable_leaf_warning_as_error_raises_it_as_jax_does():
    for lib in (jtu, tu):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(DeprecationWarning, match="'dict_values' is treated as a leaf"):
                lib.tree_map(lambda y: y, [1, {"a": 1}.values(), 2])
            with pytest.raises(DeprecationWarning, match="'generator' is treated as a leaf"):
                lib.tree_flatten_with_path({"k": (i for i in range(2))})


def test_lists_of_plain_leaves_still_take_no_warning():
    # The all-leaves fast path (csrc/treedef/leaf_sequence.cpp) leaves warned types to the
    # general walk: a list mixing both warns once per warned leaf.
    mixed = [1.0, {"a": 1}.values(), 2.0, iter([])]
    expected, _ = _recorded(lambda: jtu.tree_leaves(mixed))
    got, _ = _recorded(lambda: tu.tree_leaves(mixed))
    assert got == expected
    plain, _ = _recorded(lambda: tu.tree_leaves([1.0] * 100))
    assert plain == []


def test_iterable_leaf_warning_reinstalled_drops_the_memo():
    from fastree import _core
    from fastree.jax_interop import bridge as _jax_bridge

    dv = {"a": 1}.values()
    try:
        _core.set_iterable_leaf_warning(None, None)
        assert _recorded(lambda: tu.tree_leaves([dv]))[0] == []
        with pytest.raises(TypeError, match="tuple of types"):
            _core.set_iterable_leaf_warning((1,), None)
    finally:
        _jax_bridge.install()
    expected, _ = _recorded(lambda: jtu.tree_leaves([dv]))
    assert _recorded(lambda: tu.tree_leaves([dv]))[0] == expected


# ------------------------------------------------------------------------------------------------
# register_dataclass with drop_fields


def _drop_fields_class():
    @dataclasses.dataclass
    class Cell:
        x: Any
        name: str = dataclasses.field(default="n", metadata=dict(static=True))
        cache: Any = None

    return Cell


def _outcome(call):
    try:
        return call(), None
    except Exception as e:  # noqa: BLE001 - compared with the other library's outcome
        return None, e


@pytest.mark.parametrize("drop_fields", [("cache",), ("cache", "x"), ()])
@pytest.mark.parametrize("preserve_identity", [False, True])
def test_register_dataclass_drop_fields_defaults_follow_jax(preserve_identity, drop_fields):
    jax_cls, fastree_cls = _drop_fields_class(), _drop_fields_class()
    _, jax_error = _outcome(lambda: jtu.register_dataclass(jax_cls, drop_fields=drop_fields))
    _, error = _outcome(
        lambda: tu.register_dataclass(
            fastree_cls, drop_fields=drop_fields, preserve_identity=preserve_identity
        )
    )
    assert type(error) is type(jax_error)
    assert str(error) == str(jax_error)
    if jax_error is not None:
        return
    leaves, treedef = tu.tree_flatten(fastree_cls(1.0, "m", cache=[5]))
    jax_leaves, jax_treedef = jtu.tree_flatten(jax_cls(1.0, "m", cache=[5]))
    assert leaves == jax_leaves
    new_leaves = [2.0 + i for i in range(len(leaves))]
    rebuilt, rebuild_error = _outcome(lambda: tu.tree_unflatten(treedef, new_leaves))
    jax_rebuilt, jax_rebuild_error = _outcome(lambda: jtu.tree_unflatten(jax_treedef, new_leaves))
    assert type(rebuild_error) is type(jax_rebuild_error)
    if jax_rebuild_error is None:
        assert vars(rebuilt) == vars(jax_rebuilt)


def test_drop_fields_rules_match_the_installed_jax():
    cls = _drop_fields_class()
    _, error = _outcome(lambda: jtu.register_dataclass(cls, drop_fields=("cache",)))
    if _jax_compat.JAX_DATACLASS_DEFAULTS_OMIT_DROP_FIELDS:
        assert error is None and _jax_compat.jax_dataclass_fields(cls) == ("x",)
    elif _jax_compat.JAX_DROP_FIELDS_READ_AS_CHARACTERS:
        # "cache" taken apart into characters: nothing dropped, the check passes, cache a leaf.
        assert error is None and _jax_compat.jax_dataclass_fields(cls) == ("x", "cache")
    else:
        assert isinstance(error, ValueError) and "Unexpected fields: {'cache'}" in str(error)


# ------------------------------------------------------------------------------------------------
# tree_map's explanation of a different number of children


@pytest.mark.skipif(
    not _jax_compat.JAX_EXPLAINS_MAP_ERRORS, reason=f"jax {jax.__version__} does not explain"
)
@pytest.mark.parametrize(
    "prefix, full",
    [
        ({"a": 1}, {"a": 1, "b": 2}),
        ({"a": {"x": 1}}, {"a": {"x": 1, "y": 2, "z": 3}}),
        (collections.OrderedDict(a=1), collections.OrderedDict(a=1, b=2)),
    ],
)
def test_child_key_listing_follows_jax(prefix, full):
    f = lambda *xs: None  # noqa: E731
    assert_same_error(lambda: jtu.tree_map(f, prefix, full), lambda: tu.tree_map(f, prefix, full))


# ------------------------------------------------------------------------------------------------
# the probes and the version


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0.4.36", (0, 4, 36)),
        ("0.12.0.1", (0, 12, 0, 1)),
        ("0.5.0rc1", (0, 5, 0)),
        ("0.4.36.dev20241122", (0, 4, 36)),
        ("1", (1,)),
    ],
)
def test_version_tuple(text, expected):
    assert _jax_compat.version_tuple(text) == expected


def test_version_is_the_installed_jax():
    assert _jax_compat.JAX_VERSION[:2] == tuple(int(p) for p in jax.__version__.split(".")[:2])


def test_a_probe_answered_by_another_exception_reads_as_no_text():
    def raises(error):
        def call():
            raise error

        return call

    assert _jax_compat._jax_error_text(raises(TypeError("incomparable"))) == ""
    assert _jax_compat._jax_error_text(raises(ValueError("the text"))) == "the text"
    assert _jax_compat._jax_error_text(lambda: None) == ""


# ------------------------------------------------------------------------------------------------
# key entries


def test_key_makers_make_jaxs_classes_without_jaxlibs_flatten():
    assert _key_makers.sequence_block(3) == [jtu.SequenceKey(i) for i in range(3)]
    assert _key_makers.flattened_index_block(2) == [jtu.FlattenedIndexKey(i) for i in range(2)]
    assert _key_makers.dict_key_block(["b", 1]) == [jtu.DictKey("b"), jtu.DictKey(1)]
    assert type(_key_makers.getattr_key("w")) is jtu.GetAttrKey
    wide = list(range((1 << 17) + 5))
    paths = [p for p, _ in tu.tree_flatten_with_path(wide)[0][-3:]]
    assert paths == [(jtu.SequenceKey(i),) for i in range((1 << 17) + 2, (1 << 17) + 5)]


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is Linux's")
def test_key_makers_raise_memory_error_when_the_probe_fails():
    script = textwrap.dedent(
        """
        import resource
        from fastree.jax_interop import key_makers as _key_makers
        vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (8 << 20), resource.RLIM_INFINITY))
        try:
            _key_makers.sequence_block(10)
        except MemoryError as e:
            print("MemoryError", e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MemoryError fastree: not enough memory to make 10 key-path entries" in out.stdout


def test_the_jax_floor_is_declared_once_in_pyproject():
    import pathlib
    import re

    pyproject = (pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    floor = ".".join(map(str, _jax_compat.MIN_JAX_VERSION))
    assert re.search(
        r'dependencies = \["jax>=([\d.]+)", "jaxlib>=([\d.]+)"', pyproject
    ).groups() == (
        floor,
        floor,
    )
    assert _jax_compat.JAX_VERSION >= _jax_compat.MIN_JAX_VERSION


def test_import_below_the_floor_is_a_clear_import_error():
    # A fresh interpreter whose jax claims an older version: import fastree must say why.
    script = textwrap.dedent(
        """
        import jax
        jax.__version__ = "0.4.36"
        try:
            import fastree
        except ImportError as e:
            print("ImportError:", e)
        """
    )
    # Without FASTREE_INSTALL (set under `python -m fastree.run`): its hook imports fastree as
    # soon as jax is imported, before the version can be patched.
    env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "fastree needs jax >= 0.6.2; the installed jax is 0.4.36" in out.stdout


def test_overlap_rule_matches_the_installed_jax():
    # JAX_DATACLASS_REJECTS_OVERLAP: jax 0.9+ rejects overlapping data and meta fields.
    def make():
        return dataclasses.make_dataclass("Overlap", [("a", int), ("b", int)])

    _, jax_error = _outcome(
        lambda: jtu.register_dataclass(make(), data_fields=["a", "b"], meta_fields=["b"])
    )
    assert (jax_error is not None) == _jax_compat.JAX_DATACLASS_REJECTS_OVERLAP
    _, error = _outcome(
        lambda: tu.register_dataclass(
            make(), data_fields=["a", "b"], meta_fields=["b"], preserve_identity=True
        )
    )
    assert type(error) is type(jax_error) and str(error) == str(jax_error)
