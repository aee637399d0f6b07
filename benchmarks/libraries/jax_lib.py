"""jax.tree_util: the reference every other library's leaves are checked against."""

from __future__ import annotations

from benchmarks.libraries.base import Library
from benchmarks.libraries.jax_like import TREE_OPS_OF_JAX_LIKE, tree_util_api


def load() -> Library:
    import jax
    import jax.tree_util as jtu

    api = tree_util_api(jtu)
    return Library(
        name="jax",
        version=jax.__version__,
        ops=TREE_OPS_OF_JAX_LIKE,
        api_for=lambda _case: api,
    )
