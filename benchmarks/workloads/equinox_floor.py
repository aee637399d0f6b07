"""equinox against its builtin-shape floor: the equinox model's tree and filter_jit call, each timed
against the same shape made of builtin containers, in the same process (``floor``).

The model is ``equinox_ops``'s (the equinox-filter-jit transformer: 12 blocks of attention, MLP
and two layer norms). Its twin: a Module -> a dict of its fields that equinox flattens as
children (static fields are aux data, not children), recursively, lists, tuples and dicts rebuilt
around their items: the same leaves in builtin nodes. The filter_jit row's floor is a ``jax.jit``
identity on the model's arrays in a list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from benchmarks.workloads.base import FLOOR, Prepared, Workload
from benchmarks.workloads.equinox_ops import SIZES, _model
from benchmarks.workloads.floor import (
    flatten_pair,
    jit_on_arrays,
    mirror_containers,
    prepared_against_twin,
    unflatten_pair,
)


def mirror(x: Any) -> Any:
    """The builtin-shape twin of an equinox tree (the module docstring says how it is made)."""
    import equinox as eqx

    def node(value: Any) -> Any | None:
        if not isinstance(value, eqx.Module):
            return None
        return {
            field.name: mirror_containers(getattr(value, field.name), node)
            for field in dataclasses.fields(value)
            if not field.metadata.get("static", False)
        }

    return mirror_containers(x, node)


def _op(make: Callable[[Any, Any], tuple[Callable[[], Any], Callable[[], Any]]]
        ) -> Callable[[int], Prepared]:
    def build(blocks: int) -> Prepared:
        model = _model(blocks)
        return prepared_against_twin(model, model, mirror, make, f"{blocks} blocks")

    return build


def _filter_jit(model: Any, _twin: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    import equinox as eqx
    import jax

    noop = eqx.filter_jit(_noop)
    arrays = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array))
    return (lambda: noop(model)), jit_on_arrays(arrays)


def _noop(model: Any) -> None:
    return None


_WHY = (
    "call / floor in each process: the equinox model against its builtin-shape twin (the same "
    "leaves in dicts and tuples), timed turn by turn in one process."
)

WORKLOADS: tuple[Workload, ...] = (
    Workload("equinox-floor-flatten", "`jax.tree_util.tree_flatten(model)` against the builtin "
             "twin's", _WHY, _op(flatten_pair), SIZES, FLOOR),
    Workload("equinox-floor-unflatten", "`jax.tree_util.tree_unflatten(treedef, leaves)` "
             "against the builtin twin's", _WHY, _op(unflatten_pair), SIZES, FLOOR),
    Workload("equinox-floor-filter-jit", "an `eqx.filter_jit` no-op call of `f(model)` against "
             "a `jax.jit` identity on the model's arrays in a list", _WHY, _op(_filter_jit),
             SIZES, FLOOR),
)
