"""The benchmark trees: a catalog of recipes and the builders behind them.

Sizes: transformer-12 has 195 leaves, transformer-50 803, transformer-1000 16,003; resnet50 ~270.
dict-10k and its variants (dict_orders) hold 10,000 keys in one dict, inserted in six orders.
Each recipe lists the features a library must understand to express the tree, so an adapter can
skip it up front with a note (dm-tree: no custom nodes, and None is a leaf there, not an empty
node).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax.tree_util as jtu

from benchmarks.data import custom_nodes, dict_orders, identity_nodes, nnx_models
from benchmarks.data.leaves import LeafFactory
from benchmarks.data.operations import DICT_ORDER_OPS, GRAPH_OPS, IDENTITY_OPS, TREE_OPS
from benchmarks.unsupported import Unsupported

# Features a tree may need from a library.
CUSTOM_NODES = "custom_nodes"  # registered classes (dataclasses here)
NNX = "nnx"  # flax.nnx State / Variable nodes, registered with JAX by flax
NONE_NODE = "none"  # None as an empty subtree (JAX, optree, torch) rather than a leaf (dm-tree)


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    build: Callable[[LeafFactory], Any]
    features: frozenset[str] = frozenset()
    ops: tuple[str, ...] = TREE_OPS
    fixed_leaves: bool = False
    """The tree owns its leaves (floats, nnx Variables): built once, whatever --leaves says."""
    memory_probe: bool = False
    """Whether the per-node treedef memory is measured on this tree."""
    variant_of: str | None = None
    """The recipe this one repeats with one thing changed (the dict-order variants of dict-10k).
    Variants get their own table and chart panel and stay out of the geometric means over trees,
    so one tree shape is not counted six times there."""


@dataclass
class TreeCase:
    """A built tree ready to benchmark: ``name`` carries the leaf kind, e.g. transformer-12@jax."""

    name: str
    recipe: Recipe
    leaf_kind: str
    tree: Any
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Inputs that are not the pytree itself, e.g. the nnx module for split/merge."""

    @property
    def features(self) -> frozenset[str]:
        return self.recipe.features

    @functools.cached_property
    def reference_leaves(self) -> list[Any]:
        """jax.tree_util's leaves: every library must return these objects, in this order."""
        return jtu.tree_leaves(self.tree)

    @functools.cached_property
    def num_nodes(self) -> int:
        return jtu.tree_structure(self.tree).num_nodes

    @functools.cached_property
    def twins(self) -> tuple[Any, Any]:
        """Two more trees of this structure (new containers, same leaves) for 3-tree tree_map."""
        return jtu.tree_map(lambda x: x, self.tree), jtu.tree_map(lambda x: x, self.tree)


# ------------------------------------------------------------------------------------------------
# builders


def transformer_params(num_layers: int, leaf: LeafFactory) -> dict[str, Any]:
    """Flax-style parameters: embedding, a list of layers, a final norm; 16 leaves per layer."""

    def dense() -> dict[str, Any]:
        return {"kernel": leaf((2, 2)), "bias": leaf((2,))}

    def norm() -> dict[str, Any]:
        return {"scale": leaf((2,)), "bias": leaf((2,))}

    layers = [
        {
            "attention": {"query": dense(), "key": dense(), "value": dense(), "out": dense()},
            "mlp": {"fc1": dense(), "fc2": dense()},
            "ln1": norm(),
            "ln2": norm(),
        }
        for _ in range(num_layers)
    ]
    return {"embedding": {"embedding": leaf((2, 2))}, "layers": layers, "final_norm": norm()}


def resnet50_params(leaf: LeafFactory) -> dict[str, Any]:
    """ResNet-50 layout: stem, [3, 4, 6, 3] bottlenecks (3 conv+bn; first downsamples), fc."""

    def conv() -> dict[str, Any]:
        return {"kernel": leaf((2, 2))}

    def batch_norm() -> dict[str, Any]:
        return {"scale": leaf((2,)), "bias": leaf((2,)), "mean": leaf((2,)), "var": leaf((2,))}

    def bottleneck(downsample: bool) -> dict[str, Any]:
        block = {f"conv{i}": conv() for i in (1, 2, 3)} | {
            f"bn{i}": batch_norm() for i in (1, 2, 3)
        }
        if downsample:
            block["downsample"] = {"conv": conv(), "bn": batch_norm()}
        return block

    stages = {
        f"stage{s + 1}": [bottleneck(downsample=(b == 0)) for b in range(depth)]
        for s, depth in enumerate((3, 4, 6, 3))
    }
    return {
        "stem": {"conv": conv(), "bn": batch_norm()},
        **stages,
        "fc": {"kernel": leaf((2, 2)), "bias": leaf((2,))},
    }


