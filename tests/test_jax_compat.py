"""fastree.jax_interop.compat against the installed JAX: each adapter, and that no other module reaches in.

Everything fastree reads from JAX beyond its public API goes through ``_jax_compat``; a JAX
release that changes one of those internals must fail here, loudly, and nowhere else first.
So each adapter is exercised against the installed JAX (the ones for older jaxlib releases too,
where the installed one still accepts their route), and one test reads the package's source to
check that no other module imports JAX or touches what ``_jax_compat`` wraps.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import pathlib
import re
from typing import NamedTuple

import fastree
import fastree.tree_util as tu
import jax
import jax.numpy as jnp
import pytest
from fastree import _statetree
from fastree.jax_interop import bridge as _jax_bridge
from fastree.jax_interop import compat as _jax_compat
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own objects, installed or not
from helpers import stable_id

PACKAGE = pathlib.Path(fastree.__file__).parent
JAX_VERSION = tuple(int(p) for p in re.findall(r"\d+", jax.__version__)[:3])


class Point(NamedTuple):
    x: object
    y: object


class Box:
    def __init__(self, v):
        self.v = v


jtu.register_pytree_node(Box, lambda b: ((b.v,), "box"), lambda _, c: Box(*c))


@dataclasses.dataclass
class JaxCell:  # registered with JAX's own register_dataclass only
    a: object
    b: object
    tag: str = dataclasses.field(default="t", metadata={"static": True})


jtu.register_dataclass(JaxCell)


class Explicit:  # register_dataclass with explicit fields, on a non-dataclass
    def __init__(self, w, bias, name):
        self.w, self.bias, self.name = w, bias, name


jtu.register_dataclass(Explicit, data_fields=["w", "bias"], meta_fields=["name"])


@tu.register_dataclass
@dataclasses.dataclass
class FastCell:  # registered through fastree (with the core and with JAX)
    a: object
    meta: int = dataclasses.field(default=0, metadata={"static": True})


TREES = {
    "leaf": 1,
    "none": None,
    "builtins": {"a": (1, None), "b": [2, Point(3, 4)]},
    "ordered": collections.OrderedDict(z=1, y=[2]),
    "default": collections.defaultdict(list, {"q": 1}),
    "custom": {"box": Box((1, 2))},
    "jax-dataclass": [JaxCell(1, (2, 3))],
    "jax-explicit": Explicit(1, 2, "n"),
    "fastree-dataclass": FastCell([1, 2], meta=3),
    "partial": jtu.Partial(print, 1),
}


# ------------------------------------------------------------------------------------------------
# JAX's public objects


def test_public_objects_are_jax_own():
    assert jtu.DictKey is jax.tree_util.DictKey
    assert jtu.PyTreeDef is jax.tree_util.PyTreeDef
    assert _jax_compat.internal.__name__ == "jax._src.tree_util"
    assert set(_jax_compat.PUBLIC_TREE_UTIL_NAMES) <= set(vars(jtu))
    assert isinstance(jnp.zeros(1), _jax_compat.Array)
    seen = []
    jax.jit(lambda x: seen.append(isinstance(x, _jax_compat.Tracer)) or x)(1.0)
    assert seen == [True]


# ------------------------------------------------------------------------------------------------
# JAX's Python-side registry


def test_registry_is_the_dict_jax_registers_into():
    class Late:
        pass

    registry = _jax_compat.jax_registry()
    assert Late not in registry
    jtu.register_pytree_node(Late, lambda x: ((), None), lambda a, c: Late())
    assert _jax_compat.jax_registry() is registry and Late in registry
    entry = _jax_compat.jax_registry_entry(Late)
    assert entry.to_iter(Late()) == ((), None) and callable(entry.from_iter)
    assert Late in _jax_compat.jax_registered_types()
    assert _jax_compat.jax_registry_entry(int) is None


def test_register_dataclass_entries_and_their_fields():
    is_dc = _jax_compat.is_jax_register_dataclass_entry
    entry = _jax_compat.jax_registry_entry
    assert is_dc(entry(JaxCell)) and is_dc(entry(Explicit)) and is_dc(entry(FastCell))
    assert not is_dc(entry(Box)) and not is_dc(entry(tuple)) and not is_dc(None)
    assert _jax_compat.jax_dataclass_fields(JaxCell) == ("a", "b")
    assert _jax_compat.jax_dataclass_fields(Explicit) == ("w", "bias")
    assert _jax_compat.jax_dataclass_fields(Box) is None
    assert _jax_compat.jax_dataclass_fields(int) is None


@pytest.mark.parametrize("tree", [TREES["jax-dataclass"], TREES["jax-explicit"]], ids=stable_id)
def test_jax_only_dataclass_keys_are_jax_paths(tree):
    # The core adopts such a type as a custom node; the fields read through the adapter give
    # the key paths JAX gives (structure diffs and error paths use them).
    nodes = _statetree.parse_nodes(tu.tree_structure(tree))
    leaf_paths = [n.path for n in nodes if n.is_leaf]
    assert leaf_paths == [p for p, _ in jtu.tree_flatten_with_path(tree)[0]]


# ------------------------------------------------------------------------------------------------
# building JAX treedefs, per jaxlib version range


@pytest.mark.skipif(
    not _jax_compat.JAXLIB_BUILDS_FROM_NODE_DATA, reason="jaxlib < 0.7: no from_node_data"
)
@pytest.mark.parametrize("name", list(TREES))
def test_from_node_data_route(name):
    td = tu.tree_structure(TREES[name])
    nodes = _statetree.parse_nodes(td)
    assert _jax_bridge._to_jax(td, nodes) == jtu.tree_structure(TREES[name])
    assert _jax_compat.jax_treedef_from_node_data(None, []) == jtu.tree_structure(0)


@pytest.mark.parametrize("name", list(TREES))
def test_pickled_state_route(name):
    # The only route before jaxlib 0.7; later releases still restore it (as unpickling does).
    td = tu.tree_structure(TREES[name])
    converted = _jax_bridge._to_jax_from_state(td, _statetree.parse_nodes(td))
    assert converted == jtu.tree_structure(TREES[name])


def test_state_kinds_are_jaxlibs():
    state = getattr(jtu.tree_structure(0), "__getstate__", None)
    if state is None:
        pytest.skip("this jaxlib does not expose its pickled state")
    kinds = _jax_compat.JAXLIB_STATE_KINDS
    cases = {
        kinds.LEAF: 1,
        kinds.NONE: None,
        kinds.TUPLE: (1,),
        kinds.NAMEDTUPLE: Point(1, 2),
        kinds.LIST: [1],
        kinds.DICT: {"a": 1},
        kinds.CUSTOM: Box(1),
        kinds.DATACLASS: JaxCell(1, 2),
    }
    for kind, tree in cases.items():
        _, entries = jtu.tree_structure(tree).__getstate__()
        assert entries[-1][0] == kind, (tree, entries)


def test_jaxlib_is_node():
    if _jax_compat.jaxlib_is_node is None:
        assert JAX_VERSION < (0, 7)
        return
    assert _jax_compat.jaxlib_is_node(dict) and _jax_compat.jaxlib_is_node(Box)
    assert not _jax_compat.jaxlib_is_node(int)


# ------------------------------------------------------------------------------------------------
# texts probed from the installed JAX


def test_probed_texts_match_the_installed_release():
    assert _jax_compat.JAX_DICT_MISMATCH_SHOWS_DICT == (JAX_VERSION < (0, 7))
    assert _jax_compat.JAX_EXPLAINS_MAP_ERRORS == (JAX_VERSION >= (0, 7))
    assert _jax_compat.JAX_AUX_EQUALITY_NAMES_TYPE == (JAX_VERSION >= (0, 12))
    assert fastree.jax_interop.map_errors._ENABLED == _jax_compat.JAX_EXPLAINS_MAP_ERRORS


# ------------------------------------------------------------------------------------------------
# no other module reaches into JAX

# Attribute or variable names only JAX internals use here: JAX's registry dict, the closure
# cells of its functions, jaxlib's pickled state.
FORBIDDEN_NAMES = {"_registry", "__closure__", "co_freevars", "cell_contents"}
FORBIDDEN_NAMES |= {"__setstate__", "__getstate__"}


JAX_MODULES = ("jax", "jaxlib")
INTERNAL_TEXT = re.compile(r"\bjax\._src\b|\bjaxlib\.\w")  # a module path in a string


def reaches_into_jax(path: pathlib.Path) -> list[str]:
    """What ``path``'s code (not its docstrings or comments) takes from JAX directly."""
    tree = ast.parse(path.read_text())
    docstrings = {id(d) for d in _docstrings(tree)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in JAX_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if (node.module or "").split(".")[0] in JAX_MODULES:
                found.append(f"from {node.module}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            found.append(f".{node.attr}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(node.id)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and INTERNAL_TEXT.search(node.value)
        ):
            found.append(repr(node.value[:40]))
    return found


def _docstrings(tree: ast.AST) -> list[ast.AST]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [
        node.body[0].value
        for node in ast.walk(tree)
        if isinstance(node, owners) and node.body and isinstance(node.body[0], ast.Expr)
    ]


COMPAT = PACKAGE / "jax_interop" / "compat.py"


# The integration gate reads the closure cells of the library functions it fingerprints and
# replays (flax's, equinox's, chex's: `_mirrored_code`), never JAX's; these modules may name the
# closure attributes, and nothing else on the list.
CLOSURE_READERS = {"integrations/_mirrored_code.py", "integrations/_flax_nnx_graph_replay.py"}
CLOSURE_NAMES = {".__closure__", ".co_freevars", ".cell_contents"}


def test_only_jax_compat_reaches_into_jax():
    modules = sorted(PACKAGE.rglob("*.py"))  # every subpackage too
    assert COMPAT in modules and len(modules) > 10
    offenders = {}
    for p in modules:
        name = str(p.relative_to(PACKAGE))
        found = reaches_into_jax(p) if p != COMPAT else []
        if name in CLOSURE_READERS:
            found = [f for f in found if f not in CLOSURE_NAMES]
        if found:
            offenders[name] = found
    assert offenders == {}
    # The check finds what it looks for (the stub declares the core, not JAX: not checked).
    assert reaches_into_jax(COMPAT)


def test_source_check_catches_each_kind(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""Docstrings may name jax._src and jaxlib.xla freely."""\n'
        "import jax.tree_util\n"
        "from jaxlib import xla_client\n"
        "x = internal._registry\n"
        "y = fn.__closure__[0].cell_contents\n"
        "z = 'jax._src.tree_util'\n"
    )
    assert sorted(reaches_into_jax(bad)) == sorted(
        ["jax.tree_util", "from jaxlib", "._registry", ".__closure__", ".cell_contents"]
        + ["'jax._src.tree_util'"]
    )


def test_the_current_trace_is_read_where_jax_keeps_it():
    where = _jax_compat.opaque_trace_context()
    if where is None:
        pytest.skip("this jax has no public get_opaque_trace_state: the C code asks "
                    "flax's current_jax_trace instead")
    from jax._src import core
    from jax.extend.core import get_opaque_trace_state

    holder, name = where
    assert getattr(holder, name) is core.trace_ctx.trace
    seen = []

    @jax.jit
    def inside(x):
        seen.append((getattr(holder, name), core.trace_ctx.trace,
                     vars(get_opaque_trace_state())["_trace_ref"]))
        return x

    inside(1.0)
    traced, expected, ref = seen[0]
    assert traced is expected and ref() is traced
