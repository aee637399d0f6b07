"""flax.nnx graph walks where user code runs mid-walk, and what the walks keep alive: each
program runs in child processes, once with plain flax and once with fastree installed into JAX (so that a crash fails
the test rather than the run), and the two outcomes must be the same.

Pinned here: what Python code run in the middle of a native walk may change (a GraphDef's
attribute pairs, a module's __dict__, a Variable class), what the GraphDef record caches keep
alive and share, and how many times a user's metadata ``__eq__`` runs per update.
"""

from __future__ import annotations

import pytest

from helpers import run_json_program, skip_unless_integration_knows

skip_unless_integration_knows("flax", "flax_nnx")


def same_outcome(program: str, *args: str) -> object:
    """The program's JSON result, plainly and installed; asserts the two are the same."""
    plain = run_json_program(program, False, *args)
    installed = run_json_program(program, True, *args)
    assert installed == plain
    return plain


# A child program's ending: the outcome of `run()` (its value, or its exception's type and
# message) as JSON.
OUTCOME = r"""
import json
try:
    result = ["ok", run()]
except Exception as error:
    result = [type(error).__name__, str(error)]
print(json.dumps(result))
"""


# (a) nnx.merge, with a callback run during the unflatten that replaces the GraphDef's attribute
# pairs: the native walk read them as the 2-tuples its first look saw (a segfault).
PAIRS_CHANGED = r"""
import sys
import jax, jax.numpy as jnp
from flax import nnx
HOLD = {}
MAKE = {
    "list": list,
    "int": lambda pair: 7,
    "short": lambda pair: pair[:1],
    "long": lambda pair: (*pair, 0),
    "unknown": lambda pair: (pair[0], 5),
}[sys.argv[1]]
class P:
    def __init__(self, x): self.x = x
def unflatten(aux, children):
    graphdef = HOLD.get("graphdef")
    if graphdef is not None:
        for i, pair in enumerate(graphdef.attributes):
            graphdef.attributes[i] = MAKE(pair) if isinstance(pair, tuple) else pair
    return P(children[0])
jax.tree_util.register_pytree_node(P, lambda p: ((p.x,), None), unflatten)
class M(nnx.Module):
    def __init__(self):
        self.a = nnx.data(P(jnp.ones(2)))
        self.b = nnx.Param(jnp.ones(3))
        self.c = nnx.Param(jnp.ones(4))
m = M()
graphdef, state = nnx.split(m)
nnx.merge(graphdef, state); nnx.merge(graphdef, state)
graphdef, state = nnx.split(m)
HOLD["graphdef"] = graphdef
def run():
    merged = nnx.merge(graphdef, state)
    return [type(merged).__name__, merged.b[...].shape[0], merged.c[...].shape[0]]
""" + OUTCOME


@pytest.mark.parametrize("change", ["list", "int", "short", "long", "unknown"])
def test_merge_attribute_pairs_changed_by_a_callback(change: str) -> None:
    outcome = same_outcome(PAIRS_CHANGED, change)
    expected = {"list": "ok", "int": "TypeError", "short": "ValueError", "long": "ValueError",
                "unknown": "RuntimeError"}[change]
    assert outcome[0] == expected


# (c) nnx.split's GraphDef records were cached (by their fields' ids) for later splits: every
# static attribute value and Variable metadata value stayed alive after the model and its split
# were deleted.
RECORDS_KEPT = r"""
import gc, json, weakref
import jax.numpy as jnp
from flax import nnx
class Config:
    pass
class Note:
    pass
refs = []
for i in range(20):
    m = nnx.Module()
    m.cfg = Config()
    m.w = nnx.Param(jnp.ones(2), note=Note())
    refs.append((weakref.ref(m.cfg), weakref.ref(m.w.get_metadata("note"))))
    graphdef, state = nnx.split(m)
    nnx.merge(graphdef, state)
    del m, graphdef, state
gc.collect()
print(json.dumps([sum(c() is not None for c, _ in refs), sum(n() is not None for _, n in refs)]))
"""


def test_split_keeps_no_static_value_or_metadata_alive() -> None:
    assert same_outcome(RECORDS_KEPT) == [0, 0]


# The kind tables held every class a walk met: leaf classes made one after another (a model's
# data of a class made per model) stayed alive for the process, each with what it holds.
CLASSES_KEPT = r"""
import gc, json, weakref
import jax.numpy as jnp
from flax import nnx

class Holder(nnx.Module):
    def __init__(self, leaf):
        self.leaf = nnx.data(leaf)  # a data leaf: its class is classified
        self.w = nnx.Param(jnp.ones(1))

refs = []
for i in range(20):
    Leaf = type(f"Leaf{i}", (), {"payload": bytearray(1 << 20)})
    m = Holder(Leaf())
    graphdef, state = nnx.split(m)
    nnx.merge(graphdef, state)
    nnx.update(m, state)
    nnx.state(m)
    refs.append(weakref.ref(Leaf))
    del Leaf, m, graphdef, state
gc.collect()
print(json.dumps(sum(r() is not None for r in refs)))
"""


def test_walks_keep_no_class_alive() -> None:
    assert same_outcome(CLASSES_KEPT) == 0