def mlp_params(leaf: LeafFactory) -> dict[str, Any]:
    """4 dense layers; the last has no bias and holds None there, as equinox does."""
    layers = [{"kernel": leaf((2, 2)), "bias": leaf((2,))} for _ in range(3)]
    layers.append({"kernel": leaf((2, 2)), "bias": None})
    return {"layers": layers}


class ScaleByAdamState(NamedTuple):
    """Mirrors optax.ScaleByAdamState (a NamedTuple) without depending on optax."""

    count: Any
    mu: Any
    nu: Any


class EmptyState(NamedTuple):
    """Mirrors optax.EmptyState, the state of stateless transforms in an optax.chain."""


def adam_state(leaf: LeafFactory) -> tuple[Any, ...]:
    """optax.chain(scale_by_adam(), scale(-lr)) state around transformer-12 parameters."""
    return (
        ScaleByAdamState(
            count=leaf(()), mu=transformer_params(12, leaf), nu=transformer_params(12, leaf)
        ),
        EmptyState(),
    )


def custom_node_model(leaf: LeafFactory, num_blocks: int = 12) -> list[Any]:
    """Registered Block dataclasses (each 3 custom children) behind an embedding Linear."""
    custom_nodes.ensure_registered()
    Linear, LayerNorm, Block = custom_nodes.Linear, custom_nodes.LayerNorm, custom_nodes.Block

    def linear() -> Any:
        return Linear(leaf((2, 2)), leaf((2,)))

    blocks = [
        Block(
            attention=linear(),
            mlp=linear(),
            norm=LayerNorm(leaf((2,)), leaf((2,))),
            name=f"block{i}",
        )
        for i in range(num_blocks)
    ]
    return [linear(), *blocks]


def flat_floats(_leaf: LeafFactory) -> list[float]:
    """100k distinct Python floats in one list: the per-leaf cost with no nesting at all."""
    return [float(i) for i in range(100_000)]


def deep_nesting(leaf: LeafFactory) -> Any:
    """500 levels, cycling dict / list / tuple, one leaf per level: recursion cost per level."""
    node: Any = leaf((2,))
    for depth in range(500):
        kind = depth % 3
        if kind == 0:
            node = {"leaf": leaf((2,)), "child": node}
        elif kind == 1:
            node = [leaf((2,)), node]
        else:
            node = (leaf((2,)), node)
    return node


def three_leaf_tuple(leaf: LeafFactory) -> tuple[Any, Any, Any]:
    """(a, b, c): almost nothing but per-call overhead."""
    return (leaf((2,)), leaf((2,)), leaf((2,)))


def shared_graph(leaf: LeafFactory) -> dict[str, Any]:
    """Plain-dict twin of the shared-graph models: the embedding dict appears twice.

    An ordinary pytree flatten duplicates it; the split_merge op times the identity-preserving
    versions of this graph (identity_nodes.shared_model for fastree, nnx_models for nnx), which
    keep it shared. This twin only gives the report its leaf and node counts.
    """
    embed = {"embedding": leaf((4, 2))}

    def linear() -> dict[str, Any]:
        return {"kernel": leaf((2, 2)), "bias": leaf((2,))}

    blocks = [{"fc1": linear(), "fc2": linear()} for _ in range(identity_nodes.SHARED_BLOCKS)]
    return {"embed": embed, "blocks": blocks, "unembed": embed}


# ------------------------------------------------------------------------------------------------
# catalog


