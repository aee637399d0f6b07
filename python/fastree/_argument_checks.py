"""Checks of registration arguments shared by every registering function (public and registry)."""

from __future__ import annotations

from typing import Any


def require_type(nodetype: Any, function: str) -> None:
    """Refuses a non-type before anything is registered anywhere.

    JAX accepts any object here and registers it uselessly; fastree refuses, so JAX and fastree
    never disagree about a registration.

    >>> require_type(3, "register_pytree_node")
    Traceback (most recent call last):
    TypeError: register_pytree_node: expected a type to register, got 3.
    """
    if not isinstance(nodetype, type):
        raise TypeError(f"{function}: expected a type to register, got {nodetype!r}.")
