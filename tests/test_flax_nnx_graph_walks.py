"""Each graph walk's own gate: a change to one flax function turns off only what depends on it.

``flax_nnx_graph.WALKS`` names, per native walk (flatten, unflatten into new objects or into the
caller's, update, ``_merge_to_flat_state``), the mirrored functions and classes it reproduces. A
walk is served where every one of them has one known release's code (``_known_flax.CODE``, one
line per function and code), and goes back to flax's own function, alone, when one of them is
replaced after attach. These tests pin that: a fingerprint perturbed turns off exactly the walks
whose set names it; ``status()`` says which walk and which function; results stay flax's.
"""

from __future__ import annotations

import helpers
import pytest

helpers.skip_unless_integration_knows("flax", "flax_nnx")

from fastree.integrations import _flax_nnx_shared, _known_flax, _mirrored_code  # noqa: E402
from fastree.integrations import flax_nnx, flax_nnx_graph  # noqa: E402

_NAMES = sorted({item.name for item in flax_nnx.MIRRORED + flax_nnx_graph.MIRRORED})


def test_every_walk_names_mirrored_code_and_every_mirrored_name_serves_a_walk():
    qualnames = {item.qualname for item in _flax_nnx_shared.MIRRORED + flax_nnx_graph.MIRRORED}
    for walk, names in flax_nnx_graph.WALKS.items():
        assert names <= qualnames, (walk, sorted(names - qualnames))
        # walk_mirrored finds every name it declares, once.
        found = [item.qualname for item in flax_nnx_graph.walk_mirrored(walk)]
        assert sorted(found) == sorted(names), walk
    used = set().union(*flax_nnx_graph.WALKS.values())
    assert used == qualnames, sorted(qualnames - used)  # no mirrored name guards nothing
    # Tree mode's names outside the walks' gate: nnx.State's node (its own gate; its __init__
    # is also the update walk's) and Optimizer's lookup, which flax_nnx vouches for.
    assert set(flax_nnx.MIRRORED) - set(_flax_nnx_shared.MIRRORED) == {
        *_flax_nnx_shared.STATE_MIRRORED, _flax_nnx_shared.OPTIMIZER_GETATTRIBUTE}
    # Each function attach rebinds is in the set of the walk that replaces it.
    for walk, bound in flax_nnx_graph._BINDS.items():
        assert bound in flax_nnx_graph.WALKS[walk]


def test_the_known_code_table_is_one_line_per_function_and_code():
    lines = [line.split() for line in _known_flax.CODE.splitlines() if line.strip()]
    pairs = [(name, value) for name, value, *_ in lines]
    assert len(pairs) == len(set(pairs))
    assert {name for name, _ in pairs} == set(_NAMES)
    # The releases sharing all their code are one entry (what recognise names).
    assert list(_known_flax.KNOWN_CODE) == ["0.12.7", "0.12.8", "0.12.10, 0.12.12"]
    # 0.12.7's alias check is older code, not mirrored, and it has no apply_updates: those
    # walks are flax's there.
    missing = {release: set(_NAMES) - set(prints)
               for release, prints in _known_flax.KNOWN_CODE.items()}
    assert missing == {"0.12.7": {"flax.nnx.extract:check_no_aliases",
                                  "flax.nnx.extract:labeled", "flax.nnx.extract:apply_updates",
                                  "flax.nnx.extract:Updates"},
                       "0.12.8": set(), "0.12.10, 0.12.12": set()}
    differ = {name for name in _NAMES
              if len({prints[name] for prints in _known_flax.KNOWN_CODE.values()
                      if name in prints}) > 1}
    assert differ == {"flax.nnx.variablelib:Variable._check_can_update"}


def test_known_code_table_refuses_two_codes_for_one_release():
    with pytest.raises(ValueError, match="1.0 has two codes of lib:f"):
        _mirrored_code.known_code_table("lib:f 0123456789abcdef 1.0\nlib:f aaaaaaaaaaaaaaaa 1.0")


@pytest.fixture
def recognise_with(monkeypatch):
    # Runs the per-walk recognition against a table with one name's fingerprint changed in every
    # release (as a release that changes only that function reads), then puts the verdicts back.
    # Under an install graphlib holds fastree's walks: flax's own are bound back meanwhile.
    saved = dict(flax_nnx_graph._walk_verdicts)
    bound = flax_nnx_graph._bound
    flax_nnx_graph.detach()
    # Walks the release's code leaves to flax anyway (0.12.7's alias check and write-back).
    off = {walk for walk, why in helpers.flax_walk_status().items() if why != "native"}

    def run(name: str) -> dict[str, bool]:
        table = {release: {**prints, name: "0" * 16}
                 for release, prints in _known_flax.KNOWN_CODE.items()}
        monkeypatch.setattr(_known_flax, "KNOWN_CODE", table)
        whole = flax_nnx_graph._recognise_walks()
        served = {walk: bool(v) for walk, v in flax_nnx_graph._walk_verdicts.items()}
        assert bool(whole) == any(served.values())
        for walk, verdict in flax_nnx_graph._walk_verdicts.items():
            assert verdict or name in verdict.reason or walk in off, (walk, verdict.reason)
        return served

    yield run
    flax_nnx_graph._walk_verdicts.clear()
    flax_nnx_graph._walk_verdicts.update(saved)
    if bound:
        flax_nnx_graph.attach()


