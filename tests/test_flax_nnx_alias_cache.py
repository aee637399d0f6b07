"""The served alias check's cache (``integrations/_flax_nnx_alias_cache.py``), in this process
(fastree not installed: ``extract.check_no_aliases`` is flax's own, the reference).

- a cached answer is flax's answer: the same paths in the same order naming the same objects,
  and a copy each time;
- any change to the arguments' Variables or structure is a miss, never a stale answer;
- the cache keeps no Variable alive past the arguments that held it, and keeps nothing for a
  Variable no weakly referenceable argument holds.
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

pytest.importorskip("flax.nnx")
import helpers  # noqa: E402

helpers.skip_unless_flax_serves("check_no_aliases")  # extract.labeled: flax 0.12.8 and later

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from flax.nnx import extract, variablelib  # noqa: E402

from fastree import _core  # noqa: E402
from fastree.integrations._flax_nnx_alias_cache import MAX_ENTRIES, AliasCache  # noqa: E402
from fastree.jax_interop import compat  # noqa: E402


def _check():
    return _core.nnx_variable_check(
        variablelib.Variable, compat.Tracer, getattr(variablelib, "HijaxVariable", None))


class _Model(nnx.Module):
    def __init__(self, seed=0):
        self.linear = nnx.Linear(2, 3, rngs=nnx.Rngs(seed))
        self.count = nnx.BatchStat(jnp.zeros(()))
        self.layers = nnx.List([nnx.Linear(3, 3, rngs=nnx.Rngs(seed + 1)) for _ in range(2)])


def _answer(cache, **kwargs):
    """The served check's steps: the cache, else the core's walk (stored). ('hit'|'miss', dict)."""
    tree = extract.labeled(**kwargs)
    cached = cache.lookup(_check(), tree)
    if cached is not None:
        return "hit", cached
    ours, treedef, positions = _core.nnx_variables_by_path(_check(), tree, True)
    cache.store(tree, ours, treedef, positions)
    return "miss", ours


def _flax(**kwargs):
    return extract.check_no_aliases("jit", **kwargs)


def _same(a, b):
    return type(a) is dict and list(a) == list(b) and all(a[p] is b[p] for p in a)


def _never_kept(cache, **kwargs):
    """Two calls, each a miss with flax's answer, and nothing kept."""
    for _ in range(2):
        kind, answer = _answer(cache, **kwargs)
        assert kind == "miss"
        assert _same(answer, _flax(**kwargs))
    assert cache._entries == []


def test_a_hit_is_flax_answer_and_a_new_dict():
    cache = AliasCache()
    model, x = _Model(), jnp.ones(2)
    kinds, answers = [], []
    for step in range(4):
        kind, answer = _answer(cache, args=(model, x + step), kwargs={})
        kinds.append(kind)
        answers.append(answer)
        assert _same(answer, _flax(args=(model, x + step), kwargs={}))
    assert kinds == ["miss", "hit", "hit", "hit"]
    assert len({id(a) for a in answers}) == 4  # a caller may change its dict


@pytest.mark.parametrize("change", ["new value", "new attribute", "swapped layer", "a Variable "
                                    "among the other arguments", "another model", "dropped key"])
def test_any_change_is_a_miss_with_flax_answer(change):
    cache = AliasCache()
    model, other = _Model(), _Model(seed=5)
    kwargs = {"args": (model, jnp.ones(2)), "kwargs": {"k": 1}}
    assert _answer(cache, **kwargs)[0] == "miss"
    if change == "new value":  # a new Variable object where the old one was
        model.count = nnx.BatchStat(jnp.ones(()))
    elif change == "new attribute":
        model.extra = nnx.Param(jnp.ones(1))
    elif change == "swapped layer":
        model.layers[0], model.layers[1] = model.layers[1], model.layers[0]
    elif change == "a Variable among the other arguments":
        kwargs = {"args": (model, nnx.Param(jnp.ones(2))), "kwargs": {"k": 1}}
    elif change == "another model":
        kwargs = {"args": (other, jnp.ones(2)), "kwargs": {"k": 1}}
    elif change == "dropped key":
        kwargs = {"args": (model, jnp.ones(2)), "kwargs": {}}
    kind, answer = _answer(cache, **kwargs)
    assert kind == "miss"
    assert _same(answer, _flax(**kwargs))
    # And the new answer is cached in turn, unless a bare Variable argument holds a Variable.
    kind, answer = _answer(cache, **kwargs)
    assert _same(answer, _flax(**kwargs))
    assert kind == ("miss" if change == "a Variable among the other arguments" else "hit")


def test_alternating_argument_sets_each_hit():
    cache = AliasCache()
    model, optimizer_like = _Model(), _Model(seed=3)
    train = {"args": (model, optimizer_like), "kwargs": {}}
    evaluate = {"args": (model,), "kwargs": {}}
    kinds = [_answer(cache, **(train if i % 2 == 0 else evaluate))[0] for i in range(6)]
    assert kinds == ["miss", "miss", "hit", "hit", "hit", "hit"]


