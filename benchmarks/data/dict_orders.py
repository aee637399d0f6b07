"""Dicts of 10k keys that differ only in the order their keys were inserted.

JAX orders a dict's children by sorted key, so flatten must sort; how much that costs depends on
the order the keys arrive in. Real trees hold big dicts in every order: flax linen names submodules
``Dense_0, Dense_1, ...`` (numeric suffixes: insertion order is not sorted order, since "Dense_10"
sorts before "Dense_2"), state dicts and checkpoints arrive already sorted, metric dicts arrive in
whatever order the code logged them. Each builder returns a dict whose sorted order is fixed and
whose insertion order is the one named, with one distinct leaf per key.

The key set of the sorted, reversed, nearly sorted and random dicts is the same (``key00000`` ..
``key09999``, as the original dict-10k tree), so only the insertion order differs among them.
Shuffles use a fixed seed: every run (and every library) sees the same dict.
"""

from __future__ import annotations

import random
from typing import Any

from benchmarks.data.leaves import LeafFactory

NUM_KEYS = 10_000
SEED = 20_261_123
NEARLY_SORTED_SWAP_FRACTION = 0.01
"""The nearly sorted dict is the sorted one with this fraction of keys swapped with a random
other key (50 swaps of 10k keys put ~1% of the keys out of place)."""


def padded_keys(num_keys: int = NUM_KEYS) -> list[str]:
    """``key00000, key00001, ...``: zero-padded, so insertion order is sorted order."""
    width = len(str(num_keys - 1))
    return [f"key{i:0{width}d}" for i in range(num_keys)]


def _dict_of(keys: list[str], leaf: LeafFactory) -> dict[str, Any]:
    return {key: leaf((2,)) for key in keys}


def sorted_dict(leaf: LeafFactory, num_keys: int = NUM_KEYS) -> dict[str, Any]:
    """Keys inserted already sorted: a loaded state dict, or anything built by sorted()."""
    return _dict_of(padded_keys(num_keys), leaf)


def natural_dict(leaf: LeafFactory, num_keys: int = NUM_KEYS) -> dict[str, Any]:
    """``k0, k1, ..., k9999`` in that order: numbered names, unpadded (k10 sorts before k2)."""
    return _dict_of([f"k{i}" for i in range(num_keys)], leaf)


def flax_dict(leaf: LeafFactory, num_keys: int = NUM_KEYS) -> dict[str, Any]:
    """``Dense_0, ..., Dense_9999`` in creation order, as flax linen names its submodules."""
    return _dict_of([f"Dense_{i}" for i in range(num_keys)], leaf)


def reversed_dict(leaf: LeafFactory, num_keys: int = NUM_KEYS) -> dict[str, Any]:
    """The sorted keys inserted last to first."""
    return _dict_of(padded_keys(num_keys)[::-1], leaf)


def nearly_sorted_dict(leaf: LeafFactory, num_keys: int = NUM_KEYS) -> dict[str, Any]:
    """Sorted, then ~1% of the keys swapped with a random other key: one appended late key, a
    hand-edited config, a dict updated in place."""
    keys = padded_keys(num_keys)
    rng = random.Random(SEED)
    for _ in range(max(1, round(num_keys * NEARLY_SORTED_SWAP_FRACTION / 2))):
        i, j = rng.randrange(num_keys), rng.randrange(num_keys)
        keys[i], keys[j] = keys[j], keys[i]
    return _dict_of(keys, leaf)


def random_dict(leaf: LeafFactory, num_keys: int = NUM_KEYS) -> dict[str, Any]:
    """The sorted keys in a random (seeded) order: a dict built from a set or a hash map."""
    keys = padded_keys(num_keys)
    random.Random(SEED).shuffle(keys)
    return _dict_of(keys, leaf)
