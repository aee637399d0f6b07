"""fastree.tree_util, imported once and lazily: the data layer registers its node types through it.

The custom-node and identity-preserving trees are registered through fastree when it imports
(fastree then registers them with JAX too, so both know them natively); a broken or missing build
leaves the suite running without fastree, saying why.
"""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def import_tree_util() -> tuple[ModuleType | None, str]:
    """(fastree.tree_util or None, why not). Cached so a failing import is attempted only once."""
    try:
        import fastree.tree_util as tu
    except Exception as error:  # noqa: BLE001 - a broken build can raise anything on import
        return None, f"fastree did not import ({type(error).__name__}: {error})"
    return tu, ""


def try_import_tree_util() -> ModuleType | None:
    return import_tree_util()[0]
