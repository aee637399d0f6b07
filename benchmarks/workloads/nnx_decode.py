"""flax.nnx decode step: a model of many Variables and almost no compute, one token per call, each
of three ways a user jits it timed against the same step on its arrays in a list (``floor``).

The model (``_classes``): an embedding, ``layers`` tiny attention layers of width 8 and a final
LayerNorm; the logits are the embedding transposed. Each layer holds 16 ``nnx.Param`` (two
LayerNorms, the query/key/value/output projections and a two-``nnx.Linear`` MLP, a kernel and a
bias each) and a KV cache of 3 ``nnx.Cache`` (the cached keys and values, ``MAX_LEN`` rows each,
and the position the next token goes to): ``variables(64)`` = 1,219 Variables at the quick size.
A decode step embeds the token, writes its key and value at each layer's position, attends over
the positions written so far, moves the position on (wrapping at ``MAX_LEN``: it never runs out)
and returns the logits and the greedy next token, which the next call decodes. The cache is
updated in place, as nnx models do; the compute is some 25 small ops a layer on 8-wide vectors, so
a call's time is mostly what the jit around it costs for ~1,200 Variables.

The three workloads (group ``FLOOR``), one per way to jit the step:

- ``nnx-floor-decode-graph``: ``nnx.jit`` (graph mode, flax's default), called on the model;
- ``nnx-floor-decode-tree``: ``nnx.jit(graph=False)`` (tree mode), called on the model;
- ``nnx-floor-decode-jax-jit``: ``jax.jit`` of a pure function of ``(graphdef, state, token)``
  that merges, steps and returns ``nnx.state(model)``, the state carried from call to call.

The floor of each: the same step compiled by ``jax.jit`` as a function of the state's arrays in
one flat list (and the token), the list carried from call to call. It is ``floor.jit_on_arrays``
with the step's own compute in it rather than an identity: the call / floor distance then counts
only what holding the arrays in Variables costs (1.0x = nothing), where an identity floor would
also count the step's compute and its new output arrays against nnx (on the 2-core VM, at 64
layers: about 3 ms of a 12-16 ms floor). Each call and its floor is a real decode step; each
fingerprints the logits of its first step and, for the call, the whole state after the warm-up.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from benchmarks.unsupported import Unsupported
from benchmarks.workloads.base import FLOOR, Prepared, Workload, require, values_fingerprint

WIDTH = 8
VOCAB = 16
MAX_LEN = 16
"""Rows of each layer's KV cache: the position wraps to 0 after the last."""
PARAMS_PER_LAYER = 16
CACHES_PER_LAYER = 3
OUTSIDE_LAYERS = 3
"""The embedding's table and the final LayerNorm's scale and bias."""
SIZES = {"tiny": 2, "quick": 64, "full": 64}


def variables(layers: int) -> int:
    """The model's number of Variables (each holds one array)."""
    return (PARAMS_PER_LAYER + CACHES_PER_LAYER) * layers + OUTSIDE_LAYERS


def _get(variable: Any) -> Any:
    # flax 0.12 deprecates .value (a DeprecationWarning, an error under the tests).
    return variable.get_value() if hasattr(variable, "get_value") else variable.value


def _set(variable: Any, value: Any) -> None:
    if hasattr(variable, "set_value"):
        variable.set_value(value)
    else:
        variable.value = value


