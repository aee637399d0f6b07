"""The core's module state (csrc/binding/module_state.h): one object, ``fastree._core._module_state``,
owns every reference the core keeps between calls and shows them to the garbage collector.

Pins: the collector sees what the state holds (a hook installed through the core's setters is a
referent of the state object, and the state a referrer of the hook); a cycle through an
installed hook survives a collection while installed and is collected once replaced; the state
object's type, name and repr; a re-import (``del sys.modules``, ``importlib.reload``) reuses the
module and its state; interpreter exit releases what the state holds, cleanly; and the module's
multiple-interpreters declaration (a subinterpreter's import raises ImportError).
"""

import gc
import re
import sys
import textwrap
import weakref

import fastree.tree_util as tu
import pytest
from fastree import _core
from fastree.diagnostics import aux as _aux
from fastree.jax_interop import bridge as _jax_bridge
from fastree.jax_interop import key_makers as _key_makers
from helpers import run_script_results


def run_child(code: str) -> tuple[dict[str, str], str]:
    """Runs `code` in a fresh interpreter; asserts it exits 0; its name=value lines and stderr."""
    results, proc = run_script_results(textwrap.dedent(code))
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return results, proc.stderr


class Hook:
    """A callable that answers like "no" to whatever the core asks, in a reference cycle."""

    def __init__(self):
        self.me = self

    def __call__(self, *args, **kwargs):
        return None


def _install_bridge_with(hook, which):
    jb = _jax_bridge
    hooks = {"to_jax": jb.to_jax, "map_error": jb._map_errors.explain}
    hooks[which] = hook
    _core.install_jax_bridge(
        jax_registry=jb._jax_compat.jax_registry(),
        flatten_one_level=jb._jtu.default_registry.flatten_one_level,
        flatten_one_level_with_keys=jb._jtu.default_registry.flatten_one_level_with_keys,
        DictKey=jb._jtu.DictKey,
        SequenceKey=jb._jtu.SequenceKey,
        GetAttrKey=jb._jtu.GetAttrKey,
        FlattenedIndexKey=jb._jtu.FlattenedIndexKey,
        **hooks,
    )


# Each setter of the core that keeps a Python object: (install `hook` with it, put back the
# Python layer's own).
SETTERS = {
    "aux_classify": (lambda h: _core.set_aux_hooks(h, _aux._report), _aux._install),
    "aux_reporter": (lambda h: _core.set_aux_hooks(_aux._classify, h), _aux._install),
    "jaxlib_adopter": (
        _core.set_jaxlib_adopter,
        lambda: _core.set_jaxlib_adopter(_jax_bridge._adopt_jaxlib_node),
    ),
    "key_maker": (lambda h: _core.set_key_makers(None, None, None, h, None), _key_makers.install),
    "to_jax": (lambda h: _install_bridge_with(h, "to_jax"), _jax_bridge.install),
    "map_error": (lambda h: _install_bridge_with(h, "map_error"), _jax_bridge.install),
}


@pytest.mark.parametrize("setter", sorted(SETTERS))
def test_the_collector_sees_an_installed_hook(setter):
    install, restore = SETTERS[setter]
    hook = Hook()
    install(hook)
    try:
        assert any(r is hook for r in gc.get_referents(_core._module_state))
        assert any(r is _core._module_state for r in gc.get_referrers(hook))
    finally:
        restore()
    assert not any(r is hook for r in gc.get_referents(_core._module_state))


@pytest.mark.parametrize("setter", sorted(SETTERS))
def test_a_cycle_through_an_installed_hook_lives_while_installed_then_is_collected(setter):
    install, restore = SETTERS[setter]
    hook = Hook()
    ref = weakref.ref(hook)
    install(hook)
    try:
        del hook
        gc.collect()
        assert ref() is not None, "an installed hook was collected"
    finally:
        restore()
    gc.collect()
    assert ref() is None, "a replaced hook's cycle survived gc.collect()"


def test_the_collector_sees_registrations_and_key_classes():
    """Registrations live for the process (as JAX's do), so a cycle through one cannot be freed;
    but the GC must still see the callbacks they hold, or a cycle through a callback's closure
    would be reported as unreachable garbage and broken while still in use."""

    class Reg:
        pass

    def flatten(x):
        return ((), None)

    def unflatten(aux, children):
        return Reg()

    tu.register_pytree_node(Reg, flatten, unflatten)
    referents = gc.get_referents(_core._module_state)
    for obj in (Reg, flatten, unflatten, _jax_bridge._jtu.DictKey, _jax_bridge._jtu.SequenceKey):
        assert any(r is obj for r in referents), obj
    # A heap type's instance visits its type.
    assert any(r is type(_core._module_state) for r in referents)


