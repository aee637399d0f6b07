"""flax.nnx graph mode served natively (fastree.integrations.flax_nnx_graph), exact or not used.

What is pinned, each in a child process (the cases and views are tests/nnx_graph_cases.py):

* installed, ``graphlib.flatten`` gives what flax's own function (kept as
  ``flax_nnx_graph._graph.flax_flatten``) gives on every case: equal GraphDef records in the same
  order, the same leaf objects, equal paths, the same RefMap entries (fresh, prepopulated, with a
  ``ref_outer_index``), the same exception; natively where it should be (no Python walk), through
  flax's function for array refs, tracers, hijax and self-made Variables;
* ``status()``: ``native`` for the flax fastree knows, ``flax: ...`` for one it does not, whose
  runs then equal plain ones;
* the first-walk check: a native walk made to differ gives flax's result and map, names the
  type in ``status()`` and leaves it to flax from then on; a type whose first walk was not served
  or raised is still checked on its first served walk;
* nnx.split/state/graphdef/merge/update/clone/jit (graph mode), an Optimizer updated inside
  nnx.jit, Dropout and BatchNorm, shared Variables and cycles: the same results and in-place
  updates plainly and installed;
* bad input: the same outcome plainly and installed (a node's own exception is the very object
  it raised, KeyboardInterrupt-like ones too), deep nesting a RecursionError, never a crash.

The child processes run concurrently, started together on first use (about 25 s in all on 2
cores).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import helpers
import nnx_graph_cases
import pytest

HERE = Path(__file__).parent
DEEP = 100_000  # list nesting for the raised-limit run: flax's Python walk goes this deep


def _flax_known() -> bool:
    if importlib.util.find_spec("flax") is None:
        return False
    import flax.nnx  # noqa: F401 - its modules loaded, the integration can read its code
    from fastree.integrations import flax_nnx

    return flax_nnx.known_code()


pytestmark = pytest.mark.skipif(
    not _flax_known(), reason="flax is absent or not a version the integration reproduces"
)


# ------------------------------------------------------------------------------------------------
# child processes

_CASES_SCRIPT = str(HERE / "nnx_graph_cases.py")
_THIS = "import json, test_flax_nnx_graph_mode as t; print(json.dumps(t.{}))"
CHILDREN: dict[str, tuple[bool, list[str]]] = {
    # name: (installed, argv after the interpreter)
    "flatten": (True, [_CASES_SCRIPT, "flatten"]),
    "public_plain": (False, [_CASES_SCRIPT, "public"]),
    "public_installed": (True, [_CASES_SCRIPT, "public"]),
    "public_unknown": (True, [_CASES_SCRIPT, "unknown"]),
    "fallback": (True, ["-c", _THIS.format("fallback_child()")]),
    "deep_plain": (False, ["-c", _THIS.format(f"deep_child({DEEP}, {10 * DEEP})")]),
    "deep_installed": (True, ["-c", _THIS.format(f"deep_child({DEEP}, {10 * DEEP})")]),
}
_started: dict[str, subprocess.Popen] = {}
_results: dict[str, tuple[int, Any, str]] = {}


def _start_all() -> None:
    for name, (installed, argv) in CHILDREN.items():
        if name in _started:
            continue
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTREE_")}
        env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
        if installed:
            env["FASTREE_INSTALL"] = "1"
        _started[name] = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=HERE,
        )


@pytest.fixture(autouse=True, scope="module")
def _no_child_left_behind():
    yield
    for name, proc in _started.items():  # those no test awaited (a run stopped early)
        if name not in _results:
            proc.kill()
            proc.communicate()


def child(name: str) -> tuple[int, Any, str]:
    """(return code, the JSON it printed or None, the tail of its stderr)."""
    if name not in _results:
        _start_all()  # all at once: they run side by side while the first is awaited
        stdout, stderr = _started[name].communicate(timeout=600)
        rc = _started[name].returncode
        _results[name] = (rc, json.loads(stdout) if rc == 0 else None, stderr[-3000:])
    return _results[name]


def child_json(name: str) -> Any:
    rc, out, stderr = child(name)
    assert rc == 0, f"{name} exited with {rc}; stderr ends:\n{stderr}"
    return out


# ------------------------------------------------------------------------------------------------
# 1. graphlib.flatten against flax's function, case by case


@pytest.mark.parametrize("name", list(nnx_graph_cases.CASES))
def test_flatten_equals_flax(name):
    report = child_json("flatten")["cases"].get(name)
    assert report is not None, f"the case {name} did not run"
    assert report["diffs"] == [], "\n".join(report["diffs"][:20])
    assert report["served"], f"{name} made no call"
    wrong = [
        (tag, expected, got)
        for tag, expected, got in report["served"]
        if expected is not None and expected != got
    ]
    assert wrong == [], f"(call, natively expected, natively served): {wrong}"


def test_flatten_cases_compare_for_real():
    out = child_json("flatten")
    # the comparison sees a difference between two models, and none between a result and itself
    assert out["comparator_sanity"] == [True, True]
    # fastree's function is what every nnx module calls, and it is not flax's
    assert out["is_flax_function"] is False
    assert out["rebound"] == {"flax.nnx": True, "flax.nnx.graph": True, "flax.nnx.graphlib": True}
    served = [call for case in out["cases"].values() for call in case["served"] if call[2]]
    assert len(served) > 100  # most calls were native: the comparisons above compare native walks


# ------------------------------------------------------------------------------------------------
# 2. status()


def test_status_native_for_known_flax_after_every_case():
    status = child_json("flatten")["status"]
    assert status["flatten"] == "native"
    # no type was left to flax by a difference over all the cases, and every walk is as the
    # release's code makes it (flax 0.12.7 has no code for two of them)
    expected = helpers.flax_walk_status()
    assert {key: why for key, why in status.items() if why != expected.get(key)} == {}


def test_unknown_flax_code_keeps_flax_functions():
    unknown, plain = child_json("public_unknown"), child_json("public_plain")
    assert unknown["installed"] is True
    assert unknown["flax_function"] is True
    assert unknown["status"]["flatten"].startswith("flax:")
    assert all(why.startswith("flax:") for why in unknown["status"].values())
    assert unknown["views"] == plain["views"]
    assert unknown["bad"] == plain["bad"]


# ------------------------------------------------------------------------------------------------
# 3. the first-walk check and the fallback


def fallback_child() -> dict:
    """Runs in the child: fastree's walk gets a Variable class wrong (its table entry names
    another class) and the check must catch it; also flax's function made to differ once."""
    e = nnx_graph_cases._env()
    nnx, jnp, jax, graphlib = e.nnx, e.jnp, e.jax, e.graphlib
    from fastree import integrations
    from fastree.integrations import flax_nnx_graph

    graph = flax_nnx_graph._graph
    real_classify = graph.classify
    wrong: set[type] = set()

    def classify(cls):  # the real entry, naming Param as the type for the classes in `wrong`
        entry = real_classify(cls)
        if cls in wrong and entry[0] != flax_nnx_graph.UNSERVED:
            entry = (entry[0], entry[1], nnx.Param)
            graph.kinds[cls] = entry
        return entry

    graph.context = (graph.context[0], classify, *graph.context[2:])
    walks = [0]
    walk_code = graphlib._graph_flatten.__code__

    def profile(frame, event, arg):  # counts flax's walk without replacing it (see code_replaced)
        if event == "call" and frame.f_code is walk_code:
            walks[0] += 1

    def compared(node, **kwargs):
        """(differences from flax's result and map, whether flax's walk ran, the result)."""
        ours_map, theirs_map = graphlib.RefMap(), graphlib.RefMap()
        walks[0] = 0
        sys.setprofile(profile)
        try:
            ours = graphlib.flatten(node, ref_index=ours_map, **kwargs)
        finally:
            sys.setprofile(None)
        walked = walks[0] > 0
        theirs = graph.flax_flatten(node, ref_index=theirs_map, **kwargs)
        diffs = nnx_graph_cases.result_diffs(ours, theirs, kwargs.get("with_paths", True))
        return diffs + nnx_graph_cases.map_diffs(ours_map, theirs_map), walked, ours

    class Holder(nnx.Module):
        pass

    def model(var_cls, extra=None):
        m = Holder()
        m.a = nnx.Linear(1, 1, rngs=nnx.Rngs(0))
        m.b = var_cls(jnp.ones(2))
        if extra is not None:
            m.z = nnx.data(extra)
        return m

    def key(cls):
        return f"{cls.__module__}.{cls.__qualname__}"

    compared(model(nnx.Param))  # Holder, Linear, Param... met and checked first
    out: dict[str, Any] = {}

    # A: the first walk over Odd differs from flax's: flax's result, Odd left to flax.
    class Odd(nnx.Param):
        pass

    wrong.add(Odd)
    first = compared(model(Odd))
    again = compared(model(Odd), with_paths=False)
    others = compared(model(nnx.Param))
    out["A"] = {
        "first": first[0],
        "again": again[0],
        "again_walked": again[1],
        "others": others[0],
        "others_walked": others[1],
        "status": flax_nnx_graph.status(),
        "key": key(Odd),
        "class_status": integrations.status(Odd),
    }

    # B: flax's function, in the check, returns something else once: that is what is returned.
    class Odd2(nnx.Param):
        pass

    real_flax = graph.flax_flatten
    tweaked: list = []

    def tweaking(node, **kwargs):
        graphdef, state = real_flax(node, **kwargs)
        if not tweaked:
            tweaked.append(
                (
                    type(graphdef)(
                        nodes=graphdef.nodes[:-1],
                        attributes=graphdef.attributes,
                        num_leaves=graphdef.num_leaves,
                    ),
                    state,
                )
            )
            return tweaked[0]
        return graphdef, state

    graph.flax_flatten = tweaking
    try:
        got = graphlib.flatten(model(Odd2))
    finally:
        graph.flax_flatten = real_flax
    later = compared(model(Odd2))
    out["B"] = {
        "returned": bool(tweaked) and got[0] is tweaked[0][0] and got[1] is tweaked[0][1],
        "later": later[0],
        "later_walked": later[1],
        "status": flax_nnx_graph.status(),
        "key": key(Odd2),
    }

    # C: Odd3 first met by a walk that is not served (an array ref further on, as in a model
    # made under jit): its first served walk is still checked.
    class Odd3(nnx.Param):
        pass

    wrong.add(Odd3)
    ref = jax.new_ref(jnp.zeros(1)) if hasattr(jax, "new_ref") else None
    unserved = compared(model(Odd3, extra=ref)) if ref is not None else ([], True, None)
    served = compared(model(Odd3))
    out["C"] = {
        "unserved": unserved[0],
        "unserved_walked": unserved[1],
        "served": served[0],
        "status": flax_nnx_graph.status(),
        "key": key(Odd3),
    }

    # D: Odd4 first met by a walk that raises (a node's flatten fails further on), then another
    # walk over checked types only: Odd4's first served walk is still checked.
    class Odd4(nnx.Param):
        pass

    class Failing:
        pass

    def failing_flatten(node):
        raise nnx_graph_cases.Custom("failing")

    graphlib.register_graph_node_type(
        Failing,
        failing_flatten,
        set_key=None,
        pop_key=None,
        create_empty=None,
        clear=None,
        init=None,
    )
    wrong.add(Odd4)
    try:
        graphlib.flatten(model(Odd4, extra=Failing()))
        raised = None
    except nnx_graph_cases.Custom as error:
        raised = str(error)
    between = compared(model(nnx.Param))
    served = compared(model(Odd4))
    out["D"] = {
        "raised": raised,
        "between": between[0],
        "served": served[0],
        "status": flax_nnx_graph.status(),
        "key": key(Odd4),
    }
    return out


