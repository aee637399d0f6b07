"""One small equinox program for scripts/release_matrix.py: filter_jit, partition/combine, tree
calls on a Module. Prints one JSON line (see flax_program.py)."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
from _outcome import outcome  # beside this file: the script's folder is on sys.path


class Block(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    name: str = eqx.field(static=True)

    def __call__(self, x):
        return x @ self.weight + self.bias


model = [Block(jnp.ones((3, 3)), jnp.zeros(3), "a"), eqx.nn.Linear(3, 2, key=jax.random.key(0))]
out = {}
out["leaves"] = outcome(lambda: jax.tree_util.tree_leaves(model))
out["structure"] = outcome(lambda: str(jax.tree_util.tree_structure(model)))
out["map"] = outcome(lambda: jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a: a + 1,
                                                                              model)))
out["paths"] = outcome(lambda: [jax.tree_util.keystr(p) for p, _ in
                                jax.tree_util.tree_leaves_with_path(model)])
out["combine"] = outcome(lambda: jax.tree_util.tree_leaves(
    eqx.combine(*eqx.partition(model, eqx.is_array))))
out["filter_jit"] = outcome(lambda: eqx.filter_jit(lambda m, x: m[1](m[0](x)))(model,
                                                                               jnp.ones(3)))
try:
    from fastree.integrations import equinox as integration
    from fastree.integrations import status

    out["status"] = {"code": integration.code_verdict().reason, "Block": status(Block)}
except ImportError:
    out["status"] = None
print(json.dumps(out, sort_keys=True, default=repr))
