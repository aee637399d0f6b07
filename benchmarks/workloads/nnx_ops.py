"""flax.nnx: the operations of flax's own graph-overhead benchmark model, one workload each.

The model is flax's ``benchmarks/nnx_graph_overhead.py`` MLP (an input block, 20 hidden blocks
of ``nnx.Linear`` + ``nnx.BatchNorm``, width 32, a linear output) with an
``nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)``. Installed before flax is imported,
fastree reads every nnx ``Pytree``/``Module`` and ``Variable`` class natively (README, "Library
nodes"): the tree-mode rows run in C, and so do nnx's graph-mode walks (``nnx.split``,
``nnx.merge``, ``nnx.update``, the split and merge of ``nnx.jit``;
``fastree/integrations/flax_nnx_graph.py``). ``nnx-jax-jit-call`` is flax's own "JAX" mode: a
``jax.jit`` call on the pre-split state, the floor an ``nnx.jit`` call is measured against.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from benchmarks.workloads.base import NNX_MODEL, Prepared, Workload, require, shapes_fingerprint
from benchmarks.workloads.nnx_train_step import apply_update

WIDTH = 32
SIZES = {"tiny": 2, "quick": 20, "full": 20}


@functools.cache
def _classes() -> SimpleNamespace:
    import jax
    from flax import nnx

    module_list = getattr(nnx, "List", list)  # flax < 0.12 takes a plain list

    class Block(nnx.Module):
        def __init__(self, din: int, dout: int, rngs: Any) -> None:
            self.linear = nnx.Linear(din, dout, rngs=rngs)
            self.bn = nnx.BatchNorm(dout, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return jax.nn.relu(self.bn(self.linear(x)))

    class MLP(nnx.Module):
        def __init__(self, depth: int, rngs: Any) -> None:
            self.input = Block(WIDTH, WIDTH, rngs)
            self.layers = module_list([Block(WIDTH, WIDTH, rngs) for _ in range(depth)])
            self.output = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = self.input(x)
            for layer in self.layers:
                x = layer(x)
            return self.output(x)

    return SimpleNamespace(MLP=MLP)


@functools.cache
def _state(depth: int) -> SimpleNamespace:
    require("flax.nnx")
    require("optax")
    import optax
    from flax import nnx

    model = _classes().MLP(depth, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    return SimpleNamespace(model=model, optimizer=optimizer)


def _op(make_call: Callable[[SimpleNamespace], Callable[[], Any]], stateful: bool = False
        ) -> Callable[[int], Prepared]:
    def build(depth: int) -> Prepared:
        import jax

        state = _state(depth)
        leaves = len(jax.tree_util.tree_leaves((state.model, state.optimizer)))
        kwargs = {"fingerprint": shapes_fingerprint} if stateful else {}
        return Prepared(make_call(state), f"{depth} blocks, {leaves} leaves", **kwargs)

    return build


def _identity(x: Any) -> Any:
    return x


def _tree(s: SimpleNamespace) -> Any:
    return (s.model, s.optimizer)


def _flatten(s: SimpleNamespace) -> Callable[[], Any]:
    import jax

    return lambda: jax.tree_util.tree_flatten(_tree(s))[0]


def _leaves(s: SimpleNamespace) -> Callable[[], Any]:
    import jax

    return lambda: jax.tree_util.tree_leaves(_tree(s))


def _tree_map(s: SimpleNamespace) -> Callable[[], Any]:
    import jax

    return lambda: jax.tree_util.tree_leaves(jax.tree_util.tree_map(_identity, _tree(s)))


def _flatten_with_path(s: SimpleNamespace) -> Callable[[], Any]:
    import jax

    return lambda: [leaf for _, leaf in jax.tree_util.tree_flatten_with_path(_tree(s))[0]]


def _unflatten(s: SimpleNamespace) -> Callable[[], Any]:
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(_tree(s))
    return lambda: jax.tree_util.tree_leaves(jax.tree_util.tree_unflatten(treedef, leaves))


def _split(s: SimpleNamespace) -> Callable[[], Any]:
    from flax import nnx

    return lambda: nnx.split(s.model)[1]


def _nnx_state(s: SimpleNamespace) -> Callable[[], Any]:
    from flax import nnx

    return lambda: nnx.state(s.model)


def _merge(s: SimpleNamespace) -> Callable[[], Any]:
    from flax import nnx

    graphdef, state = nnx.split(s.model)
    return lambda: nnx.state(nnx.merge(graphdef, state))


def _update(s: SimpleNamespace) -> Callable[[], Any]:
    from flax import nnx

    state = nnx.state(s.model)

    def call() -> Any:
        nnx.update(s.model, state)
        return state

    return call


def _jit_noop(s: SimpleNamespace) -> Callable[[], Any]:
    from flax import nnx

    @nnx.jit
    def noop(model: Any, optimizer: Any) -> None:
        return None

    return lambda: noop(s.model, s.optimizer)


def _jit_tree_mode(s: SimpleNamespace) -> Callable[[], Any]:
    from flax import nnx

    if "graph" not in inspect.signature(nnx.jit).parameters:
        from benchmarks.unsupported import Unsupported

        raise Unsupported("unavailable: this flax has no nnx.jit(graph=False)")

    @nnx.jit(graph=False)
    def noop(model: Any, optimizer: Any) -> None:
        return None

    return lambda: noop(s.model, s.optimizer)


def _jax_jit_call(s: SimpleNamespace) -> Callable[[], Any]:
    import jax
    from flax import nnx

    @jax.jit
    def step(graphdef: Any, state: Any) -> Any:
        return graphdef, state

    graphdef, state = nnx.split((s.model, s.optimizer))
    return lambda: step(graphdef, state)


def _train_step(s: SimpleNamespace) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    x = jnp.ones((8, WIDTH))

    @nnx.jit
    def step(model: Any, optimizer: Any) -> Any:
        def loss_fn(model: Any) -> Any:
            return (model(x) ** 2).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        apply_update(optimizer, model, grads)
        return loss

    return lambda: jax.block_until_ready(step(s.model, s.optimizer))


_WHY_TREE = (
    "Installed first, every nnx Pytree and Variable class is an attribute node: JAX's own flatten "
    "calls its C functions instead of flax's Python ones, and the routed functions read it in "
    "fastree's core. A rebuild makes what flax's Variable._new and PytreeState() make (a new "
    "trace state each), in C."
)
_WHY_GRAPH = (
    "nnx's graph mode is flax's own traversal (graphlib), not jax.tree_util. Installed, its walks "
    "(flatten, unflatten, update, the merge of states) run in C, making the same GraphDef records "
    "and states, new ones each call as flax makes them: nnx.jit's cache still compares two "
    "GraphDefs record by record with flax's own ==."
)


def _workload(name: str, description: str, why: str, make: Callable[..., Any],
              stateful: bool = False) -> Workload:
    return Workload(name, description, why, _op(make, stateful), SIZES, NNX_MODEL)


WORKLOADS: tuple[Workload, ...] = (
    _workload("nnx-tree_flatten", "`jax.tree_util.tree_flatten((model, optimizer))`",
              _WHY_TREE + " tree_flatten itself stays JAX's (it returns a treedef).", _flatten),
    _workload("nnx-tree_leaves", "`jax.tree_util.tree_leaves((model, optimizer))`", _WHY_TREE,
              _leaves),
    _workload("nnx-tree_map", "`jax.tree_util.tree_map(lambda x: x, (model, optimizer))`",
              _WHY_TREE, _tree_map),
    _workload("nnx-tree_flatten_with_path", "`jax.tree_util.tree_flatten_with_path(...)`",
              _WHY_TREE + " It stays JAX's (it returns a treedef).", _flatten_with_path),
    _workload("nnx-tree_unflatten", "`jax.tree_util.tree_unflatten(treedef, leaves)`",
              _WHY_TREE + " It stays JAX's (it takes a treedef).", _unflatten),
    _workload("nnx-split", "`nnx.split(model)`", _WHY_GRAPH, _split),
    _workload("nnx-state", "`nnx.state(model)`", _WHY_GRAPH, _nnx_state),
    _workload("nnx-merge", "`nnx.merge(graphdef, state)`", _WHY_GRAPH, _merge),
    _workload("nnx-update", "`nnx.update(model, state)`", _WHY_GRAPH, _update),
    _workload("nnx-jit-call", "an `nnx.jit` call of a no-op `f(model, optimizer)`", _WHY_GRAPH,
              _jit_noop),
    _workload("nnx-jit-train-step", "an `nnx.jit` train step (`nnx.value_and_grad` + "
              "`optimizer.update`)", _WHY_GRAPH, _train_step, stateful=True),
    _workload("nnx-jax-jit-call", "a `jax.jit` call on `nnx.split((model, optimizer))` "
              "(flax's own \"JAX\" mode)",
              "jax.jit flattens the State (Variables are native nodes) and compares the static "
              "GraphDef; it rebuilds every Variable with flax's Variable._new.", _jax_jit_call,
              stateful=True),
    _workload("nnx-jit-tree-mode", "an `nnx.jit(graph=False)` call of the same no-op",
              "Tree mode flattens with jax.tree_util: the model's nodes are read in C.",
              _jit_tree_mode),
)
