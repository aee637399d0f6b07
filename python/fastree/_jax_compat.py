"""Every JAX object fastree uses, bound once, when fastree is imported.

fastree calls JAX (to register types with it, to build JAX treedefs, to read its registry) and
:func:`fastree.install` replaces the functions of ``jax.tree_util`` and ``jax.tree`` by fastree's.
Were fastree to look JAX's functions up as module attributes at call time, an installed
``jax.tree_util.register_pytree_node`` would call itself. So the rest of fastree takes JAX's
objects from here, never from ``jax.tree_util`` / ``jax.tree``:

* :data:`tree_util`, :data:`tree`: the public names of ``jax.tree_util`` / ``jax.tree``, as JAX
  defines them. They are read from the modules that define them (``jax._src.tree_util`` and
  ``jax._src.tree``), which install never touches, so they are JAX's own objects even if fastree
  is imported (or reloaded) while another patch is in place.
* :data:`internal`: ``jax._src.tree_util`` itself (its ``_registry`` dict is read live, and
  install never modifies that module).

>>> import jax.tree_util
>>> from fastree import _jax_compat
>>> _jax_compat.tree_util.tree_map is jax.tree_util.tree_map  # as long as nothing is installed
True
"""

from __future__ import annotations

import types

import jax
import jax.tree as _jax_tree
import jax.tree_util as _jax_tree_util
from jax._src import tree as _jax_src_tree
from jax._src import tree_util as internal

__all__ = ["PUBLIC_TREE_NAMES", "PUBLIC_TREE_UTIL_NAMES", "internal", "jax", "tree", "tree_util"]


def _public_names(module: types.ModuleType) -> tuple[str, ...]:
    return tuple(sorted(n for n in vars(module) if not n.startswith("_") and n != "annotations"))


def _snapshot(
    public: types.ModuleType, defining: types.ModuleType, names: tuple[str, ...]
) -> types.SimpleNamespace:
    # The defining module first: it is the one place install never writes to. A name the public
    # module defines itself (none in the JAX versions tested) comes from the public module.
    missing = object()
    values = {}
    for name in names:
        value = getattr(defining, name, missing)
        values[name] = getattr(public, name) if value is missing else value
    return types.SimpleNamespace(**values)


PUBLIC_TREE_UTIL_NAMES = _public_names(_jax_tree_util)
"""The public names of ``jax.tree_util`` in the installed JAX."""

PUBLIC_TREE_NAMES = tuple(n for n in _public_names(_jax_tree) if n != "tree_util")
"""The public names of ``jax.tree`` in the installed JAX."""

tree_util = _snapshot(_jax_tree_util, internal, PUBLIC_TREE_UTIL_NAMES)
"""JAX's own ``jax.tree_util`` objects (a namespace; attribute access as on the module)."""

tree = _snapshot(_jax_tree, _jax_src_tree, PUBLIC_TREE_NAMES)
"""JAX's own ``jax.tree`` objects (a namespace; attribute access as on the module)."""

# The module objects install writes to. Only fastree._install uses these.
public_tree_util_module = _jax_tree_util
public_tree_module = _jax_tree
