"""The nnx decode-step workloads (benchmarks/workloads/nnx_decode.py).

Behaviour only, nothing about how fast anything is: the three workloads (``nnx.jit``,
``nnx.jit(graph=False)``, ``jax.jit`` over an ``nnx.State``) are registered with the floor rows;
the model has the Variables its docstring and size say (1,219 at the quick size, 192 of them
``nnx.Cache``); each call and each floor call is a real decode step, writing the next cache row
and wrapping at the end, deterministically and alike in the three modes. That they run in a
plain and an installed process whose fingerprints agree, each with its distance from the floor,
is tests/test_benchmarks_floor.py's check of every floor row, these included.
"""

from __future__ import annotations

from typing import Any

import pytest
from bench_results import REPO_ROOT  # noqa: F401 - puts the repository root on sys.path

from benchmarks.selection import case_selected
from benchmarks.workloads import WORKLOAD_OP, WORKLOADS, nnx_decode
from benchmarks.workloads.base import FLOOR, Workload

NAMES = ["nnx-floor-decode-graph", "nnx-floor-decode-tree", "nnx-floor-decode-jax-jit"]
DECODE = [w for w in WORKLOADS if w.name in NAMES]
TINY = nnx_decode.SIZES["tiny"]


def test_the_decode_workloads_are_floor_rows_of_the_suite() -> None:
    assert [w.name for w in DECODE] == NAMES
    for workload in DECODE:
        assert workload.group == FLOOR and workload.why
        assert dict(workload.sizes) == {"tiny": 2, "quick": 64, "full": 64}
        assert case_selected(WORKLOAD_OP, workload.name, ["workload/nnx-floor-decode*"])
        assert case_selected(WORKLOAD_OP, workload.name, ["workload/*-floor-*"])


def test_the_model_has_the_variables_the_description_says() -> None:
    pytest.importorskip("flax.nnx")
    import jax
    from flax import nnx

    def count(model: Any, *filters: Any) -> int:
        return len(jax.tree_util.tree_leaves(nnx.state(model, *filters)))

    tiny = nnx_decode.model(TINY)
    assert count(tiny) == nnx_decode.variables(TINY) == 41
    assert count(tiny, nnx.Cache) == 3 * TINY and count(tiny, nnx.Param) == 16 * TINY + 3
    # The quick and full size, abstractly (no array is made): ~1,200 Variables.
    quick = nnx_decode.SIZES["quick"]
    abstract = nnx.eval_shape(lambda: nnx_decode._classes().Decoder(quick, nnx.Rngs(0)))
    assert count(abstract) == nnx_decode.variables(quick) == 1219
    assert count(abstract, nnx.Cache) == 192
    assert "1,219 Variables" in nnx_decode.__doc__
    prepared = DECODE[0].build(TINY)
    assert prepared.size == "2 layers, 41 Variables (6 nnx.Cache), 41 leaves"


def _cache(state: Any, name: str) -> list[Any]:
    """Each layer's ``name`` Cache (``position``, ``cached_keys``...) in ``state``, in order."""
    import jax

    layers = nnx_decode.cache_state(state)["layers"]
    return [jax.tree_util.tree_leaves(layers[i][name])[0] for i in range(TINY)]


@pytest.mark.parametrize("workload", DECODE, ids=lambda w: w.name)
def test_each_call_and_each_floor_call_is_a_decode_step(workload: Workload) -> None:
    pytest.importorskip("flax.nnx")
    import numpy as np

    from benchmarks.unsupported import Unsupported

    try:
        call, state = nnx_decode.decode_calls(workload.name, TINY)
    except Unsupported as reason:  # a flax without tree mode
        pytest.skip(str(reason))
    floor = nnx_decode.floor(TINY)
    assert _cache(state(), "position") == [0] * TINY
    steps = nnx_decode.MAX_LEN + 1  # one past the cache's last row: the position wraps
    for step in range(1, steps + 1):
        (logits, token), (floor_logits, floor_token) = call(), floor()
        # The call and its floor decode the same greedy tokens to the same logits.
        assert logits.shape == (nnx_decode.VOCAB,) and token.shape == ()
        assert np.array_equal(logits, floor_logits) and int(token) == int(floor_token)
        # Every layer's cache moved on one row, in place (the model's, or the carried state's).
        assert [int(p) for p in _cache(state(), "position")] == [step % nnx_decode.MAX_LEN] * TINY
    for keys in _cache(state(), "cached_keys") + _cache(state(), "cached_values"):
        assert keys.shape == (nnx_decode.MAX_LEN, nnx_decode.WIDTH)
        assert (np.abs(keys).sum(axis=1) > 0).all()  # every row written


def test_the_three_modes_compute_the_same_steps() -> None:
    """One model, one step: the three ways to jit it give the same logits and cache."""
    pytest.importorskip("flax.nnx")
    fingerprints = set()
    for workload in DECODE:
        built = workload.build(TINY)
        first = built.call()
        built.call()
        fingerprints.add(built.fingerprint(first))
    assert len(fingerprints) == 1
