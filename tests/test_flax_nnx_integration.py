"""flax.nnx Pytree/Module and Variable classes as native attribute nodes, exact or not used.

What is pinned:

* random nnx models (tests/nnx_random_models.py: Linear/BatchNorm/Dropout, nnx.List/nnx.Dict,
  shared submodules and Variables, Rngs, Variables with metadata, static attributes, an
  Optimizer, a module changed between calls) give the same leaves, treedefs, key paths, mapped
  and rebuilt trees, GraphDefs, states, merges, nnx.jit results and in-place updates plainly and
  under ``python -m fastree.run``, and flax's classes are then read natively;
* a flax version the integration does not know keeps flax's functions, with the same results;
* the mapping layout itself (csrc/attr/attr_mapping.h) on classes made here, without flax.

The child processes compare with flax and JAX themselves: the plain run is their own code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import fastree.tree_util as tu
import pytest
from fastree import _core
from helpers import run_json_program

HERE = Path(__file__).parent
MODELS = HERE / "nnx_random_models.py"


def _flax_known() -> bool:
    if importlib.util.find_spec("flax") is None:
        return False
    import flax.nnx  # noqa: F401 - its modules loaded, the integration can read its code
    from fastree.integrations import flax_nnx

    return flax_nnx.known_code()


needs_known_flax = pytest.mark.skipif(
    not _flax_known(), reason="flax is absent or not a version the integration reproduces"
)


def _views(installed: bool, first: int, count: int, prelude: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTREE_")}
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    if installed:
        code = (
            "import fastree, runpy, sys\n"
            f"{prelude}\n"
            "fastree.install()\n"
            f"sys.argv = ['nnx_random_models.py', '{first}', '{count}']\n"
            f"runpy.run_path({str(MODELS)!r}, run_name='__main__')\n"
        )
        args = [sys.executable, "-c", code]
    else:
        args = [sys.executable, str(MODELS), str(first), str(count)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=HERE)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@needs_known_flax
def test_random_models_match_flax_and_are_native():
    plain = _views(False, 0, 6)
    installed = _views(True, 0, 6)
    for seed, view in plain["views"].items():
        for what, value in view.items():
            assert installed["views"][seed][what] == value, (seed, what)
    for name in ("Linear", "BatchNorm", "Param", "List", "Dict", "Rngs"):
        assert installed["status"][name] == "native", (name, installed["status"])


@needs_known_flax
def test_unknown_flax_code_keeps_flax_functions():
    prelude = "import fastree.integrations._known_flax as k; k.KNOWN_CODE.clear()"
    plain = _views(False, 6, 2)
    installed = _views(True, 6, 2, prelude)
    assert installed["views"] == plain["views"]
    assert set(installed["status"].values()) == {"not an attribute node"}


# ------------------------------------------------------------------------------------------------
# the mapping layout on classes made here


class Flags:
    """A stand-in for flax's HashableMapping: the dict lives in ``_mapping``."""

    def __init__(self, mapping):
        self._mapping = mapping


class Holder:
    _pytree__has_int_keys = False


class IntHolder:
    _pytree__has_int_keys = True


def _node(cls):
    return _core.AttrNode(
        cls, (), mapping=("_pytree__nodes", Flags, "_mapping", "_pytree__has_int_keys")
    )


def _holder(cls, flags, **attrs):
    obj = object.__new__(cls)
    obj.__dict__["_pytree__nodes"] = Flags(flags)
    obj.__dict__.update(attrs)
    return obj


def test_mapping_layout_splits_sorted_names_by_the_flags():
    node = _node(Holder)
    obj = _holder(Holder, {"w": True, "b": True, "name": False}, w=1, name="n", b=2, extra=3)
    children, aux = node.flatten(obj)
    assert children == (2, 1)  # b, w: sorted
    assert aux[0] == ("b", "w")
    assert aux[1] == ("_pytree__nodes", "extra", "name")
    assert aux[2][1:] == (3, "n")
    pairs, _ = node.flatten_with_keys(obj)
    assert [str(k) for k, _ in pairs] == [".b", ".w"]
    rebuilt = node.unflatten(aux, (20, 10))
    assert type(rebuilt) is Holder
    assert list(vars(rebuilt)) == ["b", "w", "_pytree__nodes", "extra", "name"]
    assert (rebuilt.b, rebuilt.w, rebuilt.name) == (20, 10, "n")


def test_mapping_layout_reads_int_names_first_as_sequence_keys():
    node = _node(IntHolder)
    obj = _holder(IntHolder, {"0": True, "1": True, "10": True, "x": True}, x="x")
    obj.__dict__.update({"10": "ten", "1": "one", "0": "zero"})
    children, aux = node.flatten(obj)
    assert children == ("zero", "one", "ten", "x")
    assert aux[0] == (0, 1, 10, "x")
    pairs, _ = node.flatten_with_keys(obj)
    assert [str(k) for k, _ in pairs] == ["[0]", "[1]", "[10]", ".x"]
    rebuilt = node.unflatten(aux, ("a", "b", "c", "d"))
    assert vars(rebuilt)["10"] == "c" and vars(rebuilt)["x"] == "d"