@functools.cache
def _classes() -> SimpleNamespace:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    module_list = getattr(nnx, "List", list)  # flax < 0.12 takes a plain list

    class Layer(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.attention_norm = nnx.LayerNorm(WIDTH, rngs=rngs)
            self.query = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.key = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.value = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.output = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.mlp_norm = nnx.LayerNorm(WIDTH, rngs=rngs)
            self.up = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.down = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.cached_keys = nnx.Cache(jnp.zeros((MAX_LEN, WIDTH)))
            self.cached_values = nnx.Cache(jnp.zeros((MAX_LEN, WIDTH)))
            self.position = nnx.Cache(jnp.zeros((), jnp.int32))

        def __call__(self, x: Any) -> Any:
            h = self.attention_norm(x)
            position = _get(self.position)
            keys = _get(self.cached_keys).at[position].set(self.key(h))
            values = _get(self.cached_values).at[position].set(self.value(h))
            _set(self.cached_keys, keys)
            _set(self.cached_values, values)
            _set(self.position, (position + 1) % MAX_LEN)
            scores = keys @ self.query(h) / math.sqrt(WIDTH)
            scores = jnp.where(jnp.arange(MAX_LEN) <= position, scores, -jnp.inf)
            x = x + self.output(jax.nn.softmax(scores) @ values)
            return x + self.down(jax.nn.relu(self.up(self.mlp_norm(x))))

    class Decoder(nnx.Module):
        def __init__(self, layers: int, rngs: Any) -> None:
            self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
            self.layers = module_list([Layer(rngs) for _ in range(layers)])
            self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)

        def __call__(self, token: Any) -> Any:
            x = self.embed(token)
            for layer in self.layers:
                x = layer(x)
            return self.embed.attend(self.norm(x))

    def decode(model: Any, token: Any) -> tuple[Any, Any]:
        """One decode step: the logits, and the greedy next token."""
        logits = model(token)
        return logits, jnp.argmax(logits).astype(jnp.int32)

    return SimpleNamespace(Decoder=Decoder, decode=decode)


@functools.cache
def _template(layers: int) -> Any:
    """The decoder every workload of this process starts from (never stepped itself); the same in
    every process."""
    require("flax.nnx")
    from flax import nnx

    return _classes().Decoder(layers, nnx.Rngs(0))


def model(layers: int) -> Any:
    """A new decoder in its initial state: its own Variables (the workloads step theirs), the
    template's arrays (made once: 64 layers take seconds to initialise)."""
    template = _template(layers)  # first: Unsupported when flax is missing
    from flax import nnx

    return nnx.clone(template)


Calls = tuple[Callable[[], Any], Callable[[], Any]]
"""A decode call (its logits and next token) and what to fingerprint after the warm-up."""


def _graph(decoder: Any) -> Calls:
    from flax import nnx

    return _on_model(decoder, nnx.jit(_classes().decode))


def _tree(decoder: Any) -> Calls:
    import jax
    from flax import nnx

    if "graph" not in inspect.signature(nnx.jit).parameters:
        raise Unsupported("unavailable: this flax's nnx.jit has no graph= (no tree mode)")
    if jax.tree_util.tree_leaves(decoder) == [decoder]:
        # flax before 0.11: an nnx Module is no jax pytree, so tree mode has nothing to walk.
        raise Unsupported("unavailable: this flax's nnx Modules are not jax pytrees")
    return _on_model(decoder, nnx.jit(_classes().decode, graph=False))


def _on_model(decoder: Any, step: Callable[[Any, Any], tuple[Any, Any]]) -> Calls:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    token = jnp.zeros((), jnp.int32)

    def call() -> Any:
        nonlocal token
        logits, token = jax.block_until_ready(step(decoder, token))
        return logits, token

    return call, lambda: nnx.state(decoder)


def _jax_jit(decoder: Any) -> Calls:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    decode = _classes().decode

    @jax.jit
    def step(graphdef: Any, state: Any, token: Any) -> tuple[Any, Any, Any]:
        model = nnx.merge(graphdef, state)
        logits, token = decode(model, token)
        return logits, token, nnx.state(model)

    graphdef, state = nnx.split(decoder)
    token = jnp.zeros((), jnp.int32)

    def call() -> Any:
        nonlocal state, token
        logits, token, state = jax.block_until_ready(step(graphdef, state, token))
        return logits, token

    return call, lambda: state


