"""``FASTREE_INSTALL=1``: install fastree into JAX as soon as JAX is imported.

``fastree_install.pth`` (in site-packages) imports this module at interpreter start, and only
when ``FASTREE_INSTALL`` is set to anything but ``""`` or ``"0"``; with the variable unset a
Python start costs one environment lookup. This module imports neither JAX nor fastree: it waits
for the program's first ``import jax`` and runs ``fastree.install()`` the moment JAX's package
has executed, before the importing library reads any name from it. A program that never imports
JAX pays nothing more.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any

_lock = threading.Lock()


_deferred = False
"""True when JAX was first imported by fastree's own import: fastree installs itself at the end
of its ``__init__`` (it cannot be installed half-imported)."""


def _install() -> None:
    global _deferred
    importing = sys.modules.get("fastree")
    if importing is not None and getattr(importing.__spec__, "_initializing", False):
        # `import fastree` came first and imported JAX: finish that import first.
        _deferred = True
        return
    import fastree

    fastree.install()


class _InstallAfterJaxImport:
    """A meta path finder that only watches for ``jax`` and wraps its loader's exec_module."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "jax":
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            del spec.loader.exec_module  # the loader's own method again
            _install()

        spec.loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


if "jax" in sys.modules:  # imported before site ran us (another .pth): install now
    _install()
else:
    sys.meta_path.insert(0, _InstallAfterJaxImport())
