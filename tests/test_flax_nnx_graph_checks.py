"""The first-walk checks of flax.nnx graph mode decide only what they can compare.

A check compares a native result with flax's (fastree/integrations/_flax_nnx_graph_compare.py);
a class goes back to flax's functions only on a real difference. Two programs that once made the
checks blame a class wrongly (both found by flax's own tests/nnx run installed):

* an ``nnx.update`` inside ``nnx.jit(graph=False)`` of a model holding a Variable subclass the
  walk had not met (the comparison did not know it as a Variable);
* a rebuilt graph whose leaves are tracers made anew by each rebuild (nothing to compare: the
  call is flax's, and nothing is decided);
* an update of Variables that hold array refs (``nnx.var_defaults(ref=True)``): the check's two
  copies each hold new refs of their own, which neither update replaces (flax's mutable-arrays
  example, in its tests/nnx/integration_test.py).

Each runs plainly and installed in child processes: the same results, and installed, every
entry of ``flax_nnx_graph.status()`` is ``native``.
"""

from __future__ import annotations

import pytest

import helpers
from helpers import run_json_program, skip_unless_integration_knows

_PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
from flax import nnx

class Count(nnx.Variable):
    pass

class Linear(nnx.Module):
    def __init__(self, din, dout, *, rngs):
        self.w = nnx.Param(jax.random.uniform(rngs.params(), (din, dout)))
        self.b = nnx.Param(jnp.zeros((dout,)))
        self.count = Count(jnp.array(0))

    def __call__(self, x):
        self.count[...] = self.count[...] + 1
        return x @ self.w + self.b[None]

model = Linear(12, 2, rngs=nnx.Rngs(0))
x = jnp.ones((8, 12))
y = model(x)

@nnx.jit(graph=False)
def train_step(model, x, y):
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)
    grads = nnx.grad(loss_fn, graph=False, allow_int=True)(model)
    params = jax.tree.map(lambda w, g: w - 0.1 * g, nnx.state(model, nnx.Param),
                          nnx.state(grads, nnx.Param))
    nnx.update(model, params)

train_step(model, x, y)
train_step(model, x, y)
out = {
    "count": int(model.count[...]),
    "w": [round(float(v), 5) for v in model.w[...].ravel()[:4]],
}

# a model split and merged inside jax.jit, its Variables traced by value_and_grad
model2 = nnx.Linear(2, 3, rngs=nnx.Rngs(1))

@jax.jit
def loss(x):
    graphdef, params, rest = nnx.split(model2, nnx.Param, ...)
    def f(params):
        m = nnx.merge(graphdef, params, rest)
        return (m(x) ** 2).mean()
    return jax.value_and_grad(f)(params)[0]

out["loss"] = round(float(loss(jnp.ones((4, 2)))), 5)
if len(sys.argv) > 1:
    from fastree.integrations import flax_nnx_graph
    out["status"] = flax_nnx_graph.status()
print(json.dumps(out))
"""


skip_unless_integration_knows("flax", "flax_nnx")


def _run(installed: bool) -> dict:
    return run_json_program(_PROGRAM, installed, *(["status"] if installed else []))


def test_checks_blame_no_class_without_a_difference():
    plain, installed = _run(False), _run(True)
    status = installed.pop("status")
    assert installed == plain
    assert plain["count"] == 3
    assert status == helpers.flax_walk_status(), status


_ARRAY_REFS = r"""
import json, sys
import jax, jax.numpy as jnp, optax
from flax import nnx

class Model(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(2, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, use_running_average=False, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, deterministic=False, rngs=rngs)
        self.linear_out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.linear_out(nnx.relu(self.dropout(self.bn(self.linear(x)))))

with nnx.var_defaults(ref=True):
    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

@jax.jit
def train_step(x, y):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    def loss_fn(params):
        m = nnx.merge(graphdef, params, rest)
        return ((m(x) - y) ** 2).mean()
    loss, grads = jax.value_and_grad(loss_fn)(nnx.with_vars(params, ref=False))
    optimizer.update(model, grads)
    return loss

x = jax.random.normal(jax.random.key(0), (8, 2))
y = jax.random.normal(jax.random.key(1), (8, 3))
losses = [round(float(train_step(x, y)), 4) for _ in range(3)]

# eagerly: an update of ref-holding Variables from a state of plain arrays
state = nnx.state(model, nnx.Param)
nnx.update(model, jax.tree.map(lambda v: v * 0 + 1, nnx.with_vars(state, ref=False)))
out = {
    "losses": losses,
    "w": [round(float(v), 4) for v in model.linear.kernel[...].ravel()[:4]],
    "mean": [round(float(v), 4) for v in model.bn.mean[...][:4]],
    "count": int(optimizer.step[...]),
}
if len(sys.argv) > 1:
    from fastree.integrations import flax_nnx_graph
    out["status"] = flax_nnx_graph.status()
print(json.dumps(out))
"""


def test_updates_of_array_ref_variables_stay_native():
    from flax import nnx

    if not hasattr(nnx, "with_vars"):
        pytest.skip("this flax has no nnx.with_vars (0.12.8 and later do)")
    try:
        plain = run_json_program(_ARRAY_REFS, False)
    except AssertionError as error:
        # JAX before 0.11 refuses this program plainly (a BatchNorm's array-ref statistics set
        # under grad): nothing to compare.
        if "non-differentiated array reference" in str(error):
            pytest.skip("this JAX refuses the program plainly (array refs set under grad)")
        raise
    installed = run_json_program(_ARRAY_REFS, True, "status")
    status = installed.pop("status")
    assert installed == plain
    assert plain["count"] == 3 and plain["w"] == [1.0, 1.0, 1.0, 1.0]
    assert len(set(plain["losses"])) == 3  # each step changed the model
    assert status == helpers.flax_walk_status(), status
