"""Registered custom node types for the "custom-nodes" tree, and their registration.

The same flatten/unflatten functions are registered with every library that can take them (optree
and torch register them in their adapters), so each library runs identical Python callbacks and the
comparison measures the libraries, not the callbacks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.tree_util as jtu


@dataclasses.dataclass
class Linear:
    weight: Any
    bias: Any


@dataclasses.dataclass
class LayerNorm:
    scale: Any
    bias: Any


@dataclasses.dataclass
class Block:
    """A transformer-ish block; ``name`` is static metadata: it lands in the treedef's aux data."""

    attention: Linear
    mlp: Linear
    norm: LayerNorm
    name: str


def _flatten_linear(node: Linear) -> tuple[tuple[Any, ...], None]:
    return (node.weight, node.bias), None


def _unflatten_linear(_aux: None, children: Any) -> Linear:
    return Linear(*children)


def _flatten_layer_norm(node: LayerNorm) -> tuple[tuple[Any, ...], None]:
    return (node.scale, node.bias), None


def _unflatten_layer_norm(_aux: None, children: Any) -> LayerNorm:
    return LayerNorm(*children)


def _flatten_block(node: Block) -> tuple[tuple[Any, ...], str]:
    return (node.attention, node.mlp, node.norm), node.name


def _unflatten_block(name: str, children: Any) -> Block:
    return Block(*children, name=name)


CUSTOM_TYPES: tuple[tuple[type, Any, Any], ...] = (
    (Linear, _flatten_linear, _unflatten_linear),
    (LayerNorm, _flatten_layer_norm, _unflatten_layer_norm),
    (Block, _flatten_block, _unflatten_block),
)
"""(class, flatten(node) -> (children, aux), unflatten(aux, children) -> node), JAX's convention."""

_registered = False


def ensure_registered() -> None:
    """Register CUSTOM_TYPES with fastree when it imports (which registers them with JAX too),
    then with JAX directly for any type JAX still does not know (fastree missing or not bridging).

    JAX raises ValueError on a duplicate registration; that is how "already known" is detected.
    """
    global _registered
    if _registered:
        return
    from benchmarks.data.fastree_import import try_import_tree_util

    fastree_tu = try_import_tree_util()
    for cls, flatten, unflatten in CUSTOM_TYPES:
        if fastree_tu is not None:
            fastree_tu.register_pytree_node(cls, flatten, unflatten)
        try:
            jtu.register_pytree_node(cls, flatten, unflatten)
        except ValueError:
            pass  # fastree already registered it with JAX.
    _registered = True
