"""optree, with its defaults (none_is_leaf=False, like JAX).

Custom types live in optree's namespaces: the benchmark dataclasses and the flax.nnx node types are
registered under NAMESPACE with the same flatten/unflatten callbacks JAX uses, and the namespace is
passed only on trees that need it, so plain trees are timed without the keyword-argument overhead.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

from benchmarks.data import custom_nodes
from benchmarks.data.trees import CUSTOM_NODES, NNX, TreeCase
from benchmarks.libraries.base import Library, TreeApi
from benchmarks.libraries.jax_like import TREE_OPS_OF_JAX_LIKE
from benchmarks.unsupported import Unsupported

NAMESPACE = "fastree-bench"

BUILTIN_NODES = frozenset(
    {
        dict,
        list,
        tuple,
        type(None),
        collections.OrderedDict,
        collections.defaultdict,
        collections.deque,
    }
)


def load() -> Library:
    try:
        import optree
    except ImportError as error:
        raise Unsupported(f"optree is not installed ({error})") from None

    plain = _api(optree, namespace="")
    namespaced = _api(optree, namespace=NAMESPACE)

    def api_for(case: TreeCase) -> TreeApi:
        if case.features & {CUSTOM_NODES, NNX}:
            _register_custom_types(optree, case)
            return namespaced
        return plain

    return Library(
        name="optree", version=optree.__version__, ops=TREE_OPS_OF_JAX_LIKE, api_for=api_for
    )


def _api(optree: Any, namespace: str) -> TreeApi:
    def bound(fn: Any) -> Any:
        return functools.partial(fn, namespace=namespace) if namespace else fn

    flatten, unflatten = bound(optree.tree_flatten), optree.tree_unflatten

    def copy(tree: Any, flatten: Any = flatten, unflatten: Any = unflatten) -> Any:
        leaves, treespec = flatten(tree)
        return unflatten(treespec, leaves)

    return TreeApi(
        flatten=flatten,
        leaves=bound(optree.tree_leaves),
        structure=bound(optree.tree_structure),
        treedef_of=bound(optree.tree_structure),
        unflatten=unflatten,
        tree_map=bound(optree.tree_map),
        flatten_with_path=bound(optree.tree_flatten_with_path),
        map_with_path=bound(optree.tree_map_with_path),
        bind_flatten_up_to=lambda treespec: treespec.flatten_up_to,
        all_leaves=bound(optree.all_leaves),
        copy=copy,
    )


_registered: set[type] = set()


def _register_custom_types(optree: Any, case: TreeCase) -> None:
    """Register the benchmark dataclasses, and whatever JAX-registered types the tree holds."""
    wanted = [(cls, f, u) for cls, f, u in custom_nodes.CUSTOM_TYPES]
    if NNX in case.features:
        wanted += _jax_registered_types_in(case.tree)
    for cls, flatten, unflatten in wanted:
        if cls not in _registered:
            optree.register_pytree_node(cls, flatten, unflatten, namespace=NAMESPACE)
            _registered.add(cls)


def _jax_registered_types_in(tree: Any) -> list[tuple[type, Any, Any]]:
    """(type, flatten, unflatten) of every JAX-registered custom type in ``tree``.

    flax registers nnx.State and each Variable class with JAX only. Reading JAX's registry (private,
    hence the guard) hands optree the very callbacks JAX runs, which keeps the comparison fair.
    """
    try:
        from jax._src.tree_util import _registry
    except ImportError:
        raise Unsupported("cannot read JAX's registry to register flax's nnx types") from None

    found: dict[type, tuple[type, Any, Any]] = {}

    def visit(node: Any) -> None:
        entry = _registry.get(type(node))
        # JAX's registry also lists the built-in containers, which optree knows natively.
        if entry is not None and type(node) not in BUILTIN_NODES:
            found.setdefault(type(node), (type(node), entry.to_iter, entry.from_iter))
            children, _aux = entry.to_iter(node)
            for child in children:
                visit(child)
        elif isinstance(node, dict):
            for child in node.values():
                visit(child)
        elif isinstance(node, (list, tuple)):
            for child in node:
                visit(child)

    visit(tree)
    return list(found.values())
