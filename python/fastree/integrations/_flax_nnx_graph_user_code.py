"""Whether a flax graph walk would run a user's own functions, found without running them.

A first-walk check (:mod:`fastree.integrations.flax_nnx_graph`) runs flax's function beside the
native walk and compares the two. For the nodes flax and fastree read themselves that costs a
second read nobody can see. A node whose impl calls functions a user registered
(``graphlib.register_graph_node_type``, ``graphlib.register_pytree_node_type``, a jax pytree
registered with Python functions) would see each of its calls twice: a flatten that counts, a
``create_empty`` that allocates or registers. So the checks ask here first, and a call whose
check would run such a function again is flax's alone, as it would be without fastree.

A function is library code when it is C code or Python code of flax, jax, optax, equinox, chex or
fastree: calling it again changes nothing a program can see. Anything else is the user's.
Nothing here calls a user's function: the walks below stop at a node that would.

>>> def flatten(box):
...     return (box.items,), None
>>> flatten.__module__ = "my_project.nodes"
>>> _library_function(len), _library_function(flatten)
(True, False)
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import gc
import operator
import sys
import types
from typing import Any

from ..jax_interop import compat as _jax_compat
from ._flax_nnx_graph_kinds import (
    CALLS_ITS_OWN,
    DICT,
    LIST,
    NNX_PYTREE,
    TUPLE,
    UNSERVED,
    VARIABLE,
)

_LIBRARY_PACKAGES = frozenset({"flax", "jax", "jaxlib", "optax", "equinox", "chex", "fastree"})
_C_FUNCTIONS = (types.BuiltinFunctionType, types.BuiltinMethodType, types.WrapperDescriptorType,
                types.MethodWrapperType, types.MethodDescriptorType)


def _library_function(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        if any(not _library_function(arg) for arg in fn.args if callable(arg)):
            return False
        fn = fn.func
    fn = getattr(fn, "__func__", fn)  # a bound method or classmethod: its function
    if isinstance(fn, _C_FUNCTIONS):
        return True
    module = fn.__module__ if isinstance(fn, types.FunctionType) else type(fn).__module__
    return isinstance(module, str) and module.partition(".")[0] in _LIBRARY_PACKAGES


def library_class(cls: type) -> bool:
    """Whether ``cls`` is a builtin, numpy's, or a class of the libraries above.

    >>> import numpy as np
    >>> Mine = type("Mine", (), {"__module__": "my_project.models"})
    >>> library_class(dict), library_class(np.ndarray), library_class(Mine)
    (True, True, False)
    """
    module = getattr(cls, "__module__", None)
    if not isinstance(module, str):
        return False
    top = module.partition(".")[0]
    return top in _LIBRARY_PACKAGES or top in ("builtins", "numpy")


# The hooks every attribute read or write of an instance goes through, where a class defines them.
_ATTRIBUTE_HOOKS = ("__getattribute__", "__getattr__", "__setattr__", "__delattr__")


def attribute_hooks_run_user_code(cls: type) -> bool:
    """Whether reading or writing an attribute of a ``cls`` instance runs a user's function: a
    ``__getattribute__``, ``__getattr__``, ``__setattr__`` or ``__delattr__`` of the user's
    anywhere in its MRO. flax's graph walks read a Pytree's attributes (``vars(node)``,
    ``node._pytree__nodes``) and set them through these hooks; a walk that does so natively
    calls them as often as flax does only when they are library code.

    >>> class Plain: pass
    >>> class Logged:
    ...     def __getattribute__(self, name):
    ...         return object.__getattribute__(self, name)
    >>> Logged.__getattribute__.__module__ = "my_project.models"
    >>> attribute_hooks_run_user_code(Plain), attribute_hooks_run_user_code(Logged)
    (False, True)
    """
    for name in _ATTRIBUTE_HOOKS:
        for klass in cls.__mro__:
            hook = vars(klass).get(name)
            if hook is not None:
                if not _library_function(hook):
                    return True
                break  # the one lookup finds
    return False


def _key_runs_user_code(key: Any) -> bool:
    # A dict key whose hash, == or < is a user's (a key of a user's class, or a tuple holding
    # one): flax's dict handling runs them, a native walk a different number of times.
    if type(key) is tuple:
        return any(_key_runs_user_code(item) for item in key)
    return not library_class(type(key))


def _value_runs_user_code(value: Any) -> bool:
    # A Variable's metadata value whose == is a user's: flax's update compares a Variable's
    # metadata with the state's (`!=`, item by item), and so does a check of it, on copies.
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) in (tuple, list, frozenset, set):
            stack.extend(item)
        elif type(item) is dict:
            stack.extend(item)
            stack.extend(item.values())
        elif not library_class(type(item)):
            return True
    return False


def metadata_runs_user_code(variable: Any) -> bool:
    """Whether comparing ``variable``'s metadata (a plain Variable's ``_var_metadata`` dict) with
    another's could run a user's ``==``: a value of a user's class in it."""
    metadata = object.__getattribute__(variable, "_var_metadata")
    return type(metadata) is not dict or _value_runs_user_code(metadata)


