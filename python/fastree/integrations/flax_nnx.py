"""flax.nnx Pytree and Module classes as native attribute nodes (tree mode).

flax.nnx (0.12) registers each ``Pytree`` subclass (``nnx.Module``, ``nnx.Optimizer``,
``nnx.Rngs``, ...) with JAX through three Python functions it defines once on ``Pytree``:
``_pytree__flatten`` and ``_pytree__flatten_with_paths`` read ``sorted(vars(self))`` and split
the attributes into data and static ones by the instance's ``_pytree__nodes`` mapping;
``_pytree__unflatten`` is ``object.__new__`` plus ``object.__setattr__`` per attribute. Every
``jax.tree_util`` call on a model (and ``nnx.jit(graph=False)``) runs them once per node.

Each ``Variable`` class is registered with module functions of ``flax.nnx.variablelib``: the
raw value as the one child (key ``GetAttrKey('value')``) and ``tuple(sorted(metadata.items()))``
as aux data, rebuilt by ``cls._new(value, dict(aux))``. ``nnx.State`` (a Mapping over its
``_mapping`` dict) is registered with ``statelib`` functions: the values of its sorted items as
children, the sorted keys as aux data, rebuilt by ``cls(zip(keys, children))`` (the items layout,
``csrc/attr/attr_items.h``). ``nnx.Optimizer`` has a ``__getattribute__`` of its own, which the
Pytree node reads through only where its code is a known release's (:func:`_optimizer_getattribute`).

When fastree is installed before flax registers its classes (``python -m fastree.run``,
``FASTREE_INSTALL=1``), :func:`native_node` recognises those functions and gives the class an
:class:`~fastree._core.AttrNode` with the mapping layout (``csrc/attr/attr_mapping.h``): the same
children, aux data and keys from C, checked against flax's own functions on the first instances
(``_checked``). flax's graph mode (``nnx.split``, ``nnx.merge``, ``nnx.jit``) is served by
:mod:`fastree.integrations.flax_nnx_graph`, attached from here once ``flax.nnx.graphlib`` has loaded.

Nothing here imports flax: the registration hook calls :func:`native_node` only once
``flax.nnx.variablelib`` is loaded.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

from .. import _core
from . import _checked, _known_flax, _library, _mirrored_code
from . import _flax_nnx_shared as _shared

_PYTREE_MODULE = _shared.PYTREE_MODULE
_VARIABLE_MODULE = _shared.VARIABLE_MODULE
_TYPING_MODULE = _shared.TYPING_MODULE
_TRACERS_MODULE = _shared.TRACERS_MODULE
# What tree mode reproduces: the nodes' code, and the one __getattribute__ they read through.
MIRRORED = _shared.MIRRORED + _shared.STATE_MIRRORED + (_shared.OPTIMIZER_GETATTRIBUTE,)
code_verdict = _shared.code_verdict
known_code = _shared.known_code


def _flax_functions() -> tuple[Any, Any, Any, Any] | None:
    """Pytree's three functions and flax's HashableMapping, or None if flax is not as known."""
    pytreelib = sys.modules.get(_PYTREE_MODULE)
    typing = sys.modules.get(_TYPING_MODULE)
    pytree = getattr(pytreelib, "Pytree", None)
    mapping = getattr(typing, "HashableMapping", None)
    if not isinstance(pytree, type) or not isinstance(mapping, type):
        return None
    namespace = vars(pytree)
    flatten = namespace.get("_pytree__flatten")
    flatten_with_paths = namespace.get("_pytree__flatten_with_paths")
    unflatten = namespace.get("_pytree__unflatten")
    if flatten is None or flatten_with_paths is None or not isinstance(unflatten, classmethod):
        return None
    return flatten, flatten_with_paths, unflatten.__func__, mapping


def _is_nnx_registration(cls: type, flatten_with_keys: Any, unflatten: Any, flatten: Any,
                         known: tuple[Any, Any, Any, Any]) -> bool:
    base_flatten, base_flatten_with_paths, base_unflatten, _ = known
    return (
        flatten is base_flatten
        and flatten_with_keys is base_flatten_with_paths
        and getattr(unflatten, "__func__", None) is base_unflatten
        and getattr(unflatten, "__self__", None) is cls
    )


def _variable_node(cls: type, flatten_with_keys: Any, unflatten: Any,
                   flatten: Any) -> Any | None:
    variablelib = sys.modules.get(_VARIABLE_MODULE)
    base_flatten = getattr(variablelib, "_variable_flatten", None)
    base_unflatten = getattr(variablelib, "_variable_unflatten", None)
    base_flatten_with_keys = getattr(variablelib, "_variable_flatten_with_keys", None)
    if base_flatten is None or flatten is not base_flatten:
        return None
    if flatten_with_keys is None:
        flatten_with_keys = base_flatten_with_keys
    if (
        flatten_with_keys is not base_flatten_with_keys
        or not isinstance(unflatten, functools.partial)
        or unflatten.func is not base_unflatten
        or unflatten.args != (cls,)
        or unflatten.keywords
    ):
        return None
    node = _core.AttrNode(
        cls,
        ("_raw_value",),
        ("_var_metadata",),
        meta_items=True,
        key_names=("value",),
        rebuild_with="_new",
        trace_classes=_native_new(cls),
    )
    # A rebuild runs flax's own Variable._new (as flax's unflatten does), which makes a new trace
    # state each time, from a new metadata dict: both compared by content, not identity.
    _checked.attach(node, flatten, flatten_with_keys, unflatten,
                    fresh=("_trace_state", "_var_metadata"))
    return node


def _native_new(cls: type) -> tuple[Any, Any, Any, Any] | None:
    # Variable._new made in C (a new TraceState, the metadata, the value: what _new sets, in its
    # order) for a class whose _new and TraceState are flax's own; None keeps flax's _new.
    variablelib = sys.modules.get(_VARIABLE_MODULE)
    tracers = sys.modules.get(_TRACERS_MODULE)
    variable = getattr(variablelib, "Variable", None)
    trace_state = getattr(tracers, "TraceState", None)
    if variable is None or trace_state is None:
        return None
    own = inspect.getattr_static(cls, "_new", None)
    if own is not inspect.getattr_static(variable, "_new", None) or not isinstance(own,
                                                                                   classmethod):
        return None
    if getattr(trace_state, "__slots__", None) != ["_jax_trace"]:
        return None
    return _shared.trace_classes(tracers)


def _pytree_state_node(cls: type, flatten_with_keys: Any, unflatten: Any,
                       flatten: Any) -> Any | None:
    # pytreelib.PytreeState, registered by flax with _flatten_pytree_state (no children, aux
    # (initializing, is_setup)) and _unflatten_pytree_state (PytreeState(initializing, setup):
    # a new TraceState first). Registered while pytreelib is still loading.
    pytreelib = sys.modules.get(_PYTREE_MODULE)
    tracers = sys.modules.get(_TRACERS_MODULE)
    if (
        pytreelib is None
        or tracers is None
        or cls is not getattr(pytreelib, "PytreeState", None)
        or flatten is not getattr(pytreelib, "_flatten_pytree_state", None)
        or unflatten is not getattr(pytreelib, "_unflatten_pytree_state", None)
        or flatten_with_keys is not None
        or getattr(cls, "__slots__", None) != ("_trace_state", "_initializing", "_is_setup")
        or not _shared.pytree_state_code
    ):
        return None
    node = _core.AttrNode(
        cls,
        (),
        ("_initializing", "_is_setup"),
        trace_classes=_shared.trace_classes(tracers),
        trace_field="_trace_state",
    )

    def flatten_with_keys_of_flax(state: Any) -> tuple[tuple[()], Any]:
        # What JAX derives for a registration without keys (no children: no keys).
        children, aux = flatten(state)
        return tuple(children), aux

    # A rebuild makes a new TraceState, as flax's __init__ does: compared by type, not identity.
    _checked.attach(node, flatten, flatten_with_keys_of_flax, unflatten,
                    fresh=("_trace_state",))
    return node


def _state_node(cls: type, flatten_with_keys: Any, unflatten: Any, flatten: Any) -> Any | None:
    # statelib.State and its subclasses, registered with _state_flatten_with_keys,
    # partial(_state_unflatten, cls) and (State itself) _state_flatten: the children are the
    # values of sorted(x._mapping.items()), the aux data the sorted keys, and a rebuild is
    # cls(zip(keys, children)), whose __init__ sets `_mapping = dict(...)` through object's
    # __setattr__. The items layout does that in C where the class's construction is exactly that.
    statelib = sys.modules.get(_shared.STATE_MODULE)
    state = getattr(statelib, "State", None)
    base_flatten = getattr(statelib, "_state_flatten", None)
    base_flatten_with_keys = getattr(statelib, "_state_flatten_with_keys", None)
    base_unflatten = getattr(statelib, "_state_unflatten", None)
    if (
        not isinstance(state, type)
        or not isinstance(cls, type)
        or not issubclass(cls, state)
        or base_flatten_with_keys is None
        or flatten_with_keys not in (base_flatten_with_keys, None)
        or flatten not in (base_flatten, None)
        or not isinstance(unflatten, functools.partial)
        or unflatten.func is not base_unflatten
        or unflatten.args != (cls,)
        or unflatten.keywords
        or not _constructed_as_state(cls, state)
        or not _shared.state_code
    ):
        return None
    node = _core.AttrNode(cls, (), items_field="_mapping")
    # Each rebuild makes a new `_mapping` dict: compared by its keys and value objects.
    _checked.attach(node, base_flatten, base_flatten_with_keys, unflatten, fresh=("_mapping",))
    return node


def _defining(cls: type, name: str) -> list[type]:
    # The classes on cls's MRO whose own namespace defines `name`, in lookup order (read from the
    # class dicts: no descriptor runs). The first is the one attribute lookup finds.
    return [base for base in cls.__mro__ if name in vars(base)]


def _constructed_as_state(cls: type, state: type) -> bool:
    # `cls(...)` runs State.__init__ alone: type's own call, object's __new__, State's __init__,
    # and no __setattr__ between State and object on the MRO for its super().__setattr__ to
    # reach.
    after = cls.__mro__[cls.__mro__.index(state) + 1:]
    return (
        type(cls).__call__ is type.__call__
        and vars(_defining(cls, "__new__")[0])["__new__"] is object.__new__
        and vars(_defining(cls, "__init__")[0])["__init__"] is vars(state).get("__init__")
        and all(base not in after or base is object for base in _defining(cls, "__setattr__"))
    )


def native_node(cls: type, flatten_with_keys: Any, unflatten: Any, flatten: Any) -> Any | None:
    """The checked :class:`~fastree._core.AttrNode` for an nnx registration, or None.

    None unless the functions are the ones flax defines on ``Pytree`` (no subclass overrides
    them) or for ``Variable`` classes, and the loaded flax is code fastree knows
    (:func:`code_verdict`).
    ``flatten_with_keys`` may be None (:func:`accelerate` on a JAX that keeps it in jaxlib
    only): the class's own is taken then.
    """
    pytree_state = _pytree_state_node(cls, flatten_with_keys, unflatten, flatten)
    if pytree_state is not None:
        return pytree_state
    state = _state_node(cls, flatten_with_keys, unflatten, flatten)
    if state is not None:
        return state
    if not _shared.variable_code:
        return None
    _attach_graph_mode()
    variable = _variable_node(cls, flatten_with_keys, unflatten, flatten)
    if variable is not None:
        return variable
    if not _shared.pytree_code:
        return None
    known = _flax_functions()
    if known is None:
        return None
    if flatten_with_keys is None:
        flatten_with_keys = getattr(cls, "_pytree__flatten_with_paths", None)
    if not _is_nnx_registration(cls, flatten_with_keys, unflatten, flatten, known):
        return None
    node = _core.AttrNode(
        cls,
        (),
        mapping=("_pytree__nodes", known[3], "_mapping", "_pytree__has_int_keys"),
        trusted_getattribute=_optimizer_getattribute(cls),
    )
    _checked.attach(node, flatten, flatten_with_keys, unflatten)
    return node


def _optimizer_getattribute(cls: type) -> Any:
    """nnx.Optimizer's own ``__getattribute__`` where ``cls`` reads attributes through it and
    it is the code of the release whose Pytree code is loaded; else None.

    That function refuses the name ``model`` (gone since flax 0.11) and passes every other name to
    ``super().__getattribute__``, so flax's ``vars(self)`` finds the ``__dict__`` object's lookup
    finds: the node may read it natively (the core also checks, at each read, that the class
    still finds this function, with this code). Only where nothing between it and ``object`` on
    the MRO defines another: its ``super()`` call would run that one.
    """
    owners = _defining(cls, "__getattribute__")
    if len(owners) != 2 or owners[1] is not object:
        return None
    owner = owners[0]
    item = _shared.OPTIMIZER_GETATTRIBUTE
    if owner.__module__ != item.module or owner.__qualname__ != item.qualname.partition(".")[0]:
        return None
    function = vars(owner)["__getattribute__"]
    verdict = _shared.pytree_code.verdict()
    known = _known_flax.KNOWN_CODE.get(verdict.release or "", {})
    if not verdict or known.get(item.name) != _mirrored_code.fingerprint(function):
        return None
    return function


def accelerate() -> list[type]:
    """Makes fastree's own functions read nnx classes registered before fastree was installed.

    As :func:`fastree.integrations.equinox.accelerate`: JAX keeps flax's functions for those
    classes; fastree's own functions (and the routed ``jax.tree_util`` ones) read them natively.
    """
    return _library.accelerate_with(native_node)


def _attach_graph_mode() -> None:
    # Graph mode (flax_nnx_graph) replaces flax's own functions, so only an install binds it:
    # fastree.install() when graphlib is loaded already, else here, at the first class flax
    # registers once graphlib has loaded (nnx.Module's, before flax.nnx re-exports graphlib's
    # functions). A registration through fastree's own functions, not installed, leaves flax be.
    from .. import _install

    if _install.is_installed():
        from . import flax_nnx_graph

        flax_nnx_graph.attach()