RECIPES: tuple[Recipe, ...] = (
    Recipe("tuple3", "(a, b, c): per-call overhead", three_leaf_tuple),
    Recipe(
        "mlp",
        "4-layer MLP params, last bias None (equinox style)",
        mlp_params,
        features=frozenset({NONE_NODE}),
    ),
    Recipe(
        "transformer-12",
        "12-layer transformer params (195 leaves)",
        functools.partial(transformer_params, 12),
    ),
    Recipe(
        "transformer-50",
        "50-layer transformer params (803 leaves)",
        functools.partial(transformer_params, 50),
        memory_probe=True,
    ),
    Recipe(
        "transformer-1000",
        "1000-layer transformer params (16,003 leaves)",
        functools.partial(transformer_params, 1000),
        memory_probe=True,
    ),
    Recipe("resnet50", "ResNet-50-like params: conv kernels, batch-norm stats", resnet50_params),
    Recipe(
        "adam-state",
        "optax-style chain state: (ScaleByAdamState(count, mu, nu), EmptyState())"
        " around transformer-12",
        adam_state,
    ),
    Recipe(
        "custom-nodes",
        "12 registered dataclass blocks (custom nodes with aux data)",
        custom_node_model,
        features=frozenset({CUSTOM_NODES}),
    ),
    Recipe(
        "custom-nodes-1000",
        "1000 registered dataclass blocks (4,001 custom nodes, str/None aux data): also times"
        " fastree with its aux_data checks off (fastree-noaux)",
        functools.partial(custom_node_model, num_blocks=1000),
        features=frozenset({CUSTOM_NODES}),
    ),
    Recipe(
        "nnx-state",
        "flax.nnx State of a small model (nnx.split)",
        lambda _leaf: nnx_models.small_model_state(),
        features=frozenset({NNX}),
        fixed_leaves=True,
    ),
    Recipe("flat-100k", "list of 100,000 floats", flat_floats, fixed_leaves=True),
    Recipe(
        "dict-10k",
        "dict of 10,000 keys key00000..key09999, inserted already sorted",
        dict_orders.sorted_dict,
    ),
    *(
        Recipe(
            f"dict-10k-{order}",
            f"dict of 10,000 keys, {description}",
            build,
            ops=DICT_ORDER_OPS,
            variant_of="dict-10k",
        )
        for order, description, build in (
            ("natural", "k0, k1, ..., k9999 inserted in that order", dict_orders.natural_dict),
            ("flax", "Dense_0, ..., Dense_9999 inserted in that order", dict_orders.flax_dict),
            ("reversed", "dict-10k's keys inserted in reverse order", dict_orders.reversed_dict),
            (
                "nearly",
                "dict-10k's keys sorted, then ~1% of them swapped out of place",
                dict_orders.nearly_sorted_dict,
            ),
            ("random", "dict-10k's keys inserted in a random order", dict_orders.random_dict),
        )
    ),
    Recipe("deep-500", "500-deep nesting of dict/list/tuple", deep_nesting),
    Recipe(
        "shared-graph",
        f"model with an embedding tied at input and output and {identity_nodes.SHARED_BLOCKS}"
        " blocks of two linear layers (fastree identity-preserving modules vs nnx split/merge)",
        shared_graph,
        ops=GRAPH_OPS,
    ),
    Recipe(
        "modules-12",
        "transformer-12 params as nested dataclass modules, no sharing: identity-preserving"
        " (fastree) vs plain registration (fastree-plain)",
        functools.partial(transformer_params, 12),
        features=frozenset({CUSTOM_NODES}),
        ops=IDENTITY_OPS,
    ),
)


def case_name(recipe: Recipe, leaf_kind: str) -> str:
    """The tree's name in results and --only: the recipe name, plus @kind for non-numpy leaves."""
    if recipe.fixed_leaves or leaf_kind == "numpy":
        return recipe.name
    return f"{recipe.name}@{leaf_kind}"


def build_case(recipe: Recipe, leaf_kind: str, leaf: LeafFactory) -> TreeCase:
    extras: dict[str, Any] = {}
    tree = recipe.build(leaf)
    if recipe.ops == GRAPH_OPS:
        try:
            extras["nnx_module"] = nnx_models.shared_submodule_model()
        except Unsupported:
            pass  # flax is missing; the nnx library's own "not installed" note says so.
        try:
            extras["fastree_graph"] = identity_nodes.shared_model(leaf)
        except Unsupported:
            pass  # fastree is missing or too old; its adapter says so.
    if recipe.ops == IDENTITY_OPS:
        # Both module families over the same leaf objects; the plain one is the case's tree, so
        # the guard and the leaf/node counts see an ordinary pytree. Unsupported without fastree.
        tree, extras["identity_tree"] = identity_nodes.module_transformer(tree)
    return TreeCase(
        name=case_name(recipe, leaf_kind),
        recipe=recipe,
        leaf_kind="fixed" if recipe.fixed_leaves else leaf_kind,
        tree=tree,
        extras=extras,
    )
