"""Which ``jax.tree_util`` / ``jax.tree`` functions installing fastree routes, for the report.

The workloads themselves install fastree in child processes (``workloads.py``); this module asks,
in the parent, what ``fastree.installed()`` replaces, so the report can list it. Every check here
answers "can that be asked?": fastree must import, must have ``installed()``, and the process must
not already run with fastree installed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from benchmarks.data.fastree_import import try_import_tree_util
from benchmarks.unsupported import Unsupported

Installer = Callable[[], AbstractContextManager[Any]]


def fastree_installer() -> Installer:
    """``fastree.installed``; raises Unsupported ("unavailable: ...") when it cannot be used."""
    if try_import_tree_util() is None:
        raise Unsupported("unavailable: fastree did not import")
    import fastree

    installed = getattr(fastree, "installed", None)
    if installed is None:
        raise Unsupported("unavailable: this fastree has no fastree.installed()")
    is_installed = getattr(fastree, "is_installed", lambda: False)
    if is_installed() or any(_is_fastree(fn) for fn in public_functions().values()):
        raise Unsupported(
            "unavailable: jax.tree_util is already routed to fastree in this process "
            "(fastree.run or an install before the suite), so there is no plain baseline"
        )
    return installed


def routed_functions(installer: Installer) -> list[str]:
    """Names of jax.tree_util / jax.tree functions that the installer replaces."""
    before = public_functions()
    with installer():
        during = public_functions()
    return sorted(name for name, fn in during.items() if fn is not before.get(name))


def public_functions() -> dict[str, Any]:
    """``"jax.tree_util.tree_map" -> object`` for every public callable of both modules."""
    import jax

    found = {}
    for module_name, module in (("jax.tree_util", jax.tree_util), ("jax.tree", jax.tree)):
        for name in dir(module):
            value = getattr(module, name)
            if not name.startswith("_") and callable(value) and not isinstance(value, type):
                found[f"{module_name}.{name}"] = value
    return found


def _is_fastree(fn: Any) -> bool:
    return str(getattr(fn, "__module__", "") or "").startswith("fastree")
