"""Library node classes read natively: equinox Modules, chex dataclasses, flax.nnx Pytrees
(one module each).

A library registers its node classes with JAX by passing Python flatten/unflatten functions. When
fastree is installed (``python -m fastree.run``, ``FASTREE_INSTALL=1``, ``fastree.install()``)
before the library registers, the registration reaches fastree, which asks :func:`native_node`
whether an integration knows those functions. If one does, the class is registered, with JAX and
with fastree, as an attribute node (:class:`fastree._core.AttrNode`): C functions that give the
same output as the library's, checked against them on the first instances.

An integration module is imported only once its library is loaded; none of the libraries is a
dependency of fastree.

>>> from fastree import integrations
>>> integrations.status(dict)
'not an attribute node'
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from .. import _core
from . import _checked, _library

# (module whose presence shows the library is loaded, fastree integration module)
_LIBRARIES = (
    ("equinox._module._flatten", "equinox"),
    ("chex._src.dataclass", "chex"),
    ("flax.nnx.variablelib", "flax_nnx"),
)
# Library functions an integration replaces by walks of its own (flax.nnx's graph mode), bound
# while fastree is installed only: (module whose presence shows the library is loaded, module).
_GRAPH_WALKS = (("flax.nnx.graphlib", "flax_nnx_graph"),)


def bind_graph_walks(installed: bool) -> None:
    """Binds the loaded libraries' graph walks (install) or gives the libraries theirs back."""
    for marker, name in _GRAPH_WALKS:
        module_name = f"{__name__}.{name}"
        if installed and marker in sys.modules:
            importlib.import_module(module_name).attach()
        elif not installed and module_name in sys.modules:
            sys.modules[module_name].detach()


def native_node(cls: type, flatten_with_keys: Any, unflatten: Any, flatten: Any) -> Any | None:
    """The checked AttrNode an integration offers for this registration, or None.

    None also for a class whose own ``__getattribute__`` (one its integration did not vouch
    for) would make the library read every instance: the node could never read one, so its
    first-instance checks would never run, and each call would pay for a native read that
    gives up. Such a class is the library's from the start, and :func:`status` says why.
    """
    for marker, name in _LIBRARIES:
        if marker not in sys.modules:
            continue
        integration = importlib.import_module(f"{__name__}.{name}")
        node = integration.native_node(cls, flatten_with_keys, unflatten, flatten)
        if node is None:
            continue
        if not node.plain_attribute_access:
            _checked.fallbacks[cls] = (
                f"{cls.__qualname__} has its own __getattribute__, through which the library "
                "reads every instance: nothing native to compare")
            return None
        return node
    return None


def _adopt(cls: type, flatten: Any, unflatten: Any) -> bool:
    """The core's question for a class it meets that JAX holds in its Python-side registry: the
    class is registered with fastree as a native node if a loaded library's integration reads it
    (True), else the core adopts JAX's functions for it (False).

    This is :func:`accelerate` for one class, done when fastree's walks first meet it: classes a
    library registered while fastree was not installed (flax's Variables when a program uses
    ``fastree.tree_util`` directly) are read natively by fastree's own functions, as JAX reads
    them with the library's. Asked once per class; costs nothing while no library is loaded.
    """
    if not any(marker in sys.modules for marker, _ in _LIBRARIES):
        return False
    return _library.adopt_with(native_node, cls, flatten, unflatten)


_core.set_library_adopter(_adopt)


def accelerate() -> list[type]:
    """Makes classes that loaded libraries registered before install native for fastree.

    See :func:`fastree.integrations.equinox.accelerate` for what this can and cannot reach.
    """
    changed: list[type] = []
    for marker, name in _LIBRARIES:
        if marker in sys.modules:
            changed += importlib.import_module(f"{__name__}.{name}").accelerate()
    return changed


def status(cls: type) -> str:
    """How fastree reads ``cls``: natively, still being checked, or by its library (and why).

    ``"checking"``: the next instances a tree walk (``jax.tree_util``'s functions, fastree's)
    meets are compared with the library's own functions before their native result is used; the
    comparison costs those calls alone (each runs the library's flatten and unflatten besides
    the node's), and a walk that never reaches the node, such as flax's graph-mode walks, costs
    nothing and ends nothing. A class whose own ``__getattribute__`` makes the library read
    every instance leaves nothing to compare: it is ``"library: ..."`` from its first instance.

    For a flax.nnx class that flax's graph mode walks with its own functions after a difference,
    ``"; graph mode: flax: <reason>"`` follows (:func:`fastree.integrations.flax_nnx_graph.status`
    has the whole picture).
    """
    return _tree_status(cls) + _graph_status(cls)


def _tree_status(cls: type) -> str:
    node = _core.attribute_node(cls)
    if node is None:
        reason = _checked.fallbacks.get(cls)
        return f"library: {reason}" if reason else "not an attribute node"
    if node.use_library:
        why = _checked.fallbacks.get(cls) or node.library_reason or "switched by hand"
        return f"library: {why}"
    return "checking" if node.checks_left else "native"


def _graph_status(cls: type) -> str:
    graph = sys.modules.get(f"{__name__}.flax_nnx_graph")
    reason = graph.fallback_reason(cls) if graph is not None else None
    return f"; graph mode: flax: {reason}" if reason else ""
