"""flax.nnx in tree mode for scripts/release_matrix.py: the transforms with ``graph=False``.

Tree mode (flax's FLIP 5310) walks a model with ``jax.tree`` calls over its Pytree and Variable
nodes instead of flax's graph walks, which is where fastree's tree-mode nodes serve it. The
program trains a small model with an optimizer under ``nnx.jit(graph=False)`` and
``nnx.value_and_grad(graph=False)``, runs ``nnx.grad(graph=False)`` and ``nnx.vmap``, and maps
over the model and its state with ``jax.tree_util``. A release without the ``graph`` argument
records the TypeError on both runs (``tree_mode`` says whether it has one).

Prints one JSON line, as flax_program.py does; the matrix compares the plain and installed runs,
status aside.
"""

import inspect
import json

import jax
import jax.numpy as jnp
import optax
from _outcome import outcome  # beside this file: the script's folder is on sys.path
from flax import nnx


class Model(nnx.Module):
    def __init__(self, rngs):
        self.first = nnx.Linear(3, 4, rngs=rngs)
        self.norm = nnx.LayerNorm(4, rngs=rngs)
        self.last = nnx.Linear(4, 2, rngs=rngs)
        self.calls = nnx.BatchStat(jnp.zeros(()))

    def __call__(self, x):
        self.calls.value += 1
        return self.last(jax.nn.relu(self.norm(self.first(x))))


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


model = Model(nnx.Rngs(0))
x = jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)
y = jnp.ones((5, 2))
out = {"tree_mode": "graph" in inspect.signature(nnx.jit).parameters}


def train():
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit(graph=False)
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn, graph=False)(model, x, y)
        optimizer.update(model, grads)
        return loss

    return [step(model, optimizer, x, y) for _ in range(3)] + [nnx.state(model)]


out["train"] = outcome(train)
out["grad"] = outcome(lambda: nnx.state(nnx.grad(loss_fn, graph=False)(model, x, y)))
out["vmap"] = outcome(lambda: nnx.vmap(lambda m, row: m(row), in_axes=(None, 0),
                                       graph=False)(model, x))
out["tree_leaves"] = outcome(lambda: jax.tree_util.tree_leaves(model))
out["tree_map"] = outcome(lambda: nnx.state(jax.tree_util.tree_map(lambda a: a * 2, model)))
out["with_path"] = outcome(lambda: [jax.tree_util.keystr(p) for p, _ in
                                    jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]])
try:
    from fastree.integrations import flax_nnx, status

    out["status"] = {"tree": flax_nnx.code_verdict().reason, "Model": status(Model),
                     "Param": status(nnx.Param)}
except ImportError:
    out["status"] = None
print(json.dumps(out, sort_keys=True, default=repr))
