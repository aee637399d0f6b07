"""Leaf factories: each call returns a new, distinct, tiny array.

Arrays stay at shape (2,) or (2, 2) (scalars for counters) because the suite measures tree overhead,
not array math; distinct objects let the correctness guard compare leaves by identity.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from benchmarks.unsupported import Unsupported

LeafFactory = Callable[[tuple[int, ...]], object]
"""shape -> a new array of (about) that shape."""

SHARDED_DEVICES = 8


def leaf_factory(kind: str, device: str) -> LeafFactory:
    """The factory for a leaf kind; raises Unsupported when the machine cannot provide it."""
    if kind == "numpy":
        return _numpy_leaf
    if kind == "jax":
        return _jax_leaf_factory(device)
    if kind == "sharded":
        return _sharded_leaf_factory()
    raise ValueError(f"unknown leaf kind {kind!r}")


def _numpy_leaf(shape: tuple[int, ...]) -> object:
    return np.zeros(shape, dtype=np.float32)


def _jax_leaf_factory(device: str) -> LeafFactory:
    import jax

    platform = "gpu" if device == "gpu" else "cpu"
    try:
        target = jax.devices(platform)[0]
    except RuntimeError as error:
        raise Unsupported(f"JAX has no {platform} backend here ({error})") from None

    def jax_leaf(shape: tuple[int, ...]) -> object:
        return jax.device_put(np.zeros(shape, dtype=np.float32), target)

    return jax_leaf


def _sharded_leaf_factory() -> LeafFactory:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices("cpu")
    if len(devices) < SHARDED_DEVICES:
        raise Unsupported(
            f"sharded leaves need {SHARDED_DEVICES} host devices, JAX has {len(devices)}: "
            "XLA_FLAGS must carry --xla_force_host_platform_device_count=8 before JAX is imported "
            "(python -m benchmarks --leaves sharded does this)"
        )
    mesh = Mesh(np.array(devices[:SHARDED_DEVICES]), ("x",))
    sharded = NamedSharding(mesh, PartitionSpec("x"))
    replicated = NamedSharding(mesh, PartitionSpec())

    def sharded_leaf(shape: tuple[int, ...]) -> object:
        if not shape:
            # A scalar (e.g. the optimizer's step count) cannot be split; replicate it instead.
            return jax.device_put(np.zeros((), dtype=np.float32), replicated)
        # The leading axis must divide across the mesh, so it becomes 8 instead of 2.
        return jax.device_put(np.zeros((SHARDED_DEVICES, *shape[1:]), dtype=np.float32), sharded)

    return sharded_leaf