def test_the_state_object_names_itself():
    state = _core._module_state
    cls = type(state)
    assert cls.__name__ == "ModuleState"
    assert cls.__module__ == "fastree._core"
    assert re.fullmatch(
        r"<fastree._core module state: \d+ registrations, JAX bridge installed>", repr(state)
    )
    assert not hasattr(_core, "registry")  # its old name
    with pytest.raises(TypeError):
        cls()  # one state per process


def test_reimport_reuses_the_module_and_its_state():
    out, _ = run_child(
        """
        import importlib, sys
        import fastree.tree_util as tu
        from fastree import _core

        state = _core._module_state
        del sys.modules["fastree._core"]
        again = importlib.import_module("fastree._core")
        print("same_module=%s" % (again is _core))
        print("same_state=%s" % (again._module_state is state))
        importlib.reload(_core)
        print("state_after_reload=%s" % (_core._module_state is state))
        print("works=%s" % (tu.tree_leaves({"a": [1, 2]}) == [1, 2]))
        """
    )
    assert out == {
        "same_module": "True",
        "same_state": "True",
        "state_after_reload": "True",
        "works": "True",
    }


def test_exit_releases_what_the_state_holds():
    # At interpreter exit the module's dict is cleared and the state object with it: the hooks it
    # held are released then (finalizers run, and may call the core), and the process exits 0.
    out, stderr = run_child(
        """
        import os
        import fastree.tree_util as tu
        from fastree import _core
        from fastree.diagnostics import aux as _aux

        class Hook:
            def __init__(self, write=os.write, leaves=tu.tree_leaves):
                self.write, self.leaves = write, leaves

            def __call__(self, *args):
                return True

            def __del__(self):
                self.write(1, b"released=%d\\n" % len(self.leaves([1, (2, 3)])))

        _core.set_aux_hooks(Hook(), _aux._report)
        print("installed=True", flush=True)
        """
    )
    assert out == {"installed": "True", "released": "3"}
    assert "Exception ignored" not in stderr


# ------------------------------------------------------------------------------------------------
# Subinterpreters: the state is per process, so the module declares it does not support them
# (pybind11's py::multiple_interpreters::not_supported()).

SUBINTERPRETER = """
import os
import sys

try:
    import _interpreters as interpreters  # 3.13+
except ImportError:
    import _xxsubinterpreters as interpreters  # 3.12

def create(kind):  # "isolated" (its own GIL) or "legacy" (the shared GIL)
    if hasattr(interpreters, "new_config"):
        return interpreters.create(interpreters.new_config(kind))
    return interpreters.create(isolated=kind == "isolated")

# The main interpreter imports the core first, as any real program would.
if len(sys.argv) > 1:  # a path: the extension alone (no fastree package, no JAX), by hand
    import importlib.util
    spec = importlib.util.spec_from_file_location("fastree._core", sys.argv[1])
    _core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_core)
else:
    from fastree import _core

SCRIPT = '''
import importlib.util, os
spec = importlib.util.spec_from_file_location("fastree._core", %r)
try:
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.write(%d, b"imported")
except ImportError as exc:
    os.write(%d, b"ImportError: " + str(exc).encode())
'''
for kind in ("isolated", "legacy"):
    r, w = os.pipe()
    interp = create(kind)
    try:
        interpreters.run_string(interp, SCRIPT % (_core.__file__, w, w))
    finally:
        interpreters.destroy(interp)
    os.close(w)
    print("%s=%s" % (kind, os.read(r, 4096).decode()))
    os.close(r)
print("main_works=%s" % (_core.tree_leaves([1, [2]]) == [1, 2]))
"""


def _has_subinterpreters() -> bool:
    for name in ("_interpreters", "_xxsubinterpreters"):
        try:
            __import__(name)
            return True
        except ImportError:
            pass
    return False


# Before 3.12 pybind11 has no subinterpreter support: its own module init takes the GIL through
# PyGILState_Ensure, which deadlocks in a subinterpreter before any fastree code runs.
@pytest.mark.skipif(sys.version_info < (3, 12), reason="pybind11 supports subinterpreters on 3.12+")
@pytest.mark.skipif(not _has_subinterpreters(), reason="no _interpreters/_xxsubinterpreters")
def test_a_subinterpreter_cannot_import_the_core():
    out, _ = run_child(SUBINTERPRETER)
    # Isolated: CPython refuses the module from its slot. Legacy: the module's init refuses it.
    for kind in ("isolated", "legacy"):
        assert out[kind].startswith("ImportError: "), out
        assert "subinterpreters" in out[kind], out
    assert out["main_works"] == "True"