@functools.cache
def _floor_step(layers: int) -> Callable[[list[Any], Any], tuple[Any, Any, list[Any]]]:
    """The decode step ``jax.jit``-ed on the state's arrays in one list (and the token): one per
    process for the three workloads, so it is traced once."""
    import jax
    from flax import nnx

    decode = _classes().decode
    graphdef, state = nnx.split(_template(layers))
    treedef = jax.tree_util.tree_structure(state)

    @jax.jit
    def step(arrays: list[Any], token: Any) -> tuple[Any, Any, list[Any]]:
        model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, arrays))
        logits, token = decode(model, token)
        return logits, token, jax.tree_util.tree_leaves(nnx.state(model))

    return step


def floor(layers: int) -> Callable[[], Any]:
    """The floor: decode steps of ``_floor_step`` from the initial state, the list carried; each
    returns the logits and the next token, as a workload's call does."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    step = _floor_step(layers)
    arrays = jax.tree_util.tree_leaves(nnx.state(_template(layers)))
    token = jnp.zeros((), jnp.int32)

    def call() -> Any:
        nonlocal arrays, token
        logits, token, arrays = jax.block_until_ready(step(arrays, token))
        return logits, token

    return call


def cache_state(state: Any) -> Any:
    """The ``nnx.Cache`` part of a model's state (flax 0.12 deprecates ``State.filter``)."""
    from flax import nnx

    if hasattr(nnx, "filter_state"):
        return nnx.filter_state(state, nnx.Cache)
    return state.filter(nnx.Cache)


def decode_calls(name: str, layers: int) -> Calls:
    """The named workload's decode call on a new decoder, and its state (the model's, or the
    state the call carries) at the time of asking."""
    return _MODES[name](model(layers))


def _build(name: str) -> Callable[[int], Prepared]:
    def build(layers: int) -> Prepared:
        require("flax.nnx")  # first: Unsupported (the workload skipped) when flax is missing
        import jax
        from flax import nnx

        call, state = decode_calls(name, layers)

        def count_variables(tree: Any) -> int:
            is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
            return len(jax.tree_util.tree_leaves(tree, is_leaf=is_variable))

        count, caches = count_variables(state()), count_variables(cache_state(state()))
        leaves = len(jax.tree_util.tree_leaves(state()))
        floor_call = floor(layers)

        def fingerprint(result: Any) -> str:
            # The call's first step; the state after the warm-up's steps (as many in each
            # process: the child fingerprints before it times); the floor's first step.
            return values_fingerprint(result) + values_fingerprint(state()) + (
                values_fingerprint(floor_call()))

        size = f"{layers} layers, {count} Variables ({caches} nnx.Cache), {leaves} leaves"
        return Prepared(call, size, fingerprint=fingerprint, floor=floor_call)

    return build


_MODES: dict[str, Callable[[Any], Calls]] = {
    "nnx-floor-decode-graph": _graph,
    "nnx-floor-decode-tree": _tree,
    "nnx-floor-decode-jax-jit": _jax_jit,
}
_WHY = (
    "call / floor in each process: the nnx decode step against the same compiled step on the "
    "state's arrays in a list, timed turn by turn in one process. The step's compute is tiny, so "
    "above the floor is what the jit costs per Variable: nnx's graph walks (split and merge, in "
    "and out) in graph mode, flattening and rebuilding every Variable and Module in tree mode "
    "and under jax.jit, plus nnx.jit's own Python."
)


def _workload(name: str, description: str) -> Workload:
    return Workload(name, description, _WHY, _build(name), SIZES, FLOOR)


WORKLOADS: tuple[Workload, ...] = (
    _workload("nnx-floor-decode-graph", "an `nnx.jit` decode step (graph mode) updating the "
              "model's KV cache in place, against the same step `jax.jit`-ed on its arrays in "
              "a list"),
    _workload("nnx-floor-decode-tree", "an `nnx.jit(graph=False)` decode step (tree mode) "
              "updating the model's KV cache in place, against the same step `jax.jit`-ed on "
              "its arrays in a list"),
    _workload("nnx-floor-decode-jax-jit", "a `jax.jit` decode step of `(graphdef, state)` "
              "(`nnx.merge`, step, `nnx.state`), the state carried, against the same step on "
              "its arrays in a list"),
)