def gc_callbacks_run_user_code() -> bool:
    """Whether ``gc.callbacks`` holds a function of the user's.

    A collection runs where an allocation finds it due, and its callbacks with it. A native
    walk allocates elsewhere than flax's Python walk, so a callback would run at other points
    of the walk than under flax alone (one that edits the graph it walks sees it half-read by
    flax and raises there, or not at all here). While a user's callback is registered the
    graph walks are flax's own. jax's own callback (registered on import) is library code.
    Answered from the last list seen while ``gc.callbacks`` holds the same functions.
    """
    global _gc_seen
    callbacks = gc.callbacks
    seen, answer = _gc_seen
    if len(callbacks) == len(seen) and all(map(operator.is_, callbacks, seen)):
        return answer
    seen = tuple(callbacks)
    answer = not all(_library_function(callback) for callback in seen)
    _gc_seen = (seen, answer)
    return answer


# The last callbacks seen and the answer for them, one tuple rebound whole: a thread reads a
# pair another thread wrote, never one's list with another's answer.
_gc_seen: tuple[tuple[Any, ...], bool] = ((), False)


def user_gc_callbacks() -> list[str]:
    """The names of the user's functions in ``gc.callbacks`` (what turns the graph walks to
    flax's own while they are registered: :func:`gc_callbacks_run_user_code`)."""
    return [getattr(callback, "__qualname__", None) or repr(callback)
            for callback in list(gc.callbacks) if not _library_function(callback)]


def impl_runs_user_code(impl: Any) -> bool:
    """Whether a flax node impl (a dataclass of the node type's functions) holds a user's one."""
    if not dataclasses.is_dataclass(impl):
        return True
    return any(
        callable(value) and not isinstance(value, type) and not _library_function(value)
        for value in (getattr(impl, field.name, None) for field in dataclasses.fields(impl))
    )


def jax_node_runs_user_code(cls: type) -> bool:
    """Whether jax flattens or rebuilds ``cls`` with a user's function (its registration)."""
    entry = _jax_compat.jax_registry_entry(cls)
    if entry is None:
        return False  # not registered through Python: jaxlib's own kinds
    return not all(_library_function(getattr(entry, name, None) or len)
                   for name in ("to_iter", "from_iter"))


def _treedef_runs_user_code(treedef: Any) -> bool:
    stack = [treedef]
    while stack:
        node = stack.pop()
        data = node.node_data()
        if data is not None and isinstance(data[0], type) and jax_node_runs_user_code(data[0]):
            return True
        stack.extend(node.children())
    return False


def _or_true_on_error(scan: Any) -> Any:
    # A scan that fails (a library flatten raising on a half-built object) cannot say "no": the
    # caller then runs no second walk, which is always safe.
    @functools.wraps(scan)
    def guarded(graph: Any, target: Any) -> bool:
        try:
            return scan(graph, target)
        except Exception:  # noqa: BLE001 - see above; KeyboardInterrupt and kin pass
            return True

    return guarded


def flatten_runs_user_code(graph: Any, impl: Any, node: Any) -> bool:
    """Whether ``impl.flatten(node)`` (a flax node impl's) runs a user's function: the impl
    holds one, or it is flax's generic pytree impl over a jax pytree registered with one."""
    if impl_runs_user_code(impl):
        return True
    generic_impl = getattr(graph.graphlib, "PYTREE_NODE_IMPL", None)
    return impl is generic_impl and jax_node_runs_user_code(type(node))