def test_mapping_layout_in_the_core_walks():
    node = _node(Holder)
    _core.register_attribute_node(node)
    obj = _holder(Holder, {"a": True, "z": True}, z=[1, 2], a={"k": 3})
    assert tu.tree_leaves(obj) == [3, 1, 2]
    paths = [tu.keystr(p) for p, _ in tu.tree_leaves_with_path(obj)]
    assert paths == [".a['k']", ".z[0]", ".z[1]"]
    mapped = tu.tree_map(lambda x: x * 10, obj)
    assert (mapped.a, mapped.z) == ({"k": 30}, [10, 20])
    leaves, treedef = tu.tree_flatten(obj)
    assert tu.tree_unflatten(treedef, leaves).z == [1, 2]


def test_mapping_layout_without_a_library_names_what_it_cannot_read():
    node = _node(Holder)
    bad_flag = _holder(Holder, {"a": 1}, a=1)  # a flag that is no bool
    with pytest.raises(RuntimeError, match="library"):
        node.flatten(bad_flag)


def test_mapping_layout_rejects_a_mapping_class_it_cannot_read():
    class Hooked:
        def __getattribute__(self, name):
            return object.__getattribute__(self, name)

    with pytest.raises(TypeError, match="must look attributes up as object does"):
        _core.AttrNode(Holder, (), mapping=("f", Hooked, "_mapping", "i"))
    with pytest.raises(ValueError, match="takes no fields of its own"):
        _core.AttrNode(Holder, ("a",), mapping=("f", Flags, "_mapping", "i"))


def test_meta_items_layout_sorts_the_metadata():
    class Var:
        __slots__ = ("_raw_value", "_var_metadata")

        @classmethod
        def _new(cls, value, metadata):
            obj = object.__new__(cls)
            obj._raw_value, obj._var_metadata = value, metadata
            return obj

    node = _core.AttrNode(
        Var, ("_raw_value",), ("_var_metadata",), meta_items=True, key_names=("value",),
        rebuild_with="_new",
    )
    v = Var._new(5, {"z": 1, "a": 2})
    children, aux = node.flatten(v)
    assert children == (5,) and aux == (("a", 2), ("z", 1))
    pairs, _ = node.flatten_with_keys(v)
    assert str(pairs[0][0]) == ".value"
    rebuilt = node.unflatten(aux, (6,))
    assert rebuilt._raw_value == 6 and rebuilt._var_metadata == {"a": 2, "z": 1}
    v._var_metadata = {1: "not a str key"}
    with pytest.raises(TypeError, match="must be a dict of str keys"):
        node.flatten(v)


_OWN_GETATTRIBUTE = """
import json, sys
import jax
from flax import nnx
import optax
from fastree import integrations, _core
from fastree.jax_interop import compat

class Logged(nnx.Module):  # a user's module whose attribute lookup is its own
    def __init__(self):
        self.w = nnx.Param(1.0)
        self.b = 2.0

    def __getattribute__(self, name):
        return super().__getattribute__(name)

model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
trees = {"optimizer": nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), "logged": Logged()}
out = {}
for name, tree in trees.items():
    calls = [jax.tree_util.tree_structure(tree) for _ in range(4)]
    leaves = [compat.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(tree)]
    out[name] = {
        "status": integrations.status(type(tree)),
        "node": _core.attribute_node(type(tree)) is not None,
        "same_leaves": all(a is b for a, b in zip(*leaves)) and len(leaves[0]) == len(leaves[1]),
        "num_leaves": calls[-1].num_leaves,
        "rebuilt": type(jax.tree_util.tree_unflatten(calls[-1], leaves[1])).__name__,
    }
print(json.dumps(out))
"""


@pytest.mark.skipif(not _flax_known(), reason="flax code the integration does not know")
def test_a_class_read_through_its_own_getattribute_is_the_librarys_from_the_start():
    # The node could never read such an instance (the library reads each one, and no first-
    # instance check runs): a user's module with a __getattribute__ of its own is flax's from its
    # first instance, and status says why, not "checking" forever. flax's own Optimizer's is
    # vouched for (test_flax_nnx_optimizer_node.py): it has a node.
    plain = run_json_program(_OWN_GETATTRIBUTE, installed=False)
    installed = run_json_program(_OWN_GETATTRIBUTE, installed=True)
    for name, cls in (("optimizer", "Optimizer"), ("logged", "Logged")):
        got = installed[name]
        if name == "logged":
            assert got["status"] == (f"library: {cls} has its own __getattribute__, through "
                                     "which the library reads every instance: nothing native to "
                                     "compare")
        assert got["node"] == (name == "optimizer") and got["same_leaves"]
        assert got["num_leaves"] == plain[name]["num_leaves"]
        assert got["rebuilt"] == plain[name]["rebuilt"] == cls
