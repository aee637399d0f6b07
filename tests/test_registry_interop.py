"""Registration interop: fastree-registered types work in JAX transforms, JAX-registered types
(including third-party libraries) flatten in fastree exactly as in JAX."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import numpy as np
import pytest
from helpers import (
    Inferred,
    KeysClass,
    Pair,
    Point,
    StaticTag,
    WithKeys,
    assert_leaves_identical,
    assert_same_treedef,
    assert_trees_equal,
    capture,
    requires_jax,
)

import fastree.tree_util as tu

def assert_flattens_like_jax(tree):
    fpairs, ftd = tu.tree_flatten_with_path(tree)
    jpairs, jtd = jtu.tree_flatten_with_path(tree)
    assert [p for p, _ in fpairs] == [p for p, _ in jpairs]
    assert_leaves_identical([x for _, x in fpairs], [x for _, x in jpairs])
    assert_leaves_identical(tu.tree_leaves(tree), jtu.tree_leaves(tree))
    assert_same_treedef(ftd, jtd)
    assert_same_treedef(tu.tree_structure(tree), jtd)
    leaves = [x for _, x in fpairs]
    rebuilt = tu.tree_unflatten(ftd, leaves)
    assert_trees_equal(rebuilt, jtu.tree_unflatten(jtd, leaves), identical_leaves=True)
    mapped = tu.tree_map(lambda x: x, tree)
    assert_trees_equal(mapped, jtu.tree_map(lambda x: x, tree), identical_leaves=True)


# ------------------------------------------------------------------------------------------------
# fastree -> JAX


@requires_jax("tree_util.is_tree_node")
def test_fastree_registered_types_known_to_jax():
    for typ in (Pair, KeysClass, WithKeys, Point, Inferred, StaticTag):
        assert jtu.is_tree_node(typ), typ


def test_jit_accepts_fastree_registered_types():
    @jax.jit
    def f(p):
        return Point(p.x * 2, p.y + 1, label=p.label + "!")

    out = f(Point(jnp.ones(2), jnp.zeros(2), label="a"))
    assert isinstance(out, Point) and out.label == "a!"
    np.testing.assert_array_equal(out.x, 2 * np.ones(2))
    np.testing.assert_array_equal(out.y, np.ones(2))


def test_jit_static_node():
    @jax.jit
    def f(x, tag):
        return x + 1 if tag.name == "add" else x - 1

    assert float(f(1.0, StaticTag("add"))) == 2.0
    assert float(f(1.0, StaticTag("sub"))) == 0.0


def test_grad_through_custom_nodes():
    def loss(tree):
        return jnp.sum(tree.left**2) + jnp.sum(tree.right.x * 3.0) + tree.right.y

    tree = Pair(jnp.arange(3.0), KeysClass(jnp.ones(2), jnp.float32(5.0)))
    g = jax.grad(loss)(tree)
    assert isinstance(g, Pair) and isinstance(g.right, KeysClass)
    np.testing.assert_allclose(g.left, 2 * np.arange(3.0))
    np.testing.assert_allclose(g.right.x, 3 * np.ones(2))
    assert float(g.right.y) == 1.0


def test_vmap_over_custom_nodes():
    tree = WithKeys(
        jnp.arange(4.0), Inferred(weights=jnp.ones((4, 2)), mode="m", bias=jnp.zeros(4))
    )
    out = jax.vmap(lambda t: t.first + t.second.weights.sum() + t.second.bias)(tree)
    np.testing.assert_allclose(out, np.arange(4.0) + 2.0)
    out_tree = jax.vmap(lambda t: t)(tree)
    assert isinstance(out_tree, WithKeys) and out_tree.second.mode == "m"


def test_scan_with_custom_carry():
    def body(carry, x):
        return Point(carry.x + x, carry.y * 2, label=carry.label), carry.x

    init = Point(jnp.float32(0.0), jnp.float32(1.0), label="c")
    carry, ys = jax.lax.scan(body, init, jnp.arange(4.0))
    assert isinstance(carry, Point) and carry.label == "c"
    assert float(carry.x) == 6.0 and float(carry.y) == 16.0
    np.testing.assert_allclose(ys, [0.0, 0.0, 1.0, 3.0])


def test_fresh_fastree_registration_visible_to_jax():
    class Fresh:
        def __init__(self, a, b):
            self.a, self.b = a, b

    tu.register_pytree_node(Fresh, lambda f: ((f.a, f.b), "aux"), lambda aux, ch: Fresh(*ch))
    tree = Fresh(1, [2, 3])
    assert jtu.tree_leaves(tree) == [1, 2, 3]
    assert_flattens_like_jax(tree)
    out = jax.jit(lambda t: Fresh(t.a + 1, t.b))(Fresh(jnp.int32(1), [jnp.int32(2)]))
    assert isinstance(out, Fresh) and int(out.a) == 2


def test_fresh_fastree_dataclass_visible_to_jax():
    @tu.register_dataclass
    @dataclasses.dataclass
    class DC:
        a: jax.Array
        b: int = dataclasses.field(default=0, metadata={"static": True})

    out = jax.jit(lambda d: DC(d.a * d.b, d.b))(DC(jnp.ones(2), 3))
    assert isinstance(out, DC) and out.b == 3
    np.testing.assert_allclose(out.a, 3 * np.ones(2))
    assert_flattens_like_jax(DC(np.ones(1), 4))


# ------------------------------------------------------------------------------------------------
# JAX -> fastree (registered after import fastree)


def _make_class(name):
    def init(self, a, b):
        self.a, self.b = a, b

    return type(name, (), {"__init__": init, "__repr__": lambda s: f"{name}({s.a!r}, {s.b!r})"})


def test_jax_node_registered_after_fastree_saw_it_as_leaf():
    Late = _make_class("Late")
    obj = Late(1, (2, 3))
    tree = {"x": obj}
    assert tu.tree_leaves(tree) == [obj]  # a leaf for now (and fastree may cache that)
    assert tu.tree_structure(tree) == tu.tree_structure({"x": 0})
    jtu.register_pytree_node(Late, lambda o: ((o.a, o.b), None), lambda _, ch: Late(*ch))
    assert tu.tree_leaves(tree) == [1, 2, 3]
    assert_flattens_like_jax(tree)


def test_jax_register_pytree_with_keys_after_import():
    Late = _make_class("LateKeys")
    jtu.register_pytree_with_keys(
        Late,
        lambda o: (((jtu.GetAttrKey("a"), o.a), (jtu.GetAttrKey("b"), o.b)), "meta"),
        lambda meta, ch: Late(*ch),
    )
    assert_flattens_like_jax([Late(1, {"k": Late(2, None)})])


def test_jax_register_pytree_node_class_after_import():
    @jtu.register_pytree_node_class
    class LateClass:
        def __init__(self, x, aux=("m",)):
            self.x, self.aux = x, aux

        def tree_flatten(self):
            return (self.x,), self.aux

        @classmethod
        def tree_unflatten(cls, aux, ch):
            return cls(*ch, aux=aux)

    assert_flattens_like_jax((LateClass([1, 2]), LateClass(None, aux=("n",))))


def test_jax_register_dataclass_after_import():
    @jtu.register_dataclass
    @dataclasses.dataclass
    class LateDC:
        x: object
        s: str = dataclasses.field(default="s", metadata={"static": True})

    assert_flattens_like_jax({"d": LateDC([1, (2,)], s="t")})

    @dataclasses.dataclass
    class LateDC2:
        x: object
        y: object
        z: str = "z"

    jtu.register_dataclass(LateDC2, data_fields=["y", "x"], meta_fields=["z"])
    assert_flattens_like_jax(LateDC2(1, 2))


def test_jax_register_static_after_import():
    @jtu.register_static
    class LateStatic:
        def __hash__(self):
            return 7

        def __eq__(self, other):
            return isinstance(other, LateStatic)

    assert_flattens_like_jax([LateStatic(), 1])


def test_jax_register_with_flatten_with_keys_func():
    Late = _make_class("LateNodeKeys")
    jtu.register_pytree_node(
        Late,
        lambda o: ((o.a, o.b), None),
        lambda _, ch: Late(*ch),
        lambda o: (((jtu.DictKey("A"), o.a), (jtu.DictKey("B"), o.b)), None),
    )
    assert_flattens_like_jax(Late([1], Late(2, 3)))


# ------------------------------------------------------------------------------------------------
# JAX -> fastree (registered before import fastree), in a fresh interpreter

_BEFORE_IMPORT_SCRIPT = textwrap.dedent(
    """
    import dataclasses, sys
    import jax.tree_util as jtu

    class Early:
        def __init__(self, a, b):
            self.a, self.b = a, b

    jtu.register_pytree_node(Early, lambda o: ((o.a, o.b), "e"), lambda aux, ch: Early(*ch))

    @jtu.register_dataclass
    @dataclasses.dataclass
    class EarlyDC:
        x: object
        s: str = dataclasses.field(default="s", metadata={"static": True})

    @jtu.register_static
    class EarlyStatic:
        def __hash__(self):
            return 1
        def __eq__(self, other):
            return isinstance(other, EarlyStatic)

    assert "fastree" not in sys.modules
    import fastree
    import fastree.tree_util as tu

    tree = {"e": Early(1, [2, EarlyDC(3, s="q")]), "s": EarlyStatic()}
    fpairs, ftd = tu.tree_flatten_with_path(tree)
    jpairs, jtd = jtu.tree_flatten_with_path(tree)
    assert [p for p, _ in fpairs] == [p for p, _ in jpairs], (fpairs, jpairs)
    assert all(a is b for (_, a), (_, b) in zip(fpairs, jpairs))
    assert ftd.to_jax() == jtd
    assert fastree.from_jax(jtd) == ftd
    assert repr(ftd) == repr(jtd)
    rebuilt = tu.tree_unflatten(ftd, [x for _, x in fpairs])
    assert type(rebuilt["e"]) is Early and type(rebuilt["e"].b[1]) is EarlyDC
    assert rebuilt["e"].b[1].s == "q" and type(rebuilt["s"]) is EarlyStatic
    print("OK")
    """
)


def test_jax_registered_before_import():
    proc = subprocess.run(
        [sys.executable, "-c", _BEFORE_IMPORT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        # Not installed by FASTREE_INSTALL (set under `python -m fastree.run`), whose hook would
        # import fastree along with jax: the point here is JAX registrations made before it.
        env={k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("OK")


# ------------------------------------------------------------------------------------------------
# third-party libraries


def test_flax_struct_dataclass():
    flax_struct = pytest.importorskip("flax.struct")

    @flax_struct.dataclass
    class State:
        params: dict
        step: jax.Array
        name: str = flax_struct.field(pytree_node=False, default="s")

    tree = State(params={"w": jnp.ones(2), "b": [jnp.zeros(1)]}, step=jnp.int32(3), name="n")
    assert_flattens_like_jax(tree)
    assert tu.tree_unflatten(*reversed(tu.tree_flatten(tree))).name == "n"


def test_flax_frozen_dict():
    flax_core = pytest.importorskip("flax.core")
    tree = flax_core.freeze({"a": {"b": 1, "c": [2, 3]}, "d": None})
    assert_flattens_like_jax(tree)


def test_flax_linen_params():
    nn = pytest.importorskip("flax.linen")
    params = nn.Dense(3).init(jax.random.PRNGKey(0), jnp.ones(2))
    assert_flattens_like_jax(params)


def test_equinox_linear():
    eqx = pytest.importorskip("equinox")
    lin = eqx.nn.Linear(3, 2, key=jax.random.PRNGKey(0))
    assert_flattens_like_jax(lin)
    rebuilt = tu.tree_unflatten(*reversed(tu.tree_flatten(lin)))
    np.testing.assert_array_equal(rebuilt(jnp.ones(3)), lin(jnp.ones(3)))


def test_equinox_mlp():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(2, 3, 4, 2, key=jax.random.PRNGKey(0))
    assert_flattens_like_jax(mlp)
    assert_flattens_like_jax(eqx.filter(mlp, eqx.is_array))
    rebuilt = tu.tree_map(lambda x: x, mlp)
    np.testing.assert_array_equal(rebuilt(jnp.ones(2)), mlp(jnp.ones(2)))


def test_optax_states():
    optax = pytest.importorskip("optax")
    params = {"w": jnp.ones(3), "b": [jnp.zeros(2)]}
    for opt in (
        optax.adam(1e-3),
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)),
        optax.sgd(0.1, momentum=0.9),
    ):
        state = opt.init(params)
        assert_flattens_like_jax(state)
        grads = tu.tree_map(jnp.ones_like, params)
        updates, new_state = opt.update(grads, state, params)
        assert_flattens_like_jax(new_state)
        assert_trees_equal(
            tu.tree_map(lambda a, b: a + b, params, updates),
            jtu.tree_map(lambda a, b: a + b, params, updates),
        )


def test_fastree_structures_of_library_trees_are_jax_usable():
    optax = pytest.importorskip("optax")
    state = optax.adam(1e-3).init({"w": jnp.ones(3)})
    ftd = tu.tree_structure(state)
    jtd = ftd.to_jax()
    assert jtd == jtu.tree_structure(state)
    assert_trees_equal(jtd.unflatten(jtu.tree_leaves(state)), state, identical_leaves=True)


# ------------------------------------------------------------------------------------------------
# duplicate registration


def test_duplicate_registration_error_matches_jax():
    Dup = _make_class("Dup")
    tu.register_pytree_node(Dup, lambda o: ((o.a, o.b), None), lambda _, ch: Dup(*ch))
    expected = capture(jtu.register_pytree_node, Dup, lambda o: ((), None), lambda _, ch: Dup(1, 2))
    with pytest.raises(type(expected)) as info:
        tu.register_pytree_node(Dup, lambda o: ((), None), lambda _, ch: Dup(1, 2))
    assert str(info.value) == str(expected)
    # the original registration is still in force in both libraries
    assert tu.tree_leaves(Dup(1, 2)) == jtu.tree_leaves(Dup(1, 2)) == [1, 2]


def test_fastree_duplicate_of_jax_registration_matches_jax():
    Dup = _make_class("DupJ")
    jtu.register_pytree_node(Dup, lambda o: ((o.a, o.b), None), lambda _, ch: Dup(*ch))
    expected = capture(jtu.register_pytree_node, Dup, lambda o: ((), None), lambda _, ch: Dup(1, 2))
    with pytest.raises(type(expected)) as info:
        tu.register_pytree_node(Dup, lambda o: ((), None), lambda _, ch: Dup(1, 2))
    assert str(info.value) == str(expected)
    assert tu.tree_leaves(Dup(1, 2)) == [1, 2]
