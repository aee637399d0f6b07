"""An equinox Module's ``__getattribute__`` patched in place is never bypassed.

The equinox integration vouches for ``equinox.Module.__getattribute__`` (it passes ``__dict__``
and the fields through as ``object``'s lookup gives them), and the core reads a Module's
``__dict__`` natively only while the class finds that very function *with the code object it had
when vouched for* (``AttrNode.trusted_code``). A hot reloader or a patch that assigns
``__code__`` keeps the function object and changes what it runs: from then on equinox's own
functions read the instances, so the new code runs as often as without fastree.

Child processes, plainly and with fastree installed; their outputs are compared.
"""

from __future__ import annotations

import helpers

helpers.skip_unless_integration_knows("equinox")

_PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
import equinox as eqx

asked = []

class Layer(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    name: str = eqx.field(static=True)

class Patch:  # what the patch runs: logs, then object's lookup (one free variable, as equinox's)
    def __getattribute__(self, name, /):
        __import__("sys").modules["__main__"].asked.append(name)
        return super().__getattribute__(name)

layers = [Layer(jnp.ones(2) * i, jnp.zeros(2), f"l{i}") for i in range(3)]
def walk():
    del asked[:]
    leaves, treedef = jax.tree_util.tree_flatten(layers)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(layers)[0]]
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    same = all(a is b for a, b in zip(jax.tree_util.tree_leaves(rebuilt), leaves))
    return {"num_leaves": len(leaves), "paths": paths, "same": same,
            "asked": sorted(set(asked)), "count": len(asked)}

out = {"before": walk()}
function = vars(eqx.Module)["__getattribute__"]
function.__code__ = vars(Patch)["__getattribute__"].__code__
out["patched"] = walk()
print(json.dumps(out))
"""


def test_a_getattribute_patched_in_place_runs_as_often_as_plainly():
    plain = helpers.run_json_program(_PROGRAM, installed=False)
    installed = helpers.run_json_program(_PROGRAM, installed=True)
    assert plain["patched"]["count"] > 0, "the patch must run plainly for the test to say anything"
    for phase in ("before", "patched"):
        assert installed[phase] == plain[phase], phase
    assert installed["before"]["same"] and installed["before"]["num_leaves"] == 6
