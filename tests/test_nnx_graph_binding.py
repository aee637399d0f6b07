"""flax.nnx graph mode is bound by an install only, and an uninstall gives flax its functions back.

Graph mode replaces four functions of ``flax.nnx.graphlib`` (and nnx's re-exports of them). That
is install's business: fastree's own functions, its registration and ``accelerate()`` used without
an install leave them flax's. Each case runs in a child process (what flax has loaded, and what is
bound, are per process) and prints what it saw as JSON.
"""

from __future__ import annotations

import textwrap

from helpers import run_json_program, skip_unless_integration_knows

# Skips the module unless the installed flax is code the integration knows (else graph mode is
# never bound, installed or not).
skip_unless_integration_knows("flax", "flax_nnx")

# Shared by the children: flax's own functions, read before fastree is imported, and a probe
# saying, per replaced name and per module that re-exports it, whether flax's function is bound.
_PRELUDE = """
import json, sys
from flax import nnx
import flax.nnx.graphlib as graphlib
NAMES = ("flatten", "unflatten", "_graph_update_dynamic", "_merge_to_flat_state")
MODULES = [m for m in ("flax.nnx.graphlib", "flax.nnx", "flax.nnx.graph", "flax.nnx.compat")
           if m in sys.modules]
FLAX = {name: getattr(graphlib, name) for name in NAMES}
# graphlib's names and nnx's re-exports of them (flax.nnx.compat.flatten is a function of its own)
HOLDERS = [(module, name) for module in MODULES for name in NAMES
           if getattr(sys.modules[module], name, None) is FLAX[name]]

def flax_bound():
    return {f"{module}.{name}": getattr(sys.modules[module], name) is FLAX[name]
            for module, name in HOLDERS}

def model():
    return nnx.Linear(2, 3, rngs=nnx.Rngs(0))

def split_view(m):
    graphdef, state = nnx.split(m)
    merged = nnx.merge(graphdef, state)
    return [repr(graphdef), sorted(map(str, nnx.to_flat_state(state).paths)),
            type(merged).__name__]
"""


def _child(body: str, *, install_first: bool = False) -> dict:
    # install_first: fastree installed before the prelude imports flax (as fastree.run does).
    return run_json_program(_PRELUDE + textwrap.dedent(body), install_first)


def test_fastree_without_an_install_leaves_flax_functions_as_they_are():
    seen = _child("""
        import fastree, fastree.tree_util as tu
        from fastree import integrations
        from fastree.integrations import flax_nnx_graph

        class Pair:
            def __init__(self, a, b):
                self.a, self.b = a, b

        # fastree's own registration asks every loaded integration (flax's included)
        tu.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
        tu.tree_leaves(Pair(model(), 1))
        integrations.accelerate()
        before = split_view(model())
        print(json.dumps({"bound": flax_bound(), "installed": fastree.is_installed(),
                          "status": flax_nnx_graph.status()["flatten"], "view": before}))
    """)
    assert not seen["installed"]
    assert seen["bound"] and all(seen["bound"].values()), seen["bound"]
    assert seen["status"].startswith("flax: not attached"), seen["status"]


def test_an_install_after_flax_loaded_binds_graph_mode_and_uninstall_gives_it_back():
    seen = _child("""
        plain = split_view(model())
        import fastree
        from fastree.integrations import flax_nnx_graph
        out = {"plain": plain}
        fastree.install()
        out["installed"] = [flax_bound(), flax_nnx_graph.status(), split_view(model())]
        ours = {name: getattr(graphlib, name) for name in NAMES}
        fastree.uninstall()
        out["uninstalled"] = [flax_bound(), flax_nnx_graph.status()["flatten"],
                              split_view(model())]
        with fastree.installed():
            out["block"] = [flax_bound(),
                            all(getattr(graphlib, name) is ours[name] for name in NAMES)]
        out["after_block"] = flax_bound()
        print(json.dumps(out))
    """)
    bound, status, view = seen["installed"]
    assert bound and not any(bound.values()), bound
    assert set(status.values()) == {"native"}, status
    assert view == seen["plain"]
    bound, status, view = seen["uninstalled"]
    assert all(bound.values()), bound
    assert status.startswith("flax: not attached"), status
    assert view == seen["plain"]
    bound, same_walks = seen["block"]
    assert not any(bound.values()) and same_walks, seen["block"]
    assert all(seen["after_block"].values()), seen["after_block"]


