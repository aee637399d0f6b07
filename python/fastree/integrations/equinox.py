"""equinox Modules as native attribute nodes.

equinox (0.13) registers each Module class with generated Python functions
(``equinox/_module/_flatten.py``): children are the dynamic fields read with
``obj.__dict__.get(name, MISSING)``; the aux data is a tuple whose first item is ``MISSING`` when
``__dict__`` holds exactly the fields and otherwise the tuple of the five attributes
``functools.wraps`` copies (``WRAPPER_FIELD_NAMES``), followed by the static fields' values; the
rebuild is ``object.__new__`` plus ``object.__setattr__``, skipping ``MISSING``. That is exactly
an :class:`~fastree._core.AttrNode` with ``missing=MISSING`` and
``extra_fields=WRAPPER_FIELD_NAMES``, so each class gets one, checked against equinox's own
functions on its first instances (:mod:`fastree.integrations._checked`).

Converters and ``__post_init__`` run in ``__init__``, which neither equinox's unflatten nor the
node calls. Code of an equinox release not in ``_known_equinox.KNOWN_CODE`` (:data:`MIRRORED`), or functions that are not
equinox's generated ones, leave the registration to equinox.

Nothing here imports equinox: the registration hook calls :func:`native_node` only for a class
being registered while ``equinox._module._flatten`` is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

from .. import _core
from . import _checked, _known_equinox, _library, _mirrored_code

_FLATTEN_MODULE = "equinox._module._flatten"
# What the node reproduces: the generator of each Module's functions, its code templates, and
# Module's own __getattribute__ (trusted to leave __dict__ as object's lookup gives it). Served
# only where every one is code of a release in _known_equinox.KNOWN_CODE.
MIRRORED: tuple[_mirrored_code.Mirrored, ...] = tuple(
    _mirrored_code.Mirrored(module, name) for module, names in (
        (_FLATTEN_MODULE, ("generate_flatten_functions", "_make_tuple_type", "_Missing",
                           "WRAPPER_FIELD_NAMES", "_GETTER", "_FLAT_WRAPPERS", "_FLAT_CODE",
                           "_SET_WRAPPERS", "_SET_DYNAMIC", "_SET_STATIC", "_UNFLAT_FUNC")),
        ("equinox._module._module", ("Module.__getattribute__",)),
    ) for name in names
)
_code = _mirrored_code.Gate("equinox", MIRRORED, _known_equinox.KNOWN_CODE)


def code_verdict() -> _mirrored_code.Verdict:
    """Whether the loaded equinox is code whose Module layout fastree reproduces, and which
    release's."""
    return _code.verdict()


def known_code() -> bool:
    """Whether the loaded equinox is code whose Module layout fastree reproduces."""
    return bool(_code)


def _generated(fn: Any, prefix: str, cls: type) -> bool:
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename == f"<{prefix}_{cls.__qualname__}>"


def _is_equinox_registration(cls: type, flatten_with_keys: Any, unflatten: Any,
                             flatten: Any) -> bool:
    return (
        _generated(flatten, "generated_flatten", cls)
        and _generated(flatten_with_keys, "generated_flatten_with_keys", cls)
        and isinstance(unflatten, functools.partial)
        and unflatten.args == (cls,)
        and not unflatten.keywords
        and _generated(unflatten.func, "generated_unflatten", cls)
    )


def _module_getattribute(cls: type) -> Any:
    """equinox.Module's own ``__getattribute__`` (None where the release defines none)."""
    for base in cls.__mro__:
        if base.__module__ == "equinox._module._module" and base.__qualname__ == "Module":
            return vars(base).get("__getattribute__")
    return None


def native_node(cls: type, flatten_with_keys: Any, unflatten: Any,
                flatten: Any) -> Any | None:
    """The checked :class:`~fastree._core.AttrNode` for an equinox registration, or None.

    None unless the functions are the ones equinox generated for ``cls`` and the installed
    loaded equinox is code fastree knows (:func:`code_verdict`). ``flatten_with_keys`` may be None (:func:`accelerate` on a JAX
    that keeps it in jaxlib only): equinox generates it again.
    """
    layout = sys.modules.get(_FLATTEN_MODULE)
    if layout is None or not known_code():
        return None
    if flatten_with_keys is None and dataclasses.is_dataclass(cls):
        # A class JAX holds without its with-keys function where Python can read it (jax 0.10+
        # keeps that one in jaxlib only): equinox generates the same function again.
        generate = getattr(layout, "generate_flatten_functions", None)
        if generate is None:
            return None
        flatten_with_keys = generate(cls, dataclasses.fields(cls))[1]
    if not _is_equinox_registration(cls, flatten_with_keys, unflatten, flatten):
        return None
    missing = getattr(layout, "MISSING", None)
    wrapper_fields = getattr(layout, "WRAPPER_FIELD_NAMES", None)
    if missing is None or not isinstance(wrapper_fields, tuple):
        return None
    if not dataclasses.is_dataclass(cls):
        return None
    fields = dataclasses.fields(cls)
    if any(f.name in wrapper_fields for f in fields):
        return None  # a field named like a wrapper attribute (`__name__`): equinox's own rules
    dynamic = tuple(f.name for f in fields if not f.metadata.get("static", False))
    static = tuple(f.name for f in fields if f.metadata.get("static", False))
    # equinox.Module's own __getattribute__ (wrapping bound methods) leaves __dict__ and the
    # fields as object's lookup gives them: instances under it still read natively.
    node = _core.AttrNode(
        cls,
        dynamic,
        static,
        missing=missing,
        extra_fields=wrapper_fields,
        trusted_getattribute=_module_getattribute(cls),
    )
    _checked.attach(node, flatten, flatten_with_keys, unflatten)
    return node


def accelerate() -> list[type]:
    """Makes fastree's own functions read equinox classes registered before fastree was installed.

    Classes equinox registered while fastree was installed (``python -m fastree.run``,
    ``FASTREE_INSTALL=1``, or ``fastree.install()`` before ``import equinox``) are native nodes
    in JAX and fastree alike. Those registered earlier stay equinox's in JAX, which refuses a
    second registration; this makes them native for fastree's functions only
    (``fastree.tree_util``, and the ``jax.tree_util`` functions that install routes to fastree).
    Returns the classes it changed.
    """
    return _library.accelerate_with(native_node)
