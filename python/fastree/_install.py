"""Routing ``jax.tree_util`` and ``jax.tree`` to fastree for the whole process.

:func:`install` replaces module attributes of ``jax.tree_util`` and ``jax.tree`` by fastree's
functions, so that every caller that looks them up at call time (``jax.tree.map(...)``,
``jtu.tree_map(...)``: optax, flax and equinox do) runs fastree. Code that bound a function before
install (``from jax.tree_util import tree_map`` at its import time) keeps JAX's; to route it too,
install before anything else is imported: ``python -m fastree.run`` or ``FASTREE_INSTALL=1``.

Only functions that hand no treedef out and take none in are routed, plus the registration
functions (which register with JAX and fastree alike). Treedefs stay JAX's: libraries
``isinstance``-check them against ``jax.tree_util.PyTreeDef``, store them, compare them with ones
JAX builds and pass them to JAX internals that require jaxlib's class. The README's "Installing
into JAX" section gives the reason for each name.

Every fastree module takes JAX's objects from :mod:`fastree.jax_interop.compat`, bound at import, so
nothing in fastree calls an installed function by mistake (no recursion).
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator
from typing import Any

from . import _config, integrations
from . import tree as _fastree_tree
from . import tree_util as _fastree_tree_util
from .jax_interop import compat as _jax_compat

# What install routes, per JAX module (the README's table gives the reason for each name).
ROUTED_TREE_UTIL = (
    # No treedef in or out: leaves, mapped trees, reductions, booleans, key paths.
    "all_leaves",
    "flatten_one_level",
    "flatten_one_level_with_keys",
    "is_tree_node",
    "tree_all",
    "tree_broadcast",
    "tree_leaves",
    "tree_leaves_with_path",
    "tree_map",
    "tree_map_with_path",
    "tree_reduce",
    "tree_reduce_associative",
    # Registration: fastree registers with JAX (its own function, bound at import) and with
    # fastree's core, so the type is a native node for both.
    "register_dataclass",
    "register_pytree_node",
    "register_pytree_node_class",
    "register_pytree_with_keys",
    "register_pytree_with_keys_class",
    "register_static",
)
ROUTED_TREE = (
    "all",
    "broadcast",
    "leaves",
    "leaves_with_path",
    "map",
    "map_with_path",
    "reduce",
    "reduce_associative",
)

# (label, JAX's module, fastree's module, routed names)
_MODULES = (
    ("jax.tree_util", _jax_compat.public_tree_util_module, _fastree_tree_util, ROUTED_TREE_UTIL),
    ("jax.tree", _jax_compat.public_tree_module, _fastree_tree, ROUTED_TREE),
)
_ORIGINALS = {"jax.tree_util": _jax_compat.tree_util, "jax.tree": _jax_compat.tree}


def _routes() -> list[tuple[str, types.ModuleType, str, Any]]:
    # Names the installed JAX lacks (older releases) are skipped.
    return [
        (f"{label}.{name}", module, name, getattr(fastree_module, name))
        for label, module, fastree_module, names in _MODULES
        for name in names
        if hasattr(module, name)
    ]


_lock = threading.RLock()
# What was in each replaced attribute before install (JAX's object unless someone else had
# patched it first), keyed by "jax.tree_util.tree_map"; None while not installed.
_saved: dict[str, tuple[types.ModuleType, str, Any, Any]] | None = None
_explicit = False  # install() called and not yet taken back by uninstall()
_open_blocks = 0  # `with installed():` blocks currently open, in any thread


def _apply() -> None:
    global _saved
    if _saved is not None:
        return
    saved = {}
    for qualname, module, name, replacement in _routes():
        saved[qualname] = (module, name, getattr(module, name), replacement)
    # Written only after every lookup succeeded, so a failure leaves JAX untouched.
    for module, name, _, replacement in saved.values():
        setattr(module, name, replacement)
    _saved = saved
    # Routed calls must behave as JAX's: the aux_data checks go quiet unless the user asked.
    _config.set_routed(True)
    # flax.nnx's graph mode when flax is loaded already (else at flax's first registration).
    integrations.bind_graph_walks(True)


def _remove() -> None:
    global _saved
    if _saved is None:
        return
    for module, name, previous, replacement in _saved.values():
        # Someone patched it again after install: theirs stays (restoring would undo them).
        if getattr(module, name) is replacement:
            setattr(module, name, previous)
    _saved = None
    _config.set_routed(False)
    integrations.bind_graph_walks(False)


def install() -> None:
    """Routes the public tree functions of ``jax.tree_util`` and ``jax.tree`` to fastree.

    Idempotent and thread-safe. See :func:`installed_functions` for what is routed, and
    :func:`uninstall` to restore JAX's own functions.

    >>> import jax, fastree
    >>> fastree.install()
    >>> jax.tree.map is fastree.tree.map
    True
    >>> fastree.uninstall()
    >>> jax.tree.map is fastree.tree.map
    False
    """
    global _explicit
    with _lock:
        _explicit = True
        _apply()


def uninstall() -> None:
    """Takes back :func:`install`: JAX's own functions (the very objects) are restored.

    Idempotent and thread-safe. While a ``with installed():`` block is open (in any thread) the
    routing stays until the last such block exits.
    """
    global _explicit
    with _lock:
        _explicit = False
        if _open_blocks == 0:
            _remove()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Routes JAX's tree functions to fastree inside the ``with`` block.

    On exit (an exception included) the routing is removed, unless :func:`install` was in effect
    or another ``installed()`` block is still open.

    >>> import jax, fastree
    >>> with fastree.installed():
    ...     jax.tree_util.tree_leaves is fastree.tree_util.tree_leaves
    True
    >>> fastree.installed_functions()
    {}
    """
    global _open_blocks
    with _lock:
        _open_blocks += 1
        try:
            _apply()
        except BaseException:
            _open_blocks -= 1
            raise
    try:
        yield
    finally:
        with _lock:
            _open_blocks -= 1
            if _open_blocks == 0 and not _explicit:
                _remove()


def is_installed() -> bool:
    """True while JAX's tree functions are routed to fastree."""
    return _saved is not None


def installed_functions() -> dict[str, str]:
    """What is routed now: ``{"jax.tree_util.tree_map": "fastree.tree_util.tree_map", ...}``.

    Empty while nothing is installed.
    """
    with _lock:
        if _saved is None:
            return {}
        return {
            qualname: f"{qualname.rsplit('.', 1)[0].replace('jax.', 'fastree.', 1)}.{name}"
            for qualname, (_, name, _, _) in _saved.items()
        }


def original(qualname: str) -> Any:
    """JAX's own object for ``"jax.tree_util.X"`` or ``"jax.tree.X"``, installed or not.

    >>> import jax, fastree
    >>> with fastree.installed():
    ...     fastree.original("jax.tree.map") is jax.tree.map
    False
    """
    module, _, name = qualname.rpartition(".")
    if module not in _ORIGINALS or not hasattr(_ORIGINALS[module], name):
        raise AttributeError(f"{qualname!r} is not a public name of jax.tree_util or jax.tree")
    return getattr(_ORIGINALS[module], name)