def test_a_native_walk_that_differs_gives_flax_result_and_falls_back():
    a = child_json("fallback")["A"]
    assert a["first"] == [], "the first walk must return flax's result and RefMap"
    assert a["status"][a["key"]].startswith("flax: ")
    assert a["status"]["flatten"] == "native"
    # Odd now goes through flax's function, equal to flax's; the other types stay native
    assert a["again"] == [] and a["again_walked"] is True
    assert a["others"] == [] and a["others_walked"] is False
    expected = helpers.flax_walk_status()
    assert [key for key, why in a["status"].items() if why != expected.get(key, "native")] == [
        a["key"]]
    # integrations.status(cls) says it too, after the class's tree-mode status
    assert a["class_status"].endswith("; graph mode: flax: " + a["status"][a["key"]][6:])


def test_the_check_returns_what_flax_function_returned():
    b = child_json("fallback")["B"]
    assert b["returned"] is True
    assert b["status"][b["key"]].startswith("flax: ")
    assert b["later"] == [] and b["later_walked"] is True


def test_a_type_first_met_by_an_unserved_walk_is_still_checked():
    c = child_json("fallback")["C"]
    assert c["unserved"] == [] and c["unserved_walked"] is True
    assert c["served"] == [], "a type met first by an unserved walk was served unchecked"
    assert c["status"][c["key"]].startswith("flax: ")


