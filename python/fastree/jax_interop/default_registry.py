"""``tree_util.default_registry``: fastree's stand-in for jaxlib's ``PyTreeRegistry`` object.

Code written against JAX sometimes calls the registry object directly rather than the functions
of ``jax.tree_util`` (``default_registry.flatten_one_level(x)`` to test for a node without an
exception, ``PyTreeDef.from_node_data_and_children(default_registry, ...)``). This object has
the same methods with the same results, backed by fastree's core, so that such code keeps
working after ``import fastree.tree_util as tree_util``.

fastree has one registry, which this stateless object only fronts. Registering
through it does what the same call on JAX's ``default_registry`` does (JAX's registry object only,
not JAX's jit dispatch registry: exactly the reach of the JAX call being replaced), and also
registers the type with fastree's core so that it is flattened without going back through JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import _core
from .._argument_checks import require_type as _require_type
from .compat import tree_util as _jtu


class PyTreeRegistry:
    """The registry behind fastree's tree functions, with jaxlib ``PyTreeRegistry``'s methods.

    >>> from fastree.tree_util import default_registry
    >>> default_registry.flatten_one_level({'b': 1, 'a': 2})
    ((2, 1), ('a', 'b'))
    >>> default_registry.flatten_one_level(3) is None  # a leaf: None rather than an error
    True
    >>> default_registry.is_node(dict), default_registry.is_node(int)
    (True, False)
    """

    __slots__ = ()

    def flatten(
        self, tree: Any, leaf_predicate: Callable[[Any], bool] | None = None
    ) -> tuple[list[Any], _core.PyTreeDef]:
        """``tree_flatten(tree, leaf_predicate)``."""
        return _core.tree_flatten(tree, leaf_predicate)

    def flatten_with_path(
        self, tree: Any, leaf_predicate: Callable[[Any, Any], bool] | None = None
    ) -> tuple[list[tuple[tuple[Any, ...], Any]], _core.PyTreeDef]:
        """``tree_flatten_with_path``; as in JAX, the predicate is called as ``(path, x)``."""
        return _core.tree_flatten_with_path(tree, leaf_predicate, leaf_predicate is not None)

    def flatten_one_level(self, tree: Any) -> tuple[Iterable[Any], Any] | None:
        """The children and node data of a node; None for a leaf."""
        return _core.flatten_one_level(tree)

    def flatten_one_level_with_keys(self, tree: Any) -> tuple[Iterable[Any], Any] | None:
        """The (key, child) pairs and node data of a node; None for a leaf."""
        return _core.flatten_one_level_with_keys(tree)

    def is_node(self, type: type) -> bool:  # JAX's parameter name
        """True if instances of ``type`` are pytree nodes."""
        return _core.is_node_type(type)

    def register_node(
        self,
        type: type[Any],  # JAX's parameter name
        to_iterable: Callable[[Any], tuple[Iterable[Any], Any]],
        from_iterable: Callable[[Any, Iterable[Any]], Any],
        to_iterable_with_keys: Callable[[Any], tuple[Iterable[tuple[Any, Any]], Any]] | None = None,
    ) -> None:
        """Registers a custom node, as JAX's ``default_registry.register_node`` does."""
        _require_type(type, "register_node")
        # JAX first: it validates the call and raises its own errors (e.g. a duplicate).
        _jtu.default_registry.register_node(type, to_iterable, from_iterable, to_iterable_with_keys)
        _core.register_node(type, to_iterable, from_iterable, to_iterable_with_keys, False)

    def register_dataclass_node(
        self,
        type: type[Any],  # JAX's parameter name
        data_fields: Sequence[str],
        meta_fields: Sequence[str],
        /,
    ) -> None:
        """Registers a dataclass-like node by field names, as JAX's registry method does."""
        _require_type(type, "register_dataclass_node")
        data, meta = tuple(data_fields), tuple(meta_fields)  # read once: they may be iterators
        _jtu.default_registry.register_dataclass_node(type, list(data), list(meta))
        _core.register_dataclass_node(type, data, meta, False)

    def __reduce__(self) -> str:
        # Pickles as the module attribute, so that the one instance stays the only one.
        return "default_registry"

    def __repr__(self) -> str:
        return "fastree.tree_util.default_registry"


default_registry = PyTreeRegistry()
