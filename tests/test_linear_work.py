"""Every operation is linear in the tree, past every internal cache.

Measured by counting work, not time: the key entries the core asks its makers for
(``fastree.jax_interop.key_makers``, wrapped here by counting ones) while each operation runs once over a
list wider than the key cache (2**17 children). A linear operation makes each entry past the
cache a bounded number of times; a quadratic one (making a fresh block of ~2**18 entries for
every child past the cache and throwing it away, as ``_nodes()`` and so ``serialize()``,
``fingerprint()`` and ``diff()`` could) would make about ``extra * 2**18``.

The benchmark suite shows the same in time (the ``scaling`` rows, up to 10**6 children).
"""

from __future__ import annotations

import contextlib

import fastree
import fastree.tree_util as tu
import pytest
from fastree import _core
from fastree.jax_interop import key_makers as _key_makers

CACHE = 1 << 17
EXTRA = 300  # children past the cache


@contextlib.contextmanager
def counting_makers():
    made = {"entries": 0}

    def count(maker, size):
        def counted(arg):
            made["entries"] += size(arg)
            return maker(arg)

        return counted

    _core.set_key_makers(
        count(_key_makers.sequence_block, lambda n: n),
        count(_key_makers.flattened_index_block, lambda n: n),
        count(_key_makers.dict_key, lambda k: 1),
        count(_key_makers.getattr_key, lambda k: 1),
        count(_key_makers.dict_key_block, len),
    )
    try:
        yield made
    finally:
        _key_makers.install()


WIDE = [0.0] * (CACHE + EXTRA)
WIDE_TREEDEF = tu.tree_structure(WIDE)

OPERATIONS = {
    "nodes": lambda: WIDE_TREEDEF._nodes(),
    "serialize": lambda: WIDE_TREEDEF.serialize(),
    "fingerprint": lambda: WIDE_TREEDEF.fingerprint(),
    "diff": lambda: fastree.structure_diff(WIDE_TREEDEF, tu.tree_structure([0.0] * CACHE)),
    "flatten_with_path": lambda: tu.tree_flatten_with_path(WIDE),
    "map_with_path": lambda: tu.tree_map_with_path(lambda p, x: x, WIDE),
    "flatten_one_level_with_keys": lambda: tu.flatten_one_level_with_keys(WIDE),
    "registry_flatten_with_path": lambda: tu.default_registry.flatten_with_path(WIDE),
}


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_key_entries_past_the_cache_are_made_a_bounded_number_of_times(name):
    OPERATIONS[name]()  # warm the process-wide cache (indices below 2**17)
    with counting_makers() as made:
        OPERATIONS[name]()
    # Entries below the cache are kept for the process; past it, one walk's worth is made per
    # call (a block reaching past the widest container). Quadratic work made ~EXTRA * 2**18.
    assert made["entries"] <= 2 * (CACHE + EXTRA), made