def test_a_type_first_met_by_a_walk_that_raised_is_still_checked():
    d = child_json("fallback")["D"]
    assert d["raised"] == "failing"
    assert d["between"] == []
    assert d["served"] == [], "a type met first by a walk that raised was served unchecked"
    assert d["status"][d["key"]].startswith("flax: ")


# ------------------------------------------------------------------------------------------------
# 4. the public nnx functions, plain against installed


def _differences(plain: dict, installed: dict) -> list[str]:
    out = []
    for name, view in plain.items():
        other = installed.get(name)
        if isinstance(view, dict) and isinstance(other, dict):
            out.extend(
                f"{name}.{key}: {str(value)[:800]}\n   vs {str(other.get(key))[:800]}"
                for key, value in view.items()
                if other.get(key) != value
            )
        elif view != other:
            out.append(f"{name}: {str(view)[:800]}\n   vs {str(other)[:800]}")
    return out


def test_public_functions_equal_plain_runs():
    plain, installed = child_json("public_plain"), child_json("public_installed")
    assert plain["installed"] is False and installed["installed"] is True
    assert installed["flax_function"] is False
    diffs = _differences(plain["views"], installed["views"])
    assert diffs == [], "\n".join(diffs)
    # Served natively to the end: a difference a first-walk check caught (and answered with
    # flax's result) would show here as a class or function left to flax.
    assert installed["status"] == helpers.flax_walk_status(), installed["status"]
    assert set(plain["views"]) >= {
        "shared",
        "cycle",
        "dropout",
        "optimizer",
        "two_arguments",
        "made_in_jit",
        "eval_shape",
    }


