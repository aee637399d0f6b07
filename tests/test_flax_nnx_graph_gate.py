"""What flax's graph-mode gate lets through, and what it notices after attach.

Native walks serve only the very flax code they mirror (``_mirrored_code``): a fingerprint is of
the object that runs (its own code object, defaults and closure; a ``functools.wraps`` wrapper
reads as itself, not as the function it wraps), a function changed in place after attach is
noticed as a rebinding is, and nothing the gate refuses is replaced or rebuilt: a user's wrapper
runs on every call, installed or not. The checks that compare a native walk with flax's run no
user code flax alone would not run (a metadata value's ``==``), and a user's GC callback sees
flax's own walk. Each case runs in child processes, plainly and installed, and must print the
same thing.
"""

from __future__ import annotations

import helpers
import pytest

helpers.skip_unless_integration_knows("flax", "flax_nnx")


def _both(program: str, *, install_in_program: bool = False) -> tuple[dict, dict]:
    # install_in_program: the program calls fastree.install() itself when argv[1] says so (a
    # user's patch made before the install); else fastree is installed before anything runs.
    if install_in_program:
        return (helpers.run_json_program(program, False, "plain"),
                helpers.run_json_program(program, False, "installed"))
    return helpers.run_json_program(program, False), helpers.run_json_program(program, True)


_STATUS = """
def graph_status():
    if "fastree" not in sys.modules:
        return None
    from fastree.integrations import flax_nnx_graph
    return flax_nnx_graph.status()
"""

_WRAPPED_GRAPH_FLATTEN = """
import functools, json, re, sys
from flax import nnx
from flax.nnx import graphlib
calls = [0]
def counted(fn):  # a closure over fn, made with functools.wraps
    @functools.wraps(fn)
    def wrapper(*a, **k):
        calls[0] += 1
        return fn(*a, **k)
    return wrapper
graphlib._graph_flatten = counted(graphlib._graph_flatten)
if sys.argv[1] == "installed":
    import fastree
    fastree.install()
""" + _STATUS + """
m = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
out = []
for _ in range(3):
    try:
        graphdef, state = nnx.split(m)
        out.append([re.sub(" at 0x[0-9a-f]+", "", repr(graphdef)), calls[0]])
    except Exception as e:
        out.append(type(e).__name__ + ": " + str(e))
print(json.dumps({"splits": out, "status": graph_status()}))
"""


def test_a_wraps_wrapper_around_graph_flatten_runs_as_under_flax():
    # Was: the wrapper read as flax's _graph_flatten (inspect.getsource follows __wrapped__),
    # the gate let it through, and the replay rebuilt it without its closure: TypeError.
    plain, installed = _both(_WRAPPED_GRAPH_FLATTEN, install_in_program=True)
    assert installed["splits"] == plain["splits"]
    assert all(isinstance(split, list) for split in plain["splits"]), plain
    assert installed["status"]["flatten"].startswith(
        "flax: not code fastree was written against"), installed["status"]
    assert "flax.nnx.graphlib:_graph_flatten" in installed["status"]["flatten"]


_WRAPPED_FLATTEN_NO_CLOSURE = """
import functools, json, sys
from flax import nnx
from flax.nnx import graphlib
CALLS = []
_flax_flatten = graphlib.flatten
def logged(*a, **k):  # no closure: reads this module's globals
    CALLS.append(1)
    return _flax_flatten(*a, **k)
functools.update_wrapper(logged, _flax_flatten)
graphlib.flatten = logged
out = {}
if sys.argv[1] == "installed":
    import fastree
    fastree.install()
    out["bound_installed"] = graphlib.flatten is logged
m = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
counts = []
for _ in range(3):
    graphlib.flatten(m)
    counts.append(len(CALLS))
out["counts"] = counts
if sys.argv[1] == "installed":
    fastree.uninstall()
    fastree.install()
    fastree.uninstall()
    out["bound_after"] = graphlib.flatten is logged
print(json.dumps(out))
"""


def test_a_wrapper_without_closure_runs_on_every_call_and_install_keeps_it():
    # Was: the wrapper ran on the first installed split only, and install() replaced it.
    plain, installed = _both(_WRAPPED_FLATTEN_NO_CLOSURE, install_in_program=True)
    assert plain["counts"] == [1, 2, 3]
    assert installed["counts"] == plain["counts"]
    assert installed["bound_installed"] and installed["bound_after"], installed


_PATCHED_IN_PLACE = """
import json, sys
from flax import nnx
from flax.nnx import variablelib
""" + _STATUS + """
m = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
nnx.split(m); nnx.split(m)
def get_metadata(self, *args, **kwargs):
    md = dict(self._var_metadata)
    md["patched"] = True
    return md
variablelib.Variable.get_metadata.__code__ = get_metadata.__code__  # as %autoreload does
g, s = nnx.split(m)
print(json.dumps({"patched": sorted(str(d.metadata.get("patched")) for d in g.nodes
                                    if type(d).__name__ == "VariableDef"),
                  "status": graph_status()}))
"""


def test_a_function_whose_code_is_swapped_in_place_after_attach_goes_back_to_flax():
    # Was: Watch compared object identity only, and the function keeps its identity.
    plain, installed = _both(_PATCHED_IN_PLACE)
    assert plain["patched"] == ["True", "True"]
    assert installed["patched"] == plain["patched"]
    reason = ("flax: flax.nnx.variablelib:Variable.get_metadata was replaced after fastree "
              "attached")
    assert installed["status"]["flatten"] == reason, installed["status"]


