"""fastree installed into JAX: ``fastree.install()`` / ``uninstall()`` / ``installed()``,
``python -m fastree.run`` and ``FASTREE_INSTALL=1``.

What this file pins: install routes exactly the names of ``fastree._install`` and uninstall puts
JAX's very objects back; both are idempotent and thread-safe; fastree never calls an installed
function by mistake (no recursion); a type registered through either module after install is a
node for JAX (jit) and fastree; treedefs stay JAX's, so annotations, ``isinstance`` checks and
JAX's internals accept them; and a few calls of optax, equinox and flax give the same results
installed as plain (marker ``third_party``; scripts/run_third_party_suites.py runs their suites).

Tests here leave the install state as they found it, so the file also runs inside a session that
is itself installed (``python -m fastree.run -m pytest``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading

import fastree
import fastree.tree as ft
import fastree.tree_util as tu
import jax
import jax.numpy as jnp
import jax.tree_util
import numpy as np
import pytest
from fastree import _install
from helpers import skip_unless_integration_knows, used_recursion_depth

JTU = jax.tree_util  # the module install writes to
JT = jax.tree
ORIG_TU = fastree.jax_interop.compat.tree_util  # JAX's own objects, whatever is installed
ORIG_T = fastree.jax_interop.compat.tree

ROUTED = {f"jax.tree_util.{n}" for n in _install.ROUTED_TREE_UTIL if hasattr(ORIG_TU, n)} | {
    f"jax.tree.{n}" for n in _install.ROUTED_TREE if hasattr(ORIG_T, n)
}


@pytest.fixture(autouse=True)
def not_installed():
    """Each test starts uninstalled and leaves the state it found."""
    was_installed = fastree.is_installed()
    fastree.uninstall()
    yield
    fastree.uninstall()
    if was_installed:
        fastree.install()


def _public(module):
    return {n: getattr(module, n) for n in dir(module) if not n.startswith("_")}


# ------------------------------------------------------------------------------------------------
# install / uninstall / installed()


def test_uninstalled_jax_is_jax():
    for name, obj in _public(JTU).items():
        assert obj is getattr(ORIG_TU, name), name
    for name in fastree.jax_interop.compat.PUBLIC_TREE_NAMES:
        assert getattr(JT, name) is getattr(ORIG_T, name), name
    assert fastree.installed_functions() == {}


def test_install_routes_exactly_the_listed_names_and_uninstall_restores_the_objects():
    before_tu, before_t = _public(JTU), _public(JT)
    fastree.install()
    assert fastree.is_installed()
    routed = fastree.installed_functions()
    assert set(routed) == ROUTED
    for qualname, target in routed.items():
        module, name = qualname.rsplit(".", 1)
        jax_module, fastree_module = (JTU, tu) if module == "jax.tree_util" else (JT, ft)
        assert target == f"fastree.{module[4:]}.{name}"
        assert getattr(jax_module, name) is getattr(fastree_module, name)
        assert fastree.original(qualname) is before_tu.get(name, before_t.get(name))
    for name, obj in before_tu.items():  # everything not routed is untouched
        if f"jax.tree_util.{name}" not in routed:
            assert getattr(JTU, name) is obj, name
    for name, obj in before_t.items():
        if f"jax.tree.{name}" not in routed:
            assert getattr(JT, name) is obj, name
    fastree.uninstall()
    assert not fastree.is_installed()
    assert _public(JTU) == before_tu and all(_public(JTU)[n] is o for n, o in before_tu.items())
    assert all(_public(JT)[n] is o for n, o in before_t.items())


def test_treedef_functions_stay_jax():
    fastree.install()
    for name in (
        "PyTreeDef",
        "default_registry",
        "tree_flatten",
        "tree_structure",
        "tree_unflatten",
        "tree_flatten_with_path",
        "tree_transpose",
        "treedef_tuple",
        "treedef_children",
        "treedef_is_leaf",
        "keystr",
        "DictKey",
        "Partial",
    ):
        assert getattr(JTU, name) is getattr(ORIG_TU, name), name
    for name in ("flatten", "structure", "unflatten", "flatten_with_path", "transpose", "static"):
        if hasattr(ORIG_T, name):  # jax.tree.static: jax 0.7+
            assert getattr(JT, name) is getattr(ORIG_T, name), name


def test_install_and_uninstall_are_idempotent():
    fastree.install()
    first = fastree.installed_functions()
    fastree.install()
    assert fastree.installed_functions() == first
    assert JTU.tree_map is tu.tree_map
    fastree.uninstall()
    fastree.uninstall()
    assert JTU.tree_map is ORIG_TU.tree_map and JT.map is ORIG_T.map


def test_installed_block_restores_on_exception():
    with pytest.raises(KeyError, match="boom"), fastree.installed():
        assert JT.map is ft.map
        raise KeyError("boom")
    assert JT.map is ORIG_T.map and JTU.tree_leaves is ORIG_TU.tree_leaves
    assert fastree.installed_functions() == {}


def test_installed_blocks_nest_and_keep_an_explicit_install():
    with fastree.installed():
        with fastree.installed():
            assert fastree.is_installed()
        assert fastree.is_installed()  # the outer block is still open
    assert not fastree.is_installed()
    fastree.install()
    with fastree.installed():
        pass
    assert fastree.is_installed()  # install() was in effect before the block
    with fastree.installed():
        fastree.uninstall()
        assert fastree.is_installed()  # the block still holds it
    assert not fastree.is_installed()


def test_original_names_jax_objects():
    with fastree.installed():
        assert fastree.original("jax.tree_util.tree_map") is ORIG_TU.tree_map
        assert fastree.original("jax.tree.map") is ORIG_T.map
        assert fastree.original("jax.tree_util.PyTreeDef") is JTU.PyTreeDef
    with pytest.raises(AttributeError, match="not a public name"):
        fastree.original("jax.tree_util.nope")
    with pytest.raises(AttributeError, match="not a public name"):
        fastree.original("numpy.sum")


def test_uninstall_keeps_a_later_patch_by_someone_else():
    fastree.install()

    def theirs(*args, **kwargs):
        return "theirs"

    JTU.tree_leaves = theirs
    try:
        fastree.uninstall()
        assert JTU.tree_leaves is theirs
        assert JTU.tree_map is ORIG_TU.tree_map
    finally:
        JTU.tree_leaves = ORIG_TU.tree_leaves


def test_threads_install_and_uninstall_while_others_flatten_and_map():
    tree = {"a": [1, 2, (3, 4)], "b": {"c": 5.0, "d": None}, "e": np.arange(3)}
    leaves = ORIG_TU.tree_leaves(tree)
    expected_map = ORIG_TU.tree_map(lambda x: x, tree)
    stop = threading.Event()
    errors: list[BaseException] = []

    def toggler(use_block: bool) -> None:
        try:
            while not stop.is_set():
                if use_block:
                    with fastree.installed():
                        pass
                else:
                    fastree.install()
                    fastree.uninstall()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def worker() -> None:
        try:
            for _ in range(2000):
                got_leaves, td = JTU.tree_flatten(tree)
                assert got_leaves[:5] == leaves[:5] and isinstance(td, JTU.PyTreeDef)
                assert JTU.tree_leaves(tree)[:5] == leaves[:5]
                mapped = JT.map(lambda x: x, tree)
                assert ORIG_TU.tree_structure(mapped) == ORIG_TU.tree_structure(expected_map)
                assert JTU.tree_unflatten(td, got_leaves)["a"] == [1, 2, (3, 4)]
                assert JT.reduce(lambda a, b: a + 1, [1, 2, 3], 0) == 3
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=toggler, args=(flag,)) for flag in (False, True)]
    threads += [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads[2:]:
        t.join()
    stop.set()
    for t in threads[:2]:
        t.join()
    assert errors == []
    assert not fastree.is_installed()
    assert JTU.tree_map is ORIG_TU.tree_map and JT.map is ORIG_T.map


# ------------------------------------------------------------------------------------------------
# registration after install, through either module


def _new_classes():
    class ViaNode:
        def __init__(self, a, b):
            self.a, self.b = a, b

    class ViaKeys:
        def __init__(self, a, b):
            self.a, self.b = a, b

    @dataclasses.dataclass
    class ViaDataclass:
        a: object
        b: object
        tag: str = dataclasses.field(default="t", metadata={"static": True})

    class ViaStatic:
        def __eq__(self, other):
            return type(other) is ViaStatic

        def __hash__(self):
            return 7

    class ViaClass:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def tree_flatten(self):
            return (self.a, self.b), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

    class ViaKeysClass(ViaClass):
        def tree_flatten_with_keys(self):
            return ((JTU.GetAttrKey("a"), self.a), (JTU.GetAttrKey("b"), self.b)), None

    return ViaNode, ViaKeys, ViaDataclass, ViaStatic, ViaClass, ViaKeysClass


def _register_all(module):
    ViaNode, ViaKeys, ViaDataclass, ViaStatic, ViaClass, ViaKeysClass = _new_classes()
    module.register_pytree_node(ViaNode, lambda n: ((n.a, n.b), None), lambda _, c: ViaNode(*c))
    module.register_pytree_with_keys(
        ViaKeys,
        lambda n: (((JTU.GetAttrKey("a"), n.a), (JTU.GetAttrKey("b"), n.b)), None),
        lambda _, c: ViaKeys(*c),
    )
    module.register_dataclass(ViaDataclass)
    module.register_static(ViaStatic)
    module.register_pytree_node_class(ViaClass)
    module.register_pytree_with_keys_class(ViaKeysClass)
    return [
        ViaNode(1.0, 2.0),
        ViaKeys(1.0, 2.0),
        ViaDataclass(1.0, 2.0),
        [1.0, ViaStatic(), 2.0],
        ViaClass(1.0, 2.0),
        ViaKeysClass(1.0, 2.0),
    ]


@pytest.fixture
def native_registrations(monkeypatch):
    """The types registered with fastree's core itself (not adopted later from JAX's registry)."""
    from fastree import _core

    seen = []
    for name in ("register_node", "register_dataclass_node"):
        original = getattr(_core, name)

        def spy(nodetype, *args, _original=original):
            seen.append(nodetype)
            return _original(nodetype, *args)

        monkeypatch.setattr(_core, name, spy)
    return seen


@pytest.mark.parametrize("through", ["jax.tree_util", "fastree.tree_util"])
def test_registration_after_install_reaches_jax_and_fastree(through, native_registrations):
    fastree.install()
    module = JTU if through == "jax.tree_util" else tu
    objects = _register_all(module)
    # fastree's core registered each type itself (natively, not adopted from JAX on first use).
    assert native_registrations == [type(o[1] if isinstance(o, list) else o) for o in objects]
    for obj in objects:
        # JAX's own functions (not routed, or taken from before install) see a node...
        assert ORIG_TU.tree_leaves(obj) == [1.0, 2.0]
        assert ORIG_TU.tree_structure(obj).num_nodes > 1
        # ...so do fastree's.
        assert tu.tree_leaves(obj) == [1.0, 2.0] == JTU.tree_leaves(obj)
        doubled = JT.map(lambda x: x * 2, obj)
        assert ORIG_TU.tree_leaves(doubled) == [2.0, 4.0]
        out = jax.jit(lambda t: JT.map(lambda leaf: leaf + 1, t))(obj)
        assert [float(x) for x in ORIG_TU.tree_leaves(out)] == [2.0, 3.0]
        assert ORIG_TU.tree_structure(out) == ORIG_TU.tree_structure(obj)
        paths = [JTU.keystr(p) for p, _ in JTU.tree_leaves_with_path(obj)]
        assert paths == [JTU.keystr(p) for p, _ in ORIG_TU.tree_leaves_with_path(obj)]


def test_without_install_jax_registration_is_not_native(native_registrations):
    (obj, *_) = _register_all(JTU)
    assert native_registrations == []
    assert tu.tree_leaves(obj) == [1.0, 2.0]  # fastree adopts the type from JAX's registry


def test_registered_before_install_stays_registered_after_uninstall():
    (obj, *_) = _register_all(tu)
    fastree.install()
    fastree.uninstall()
    assert JTU.tree_leaves(obj) == tu.tree_leaves(obj) == [1.0, 2.0]


def test_duplicate_registration_after_install_raises_jax_error():
    class Twice:
        pass

    fastree.install()
    JTU.register_pytree_node(Twice, lambda t: ((), None), lambda _, c: Twice())
    with pytest.raises(ValueError, match="Duplicate custom PyTreeDef type registration"):
        JTU.register_pytree_node(Twice, lambda t: ((), None), lambda _, c: Twice())


# ------------------------------------------------------------------------------------------------
# nothing in fastree calls an installed function (the bug behind item 1 of the install issue)


def test_no_recursion_anywhere_when_installed():
    fastree.install()
    limit = sys.getrecursionlimit()
    # A recursion through JAX's names would exceed this at once. Relative to the depth in use:
    # jaxlib leaks recursion-counter levels on some of its error paths, which earlier tests take.
    sys.setrecursionlimit(used_recursion_depth() + 150)
    try:
        tree = {"a": (1, 2), "b": [3, None]}
        td = tu.tree_structure(tree)
        jtd = td.to_jax()
        assert isinstance(jtd, JTU.PyTreeDef) and jtd == ORIG_TU.tree_structure(tree)
        assert isinstance(tu.tree_structure(1).to_jax(), JTU.PyTreeDef)
        assert fastree.from_jax(jtd) == td
        data = td.serialize_using_proto()
        assert fastree.PyTreeDef.deserialize_using_proto(tu.default_registry, data) == td
        assert tu.tree_broadcast((1, 2), (0, {"x": 0})) == (1, {"x": 2})
        with pytest.raises(ValueError):
            tu.tree_broadcast((1, 2, 3), (0, 0))
        assert tu.tree_transpose(
            tu.tree_structure([0, 0]), tu.tree_structure((0, 0)), [(1, 2), (3, 4)]
        ) == ([1, 3], [2, 4])

        class ViaRegistry:
            pass

        tu.default_registry.register_node(
            ViaRegistry, lambda _: ((), None), lambda *_: ViaRegistry()
        )
        assert fastree.jit(lambda a, b: {"s": a + b})(1.0, 2.0)["s"] == 3.0
        assert fastree.structure_diff({"a": 1}, {"a": 1}) == []
        assert JTU.tree_reduce(lambda a, b: a + b, [1, 2]) == 3
        if hasattr(JTU, "tree_reduce_associative"):  # jax 0.7+
            assert JTU.tree_reduce_associative(lambda a, b: a + b, [1, 2, 3]) == 6
        assert JTU.tree_all([True, (1,)]) and JTU.all_leaves([1, 2])
        if hasattr(JTU, "is_tree_node"):
            assert JTU.is_tree_node(dict) and not JTU.is_tree_node(int)
        _register_all(JTU)
    finally:
        sys.setrecursionlimit(limit)


# ------------------------------------------------------------------------------------------------
# treedefs stay JAX's: annotations, isinstance, equality with what JAX's internals build


TREES = [
    {"w": jnp.ones(2), "b": (jnp.zeros(1), None)},
    [1.0, (2.0, {"k": 3.0})],
    jax.tree_util.Partial(jnp.add, 1.0),
]


@pytest.mark.parametrize("tree", TREES, ids=["dict", "list", "Partial"])
def test_jaxtyping_beartype_accepts_installed_treedefs(tree):
    jaxtyping = pytest.importorskip("jaxtyping")
    beartype = pytest.importorskip("beartype")

    @jaxtyping.jaxtyped(typechecker=beartype.beartype)
    def count(treedef: jax.tree_util.PyTreeDef) -> int:
        return treedef.num_leaves

    fastree.install()
    n = len(JTU.tree_leaves(tree))
    assert count(JTU.tree_structure(tree)) == n
    assert count(JTU.tree_flatten(tree)[1]) == n
    assert count(JT.structure(tree)) == n
    assert count(JTU.tree_flatten_with_path(tree)[1]) == n
    with pytest.raises(Exception, match="treedef"):
        count(tu.tree_structure(tree))  # fastree's own class is not jaxlib's: checked for real


@pytest.mark.parametrize("tree", TREES, ids=["dict", "list", "Partial"])
def test_installed_treedefs_equal_those_jax_internals_build(tree):
    from jax import export
    from jax._src import tree_util as jax_internal

    fastree.install()
    args = (tree,)
    td = JTU.tree_structure((args, {}))
    exported = export.export(jax.jit(lambda t: JT.leaves(t)))(tree)
    assert exported.in_tree == td and td == exported.in_tree
    assert jax_internal.tree_structure(tree) == JT.structure(tree)
    built = jax_internal.treedef_tuple([JTU.tree_structure(tree), JT.structure(1)])
    assert built == JTU.tree_structure((tree, 1))
    assert JTU.tree_structure(tree) == tu.tree_structure(tree).to_jax()


def test_jit_and_grad_work_over_routed_maps():
    fastree.install()
    params = {"w": jnp.arange(3.0), "b": (jnp.ones(()),)}

    @jax.jit
    def loss(p):
        return JT.reduce(lambda a, b: a + b, JT.map(lambda x: (x**2).sum(), p))

    grads = jax.grad(loss)(params)
    assert JTU.tree_all(JT.map(lambda g, p: bool(jnp.allclose(g, 2 * p)), grads, params))


# ------------------------------------------------------------------------------------------------
# python -m fastree.run and FASTREE_INSTALL=1, in subprocesses

_PROBE = textwrap.dedent(
    """
    import sys
    from jax.tree_util import tree_map  # bound at import time, as libraries do
    import jax, fastree
    print("argv", sys.argv[1:])
    print("routed", tree_map is fastree.tree_util.tree_map, jax.tree.map is fastree.tree.map)
    print("leaves", jax.tree.leaves({"b": 1, "a": [2, 3]}))
    """
)


def _run(args, env=None, cwd=None):
    # The subprocess sees FASTREE_INSTALL only where a test sets it.
    full_env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
    full_env.update({"SKBUILD_EDITABLE_VERBOSE": "0", **(env or {})})
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=full_env,
        cwd=cwd,
    )


def test_fastree_run_script(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    proc = _run(["-m", "fastree.run", str(script), "x", "--y"])
    assert proc.returncode == 0, proc.stderr
    assert "argv ['x', '--y']" in proc.stdout
    assert "routed True True" in proc.stdout
    assert "leaves [2, 3, 1]" in proc.stdout


def test_fastree_run_module(tmp_path):
    (tmp_path / "probe_mod.py").write_text(_PROBE)
    proc = _run(["-m", "fastree.run", "-m", "probe_mod", "z"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "argv ['z']" in proc.stdout and "routed True True" in proc.stdout


def test_fastree_run_reaches_child_processes(tmp_path):
    # pytest-xdist workers, multiprocessing and subprocess children inherit FASTREE_INSTALL=1.
    if not _pth_installed():
        pytest.skip("fastree_install.pth is not installed in this environment")
    (tmp_path / "probe_child.py").write_text(_PROBE)
    parent = tmp_path / "parent.py"
    parent.write_text(
        textwrap.dedent(
            f"""
            import multiprocessing, subprocess, sys

            def child_routed(_):
                import jax, fastree
                return jax.tree_util.tree_map is fastree.tree_util.tree_map

            if __name__ == "__main__":
                out = subprocess.run([sys.executable, {str(tmp_path / "probe_child.py")!r}],
                                     capture_output=True, text=True)
                print("subprocess", out.stdout.splitlines()[1])
                ctx = multiprocessing.get_context("spawn")
                with ctx.Pool(1) as pool:
                    print("spawned", pool.map(child_routed, [0]))
            """
        )
    )
    proc = _run(["-m", "fastree.run", str(parent)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "subprocess routed True True" in proc.stdout
    assert "spawned [True]" in proc.stdout


def test_fastree_install_env_with_fastree_imported_before_jax():
    # FASTREE_INSTALL=1 and `import fastree` first: fastree's own import imports JAX, when
    # fastree cannot be installed yet; it installs itself at the end of its import.
    if not _pth_installed():
        pytest.skip("fastree_install.pth is not installed in this environment")
    code = (
        "import fastree, jax\n"
        "print('routed', jax.tree_util.tree_map is fastree.tree_util.tree_map)\n"
    )
    proc = _run(["-c", code], env={"FASTREE_INSTALL": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "routed True" in proc.stdout


def test_fastree_run_passes_the_exit_status(tmp_path):
    # Its answers to bad arguments and --help: tests/test_run_command.py.
    script = tmp_path / "exit.py"
    script.write_text("raise SystemExit(3)\n")
    assert _run(["-m", "fastree.run", str(script)]).returncode == 3


def _pth_installed() -> bool:
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any(os.path.exists(os.path.join(d, "fastree_install.pth")) for d in dirs)


@pytest.mark.skipif(not _pth_installed(), reason="fastree_install.pth is not in site-packages")
def test_environment_variable_installs_before_the_program_imports_jax(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint('jax at start', 'jax' in sys.modules)\n" + _PROBE)
    proc = _run([str(script)], env={"FASTREE_INSTALL": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "jax at start False" in proc.stdout  # nothing imported eagerly
    assert "routed True True" in proc.stdout
    for off in ("0", ""):
        proc = _run([str(script)], env={"FASTREE_INSTALL": off})
        assert proc.returncode == 0, proc.stderr
        assert "routed False False" in proc.stdout


@pytest.mark.skipif(not _pth_installed(), reason="fastree_install.pth is not in site-packages")
def test_environment_variable_unset_costs_no_import():
    probe = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in %r))"
    proc = _run(["-c", probe % (("fastree", "_fastree_autoinstall", "jax"),)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------------
# other projects' code, installed vs plain (their full suites: scripts/run_third_party_suites.py)


def _plain_and_installed(fn):
    plain = fn()
    with fastree.installed():
        routed = fn()
    return plain, routed


def _assert_close_trees(a, b):
    assert ORIG_TU.tree_structure(a) == ORIG_TU.tree_structure(b)
    for x, y in zip(ORIG_TU.tree_leaves(a), ORIG_TU.tree_leaves(b), strict=True):
        if isinstance(x, (jax.Array, np.ndarray, float)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
        else:
            assert x == y


@pytest.mark.third_party
def test_optax_adamw_update_installed_matches_plain():
    optax = pytest.importorskip("optax")
    params = {"dense": {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}, "scale": (jnp.ones(()),)}
    grads = ORIG_TU.tree_map(lambda p: p * 0.5 + 1.0, params)

    def step():
        opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
        state = opt.init(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    plain, routed = _plain_and_installed(step)
    _assert_close_trees(plain, routed)


@pytest.mark.third_party
def test_equinox_module_installed_matches_plain():
    eqx = pytest.importorskip("equinox")

    def run():
        class Linear(eqx.Module):  # defined (so registered) inside: through fastree when installed
            w: jax.Array
            b: jax.Array
            name: str = eqx.field(static=True, default="lin")

            def __call__(self, x):
                return self.w @ x + self.b

        model = Linear(jnp.ones((2, 3)), jnp.zeros(2))
        out = eqx.filter_jit(lambda m, x: m(x))(model, jnp.arange(3.0))
        grads = eqx.filter_grad(lambda m, x: m(x).sum())(model, jnp.arange(3.0))
        children, treedef = eqx.tree_flatten_one_level(model)
        assert isinstance(treedef, JTU.PyTreeDef)
        params, static = eqx.partition(model, eqx.is_array)
        combined = eqx.combine(params, static)
        mlp = eqx.nn.MLP(3, 2, 4, 2, key=jax.random.PRNGKey(0))
        return (
            out,
            grads.w,
            len(children),
            combined.name,
            mlp(jnp.arange(3.0)),
            eqx.tree_equal(model, combined),
        )

    plain, routed = _plain_and_installed(run)
    _assert_close_trees(plain, routed)


@pytest.mark.third_party
def test_flax_nnx_train_step_installed_matches_plain():
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    def run():
        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

        # flax 0.11 made the model an argument of Optimizer.update (before: update(grads)).
        takes_model = "model" in inspect.signature(nnx.Optimizer.update).parameters

        @nnx.jit
        def train_step(model, optimizer, x):
            grads = nnx.grad(lambda m: (m(x) ** 2).sum())(model)
            if takes_model:
                optimizer.update(model, grads)
            else:
                optimizer.update(grads)

        train_step(model, optimizer, jnp.ones((1, 3)))
        graphdef, state = nnx.split(model)
        return nnx.state(nnx.merge(graphdef, state), nnx.Param)

    plain, routed = _plain_and_installed(run)
    _assert_close_trees(ORIG_TU.tree_leaves(plain), ORIG_TU.tree_leaves(routed))


_EQUINOX_CHILD = textwrap.dedent(
    """
    import json
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np

    import equinox as eqx
    import fastree
    from fastree import integrations

    JTU = jax.tree_util


    def describe(tree):
        # Leaves and treedef as text; function addresses differ between processes.
        leaves, treedef = JTU.tree_flatten(tree)
        shown = [np.asarray(x).round(6).tolist() if eqx.is_array(x) else repr(x) for x in leaves]
        return re.sub(r" at 0x[0-9a-f]+", " at 0x?", f"{treedef} {shown}")


    class Scaled(eqx.Module):
        w: jax.Array
        name: str = eqx.field(static=True)

        def __call__(self, x):
            return self.w * x


    SEEN = []


    class Late(eqx.Module):
        a: jax.Array
        b: jax.Array

        def __init__(self, a):
            self.a = a
            SEEN.append(describe(self))  # b not set yet: equinox flattens it as MISSING
            self.b = a + 1


    mlp = eqx.nn.MLP(2, 3, 4, 2, key=jax.random.PRNGKey(0))
    x = jnp.arange(2.0)
    params, static = eqx.partition(mlp, eqx.is_array)
    scaled = Scaled(jnp.ones(3), name="s")
    late = Late(jnp.ones(2))
    results = {
        "mlp": describe(mlp),
        "jit": describe(eqx.filter_jit(lambda m, x: m(x))(mlp, x)),
        "partition": [describe(params), describe(static)],
        "combine": bool(eqx.tree_equal(eqx.combine(params, static), mlp)),
        "tree_at": describe(eqx.tree_at(lambda m: m.layers[0].bias, mlp, jnp.zeros(4))),
        "static": [describe(scaled), describe(eqx.filter_grad(lambda m: m(2.0).sum())(scaled))],
        "late": [SEEN, describe(late)],
    }
    for _ in range(10):  # past the checks of the first instances
        JTU.tree_leaves([mlp, scaled, late])
    print("installed", fastree.is_installed())
    print("results", json.dumps(results, sort_keys=True))
    status = {c.__name__: integrations.status(c) for c in (type(mlp), eqx.nn.Linear, Scaled, Late)}
    print("status", json.dumps(status, sort_keys=True))
    """
)


@pytest.mark.third_party
def test_equinox_under_fastree_run_matches_plain_and_goes_native(tmp_path):
    # equinox imported after install (python -m fastree.run): its Module classes are registered as
    # native attribute nodes (fastree.integrations), not with equinox's generated functions.
    skip_unless_integration_knows("equinox")
    script = tmp_path / "equinox_child.py"
    script.write_text(_EQUINOX_CHILD)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two children at once: half the time
        plain, routed = pool.map(_run, [[str(script)], ["-m", "fastree.run", str(script)]])
    assert plain.returncode == 0, plain.stderr
    assert routed.returncode == 0, routed.stderr
    plain_lines = dict(line.split(" ", 1) for line in plain.stdout.splitlines())
    routed_lines = dict(line.split(" ", 1) for line in routed.stdout.splitlines())
    assert (plain_lines["installed"], routed_lines["installed"]) == ("False", "True")
    assert routed_lines["results"] == plain_lines["results"]  # leaves and treedefs, as text
    names = ("Late", "Linear", "MLP", "Scaled")
    # Plain, JAX keeps equinox's functions; fastree's own functions read the classes natively
    # from the first meeting (status asks as a walk would), and none has met an instance yet.
    assert json.loads(plain_lines["status"]) == dict.fromkeys(names, "checking")
    assert json.loads(routed_lines["status"]) == dict.fromkeys(names, "native")


@pytest.mark.parametrize("module", ["fastree._install", "fastree.jax_interop.compat"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