# (d) Two splits of one module returned the same records, so a VariableDef's metadata mapping
# (a HashableMapping around a dict) was one object in two GraphDefs that flax makes distinct.
RECORDS_SHARED = r"""
import json
import jax.numpy as jnp
from flax import nnx
class M(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones(2), note="original")
        self.size = 3
        self.items = nnx.List([nnx.Param(jnp.ones(1)), 4])
        self.items2 = self.items
m = M()
first, _ = nnx.split(m)
second, _ = nnx.split(m)
variable_defs = [(a, b) for a, b in zip(first.nodes, second.nodes)
                 if type(a).__name__ == "VariableDef"]
for a, _ in variable_defs:
    a.metadata._mapping["note"] = "edited"
shared_records = [a is b for a, b in zip(first.nodes, second.nodes)]
shared_statics = [a[1] is b[1] for a, b in zip(first.attributes, second.attributes)
                  if type(a[1]).__name__ == "Static"]
print(json.dumps([[b.metadata.get("note") for _, b in variable_defs], shared_records,
                  shared_statics, first == second]))
"""


def test_splits_share_no_record_or_metadata() -> None:
    notes, shared_records, shared_statics, equal = same_outcome(RECORDS_SHARED)
    assert sorted(notes, key=str) == [None, "original"]
    assert not any(shared_records) and not any(shared_statics)
    assert not equal  # the edit shows in one GraphDef only


# (f) An update from a Variable compared the metadata natively, then called flax's
# update_from_state, which compared it again: a metadata value's __eq__ ran twice per update.
# Also: a change to the state's dict made by that __eq__ raises as flax's loop over it raises.
METADATA_EQ = r"""
import sys
import jax.numpy as jnp
from flax import nnx
CALLS = []
class Tag:
    def __init__(self, equal): self.equal = equal
    def __eq__(self, other):
        CALLS.append(1)
        if HOLD.get("grow") is not None:
            HOLD.pop("grow")["added"] = 1
        return self.equal
    __hash__ = object.__hash__
HOLD = {}
class M(nnx.Module):
    def __init__(self, equal):
        self.w = nnx.Param(jnp.ones(2), tag=Tag(equal))
        self.v = nnx.Param(jnp.ones(3))
equal = sys.argv[1] == "equal"
m = M(equal)
nnx.update(m, nnx.state(M(equal)))  # the first update of a root type is checked: not counted
def run():
    other = M(equal)
    state = nnx.state(other)
    if sys.argv[2] == "grow":
        HOLD["grow"] = state._mapping
    CALLS.clear()
    nnx.update(m, state)
    return [len(CALLS), m.w.get_metadata("tag") is other.w.get_metadata("tag"), sorted(state)]
""" + OUTCOME


@pytest.mark.parametrize("equal", ["equal", "different"])
def test_update_runs_metadata_eq_once(equal: str) -> None:
    outcome = same_outcome(METADATA_EQ, equal, "keep")
    assert outcome == ["ok", [1, equal == "different", ["v", "w"]]]


def test_update_state_changed_by_metadata_eq() -> None:
    outcome = same_outcome(METADATA_EQ, "equal", "grow")
    assert outcome == ["RuntimeError", "dictionary changed size during iteration"]


# (h) A Variable class classified as plain by an earlier walk kept that classification after
# its accessors were patched: the native walk read its slots where flax calls the new accessor.
CLASS_PATCHED = r"""
import jax.numpy as jnp
from flax import nnx
class P(nnx.Param):
    pass
m = nnx.Module()
m.w = P(jnp.ones(2), note="kept")
for _ in range(3):
    graphdef, state = nnx.split(m)
    nnx.merge(graphdef, state)
def patched(self, *args, **kwargs):
    return {"patched": True, "hijax": False, "ref": False}
P.get_metadata = patched
def run():
    graphdef, state = nnx.split(m)
    return [sorted(record.metadata) for record in graphdef.nodes
            if type(record).__name__ == "VariableDef"]
""" + OUTCOME


def test_variable_class_patched_after_a_walk() -> None:
    assert same_outcome(CLASS_PATCHED) == ["ok", [["hijax", "patched", "ref"]]]


# (i) A module attribute added while flax's walk reads vars(module) (here by the truth of a
# data flag): flax's generator raises; the native walk read a snapshot taken before.
DICT_GROWN = r"""
import jax.numpy as jnp
from flax import nnx
class M(nnx.Module):
    def __init__(self):
        self.a = nnx.Param(jnp.ones(2))
        self.w = nnx.Param(jnp.ones(3))
class Flag:
    armed = False
    def __bool__(self):
        if Flag.armed:
            Flag.armed = False
            object.__setattr__(m, "extra", 1)
        return True
m = M()
m._pytree__nodes._mapping["a"] = Flag()
for _ in range(3):
    nnx.split(m)
def run():
    Flag.armed = True
    graphdef, state = nnx.split(m)
    return sorted(state)
""" + OUTCOME


def test_module_dict_changed_during_the_walk() -> None:
    outcome = same_outcome(DICT_GROWN)
    assert outcome == ["RuntimeError", "dictionary changed size during iteration"]


# (j) Tree mode: jax.tree_util over a Variable whose metadata has a key that is not a str.
# flax's flatten sorts the metadata's items even for tree_leaves (TypeError); the native read
# skipped the metadata when no aux data was asked for.
METADATA_KEYS = r"""
import jax, jax.numpy as jnp
from flax import nnx
for _ in range(100):  # past the first instances, which are checked against flax's flatten
    jax.tree_util.tree_leaves(nnx.Param(jnp.ones(2)))
variable = nnx.Param(jnp.ones(2))
object.__getattribute__(variable, "_var_metadata")[1] = "x"
def run():
    return [len(jax.tree_util.tree_leaves(variable))]
""" + OUTCOME


def test_tree_leaves_of_a_variable_with_a_non_str_metadata_key() -> None:
    outcome = same_outcome(METADATA_KEYS)
    assert outcome[0] == "TypeError"
