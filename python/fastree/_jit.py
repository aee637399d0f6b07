"""``fastree.jit``: jax.jit over all arguments taken together as one pytree DAG.

``jax.jit`` flattens each argument with JAX's registry, so two arguments (or two entries of a
dict) that are the same identity-preserving object arrive in the traced function as two
objects. ``fastree.jit`` flattens ``(args, kwargs)`` once with fastree, so sharing anywhere in
the arguments survives, and flattens the result the same way.

How: the arguments travel as one JAX node, ``_Packed``, whose children are the unique leaves and
whose aux data is fastree's treedef (plus any static arguments). The treedef is therefore part
of jit's cache key: a call with new leaf values reuses the compiled function; a new structure,
aux data or sharing pattern retraces. The result travels back the same way, so JAX's own output
bookkeeping hands us the right output treedef for each cache entry.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from . import _core
from .jax_interop.compat import jax
from .jax_interop.compat import tree_util as _jtu

_log = logging.getLogger("fastree.jit")

_UNSUPPORTED = ("donate_argnums", "donate_argnames", "in_shardings", "out_shardings")


class _Packed:
    """Leaves plus the static rest (treedef, static arguments); a JAX pytree node."""

    __slots__ = ("leaves", "static")

    def __init__(self, leaves: list[Any], static: Any) -> None:
        self.leaves = leaves
        self.static = static


_jtu.register_pytree_node(
    _Packed, lambda p: (p.leaves, p.static), lambda static, leaves: _Packed(list(leaves), static)
)


def _split_static(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    static_argnums: Sequence[int],
    static_argnames: Sequence[str],
) -> tuple[tuple[Any, ...], dict[str, Any], tuple[Any, ...]]:
    """Moves static arguments out of args/kwargs into a hashable tuple."""
    nums = {i % len(args) if args else i for i in static_argnums if -len(args) <= i < len(args)}
    static_pos = tuple((i, args[i]) for i in sorted(nums))
    dyn_args = tuple(None if i in nums else a for i, a in enumerate(args))
    static_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in static_argnames))
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_argnames}
    return dyn_args, dyn_kwargs, (static_pos, static_kw)


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    explain: bool = False,
    **jax_jit_kwargs: Any,
) -> Any:
    """``jax.jit`` that keeps sharing across all arguments and the result.

    Other keyword arguments go to ``jax.jit`` (donation and explicit shardings are not
    supported: the compiled function sees one flat list of leaves). With ``explain=True`` every
    retrace logs (logger ``fastree.jit``) what changed against the closest structure seen before.

    >>> import jax.numpy as jnp, fastree
    >>> @fastree.jit
    ... def add(a, b):
    ...     return {'sum': a + b}
    >>> add(jnp.ones(2), 1.0)['sum']
    Array([2., 2.], dtype=float32)
    """
    if fun is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            explain=explain,
            **jax_jit_kwargs,
        )
    for name in _UNSUPPORTED:
        if name in jax_jit_kwargs:
            raise TypeError(f"fastree.jit does not support {name}=; use jax.jit for that.")
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    seen_structures: list[_core.PyTreeDef] = []

    def traced(packed: _Packed) -> _Packed:
        treedef, (static_pos, static_kw) = packed.static
        dyn_args, kwargs = treedef.unflatten(packed.leaves)
        args = list(dyn_args)
        for i, value in static_pos:
            args[i] = value
        kwargs.update(static_kw)
        if explain:
            _explain(treedef, seen_structures)
        out_leaves, out_treedef = _core.tree_flatten(fun(*args, **kwargs))
        return _Packed(out_leaves, out_treedef)

    compiled = jax.jit(traced, **jax_jit_kwargs)

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        dyn_args, dyn_kwargs, static = _split_static(args, kwargs, nums, names)
        leaves, treedef = _core.tree_flatten((dyn_args, dyn_kwargs))
        out = compiled(_Packed(leaves, (treedef, static)))
        return out.static.unflatten(out.leaves)

    return wrapper


def _explain(treedef: _core.PyTreeDef, seen: list[_core.PyTreeDef]) -> None:
    if seen:
        if treedef in seen:
            reason = "same structure; leaf shapes, dtypes or static arguments changed"
        else:
            from .diagnostics.diff import explain_retrace

            reason = explain_retrace(treedef, seen)
        _log.warning("fastree.jit retrace: %s", reason)
    if treedef not in seen:
        seen.append(treedef)
