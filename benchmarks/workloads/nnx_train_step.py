"""flax.nnx: host overhead of an ``nnx.jit``-ed train step (loss, grads, adamw), per call."""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace
from typing import Any

from benchmarks.workloads.base import Prepared, Workload, require, shapes_fingerprint

WIDTH = 8
BATCH = 4


def build(blocks: int) -> Prepared:
    require("flax.nnx")
    require("optax")
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    classes = _classes()
    model = classes.Net(blocks, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    x, y = jnp.ones((BATCH, WIDTH)), jnp.zeros((BATCH, 1))

    def call() -> Any:
        # Each call moves the weights (nnx modules are mutable): results are compared by shape.
        return jax.block_until_ready(classes.train_step(model, optimizer, x, y))

    arrays = len(jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
    return Prepared(
        call, f"{blocks} blocks, {arrays} parameter arrays", fingerprint=shapes_fingerprint
    )


@functools.cache
def _classes() -> SimpleNamespace:
    import jax
    from flax import nnx

    module_list = getattr(nnx, "List", list)  # flax < 0.12 takes a plain list

    class Block(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
            self.fc1 = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.fc2 = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return x + self.fc2(jax.nn.relu(self.fc1(self.norm(x))))

    class Net(nnx.Module):
        def __init__(self, num_blocks: int, rngs: Any) -> None:
            self.blocks = module_list([Block(rngs) for _ in range(num_blocks)])
            self.head = nnx.Linear(WIDTH, 1, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    @nnx.jit
    def train_step(model: Any, optimizer: Any, x: Any, y: Any) -> Any:
        def loss_fn(model: Any) -> Any:
            return ((model(x) - y) ** 2).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        apply_update(optimizer, model, grads)
        return loss

    return SimpleNamespace(Net=Net, train_step=train_step)


def apply_update(optimizer: Any, model: Any, grads: Any) -> None:
    """``optimizer.update`` as the installed flax takes it: flax 0.11 made the model an argument
    (before: ``update(grads)``)."""
    if "model" in inspect.signature(type(optimizer).update).parameters:
        optimizer.update(model, grads)
    else:
        optimizer.update(grads)


WORKLOAD = Workload(
    name="nnx-train-step",
    description="an `nnx.jit`-ed train step (MSE loss, `nnx.value_and_grad`, "
    "`nnx.Optimizer(adamw).update`) on an MLP of residual blocks, compiled once, timed per call",
    why="nnx.jit splits the module graph into a GraphDef and State and merges it back on every "
    "call; installed, those graph walks run in C (fastree.integrations.flax_nnx_graph), where "
    "flax's own Python walks them plainly, and jax.jit dispatches in C++.",
    build=build,
    sizes={"tiny": 1, "quick": 12, "full": 12},
)