@_or_true_on_error
def in_graphdef(graph: Any, graphdef: Any) -> bool:
    """Whether rebuilding ``graphdef`` (flax's unflatten) runs a user's function: a node type
    whose impl holds one, or a jax pytree (a ``GenericPytree`` node) whose treedef does. True
    also when that cannot be told."""
    generic = getattr(graph.graphlib, "GenericPytree", None)
    for record in graphdef.nodes:
        cls = getattr(record, "type", None)
        if cls is None:
            continue
        if cls is generic:
            treedef = getattr(getattr(record, "metadata", None), "treedef", None)
            if treedef is not None and _treedef_runs_user_code(treedef):
                return True
            continue
        kind, impl, _ = graph.node_kind_of(cls)
        if kind in CALLS_ITS_OWN and impl is not None and impl_runs_user_code(impl):
            return True
        if kind == UNSERVED and not library_class(cls):
            return True  # a user's class left to flax (a Variable with its own accessors)
    return any(_key_runs_user_code(key) for key, _ in getattr(graphdef, "attributes", ()))


@_or_true_on_error
def in_graph(graph: Any, root: Any) -> bool:
    """Whether flax's walk of the live graph under ``root`` (its flatten, its update) runs a
    user's function. Reads what flax's walk reads up to such a node, through library code only;
    each object once (a graph may share and cycle). True also when that cannot be told."""
    graphlib = graph.graphlib
    generic_impl = getattr(graphlib, "PYTREE_NODE_IMPL", None)
    seen: dict[int, Any] = {}  # id -> the object, held so that no id is reused meanwhile
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        kind, impl, _ = graph.kind_of(type(obj))
        if kind == NNX_PYTREE:
            # Its own __dict__, as flax's _graph_node_flatten reads it (vars()), without the
            # class's attribute hooks.
            stack.extend(object.__getattribute__(obj, "__dict__").values())
        elif kind in (LIST, TUPLE):
            stack.extend(obj)
        elif kind == DICT:
            if any(_key_runs_user_code(key) for key in obj):
                return True
            stack.extend(obj.values())
        elif kind == VARIABLE:
            if metadata_runs_user_code(obj):
                return True
        elif kind == UNSERVED and not library_class(type(obj)):
            # A user's class the native walks leave to flax (a Variable with its own accessors,
            # a Pytree with its own attribute hooks): flax's walk calls its methods.
            return True
        elif kind in CALLS_ITS_OWN and impl is not None:
            if flatten_runs_user_code(graph, impl, obj):
                return True
            if impl is generic_impl:
                children, _ = _jax_compat.tree_util.tree_flatten(
                    obj, is_leaf=lambda x, node=obj: x is not node)
                stack.extend(children)
            else:
                items, _ = impl.flatten(obj)  # library code (checked above)
                stack.extend(value for _, value in items)
    return False



@_or_true_on_error
def in_state(graph: Any, state: Any) -> bool:
    """Whether an update or merge from ``state`` (nested States and dicts of Variables, or a
    FlatState's or list's leaves) compares a metadata value with a user's ``==``
    (:func:`metadata_runs_user_code`), holds a key of a user's class, or a mapping of a user's
    class. True also when that cannot be told."""
    state_type = sys.modules["flax.nnx.statelib"].State
    flat_state = getattr(graph.graphlib, "FlatState", None)
    stack = [state]
    while stack:
        obj = stack.pop()
        if type(obj) is state_type:
            obj = object.__getattribute__(obj, "_mapping")
        if type(obj) is flat_state:
            stack.extend(obj.leaves)  # (unflatten's state: its paths are strs and ints)
        elif type(obj) in (list, tuple):
            stack.extend(obj)
        elif type(obj) is dict:
            if any(_key_runs_user_code(key) for key in obj):
                return True
            stack.extend(obj.values())
        elif graph.kind_of(type(obj))[0] == VARIABLE:
            if metadata_runs_user_code(obj):
                return True
        elif isinstance(obj, collections.abc.Mapping) and not library_class(type(obj)):
            return True  # a user's mapping: walking it runs its methods
    return False
