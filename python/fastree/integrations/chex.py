"""chex dataclasses as native attribute nodes.

chex (0.1.90 to 0.1.92, ``chex/_src/dataclass.py``) registers each ``@chex.dataclass`` class with Python
functions: children are the values of the instance ``__dict__`` sorted by name, the aux data is
the tuple of those names, and the rebuild is ``cls.__new__(cls)`` plus ``object.__setattr__`` for
each dataclass field present (in field order), then ``__post_init__()`` if the class has one.

For an instance whose ``__dict__`` holds exactly the dataclass's fields (what ``__init__``
makes), that is an :class:`~fastree._core.AttrNode` with the sorted field names as data fields and
as aux data (``names_as_aux``), the field order as ``rebuild_order``, and ``post_init``. Instances
holding anything else (an attribute added after ``__init__``, a field deleted) are answered by
chex's own functions, instance by instance (``delegate_irregular``); their aux data still names
their children, so such nodes key and rebuild as chex's do. Each class is checked against chex's
functions on its first instances (:mod:`fastree.integrations._checked`); the rebuild is compared
only for classes without ``__post_init__``, whose side effects a check must not repeat.

A class with its own ``__new__``, code of a chex release not in ``_known_chex.KNOWN_CODE``, or functions that
are not chex's stay with chex. Nothing here imports chex.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

from .. import _core
from . import _checked, _known_chex, _library, _mirrored_code

_DATACLASS_MODULE = "chex._src.dataclass"
# What the node reproduces: chex's registration (its flatten closure) and the two module
# functions it registers. Served only where each is code of a release in _known_chex.KNOWN_CODE.
MIRRORED: tuple[_mirrored_code.Mirrored, ...] = tuple(
    _mirrored_code.Mirrored(_DATACLASS_MODULE, name)
    for name in ("register_dataclass_type_with_jax_tree_util", "_dataclass_unflatten",
                 "_flatten_with_path")
)
_code = _mirrored_code.Gate("chex", MIRRORED, _known_chex.KNOWN_CODE)
_FLATTEN_QUALNAME = "register_dataclass_type_with_jax_tree_util.<locals>.flatten"


def code_verdict() -> _mirrored_code.Verdict:
    """Whether the loaded chex is code whose dataclass layout fastree reproduces, and which
    release's."""
    return _code.verdict()


def known_code() -> bool:
    """Whether the loaded chex is code whose dataclass layout fastree reproduces."""
    return bool(_code)


def _is_chex_registration(module: Any, cls: type, flatten_with_keys: Any, unflatten: Any,
                          flatten: Any) -> bool:
    return (
        flatten_with_keys is getattr(module, "_flatten_with_path", None)
        and isinstance(unflatten, functools.partial)
        and unflatten.func is getattr(module, "_dataclass_unflatten", None)
        and unflatten.args == (cls,)
        and not unflatten.keywords
        and getattr(flatten, "__qualname__", None) == _FLATTEN_QUALNAME
        and getattr(flatten, "__module__", None) == _DATACLASS_MODULE
    )


def native_node(cls: type, flatten_with_keys: Any, unflatten: Any,
                flatten: Any) -> Any | None:
    """The checked :class:`~fastree._core.AttrNode` for a chex registration, or None."""
    module = sys.modules.get(_DATACLASS_MODULE)
    if module is None or not known_code():
        return None
    if flatten_with_keys is None:  # (accelerate, where JAX keeps it in jaxlib only)
        flatten_with_keys = getattr(module, "_flatten_with_path", None)
    if not _is_chex_registration(module, cls, flatten_with_keys, unflatten, flatten):
        return None
    if not dataclasses.is_dataclass(cls) or cls.__new__ is not object.__new__:
        return None
    # What __init__ leaves in __dict__: the real fields (not ClassVar / InitVar pseudo-fields).
    in_order = [f.name for f in dataclasses.fields(cls)]
    node = _core.AttrNode(
        cls,
        sorted(in_order),
        names_as_aux=True,
        rebuild_order=[name for name in cls.__dataclass_fields__ if name in in_order],
        post_init=True,
    )
    # A rebuild calls __post_init__: the check does not rebuild such classes (the user would see
    # their __post_init__ run twice more).
    _checked.attach(node, flatten, flatten_with_keys, unflatten, delegate_irregular=True,
                    check_rebuild=not callable(getattr(cls, "__post_init__", None)))
    return node


def accelerate() -> list[type]:
    """Makes fastree's own functions read chex classes registered before fastree was installed.

    As :func:`fastree.integrations.equinox.accelerate`: JAX keeps chex's functions for them.
    """
    return _library.accelerate_with(native_node)