def test_entries_are_bounded():
    cache = AliasCache()
    models = [_Model(seed=i) for i in range(MAX_ENTRIES + 3)]
    for m in models:
        _answer(cache, args=(m,), kwargs={})
    assert len(cache._entries) == MAX_ENTRIES
    assert _answer(cache, args=(models[-1],), kwargs={})[0] == "hit"
    assert _answer(cache, args=(models[0],), kwargs={})[0] == "miss"


def test_no_variable_outlives_its_arguments():
    cache = AliasCache()
    model = _Model()
    array = model.count.get_raw_value()
    dead = weakref.ref(array)
    del array
    assert _answer(cache, args=(model,), kwargs={})[0] == "miss"
    assert _answer(cache, args=(model,), kwargs={})[0] == "hit"
    del model
    gc.collect()
    assert dead() is None  # the cache held the model's Variables, and let them go with it
    assert all(entry.answer is None for entry in cache._entries)


@pytest.mark.parametrize("holder", ["a bare Variable", "a list of Variables", "a dict"])
def test_unreferenceable_holders_are_not_cached(holder):
    cache = AliasCache()
    param = nnx.Param(jnp.ones(2))
    arg = {"a bare Variable": param, "a list of Variables": [param],
           "a dict": {"p": param}}[holder]
    _never_kept(cache, args=(_Model(), arg), kwargs={})


def test_threads_share_the_cache():
    cache = AliasCache()
    models = [_Model(seed=i) for i in range(3)]
    expected = [_flax(args=(m,), kwargs={}) for m in models]
    failures = []

    def run(k):
        for i in range(40):
            j = (i + k) % 3
            if not _same(_answer(cache, args=(models[j],), kwargs={})[1], expected[j]):
                failures.append((k, i))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


class _Keyed:
    """A user's custom node with keys of its own (registered with JAX below)."""

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_with_keys(
    _Keyed,
    lambda k: (((jax.tree_util.GetAttrKey("value"), k.value),), None),
    lambda aux, children: _Keyed(*children),
)


def test_structures_with_custom_nodes_are_not_cached():
    # A custom node's keys are its own flatten_with_keys's, which no structure comparison could
    # vouch for.
    cache = AliasCache()
    model = _Model()
    _never_kept(cache, args=(model, _Keyed(nnx.Param(jnp.ones(2)))), kwargs={})


def test_states_and_optimizers_are_cached_and_a_changed_state_is_a_miss():
    # nnx.State and nnx.Optimizer are native attribute nodes (their keys follow from their aux
    # data): kept, and handed out while nothing changed.
    import optax

    cache = AliasCache()
    model = _Model()
    state = nnx.state(_Model(seed=3))  # another model's: no alias
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    assert type(state) is nnx.State
    assert _core.attribute_node(nnx.State) is not None
    args = {"args": (model, state, optimizer), "kwargs": {}}
    kinds = []
    for _ in range(3):
        kind, answer = _answer(cache, **args)
        kinds.append(kind)
        assert _same(answer, _flax(**args))
    assert kinds == ["miss", "hit", "hit"]
    state["extra"] = nnx.Param(jnp.zeros(1))  # a new key in the State's dict
    kind, answer = _answer(cache, **args)
    assert kind == "miss" and _same(answer, _flax(**args))
    assert any("extra" in jax.tree_util.keystr(path) for path in answer)


def test_a_custom_node_appearing_is_never_flattened_by_the_cache():
    # flax's walk calls a custom node's flatten_with_keys; the cache's walk, which has none,
    # must not call its flatten where the node appears inside cached arguments.

    calls = []

    class Box:
        def __init__(self, value):
            self.value = value

    jax.tree_util.register_pytree_with_keys(
        Box,
        lambda b: (calls.append("flatten_with_keys") or
                   (((jax.tree_util.GetAttrKey("value"), b.value),), None)),
        lambda aux, children: Box(*children),
        flatten_func=lambda b: (calls.append("flatten") or ((b.value,), None)),
    )
    cache = AliasCache()
    model = _Model()
    assert [_answer(cache, args=(model,), kwargs={})[0] for _ in range(2)] == ["miss", "hit"]
    model.box = nnx.data(Box(nnx.Param(jnp.ones(1))))
    calls.clear()  # (the assignment's own checks flatten it)
    kind, answer = _answer(cache, args=(model,), kwargs={})
    assert kind == "miss"
    assert _same(answer, _flax(args=(model,), kwargs={}))
    assert "flatten" not in calls and "flatten_with_keys" in calls
    # These arguments' entry is gone: the next call walks once, as flax's does.
    calls.clear()
    assert _answer(cache, args=(model,), kwargs={})[0] == "miss"
    assert calls == ["flatten_with_keys"]
