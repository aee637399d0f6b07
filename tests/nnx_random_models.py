"""Random flax.nnx models and a JSON view of what JAX, fastree and flax make of them.

Run as a script in a child process (``python nnx_random_models.py SEED COUNT``), plainly or under
``python -m fastree.run``: it prints one JSON document, which tests/test_flax_nnx_integration.py
compares between the two runs. Everything is derived from the seed (``random.Random``), so a run
is reproducible and cannot fail by chance.

Each model mixes what the integration must reproduce: Linear, BatchNorm and Dropout layers,
nnx.List / nnx.Dict and plain containers, shared submodules and shared Variables, nnx.Rngs,
Variables with metadata, static attributes, an Optimizer, and a module changed between calls.
"""

from __future__ import annotations

import json
import random
import re
import sys
from typing import Any


def _describe_leaf(x: Any) -> Any:
    shape = getattr(x, "shape", None)
    if shape is not None:
        dtype = str(getattr(x, "dtype", ""))
        if dtype.startswith("key<"):  # an RNG key: its raw bits
            import jax

            x = jax.random.key_data(x)
        return ["array", dtype, list(shape), float(abs(x).sum())]
    return [type(x).__name__, repr(x)[:60]]


def _text(obj: Any) -> str:
    # A repr without object addresses, which differ between processes.
    return re.sub(r" at 0x[0-9a-f]+", " at 0x", repr(obj) if not isinstance(obj, str) else obj)


def _identity_pattern(objects: list) -> list[int]:
    first: dict[int, int] = {}
    return [first.setdefault(id(o), i) for i, o in enumerate(objects)]


def build(rng: random.Random, nnx: Any, jnp: Any) -> Any:
    width = rng.choice([2, 3, 4])
    seed = rng.randrange(1000)
    rngs = nnx.Rngs(seed)

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(width, width, rngs=rngs)
            if rng.random() < 0.5:
                self.bn = nnx.BatchNorm(width, rngs=rngs)
            if rng.random() < 0.3:
                self.drop = nnx.Dropout(0.5, rngs=rngs)
            self.label = rng.choice(["a", "b", "block"])  # a static attribute
            self.depth = rng.randrange(3)

        def __call__(self, x):
            y = self.linear(x)
            if hasattr(self, "bn"):
                y = self.bn(y)
            return y

    class Model(nnx.Module):
        def __init__(self, rngs):
            n = rng.randrange(1, 4)
            self.blocks = nnx.List([Block(rngs) for _ in range(n)])
            if rng.random() < 0.5:
                self.named = nnx.Dict({f"k{i}": Block(rngs) for i in range(rng.randrange(1, 3))})
            if rng.random() < 0.5:  # a shared submodule
                self.again = self.blocks[0]
            self.scale = nnx.Param(jnp.ones((width,)) * rng.random(), note=rng.choice(["x", "y"]))
            if rng.random() < 0.5:  # a shared Variable
                self.scale_again = self.scale
            self.counter = nnx.Variable(jnp.zeros(()))
            self.config = {"width": width, "name": rng.choice(["m", "n"])}
            if rng.random() < 0.5:
                self.rngs = nnx.Rngs(seed + 1)

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            self.counter[...] = self.counter[...] + 1
            return x * self.scale

    model = Model(rngs)
    if rng.random() < 0.5:
        import optax

        optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    else:
        optimizer = None
    return model, optimizer, width


def view(seed: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    rng = random.Random(seed)
    model, optimizer, width = build(rng, nnx, jnp)
    tree = (model, optimizer) if optimizer is not None else model
    out: dict = {}
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    out["leaves"] = [_describe_leaf(x) for x in leaves]
    out["leaf_identity"] = _identity_pattern(leaves)
    out["treedef"] = _text(str(treedef))
    out["paths"] = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    out["leaves_fn"] = [_describe_leaf(x) for x in jax.tree_util.tree_leaves(tree)]
    doubled = jax.tree.map(
        lambda x: x * 2 if hasattr(x, "shape") and not str(x.dtype).startswith("key<") else x, tree
    )
    out["mapped"] = [_describe_leaf(x) for x in jax.tree_util.tree_leaves(doubled)]
    out["mapped_treedef"] = _text(str(jax.tree_util.tree_structure(doubled)))
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    out["rebuilt_types"] = [type(rebuilt).__name__]
    out["rebuilt_vars"] = sorted(vars(rebuilt if optimizer is None else rebuilt[0]))
    out["rebuilt_leaves"] = _identity_pattern(jax.tree_util.tree_leaves(rebuilt)) == out["leaf_identity"]
    # graph mode
    graphdef, state = nnx.split(model)
    out["graphdef"] = _text(graphdef)
    out["state"] = [_describe_leaf(x) for x in jax.tree_util.tree_leaves(state)]
    merged = nnx.merge(graphdef, state)
    out["merged_shared"] = [
        getattr(merged, "again", None) is merged.blocks[0],
        getattr(merged, "scale_again", None) is merged.scale,
    ]

    @nnx.jit
    def step(m, x):
        return m(x)

    x = jnp.ones((2, width))
    y = step(model, x)
    out["jit"] = _describe_leaf(y)
    out["counter_after_jit"] = float(model.counter[...])  # the in-place update
    # a module changed between calls: a new attribute, then tree mode again
    model.extra = nnx.Param(jnp.full((1,), 3.0))
    out["changed"] = [_describe_leaf(x) for x in jax.tree_util.tree_leaves(model)]
    out["changed_paths"] = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(model)
    ]

    @nnx.jit(graph=False) if _has_tree_mode_jit(nnx) else nnx.jit
    def tree_step(m, x):
        return m(x)

    try:  # tree mode refuses shared Variables: the same refusal with and without fastree
        out["tree_jit"] = _describe_leaf(tree_step(model, x))
    except ValueError as error:
        out["tree_jit"] = ["ValueError", str(error).splitlines()[0]]
    return out


def _has_tree_mode_jit(nnx: Any) -> bool:
    import inspect

    try:
        return "graph" in inspect.signature(nnx.jit).parameters
    except (TypeError, ValueError):
        return False


def statuses() -> dict:
    import fastree.integrations as fi
    from flax import nnx

    return {name: fi.status(getattr(nnx, name)) for name in ("Linear", "BatchNorm", "Param", "List", "Dict", "Rngs", "Optimizer")}


if __name__ == "__main__":
    first, count = int(sys.argv[1]), int(sys.argv[2])
    views = {str(seed): view(seed) for seed in range(first, first + count)}
    print(json.dumps({"views": views, "status": statuses()}))
