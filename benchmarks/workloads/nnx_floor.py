"""flax.nnx against its builtin-shape floor: the nnx model's tree and jit calls, each timed against
the same shape made of builtin containers, in the same process (``floor``).

The tree is ``nnx_ops``'s ``(model, optimizer)``: flax's graph-overhead MLP (20 blocks of
``nnx.Linear`` + ``nnx.BatchNorm``, width 32) with an adam ``nnx.Optimizer``. Its twin: a
Variable -> a 1-tuple of its value, a Pytree/Module -> a dict of the attributes flax flattens as
children (``_pytree__nodes``; static attributes are aux data, not children), a Pytree's
``PytreeState`` (a node of no children) -> an empty tuple, an ``nnx.State`` -> a dict of its
items, lists, tuples, namedtuples and dicts rebuilt around their items: the same leaves and as
many nodes, in builtin nodes only (``floor.check_builtin_twin`` refuses any other). The jit rows'
floor is a ``jax.jit`` identity on the state's arrays in a list.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from benchmarks.workloads.base import FLOOR, Prepared, Workload
from benchmarks.workloads.floor import (
    flatten_pair,
    jit_on_arrays,
    mirror_containers,
    prepared_against_twin,
    unflatten_pair,
)
from benchmarks.workloads.nnx_ops import SIZES, _state


def mirror(x: Any) -> Any:
    """The builtin-shape twin of an nnx tree (the module docstring says how it is made)."""
    from flax import nnx

    pytree_state = getattr(sys.modules.get("flax.nnx.pytreelib"), "PytreeState", None)
    state_type = getattr(nnx, "State", None)

    def node(value: Any) -> Any | None:
        if pytree_state is not None and type(value) is pytree_state:
            return ()
        if state_type is not None and isinstance(value, state_type):
            return {k: mirror_containers(v, node) for k, v in value.items()}
        if isinstance(value, nnx.Variable):
            return (value.get_value() if hasattr(value, "get_value") else value.value,)
        if isinstance(value, nnx.Pytree if hasattr(nnx, "Pytree") else nnx.Module):
            data = getattr(value, "_pytree__nodes", None)
            return {
                str(k): mirror_containers(v, node)
                for k, v in sorted(vars(value).items(), key=lambda item: str(item[0]))
                if (data.get(str(k), False) if data is not None else not str(k).startswith("_"))
            }
        return None

    return mirror_containers(x, node)


@functools.cache
def _own_state(depth: int) -> SimpleNamespace:
    return _state.__wrapped__(depth)


def _op(make: Callable[[SimpleNamespace, Any], tuple[Callable[[], Any], Callable[[], Any]]]
        ) -> Callable[[int], Prepared]:
    def build(depth: int) -> Prepared:
        # A model of its own: the stateful nnx workloads (train steps, update) step the shared
        # one a number of times that differs between the plain and the installed process, and
        # these rows fingerprint values.
        import jax

        state = _own_state(depth)
        tree = (state.model, state.optimizer)
        if jax.tree_util.tree_leaves(state.model) == [state.model]:
            from benchmarks.unsupported import Unsupported

            # flax before 0.11: an nnx Module is no jax pytree, so there is no tree to measure.
            raise Unsupported("unavailable: this flax's nnx Modules are not jax pytrees")
        return prepared_against_twin(tree, state, mirror, make, f"{depth} blocks")

    return build


def _flatten(s: SimpleNamespace, twin: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    return flatten_pair((s.model, s.optimizer), twin)


def _unflatten(s: SimpleNamespace, twin: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    return unflatten_pair((s.model, s.optimizer), twin)


def _split_arrays(s: SimpleNamespace) -> tuple[Any, list[Any]]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    _graphdef, state = nnx.split((s.model, s.optimizer))
    return state, [jnp.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]


def _jit_state(s: SimpleNamespace, _twin: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    import jax

    state, arrays = _split_arrays(s)
    identity = jax.jit(_identity)
    return (lambda: identity(state)), jit_on_arrays(arrays)


def _jit_call(s: SimpleNamespace, _twin: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    from flax import nnx

    @nnx.jit
    def noop(model: Any, optimizer: Any) -> None:
        return None

    arrays = _split_arrays(s)[1]
    return (lambda: noop(s.model, s.optimizer)), jit_on_arrays(arrays)


def _identity(x: Any) -> Any:
    return x


_WHY = (
    "call / floor in each process: the nnx tree against its builtin-shape twin (the same leaves "
    "in tuples and dicts), timed turn by turn in one process."
)


def _workload(name: str, description: str, make: Any) -> Workload:
    return Workload(name, description, _WHY, _op(make), SIZES, FLOOR)


WORKLOADS: tuple[Workload, ...] = (
    _workload("nnx-floor-flatten", "`jax.tree_util.tree_flatten((model, optimizer))` against "
              "the builtin twin's", _flatten),
    _workload("nnx-floor-unflatten", "`jax.tree_util.tree_unflatten(treedef, leaves)` against "
              "the builtin twin's", _unflatten),
    _workload("nnx-floor-jit-state", "a `jax.jit` identity on `nnx.split((model, optimizer))`'s "
              "state against the same on its arrays in a list", _jit_state),
    _workload("nnx-floor-jit-call", "an `nnx.jit` no-op call of `f(model, optimizer)` against a "
              "`jax.jit` identity on the arrays in a list", _jit_call),
)