_METADATA_EQ = """
import json
import jax.numpy as jnp
from flax import nnx
calls = [0]
class Tag:
    def __init__(self, v):
        self.v = v
    def __eq__(self, other):
        calls[0] += 1
        return isinstance(other, Tag) and self.v == other.v
    __hash__ = None
class M(nnx.Module):
    def __init__(self, t):
        self.w = nnx.Param(jnp.ones(2), tag=Tag(t))
out = []
for _ in range(5):
    m = M(1)
    st = nnx.state(M(2))
    calls[0] = 0
    nnx.update(m, st)
    out.append([calls[0], m.w.get_metadata()["tag"].v])
print(json.dumps(out))
"""


def test_a_checked_update_runs_a_metadata_eq_as_often_as_flax():
    # Was: the first update's check ran the metadata's == on two copies as well (3 calls).
    plain, installed = _both(_METADATA_EQ)
    assert plain == [[1, 2]] * 5
    assert installed == plain


_GC_CALLBACK_EDITS = """
import gc, json
import numpy as np
from flax import nnx
class M(nnx.Module):
    def __init__(self):
        for i in range(300):
            setattr(self, f"p{i:03d}", nnx.Param(np.ones(1)))
victim = M()
nnx.split(victim); nnx.split(victim)
armed = [False]; n = [0]
def cb(phase, info):
    if phase == "start" and armed[0]:
        n[0] += 1
        object.__setattr__(victim, f"zz{n[0]}", n[0])
gc.callbacks.append(cb)
gc.set_threshold(1, 1, 1)
armed[0] = True
try:
    nnx.split(victim)
    out = "returned"
except RuntimeError as e:
    out = "RuntimeError: " + str(e)
armed[0] = False
gc.callbacks.remove(cb)
gc.set_threshold(700, 10, 10)
print(json.dumps([out, n[0] > 0]))
"""


def test_a_gc_callback_that_edits_the_graph_mid_split_sees_flax_walk():
    # Was: the native walk read the module's attributes in one step with no allocation, so
    # the callback never ran inside it; flax's walk raises on the edit.
    plain, installed = _both(_GC_CALLBACK_EDITS)
    assert plain == ["RuntimeError: dictionary changed size during iteration", True]
    assert installed == plain


def test_library_gc_callbacks_leave_the_walks_native():
    from fastree.integrations import _flax_nnx_graph_user_code as user_code

    import gc

    import jax  # noqa: F401  (jax registers its own callback on import)

    # Only the libraries' callbacks: other tools in the test session add their own (hypothesis
    # times collections through one), which are a user's here and would turn the walks off.
    saved = gc.callbacks[:]
    library = [c for c in saved if getattr(c, "__module__", "").partition(".")[0] == "jax"]

    def mine(phase, info):
        pass

    try:
        gc.callbacks[:] = library
        assert not user_code.gc_callbacks_run_user_code()
        gc.callbacks.append(mine)
        assert user_code.gc_callbacks_run_user_code()
        gc.callbacks.remove(mine)
        assert not user_code.gc_callbacks_run_user_code()
    finally:
        gc.callbacks[:] = saved


_STATUS_UNDER_A_GC_CALLBACK = """
import gc, json
import fastree
fastree.install()
from flax import nnx
from fastree.integrations import flax_nnx_graph
nnx.split(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
gc.callbacks[:] = [c for c in gc.callbacks
                   if getattr(c, "__module__", "").partition(".")[0] == "jax"]
seen = [flax_nnx_graph.status()]
def watcher(phase, info):
    pass
gc.callbacks.append(watcher)
seen.append(flax_nnx_graph.status())
gc.callbacks.remove(watcher)
seen.append(flax_nnx_graph.status())
print(json.dumps(seen))
"""


def test_status_says_a_users_gc_callback_turns_every_walk_to_flax():
    before, during, after = helpers.run_json_program(_STATUS_UNDER_A_GC_CALLBACK, False)
    assert set(before.values()) == set(after.values()) == {"native"}, before
    assert set(during.values()) == {
        "flax: while gc.callbacks holds a function of the user's (watcher), every graph walk is "
        "flax's own"}, during


@pytest.mark.parametrize("name", ["flatten", "_graph_flatten"])
def test_the_gate_refuses_a_wraps_wrapper_of_any_mirrored_function(name):
    import functools
    import sys

    from fastree.integrations import _known_flax, _mirrored_code, flax_nnx_graph

    graphlib = sys.modules["flax.nnx.graphlib"]
    own = vars(graphlib)[name]
    wrapper = functools.wraps(own)(lambda *a, **k: own(*a, **k))
    assert _mirrored_code.fingerprint(wrapper) != _mirrored_code.fingerprint(own)
    saved = vars(graphlib)[name]
    setattr(graphlib, name, wrapper)
    try:
        verdict = _mirrored_code.recognise("flax", flax_nnx_graph.MIRRORED,
                                           _known_flax.KNOWN_CODE)
    finally:
        setattr(graphlib, name, saved)
    assert not verdict and f"flax.nnx.graphlib:{name}" in verdict.reason
