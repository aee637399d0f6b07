"""fastree.tree_util, the library under test. Imported lazily: it may be rebuilding or broken.

fastree is installed editable with rebuild-on-import, so the first import can take a minute or fail
while the core is mid-edit; the suite then runs without it and says so.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from benchmarks.data.fastree_import import import_tree_util
from benchmarks.libraries.base import Library, TreeApi
from benchmarks.libraries.jax_like import TREE_OPS_OF_JAX_LIKE, tree_util_api
from benchmarks.unsupported import Unsupported

if TYPE_CHECKING:
    from benchmarks.data.trees import TreeCase

IDENTITY_FEATURE_ATTR = "find_shared"
"""An attribute that arrived with identity-preserving nodes: without it, this fastree
predates the feature and split_merge / identity_copy are skipped with a note."""

IDENTITY_OPS = frozenset({"split_merge", "identity_copy"})


def _loaded() -> tuple[ModuleType, ModuleType, TreeApi]:
    """(fastree.tree_util, fastree, its TreeApi), or Unsupported saying why fastree is missing."""
    tu, why = import_tree_util()
    if tu is None:
        raise Unsupported(why)
    import fastree

    return tu, fastree, tree_util_api(tu)


def load() -> Library:
    tu, fastree, api = _loaded()
    return Library(
        name="fastree",
        version=getattr(fastree, "__version__", "unknown"),
        ops=TREE_OPS_OF_JAX_LIKE | IDENTITY_OPS,
        api_for=lambda case: _with_identity_ops(api, case, tu, fastree, "identity_tree"),
    )


def load_plain() -> Library:
    """fastree timing the identity_copy case on plainly registered twins of the same modules.

    Only there to put the cost of identity tracking in the ratio column: its time divided by
    fastree's on identity_copy is plain / identity-preserving (< 1 means tracking costs).
    """
    tu, fastree, api = _loaded()
    return Library(
        name="fastree-plain",
        version=getattr(fastree, "__version__", "unknown"),
        ops=frozenset({"identity_copy"}),
        api_for=lambda case: _with_identity_ops(api, case, tu, fastree, None),
    )


def load_noaux() -> Library:
    """fastree with its aux_data checks switched off, on trees of custom nodes.

    Only there to show what the checks cost: its time divided by fastree's on structure/flatten
    is unchecked / checked (< 1 means the checks cost). The checks are turned off around each
    call and back on after; toggling costs two C calls (~0.2 us, counted against the unchecked
    side) and, for the plain aux data of these trees, re-warms nothing.
    """
    _, fastree, api = _loaded()
    from fastree import _core
    from fastree.diagnostics import aux as _aux

    def unchecked(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            _core.set_aux_hooks(None, None)
            try:
                return fn(*args, **kwargs)
            finally:
                _core.set_aux_hooks(_aux._classify, _aux._report)

        return call

    api = replace(api, flatten=unchecked(api.flatten), structure=unchecked(api.structure))

    def api_for(case: TreeCase) -> TreeApi:
        from benchmarks.data.trees import CUSTOM_NODES

        if CUSTOM_NODES not in case.features:
            raise Unsupported("only run on trees of custom nodes (what the aux checks look at)")
        return api

    return Library(
        name="fastree-noaux",
        version=getattr(fastree, "__version__", "unknown"),
        ops=frozenset({"flatten", "structure"}),
        api_for=api_for,
    )


def _with_identity_ops(
    api: TreeApi, case: TreeCase, tu: ModuleType, fastree: ModuleType, copy_of: str | None
) -> TreeApi:
    """``api`` plus split_merge and identity_copy bound to this case's graphs, or notes saying why
    not. identity_copy copies ``case.extras[copy_of]``, or the case's own tree when None."""
    if not hasattr(fastree, IDENTITY_FEATURE_ATTR):
        note = "identity-preserving nodes not implemented in this fastree"
        return replace(api, notes={"split_merge": note, "identity_copy": note})
    notes = {}
    split_merge = identity_copy = None
    graph = case.extras.get("fastree_graph")
    if graph is None:
        notes["split_merge"] = "no identity-preserving graph for this tree"
    else:
        split_merge = functools.partial(_copy, graph, tu.tree_flatten)
        rebuilt = split_merge()
        if rebuilt.embed is not rebuilt.unembed or rebuilt.embed is graph.embed:
            raise Unsupported("fastree flatten/unflatten did not rebuild the tied embedding once")
    tree = case.tree if copy_of is None else case.extras.get(copy_of)
    if tree is None:
        notes["identity_copy"] = "no module tree for this tree"
    else:
        identity_copy = functools.partial(_copy, tree, tu.tree_flatten)
    return replace(api, split_merge=split_merge, identity_copy=identity_copy, notes=notes)


def _copy(tree: Any, flatten: Any) -> Any:
    """flatten + unflatten, as nnx.merge(*nnx.split(module)) is for nnx: a new object graph."""
    leaves, treedef = flatten(tree)
    return treedef.unflatten(leaves)