@pytest.mark.parametrize("name", _NAMES)
def test_a_changed_function_turns_off_exactly_the_walks_that_mirror_it(recognise_with, name):
    qualname = name.partition(":")[2]
    served = {walk: why == "native" for walk, why in helpers.flax_walk_status().items()}
    expected = {walk: served[walk] and qualname not in names
                for walk, names in flax_nnx_graph.WALKS.items()}
    assert recognise_with(name) == expected


def test_the_loaded_flax_serves_every_walk_its_code_has(recognise_with):
    # Every walk, on a release whose code has every mirrored name; 0.12.7, with no
    # extract.labeled, apply_updates or Updates, keeps the alias check and write-back flax's.
    flax_nnx_graph._recognise_walks()
    unserved = {walk for walk, verdict in flax_nnx_graph._walk_verdicts.items() if not verdict}
    from flax.nnx import extract

    newer = all(hasattr(extract, name) for name in ("labeled", "apply_updates", "Updates"))
    assert unserved == (set() if newer else {"check_no_aliases", "apply_updates"}), unserved


_CHECK_CAN_UPDATE_CHANGED = """
import json, re, sys
if "fastree" in sys.modules:  # installed: a release whose _check_can_update no table knows
    from fastree.integrations import _known_flax
    for prints in _known_flax.KNOWN_CODE.values():
        prints["flax.nnx.variablelib:Variable._check_can_update"] = "0" * 16
import jax.numpy as jnp
from flax import nnx
from flax.nnx import graphlib
model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
graphdef, state = nnx.split(model)
merged = nnx.merge(graphdef, state)
nnx.update(model, state)

@nnx.jit
def step(m, x):
    m.kernel[...] = m.kernel[...] * 2
    return m(x).sum()

out = {"split": re.sub(" at 0x[0-9a-f]+", "", repr(graphdef)),
       "merge": float(jnp.sum(merged.kernel[...])),
       "step": float(step(model, jnp.ones((1, 2)))),
       "kernel": float(jnp.sum(model.kernel[...]))}
if "fastree" in sys.modules:
    from fastree.integrations import flax_nnx_graph
    out["status"] = {k: v for k, v in flax_nnx_graph.status().items()
                     if k in flax_nnx_graph.WALKS}
    out["update_is_flax"] = graphlib._graph_update_dynamic is flax_nnx_graph._graph.flax_update
print(json.dumps(out))
"""


def test_a_release_changing_check_can_update_keeps_split_and_merge_native():
    program = _CHECK_CAN_UPDATE_CHANGED
    plain = helpers.run_json_program(program, False)
    installed = helpers.run_json_program(program, True)
    status = installed.pop("status")
    assert installed.pop("update_is_flax")  # a walk that is off is flax's own function
    assert installed == plain
    assert status["flatten"] == status["unflatten"] == "native"
    assert status["_merge_to_flat_state"] == "native"
    for walk in ("update", "unflatten_into_existing"):
        assert status[walk].startswith("flax: not code fastree was written against"), status
        assert "Variable._check_can_update" in status[walk]


_REPLACED_AFTER_ATTACH = """
import json, sys
from flax import nnx
from flax.nnx import variablelib
model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
nnx.merge(*nnx.split(model))
real = variablelib.Variable._check_can_update
calls = []
def spy(self):  # the user's patch after attach: counts, then runs flax's own code
    calls.append(1)
    return real(self)
variablelib.Variable._check_can_update = spy
graphdef, state = nnx.split(model)
nnx.merge(graphdef, state)
nnx.update(model, state)
out = {"spy_ran": len(calls) > 0}
if "fastree" in sys.modules:
    from fastree.integrations import flax_nnx_graph
    out["status"] = {k: v for k, v in flax_nnx_graph.status().items()
                     if k in flax_nnx_graph.WALKS}
print(json.dumps(out))
"""


def test_a_function_replaced_after_attach_turns_off_only_the_walks_that_mirror_it():
    # Variable._check_can_update rebound on the class (the Watch reads the class's namespace):
    # update and the merge into existing objects go to flax, and call the user's method.
    plain = helpers.run_json_program(_REPLACED_AFTER_ATTACH, False)
    installed = helpers.run_json_program(_REPLACED_AFTER_ATTACH, True)
    assert plain["spy_ran"] and installed["spy_ran"]
    status = installed["status"]
    assert status["flatten"] == status["unflatten"] == "native", status
    reason = ("flax: flax.nnx.variablelib:Variable._check_can_update was replaced after "
              "fastree attached")
    assert status["update"] == status["unflatten_into_existing"] == reason, status
    assert status["_merge_to_flat_state"] == "native", status
