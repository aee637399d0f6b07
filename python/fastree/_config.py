"""fastree's global settings: ``fastree.config``, and ``fastree.strict_aux`` for a block.

One setting, ``aux_checks``: what fastree does with aux_data that does not belong in static
metadata (an array, a tracer, ...) while it builds a treedef.

* ``"warn"``: an :class:`~fastree.AuxDataWarning`, once per (node type, problem);
* ``"strict"``: a ``TypeError`` every time, and aux_data must also be hashable;
* ``"off"``: no check at all, as in JAX;
* ``"auto"`` (the default): ``"warn"`` for fastree's own API, ``"off"`` while fastree is
  installed into JAX. An installed program must behave as it does on JAX, only faster: a
  routed ``jax.tree.map`` that warned would break ``python -W error``.

Its first value comes from ``FASTREE_AUX_CHECKS`` (``off``/``warn``/``strict``/``auto``) in the
environment, or ``FASTREE_STRICT_AUX=1`` for ``"strict"``. Strictness lives in the core
(``_core.strict_aux()``), which checks aux_data while it flattens; every change re-installs (or
removes) the hooks of ``diagnostics/aux.py``, whose cached verdicts depend on it.

The one-line switch for a program that wants no checks:

>>> import fastree
>>> fastree.config.aux_checks = "off"
>>> fastree.config.aux_checks = "auto"
>>> with fastree.strict_aux():
...     fastree.config.strict_aux
True
>>> fastree.config.strict_aux
False
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from . import _core
from .diagnostics import aux as _aux

AUX_CHECK_MODES = ("auto", "off", "warn", "strict")

_lock = threading.RLock()
_mode = "auto"  # what the user asked for; _effective() resolves "auto"
_routed = False  # whether fastree is installed into JAX (told by _install)


def _effective() -> str:
    if _mode != "auto":
        return _mode
    return "off" if _routed else "warn"


def _apply() -> None:
    """Puts the core in the effective mode: hooks on or off, strict or not."""
    effective = _effective()
    strict = effective == "strict"
    if effective == "off":
        _core.set_aux_hooks(None, None)  # the core checks nothing while no reporter is set
        if _core.strict_aux():
            _core.set_strict_aux(False)
        return
    if strict != _core.strict_aux():
        _core.set_strict_aux(strict)
    _aux._install()


def _set_mode(mode: str) -> None:
    global _mode
    if mode not in AUX_CHECK_MODES:
        raise ValueError(
            f"fastree.config.aux_checks must be one of {', '.join(map(repr, AUX_CHECK_MODES))}; "
            f"got {mode!r}"
        )
    with _lock:
        _mode = mode
        _apply()


def set_routed(routed: bool) -> None:
    """Told by ``_install`` whenever fastree is installed into JAX or uninstalled."""
    global _routed
    with _lock:
        if routed != _routed:
            _routed = routed
            _apply()


class Config:
    """fastree's global settings.

    Attributes:
        aux_checks: ``"auto"``, ``"off"``, ``"warn"`` or ``"strict"`` (see the module
            docstring). ``"auto"`` warns for fastree's own API and checks nothing while fastree
            is installed into JAX.
        strict_aux: True while the checks are strict: a problem in aux_data raises
            ``TypeError`` instead of warning, and aux_data must also be hashable. Setting it
            True is ``aux_checks = "strict"``; setting it False takes strict back to ``"auto"``.

    >>> import fastree
    >>> fastree.config.aux_checks
    'auto'
    >>> fastree.config.strict_aux = True
    >>> fastree.config.aux_checks
    'strict'
    >>> fastree.config.strict_aux = False
    >>> fastree.config.aux_checks
    'auto'
    """

    @property
    def aux_checks(self) -> str:
        return _mode

    @aux_checks.setter
    def aux_checks(self, mode: str) -> None:
        _set_mode(mode)

    @property
    def strict_aux(self) -> bool:
        return _effective() == "strict"

    @strict_aux.setter
    def strict_aux(self, value: bool) -> None:
        if value:
            _set_mode("strict")
        elif _mode == "strict":
            _set_mode("auto")

    def __repr__(self) -> str:
        return f"fastree.config(aux_checks={self.aux_checks!r}, strict_aux={self.strict_aux})"


config = Config()


@contextlib.contextmanager
def strict_aux(enabled: bool = True) -> Iterator[None]:
    """Context manager: strict aux_data checks inside the block (nestable, exception-safe).

    ``enabled=False`` makes them warn instead, as ``aux_checks = "warn"``. On exit the setting
    from before the block is back.

    >>> import fastree, numpy as np
    >>> import fastree.tree_util as tu
    >>> class Box:
    ...     def __init__(self, meta): self.meta = meta
    >>> tu.register_pytree_node(Box, lambda b: ((), b.meta), lambda m, _: Box(m))
    >>> tu.tree_structure(Box([1, 2]))        # a list of plain values: fine by default
    PyTreeDef(CustomNode(Box[[1, 2]], []))
    >>> with fastree.strict_aux():
    ...     tu.tree_structure({'b': Box([1, 2])})
    Traceback (most recent call last):
    TypeError: aux_data of the ...Box node at key path ['b'] holds an unhashable list. ...
    """
    with _lock:
        previous = _mode
        _set_mode("strict" if enabled else "warn")
    try:
        yield
    finally:
        _set_mode(previous)


def _mode_from_environment() -> str:
    mode = os.environ.get("FASTREE_AUX_CHECKS", "").strip().lower()
    if mode:
        if mode not in AUX_CHECK_MODES:
            raise ValueError(
                f"FASTREE_AUX_CHECKS must be one of {', '.join(AUX_CHECK_MODES)}; got {mode!r}"
            )
        return mode
    if os.environ.get("FASTREE_STRICT_AUX", "").strip() not in ("", "0"):
        return "strict"
    return "auto"


def install() -> None:
    """Reads the environment and installs the aux_data hooks (``import fastree`` does)."""
    _set_mode(_mode_from_environment())
