"""chex dataclasses under install: native attribute nodes with chex's exact results.

Each scenario runs in two child processes, one plain and one with ``fastree.install()`` before
``import chex`` (chex registers each class when it is defined), and their summaries must be equal:
leaves, treedef text, key paths, rebuilt instances' attributes in order, ``__post_init__`` runs,
and instances whose ``__dict__`` holds more or less than the fields (which chex's own functions
answer). The installed child also reports each class's status: ``native`` for the regular
classes, never a fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from helpers import skip_unless_integration_knows

skip_unless_integration_knows("chex")

SCENARIO = textwrap.dedent(
    """
    import json, sys
    if sys.argv[1] == "installed":
        import fastree
        fastree.install()
    import dataclasses
    import chex, jax
    import jax.tree_util as jtu
    import numpy as np

    @chex.dataclass
    class Plain:
        zeta: object
        alpha: object
        mid: int = 3

    @chex.dataclass(frozen=True)
    class Frozen:
        w: object
        b: object

    @chex.dataclass
    class Outer:
        inner: Plain
        items: list
        flag: bool = True

    calls = []

    @chex.dataclass
    class WithPostInit:
        x: object
        def __post_init__(self):
            calls.append(type(self).__name__)

    @chex.dataclass(mappable_dataclass=False)
    class NotMappable:
        b: object
        a: object

    # jtu as the program sees it: routed to fastree in the installed child (what is compared).
    def summary(tree):
        leaves, treedef = jtu.tree_flatten(tree)
        paths = [jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(tree)[0]]
        rebuilt = jtu.tree_unflatten(treedef, leaves)
        mapped = jtu.tree_map(lambda v: v, tree)
        return {
            "leaves": [repr(v) for v in leaves],
            "treedef": str(treedef),
            "paths": paths,
            "rebuilt": [(k, repr(v)) for k, v in vars(rebuilt).items()],
            "mapped": [(k, repr(v)) for k, v in vars(mapped).items()],
            "types": [type(rebuilt).__name__, type(mapped).__name__],
        }

    cases = {}
    for round_ in range(3):  # the first instances are checked, the later ones native
        plain = Plain(zeta=np.arange(2), alpha=[1, {"k": 2.0}])
        cases[f"plain{round_}"] = summary(plain)
        cases[f"frozen{round_}"] = summary(Frozen(w=1.5, b=None))
        cases[f"outer{round_}"] = summary(Outer(inner=plain, items=[plain, 7]))
        cases[f"post{round_}"] = summary(WithPostInit(x=round_))
        cases[f"notmappable{round_}"] = summary(NotMappable(b=1, a=2))
    more = Plain(zeta=1, alpha=2)
    more.extra = "added after __init__"
    cases["more"] = summary(more)
    less = Plain(zeta=1, alpha=2)
    del less.mid
    cases["less"] = summary(less)
    cases["replace"] = summary(Plain(zeta=1, alpha=2).replace(mid=9))
    cases["post_init_calls"] = calls
    cases["jit"] = repr(jax.jit(lambda p: p.zeta * 2)(Plain(zeta=np.ones(2), alpha=0)))
    if sys.argv[1] == "installed":
        from fastree import integrations
        import fastree.tree_util as ftu
        from fastree.jax_interop.compat import tree_util as jax_own  # not routed: JAX's
        status = {c.__name__: integrations.status(c)
                  for c in (Plain, Frozen, Outer, WithPostInit, NotMappable)}
        same = all(
            ftu.tree_leaves(t) == jax_own.tree_leaves(t)
            and ftu.tree_structure(t).to_jax() == jax_own.tree_structure(t)
            for t in (plain, more, less, Outer(inner=plain, items=[1]))
        )
        print(json.dumps({"status": status, "fastree_agrees": same}))
    print(json.dumps(cases))
    """
)


def _run(mode: str, tmp_path) -> list[dict]:
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    env = {k: v for k, v in os.environ.items() if k != "FASTREE_INSTALL"}
    done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.strip().splitlines()[-2:]]


def test_chex_dataclasses_native_and_identical(tmp_path):
    plain = _run("plain", tmp_path)[-1]
    info, installed = _run("installed", tmp_path)
    assert installed == plain
    assert info["fastree_agrees"]
    # WithPostInit's instances are regular (its __post_init__ adds nothing): native too.
    assert info["status"] == dict.fromkeys(
        ["Plain", "Frozen", "Outer", "WithPostInit", "NotMappable"], "native"
    ), info["status"]
