"""fastree's global settings: ``fastree.config``, and ``fastree.strict_aux`` for a block.

One setting so far, ``strict_aux``. Its value lives in the core (``_core.strict_aux()``), which
checks aux_data while it flattens; changing it also re-installs the aux_data hooks of
``diagnostics/aux.py``, whose cached verdicts depend on it.

>>> import fastree
>>> with fastree.strict_aux():
...     fastree.config.strict_aux
True
>>> fastree.config.strict_aux
False
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from . import _core
from .diagnostics import aux as _aux


def _set_strict(strict: bool) -> None:
    strict = bool(strict)
    if strict != _core.strict_aux():
        _core.set_strict_aux(strict)
        _aux._install()


class Config:
    """fastree's global settings.

    Attributes:
        strict_aux: when True, a problem in aux_data raises ``TypeError`` instead of warning,
            and aux_data must also be hashable. Initially ``FASTREE_STRICT_AUX=1`` in the
            environment turns it on.

    >>> import fastree
    >>> fastree.config.strict_aux = True
    >>> fastree.config.strict_aux = False
    """

    @property
    def strict_aux(self) -> bool:
        return _core.strict_aux()

    @strict_aux.setter
    def strict_aux(self, value: bool) -> None:
        _set_strict(value)

    def __repr__(self) -> str:
        return f"fastree.config(strict_aux={self.strict_aux})"


config = Config()


@contextlib.contextmanager
def strict_aux(enabled: bool = True) -> Iterator[None]:
    """Context manager: strict aux_data checks inside the block (nestable, exception-safe).

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
    previous = _core.strict_aux()
    _set_strict(enabled)
    try:
        yield
    finally:
        _set_strict(previous)


def install() -> None:
    """Reads ``FASTREE_STRICT_AUX`` and installs the aux_data hooks (``import fastree`` does)."""
    _core.set_strict_aux(os.environ.get("FASTREE_STRICT_AUX", "").strip() not in ("", "0"))
    _aux._install()
