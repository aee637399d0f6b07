"""fastree.tree_util, the library under test. Imported lazily: it may be rebuilding or broken.

fastree is installed editable with rebuild-on-import, so the first import can take a minute or fail
while the core is mid-edit; the suite then runs without it and says so.
"""

from __future__ import annotations

import functools
from types import ModuleType

from benchmarks.libraries.base import Library, TreeApi
from benchmarks.libraries.jax_like import TREE_OPS_OF_JAX_LIKE, tree_util_api
from benchmarks.unsupported import Unsupported

IDENTITY_FEATURE_ATTR = "graph_flatten"
"""The attribute fastree's identity-preserving flatten will add. Until it exists, split_merge is
skipped with "not implemented yet"; when it lands, set this name and fill in ``_split_merge``."""


@functools.cache
def _import() -> tuple[ModuleType | None, str]:
    """(fastree.tree_util or None, why not). Cached so a failing import is attempted only once."""
    try:
        import fastree.tree_util as tu
    except Exception as error:  # noqa: BLE001 - a broken build can raise anything on import
        return None, f"fastree did not import ({type(error).__name__}: {error})"
    return tu, ""


def try_import_tree_util() -> ModuleType | None:
    return _import()[0]


def load() -> Library:
    tu, why = _import()
    if tu is None:
        raise Unsupported(why)
    import fastree

    api = _with_split_merge_note(tree_util_api(tu), fastree)
    return Library(
        name="fastree",
        version=getattr(fastree, "__version__", "unknown"),
        ops=TREE_OPS_OF_JAX_LIKE | {"split_merge"},
        api_for=lambda _case: api,
    )


def _with_split_merge_note(api: TreeApi, fastree: ModuleType) -> TreeApi:
    from dataclasses import replace

    if not hasattr(fastree, IDENTITY_FEATURE_ATTR):
        return replace(
            api, notes={"split_merge": "identity-preserving flatten not implemented yet"}
        )
    # The feature exists but its adapter does not yet: skip rather than guess its signature.
    return replace(
        api,
        notes={
            "split_merge": f"fastree.{IDENTITY_FEATURE_ATTR} exists but the "
            "benchmark adapter for it is not written yet"
        },
    )
