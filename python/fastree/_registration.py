"""Registering custom pytree nodes.

Each function registers the type with JAX first (so JAX validates the call and raises its own
errors, e.g. for a duplicate registration, and so ``jax.jit``/``grad``/``vmap`` accept the type)
and then with fastree's core, which flattens it without going back through JAX.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from . import _core, _identity, integrations
from ._argument_checks import require_type as _require_type
from .jax_interop import compat as _jax_compat
from .jax_interop.compat import tree_util as _jtu

T = TypeVar("T")
Typ = TypeVar("Typ", bound=type[Any])
H = TypeVar("H")


def _register_with_jax_as_dag(nodetype: type[Any]) -> None:
    # JAX flattens node by node and would copy shared children: it sees an identity-preserving
    # object as one node holding its unique leaves, with fastree's subtree treedef as aux data.
    _jtu.register_pytree_node(nodetype, _identity.jax_flatten, _identity.jax_unflatten)


def _registered_natively(nodetype: type[Any], flatten_with_keys: Any, unflatten: Any,
                         flatten: Any, *, keyed: bool) -> bool:
    # A library's own node class (an equinox Module, flax.nnx's PytreeState): registered, with
    # JAX and with the core, as the attribute node an integration offers for these functions
    # (fastree.integrations), if one does. JAX gets the node's functions in the registration's
    # own shape (keys only where the library gave them).
    node = integrations.native_node(nodetype, flatten_with_keys, unflatten, flatten)
    if node is None:
        return False
    if keyed:
        _jtu.register_pytree_with_keys(nodetype, node.flatten_with_keys, node.unflatten,
                                       node.flatten)
    else:
        _jtu.register_pytree_node(nodetype, node.flatten, node.unflatten,
                                  None if flatten_with_keys is None else node.flatten_with_keys)
    _core.register_attribute_node(node)
    return True


def register_pytree_node(
    nodetype: type[T],
    flatten_func: Callable[[T], tuple[Iterable[Any], Any]],
    unflatten_func: Callable[[Any, Iterable[Any]], T],
    flatten_with_keys_func: Callable[[T], tuple[Iterable[tuple[Any, Any]], Any]] | None = None,
    *,
    preserve_identity: bool = False,
) -> None:
    """Makes ``nodetype`` a pytree node (in fastree and in JAX).

    With ``preserve_identity=True`` an instance reached through several paths of one tree is
    flattened once and rebuilt as one shared object (see the README's identity section).

    >>> import fastree.tree_util as tu
    >>> class Pair:
    ...     def __init__(self, a, b):
    ...         self.a, self.b = a, b
    >>> tu.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
    >>> tu.tree_leaves(Pair(1, [2, 3]))
    [1, 2, 3]
    """
    _require_type(nodetype, "register_pytree_node")
    if not preserve_identity and _registered_natively(
        nodetype, flatten_with_keys_func, unflatten_func, flatten_func, keyed=False
    ):
        return
    if preserve_identity:
        _register_with_jax_as_dag(nodetype)
    else:
        _jtu.register_pytree_node(nodetype, flatten_func, unflatten_func, flatten_with_keys_func)
    _core.register_node(
        nodetype, flatten_func, unflatten_func, flatten_with_keys_func, preserve_identity
    )


def register_pytree_with_keys(
    nodetype: type[T],
    flatten_with_keys: Callable[[T], tuple[Iterable[tuple[Any, Any]], Any]],
    unflatten_func: Callable[[Any, Iterable[Any]], T],
    flatten_func: Callable[[T], tuple[Iterable[Any], Any]] | None = None,
    *,
    preserve_identity: bool = False,
) -> None:
    """Like :func:`register_pytree_node`, with a flatten function that also returns keys.

    >>> import fastree.tree_util as tu
    >>> class Box:
    ...     def __init__(self, x):
    ...         self.x = x
    >>> tu.register_pytree_with_keys(
    ...     Box, lambda b: (((tu.GetAttrKey('x'), b.x),), None), lambda _, c: Box(*c))
    >>> tu.tree_leaves_with_path(Box(7))
    [((GetAttrKey(name='x'),), 7)]
    """
    _require_type(nodetype, "register_pytree_with_keys")
    if not preserve_identity and _registered_natively(
        nodetype, flatten_with_keys, unflatten_func, flatten_func, keyed=True
    ):
        return
    if preserve_identity:
        _register_with_jax_as_dag(nodetype)
    else:
        _jtu.register_pytree_with_keys(nodetype, flatten_with_keys, unflatten_func, flatten_func)
    if flatten_func is None:
        # The keyless flatten JAX derives, so malformed output fails with the same Python
        # unpacking errors as under JAX.
        def flatten_func(tree: T) -> tuple[list[Any], Any]:
            key_children, aux = flatten_with_keys(tree)
            return [child for _, child in key_children], aux

    _core.register_node(
        nodetype, flatten_func, unflatten_func, flatten_with_keys, preserve_identity
    )


_NO_MISSING: Any = object()


def register_attribute_node(
    nodetype: type[T],
    data_fields: Sequence[str],
    meta_fields: Sequence[str] = (),
    *,
    missing: Any = _NO_MISSING,
    extra_fields: Sequence[str] | None = None,
    preserve_identity: bool = False,
) -> None:
    """Makes ``nodetype`` a pytree node read and rebuilt in C++, by fastree and by JAX alike.

    The children are the ``data_fields``, read from each instance's own storage (its
    ``__dict__``, or a ``__slots__`` slot; never a class attribute or a property), and keyed
    ``GetAttrKey(name)``. The aux data is the tuple of the ``meta_fields`` values. A rebuilt
    instance is made as ``object.__new__(nodetype)`` followed by ``object.__setattr__`` per field:
    ``__init__`` does not run, and frozen dataclasses work. JAX is given C functions for flatten,
    flatten-with-keys and unflatten, so ``jax.tree_util`` and ``jax.jit`` dispatch run no Python
    frame per node either.

    Args:
      nodetype: the class.
      data_fields: names of the attributes that are children, in order.
      meta_fields: names of the attributes that form the aux data, in order.
      missing: the value an absent field reads as; a rebuild leaves a field whose value is
        ``missing`` unset. Without it, an absent field is an ``AttributeError``.
      extra_fields: attributes that instances rarely have (equinox's functools.wraps fields):
        the aux data then starts with one item, ``missing`` when ``__dict__`` holds exactly the
        fields, else the tuple of these attributes' values (``missing`` where absent); a rebuild
        writes them into ``__dict__``. Needs ``missing``.
      preserve_identity: as for :func:`register_pytree_node`.

    >>> import dataclasses, fastree, jax
    >>> @dataclasses.dataclass(frozen=True)
    ... class Dense:
    ...     weight: object
    ...     bias: object
    ...     activation: str
    >>> fastree.register_attribute_node(Dense, ["weight", "bias"], ["activation"])
    >>> layer = Dense(1.0, 2.0, "relu")
    >>> leaves, treedef = jax.tree_util.tree_flatten(layer)
    >>> leaves, treedef.node_data()[1]
    ([1.0, 2.0], ('relu',))
    >>> jax.tree_util.tree_map(lambda x: x * 10, layer)
    Dense(weight=10.0, bias=20.0, activation='relu')
    >>> fastree.tree_util.tree_flatten_with_path(layer)[0][0]
    ((GetAttrKey(name='weight'),), 1.0)
    """
    _require_type(nodetype, "register_attribute_node")
    options = {} if missing is _NO_MISSING else {"missing": missing}
    # Made (and checked) before anything is registered anywhere.
    node = _core.AttrNode(nodetype, data_fields, meta_fields, extra_fields=extra_fields, **options)
    if preserve_identity:
        _register_with_jax_as_dag(nodetype)
    else:
        _jtu.register_pytree_with_keys(nodetype, node.flatten_with_keys, node.unflatten,
                                       node.flatten)
    _core.register_attribute_node(node, preserve_identity)


def register_pytree_node_class(cls: Typ | None = None, *, preserve_identity: bool = False) -> Any:
    """Class decorator: registers ``cls`` using its ``tree_flatten``/``tree_unflatten``.

    Usable bare (``@register_pytree_node_class``) or as a factory
    (``@register_pytree_node_class(preserve_identity=True)``).
    """
    if cls is None:
        return lambda c: register_pytree_node_class(c, preserve_identity=preserve_identity)
    register_pytree_node(
        cls,
        operator.methodcaller("tree_flatten"),
        cls.tree_unflatten,
        preserve_identity=preserve_identity,
    )
    return cls


def register_pytree_with_keys_class(
    cls: Typ | None = None, *, preserve_identity: bool = False
) -> Any:
    """Class decorator: registers ``cls`` using ``tree_flatten_with_keys``/``tree_unflatten``.

    Usable bare or as a factory, like :func:`register_pytree_node_class`.
    """
    if cls is None:
        return lambda c: register_pytree_with_keys_class(c, preserve_identity=preserve_identity)
    flatten_func = (
        operator.methodcaller("tree_flatten") if hasattr(cls, "tree_flatten") else None
    )
    register_pytree_with_keys(
        cls,
        operator.methodcaller("tree_flatten_with_keys"),
        cls.tree_unflatten,
        flatten_func,
        preserve_identity=preserve_identity,
    )
    return cls


def _dataclass_fields(
    nodetype: type[Any],
    data_fields: Sequence[str] | None,
    meta_fields: Sequence[str] | None,
    drop_fields: Sequence[str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    # The defaults as the installed JAX derives them: the fields marked static are meta, the
    # others data; jax 0.11.1 and later leave drop_fields out of both.
    if data_fields is None or meta_fields is None:
        dropped = set(drop_fields) if _jax_compat.JAX_DATACLASS_DEFAULTS_OMIT_DROP_FIELDS else set()
        fields = [f for f in dataclasses.fields(nodetype) if f.name not in dropped]
        data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
        meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
    return tuple(data_fields), tuple(meta_fields)


def _check_dataclass_fields(
    nodetype: type[Any], data: tuple[str, ...], meta: tuple[str, ...], drop_fields: Sequence[str]
) -> None:
    # The rules JAX's register_dataclass enforces, for the identity-preserving path (which
    # registers with JAX through other functions and so does not get JAX's checks). The messages
    # print sets, whose order of str items depends on the hash seed and on the order the items
    # went in: each set is built as JAX builds it (same items, same insertion order, meta fields
    # first), so the texts are JAX's under every PYTHONHASHSEED. Discarding does not move the
    # items left, so how the dropped names are removed does not matter.
    if dataclasses.is_dataclass(nodetype):
        init_fields = {f.name for f in dataclasses.fields(nodetype) if f.init}
        init_fields -= _jax_compat.jax_dropped_names(drop_fields)
        given = {*meta, *data}
        if given != init_fields:
            # JAX's text (every supported release): each part only when it has fields.
            message = (
                "data_fields and meta_fields must include all dataclass fields with"
                " ``init=True`` and only them."
            )
            if missing := init_fields - given:
                message += (
                    f" Missing fields: {missing}. Add them to drop_fields to suppress this error."
                )
            if unexpected := given - init_fields:
                message += f" Unexpected fields: {unexpected}."
            raise ValueError(message)
    if _jax_compat.JAX_DATACLASS_REJECTS_OVERLAP and (overlap := set(data) & set(meta)):
        raise ValueError(
            f"data_fields and meta_fields must not overlap. Overlapping fields: {overlap}."
        )


def register_dataclass(
    nodetype: Typ | None = None,
    data_fields: Sequence[str] | None = None,
    meta_fields: Sequence[str] | None = None,
    drop_fields: Sequence[str] = (),
    *,
    preserve_identity: bool = False,
) -> Any:
    """Registers a dataclass-like type; its fields are read and set in C++ (no Python callback).

    Usable bare, with JAX's arguments, or as a factory:
    ``@register_dataclass(preserve_identity=True)``.

    >>> import dataclasses, fastree.tree_util as tu
    >>> @tu.register_dataclass
    ... @dataclasses.dataclass
    ... class Layer:
    ...     w: float
    ...     name: str = dataclasses.field(default='l0', metadata=dict(static=True))
    >>> tu.tree_flatten(Layer(1.5))
    ([1.5], PyTreeDef(CustomNode(Layer[('l0',)], [*])))
    """
    if nodetype is None:
        return lambda t: register_dataclass(
            t, data_fields, meta_fields, drop_fields, preserve_identity=preserve_identity
        )
    _require_type(nodetype, "register_dataclass")
    # A one-shot iterable would be used up by JAX's call before fastree's registration reads it:
    # take its items once. (Sequences stay as given, so JAX's messages show them as passed.)
    data_fields, meta_fields, drop_fields = (
        fields if fields is None or isinstance(fields, Sequence) else tuple(fields)
        for fields in (data_fields, meta_fields, drop_fields)
    )
    if not preserve_identity:
        _jtu.register_dataclass(nodetype, data_fields, meta_fields, drop_fields)
        data, meta = _dataclass_fields(nodetype, data_fields, meta_fields, drop_fields)
    else:
        if (data_fields is None) != (meta_fields is None):
            raise TypeError(
                "register_dataclass: data_fields and meta_fields must both be specified when"
                f" either is specified. Got {data_fields=} {meta_fields=}."
            )
        if data_fields is None and not dataclasses.is_dataclass(nodetype):
            raise TypeError(
                "register_dataclass: data_fields and meta_fields are required when nodetype is"
                f" not a dataclass. Got {nodetype=}."
            )
        data, meta = _dataclass_fields(nodetype, data_fields, meta_fields, drop_fields)
        _check_dataclass_fields(nodetype, data, meta, drop_fields)
        _register_with_jax_as_dag(nodetype)
    _core.register_dataclass_node(nodetype, data, meta, preserve_identity)
    return nodetype


def _static_flatten(obj: Any) -> tuple[list[Any], Any]:
    # A list, as the keyless flatten JAX derives for register_static's with-keys function.
    return [], obj


def _static_unflatten(obj: Any, _children: Iterable[Any]) -> Any:
    return obj


def register_static(cls: type[H]) -> type[H]:
    """Registers ``cls`` as a node with no children: instances live in the treedef (static).

    >>> import fastree.tree_util as tu
    >>> @tu.register_static
    ... class Mode(str):
    ...     pass
    >>> tu.tree_leaves([1, Mode('train')])
    [1]
    """
    _require_type(cls, "register_static")
    _jtu.register_static(cls)
    _core.register_node(cls, _static_flatten, _static_unflatten, _static_flatten)
    return cls