# ------------------------------------------------------------------------------------------------
# 5. bad input


def test_bad_input_has_the_same_outcome_plain_and_installed():
    plain, installed = child_json("public_plain")["bad"], child_json("public_installed")["bad"]
    side_effects = "flatten_mutates_its_parent"  # pinned by its own test below
    diffs = _differences({k: v for k, v in plain.items() if k != side_effects}, installed)
    assert diffs == [], "\n".join(diffs)
    # a node's own exception, KeyboardInterrupt-like or not, is the very object it raised
    for name in ("raises_custom_flatten", "raises_interrupt_flatten"):
        assert all(
            outcome[0] == "raised" and outcome[3] is True for outcome in installed[name].values()
        ), installed[name]
    for name in ("deep_list", "deep_modules"):
        assert all(outcome == ["RecursionError"] for outcome in installed[name].values())
    for name in ("non_str_key_in_vars", "generator_flatten", "three_items_flatten"):
        assert all(outcome[0] == "raised" for outcome in installed[name].values())


def test_a_flatten_with_side_effects_gives_flax_result():
    # A node whose flatten empties its parent's dict: flax's walk sees the parent as it was
    # when the walk began, once; fastree must not make the result depend on a second run.
    name = "flatten_mutates_its_parent"
    plain, installed = child_json("public_plain")["bad"], child_json("public_installed")["bad"]
    assert installed[name] == plain[name]


def deep_child(depth: int, limit: int) -> dict:
    """Runs in the child: graphlib.flatten of a module holding a list nested `depth` deep,
    under sys.setrecursionlimit(limit)."""
    e = nnx_graph_cases._env()
    nested: Any = None
    for _ in range(depth):
        nested = [nested]
    holder = e.nnx.Dict()
    vars(holder)["x"] = nested  # past nnx's own attribute check, which recurses too
    holder._pytree__nodes = type(holder._pytree__nodes)({**holder._pytree__nodes, "x": True})
    sys.setrecursionlimit(limit)
    try:
        graphdef, state = e.graphlib.flatten(holder)
    except RecursionError:
        return {"outcome": ["RecursionError"]}
    return {"outcome": ["ok", len(graphdef.nodes), len(graphdef.attributes), len(state.leaves)]}


def test_deep_nesting_under_a_raised_recursion_limit_does_not_crash():
    # flax's walk is Python: under a raised limit it goes as deep as the list. The native walk
    # recurses in C; it must not overflow the C stack (a crash), and should give flax's result.
    plain = child_json("deep_plain")
    rc, installed, stderr = child("deep_installed")
    assert rc == 0, f"the installed run crashed (exit {rc}); stderr ends:\n{stderr}"
    assert installed == plain
