"""One small chex program for scripts/release_matrix.py: tree calls on chex dataclasses, one with
an attribute added after __init__. Prints one JSON line (see flax_program.py)."""

import json

import chex
import jax
import jax.numpy as jnp
from _outcome import outcome  # beside this file: the script's folder is on sys.path


@chex.dataclass
class Params:
    w: jax.Array
    b: jax.Array


@chex.dataclass
class Outer:
    inner: Params
    step: int


tree = Outer(inner=Params(w=jnp.ones(3), b=jnp.zeros(2)), step=1)
irregular = Params(w=jnp.ones(1), b=jnp.ones(1))
irregular.extra = jnp.ones(4)
out = {}
out["leaves"] = outcome(lambda: jax.tree_util.tree_leaves(tree))
out["structure"] = outcome(lambda: str(jax.tree_util.tree_structure(tree)))
out["map"] = outcome(lambda: jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a: a * 3,
                                                                              tree)))
out["paths"] = outcome(lambda: [jax.tree_util.keystr(p) for p, _ in
                                jax.tree_util.tree_leaves_with_path(tree)])
out["irregular"] = outcome(lambda: jax.tree_util.tree_leaves(irregular))
out["jit"] = outcome(lambda: jax.jit(lambda t: t.inner.w * t.step)(tree))
try:
    from fastree.integrations import chex as integration
    from fastree.integrations import status

    out["status"] = {"code": integration.code_verdict().reason, "Params": status(Params)}
except ImportError:
    out["status"] = None
print(json.dumps(out, sort_keys=True, default=repr))