def test_an_install_before_flax_binds_at_flax_first_registration():
    # Installed first, the prelude's flax import happens installed: FLAX (read then) is already
    # fastree's walk, so flax's own functions are read from the attached graph instead.
    seen = _child("""
        import fastree
        from fastree.integrations import flax_nnx_graph
        graph = flax_nnx_graph._graph
        theirs = {"flatten": graph.flax_flatten, "unflatten": graph.flax_unflatten,
                  "_graph_update_dynamic": graph.flax_update,
                  "_merge_to_flat_state": graph.flax_merge_leaves}
        out = {"installed": fastree.is_installed(),
               "at_start": [getattr(graphlib, n) is theirs[n] for n in NAMES],
               "status": flax_nnx_graph.status()["flatten"]}
        fastree.uninstall()
        out["uninstalled"] = [getattr(graphlib, n) is theirs[n] for n in NAMES]
        out["nnx_flatten"] = nnx.flatten is theirs["flatten"]
        print(json.dumps(out))
    """, install_first=True)
    assert seen["installed"] and seen["status"] == "native"
    assert not any(seen["at_start"]), seen
    assert all(seen["uninstalled"]) and seen["nnx_flatten"], seen


def test_a_function_rebound_after_the_install_keeps_its_patch_at_uninstall():
    seen = _child("""
        import fastree
        fastree.install()
        def patched(*args, **kwargs):
            return FLAX["flatten"](*args, **kwargs)
        graphlib.flatten = patched
        fastree.uninstall()
        print(json.dumps({"patched_kept": graphlib.flatten is patched,
                          "others": [getattr(graphlib, n) is FLAX[n] for n in NAMES[1:]]}))
    """)
    assert seen["patched_kept"]
    assert all(seen["others"]), seen


def test_kind_codes_come_from_the_c_walks_and_attach_checks_them():
    # The codes are the C enum's (_core.NNX_GRAPH_KINDS: a name's code is its position), and a
    # kind one side names that the other does not stops attach: graph mode stays flax's.
    from fastree import _core
    from fastree.integrations import _flax_nnx_graph_kinds as kinds

    assert len(_core.NNX_GRAPH_KINDS) == len(set(_core.NNX_GRAPH_KINDS)) == 13
    for name in kinds.KIND_NAMES:
        assert getattr(kinds, name) == _core.NNX_GRAPH_KINDS.index(name)
    assert kinds.kinds_differ() is None
    seen = _child("""
        from fastree import _core
        _core.NNX_GRAPH_KINDS = _core.NNX_GRAPH_KINDS + ("NEW_KIND",)
        import fastree
        from fastree.integrations import flax_nnx_graph
        fastree.install()
        print(json.dumps({"bound": flax_bound(), "status": flax_nnx_graph.status()["flatten"],
                          "view": split_view(model())}))
    """)
    assert all(seen["bound"].values()), seen["bound"]
    assert seen["status"] == ("fastree: the C walks' node kinds differ from those the Python "
                              "side handles: ['NEW_KIND']"), seen["status"]


def test_the_kind_table_is_the_one_cache_of_a_types_kind():
    # The C walks keep nothing of a type's kind beyond the Python side's table: each value is
    # stamped with the type's version tag, a class changed since its entry was made is classified
    # again, and an entry dropped from the table (a clear, a pop) is gone for the walks too.
    seen = _child("""
        import fastree
        from fastree.integrations import flax_nnx_graph
        fastree.install()
        graph = flax_nnx_graph._graph
        real = graph.classify
        asked = []

        def classify(cls):
            asked.append(cls.__name__)
            return real(cls)

        graph.context = (graph.context[0], classify, *graph.context[2:])

        class Scale(nnx.Param):
            pass

        def walk():
            asked.clear()
            m = model()
            m.s = Scale(1.0)
            nnx.split(m)
            return "Scale" in asked

        out = {"first": walk(), "again": walk(), "current": graph.kinds.current(Scale)}
        Scale.note = "a class attribute set: a new version tag"
        out["stale"] = not graph.kinds.current(Scale)
        out["after_change"] = walk()
        out["after_change_again"] = walk()
        graph.kinds.pop(Scale)
        out["after_pop"] = walk()
        graph.kinds.clear()
        out["after_clear"] = walk()
        out["status"] = flax_nnx_graph.status()["flatten"]
        print(json.dumps(out))
    """)
    assert seen == {"first": True, "again": False, "current": True, "stale": True,
                    "after_change": True, "after_change_again": False, "after_pop": True,
                    "after_clear": True, "status": "native"}, seen
