"""One small flax.nnx program for scripts/release_matrix.py: split, merge, jit, update, tree calls.

Prints one JSON line: what each step gave (shapes, sums, GraphDef text, or the exception's type),
and how fastree serves flax (``status``). Run plainly and under ``python -m fastree.run``; the
matrix compares the two outputs, status aside.
"""

import json
import re

import jax
import jax.numpy as jnp
from _outcome import outcome  # beside this file: the script's folder is on sys.path
from flax import nnx


class Block(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(4, 4, rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.shared = self.linear  # a shared reference

    def __call__(self, x):
        return self.norm(self.linear(x))


model = nnx.Sequential(Block(nnx.Rngs(0)), Block(nnx.Rngs(1)))
x = jnp.ones((2, 4))
out = {}
out["split"] = outcome(lambda: [re.sub(r" at 0x[0-9a-f]+", "", repr(nnx.split(model)[0])),
                               nnx.split(model)[1].to_pure_dict()])
out["merge"] = outcome(lambda: nnx.state(nnx.merge(*nnx.split(model))).to_pure_dict())


@nnx.jit
def step(m, x):
    return m(x).sum()


out["jit"] = outcome(lambda: [step(model, x), step(model, x)])
out["update"] = outcome(lambda: (nnx.update(model, nnx.state(model)), nnx.state(model)
                                 .to_pure_dict())[1])
out["tree_leaves"] = outcome(lambda: jax.tree_util.tree_leaves(model))
out["tree_map"] = outcome(lambda: nnx.state(jax.tree_util.tree_map(lambda a: a * 2, model))
                          .to_pure_dict())
try:
    from fastree.integrations import flax_nnx, flax_nnx_graph, status

    out["status"] = {"graph": flax_nnx_graph.status(), "tree": flax_nnx.code_verdict().reason,
                     "Linear": status(nnx.Linear), "Param": status(nnx.Param)}
except ImportError:
    out["status"] = None
print(json.dumps(out, sort_keys=True, default=repr))
