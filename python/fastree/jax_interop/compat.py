"""Every JAX object fastree uses, and every access to JAX's internals, in this one module.

fastree calls JAX (to register types with it, to build JAX treedefs, to read its registry) and
:func:`fastree.install` replaces the functions of ``jax.tree_util`` and ``jax.tree`` by fastree's.
Were fastree to look JAX's functions up as module attributes at call time, an installed
``jax.tree_util.register_pytree_node`` would call itself. So the rest of fastree takes JAX's
objects from here, never from ``jax.tree_util`` / ``jax.tree``:

* :data:`tree_util`, :data:`tree`: the public names of ``jax.tree_util`` / ``jax.tree``, as JAX
  defines them. They are read from the modules that define them (``jax._src.tree_util`` and
  ``jax._src.tree``), which install never touches, so they are JAX's own objects even if fastree
  is imported (or reloaded) while another patch is in place.
* :data:`internal`: ``jax._src.tree_util`` itself (install never modifies that module).

Everything fastree reads from JAX beyond its public API is read here too, behind a small named
function or constant, so that a JAX release that changes one of them breaks this module and its
test (``tests/test_jax_compat.py``) and nothing else. Where JAX releases differ, each adapter says
which range it serves:

* JAX's Python-side registry dict (``jax._src.tree_util._registry``, every supported release):
  :func:`jax_registry`, :func:`jax_registry_entry`, :func:`jax_registered_types`;
* what ``jax.tree_util.register_dataclass`` keeps only in its flatten function's closure (every
  supported release): :func:`is_jax_register_dataclass_entry`, :func:`jax_dataclass_fields`;
* building a JAX treedef node by node: :func:`jax_treedef_from_node_data` (jaxlib 0.7 and later)
  or :func:`jax_treedef_from_state` over jaxlib's pickled node kinds :data:`JAXLIB_STATE_KINDS`
  (the only route before jaxlib 0.7); :data:`jaxlib_is_node` (jaxlib 0.7 and later);
* error texts that changed between releases, asked of the installed JAX once, at import:
  :data:`JAX_DICT_MISMATCH_SHOWS_DICT`, :data:`JAX_AUX_EQUALITY_NAMES_TYPE`,
  :data:`JAX_EXPLAINS_MAP_ERRORS`, :data:`JAX_MAP_ERRORS_PRINT_KEY_ENTRIES`;
* the leaves JAX warns about (jaxlib 0.10.1 and later), asked of it once, type by type:
  :data:`JAX_ITERABLE_LEAF_TYPES`, :data:`JAX_ITERABLE_LEAF_WARNING`;
* what a release changed without a text to ask about, by version number:
  :data:`JAX_DATACLASS_DEFAULTS_OMIT_DROP_FIELDS`, :data:`JAX_DROP_FIELDS_READ_AS_CHARACTERS`.

The supported range starts at :data:`MIN_JAX_VERSION` (``pyproject.toml`` declares the same
floor); README's version table says which combinations the suite runs on.

>>> import jax.tree_util
>>> from fastree.jax_interop import compat
>>> compat.tree_util.tree_map is jax.tree_util.tree_map  # as long as nothing is installed
True
"""

from __future__ import annotations

import collections
import functools
import importlib
import re
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.tree as _jax_tree
import jax.tree_util as _jax_tree_util
from jax._src import tree as _jax_src_tree
from jax._src import tree_util as internal

__all__ = [
    "JAX_DATACLASS_DEFAULTS_OMIT_DROP_FIELDS",
    "JAX_DATACLASS_REJECTS_OVERLAP",
    "JAX_DROP_FIELDS_READ_AS_CHARACTERS",
    "JAX_ITERABLE_LEAF_TYPES",
    "JAX_ITERABLE_LEAF_WARNING",
    "JAX_MAP_ERRORS_PRINT_KEY_ENTRIES",
    "JAX_VERSION",
    "MIN_JAX_VERSION",
    "JAXLIB_BUILDS_FROM_NODE_DATA",
    "JAXLIB_STATE_KINDS",
    "JAX_AUX_EQUALITY_NAMES_TYPE",
    "JAX_DICT_MISMATCH_SHOWS_DICT",
    "JAX_EXPLAINS_MAP_ERRORS",
    "PUBLIC_TREE_NAMES",
    "PUBLIC_TREE_UTIL_NAMES",
    "ARRAY_REF_TYPES",
    "NEVER_REF_ARRAY_TYPES",
    "Array",
    "ArrayImpl",
    "Tracer",
    "internal",
    "is_jax_register_dataclass_entry",
    "jax",
    "jax_dataclass_fields",
    "jax_dropped_names",
    "jax_registered_types",
    "jax_keypath_registry_entry",
    "jax_registry",
    "jax_registry_entry",
    "jax_treedef_from_node_data",
    "jax_treedef_from_state",
    "jaxlib_calls_namedtuple_like",
    "jaxlib_flatten_one_level_with_keys",
    "jaxlib_is_node",
    "keystr",
    "tree",
    "tree_util",
    "version_tuple",
]


# ------------------------------------------------------------------------------------------------
# The running JAX's version


def version_tuple(text: str) -> tuple[int, ...]:
    """A version string's leading numbers: a pre-release or local tail ends them.

    >>> version_tuple("0.12.0.1"), version_tuple("0.5.0rc1"), version_tuple("0.4.36.dev2")
    ((0, 12, 0, 1), (0, 5, 0), (0, 4, 36))
    """
    numbers = []
    for part in text.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() != len(part):
            break
    return tuple(numbers)


JAX_VERSION = version_tuple(jax.__version__)
"""The installed JAX's version as a tuple of ints: ``(0, 10, 2)``."""

MIN_JAX_VERSION = (0, 6, 2)
"""The oldest JAX fastree supports (pyproject.toml's ``jax>=``). Below it, jaxlib's registry lacks
what fastree follows JAX through (``flatten_one_level_with_keys`` for the key paths of JAX-only
registrations, ``flatten_with_path``'s path-taking predicate), and JAX lacks names the drop-in
promises (``is_leaf_takes_path``, ``keystr(simple=, separator=)``, ``jax.tree.map_with_path``);
on jax 0.4.36 the suite fails 1,020 tests. Importing fastree there raises ImportError at once."""

if JAX_VERSION < MIN_JAX_VERSION:
    _floor = ".".join(map(str, MIN_JAX_VERSION))
    raise ImportError(
        f"fastree needs jax >= {_floor}; the installed jax is {jax.__version__}. Upgrade it"
        f" (pip install -U 'jax>={_floor}') or use jax.tree_util directly."
    )

JAX_DATACLASS_DEFAULTS_OMIT_DROP_FIELDS = JAX_VERSION >= (0, 11, 1)
"""jax 0.11.1 and later leave ``drop_fields`` out of the data and meta fields that
``register_dataclass`` derives from a dataclass's fields; before, they stayed in (and the
registration failed its own check). No error text tells the two apart, so the version does."""

JAX_DATACLASS_REJECTS_OVERLAP = JAX_VERSION >= (0, 9, 0)
"""jax 0.9 and later reject ``register_dataclass`` data and meta fields that overlap
("data_fields and meta_fields must not overlap ..."); before, JAX registered them as given
(checked in the 0.8.2 and 0.9.0 wheels)."""

JAX_DROP_FIELDS_READ_AS_CHARACTERS = JAX_VERSION < (0, 10, 0)
"""Before jax 0.10, ``register_dataclass``'s field check removed ``drop_fields`` from the init
fields as ``init_fields.difference_update(*drop_fields)``: every character of every dropped name,
not the names (so ``drop_fields=("cache",)`` dropped nothing, and the check passed with ``cache``
still a data field)."""


def jax_dropped_names(drop_fields: Any) -> set[str]:
    """What the installed JAX's ``register_dataclass`` check takes out of the init fields.

    >>> names = sorted(jax_dropped_names(["ab"]))
    >>> names == (["a", "b"] if JAX_DROP_FIELDS_READ_AS_CHARACTERS else ["ab"])
    True
    """
    if JAX_DROP_FIELDS_READ_AS_CHARACTERS:
        return set().union(*drop_fields) if drop_fields else set()
    return set(drop_fields)


# ------------------------------------------------------------------------------------------------
# JAX's public objects


def _public_names(module: types.ModuleType) -> tuple[str, ...]:
    return tuple(sorted(n for n in vars(module) if not n.startswith("_") and n != "annotations"))


def _snapshot(
    public: types.ModuleType, defining: types.ModuleType, names: tuple[str, ...]
) -> types.SimpleNamespace:
    # The defining module first: it is the one place install never writes to. A name the public
    # module defines itself (none in the JAX versions tested) comes from the public module.
    missing = object()
    values = {}
    for name in names:
        value = getattr(defining, name, missing)
        values[name] = getattr(public, name) if value is missing else value
    return types.SimpleNamespace(**values)


PUBLIC_TREE_UTIL_NAMES = _public_names(_jax_tree_util)
"""The public names of ``jax.tree_util`` in the installed JAX."""

PUBLIC_TREE_NAMES = tuple(n for n in _public_names(_jax_tree) if n != "tree_util")
"""The public names of ``jax.tree`` in the installed JAX."""

tree_util = _snapshot(_jax_tree_util, internal, PUBLIC_TREE_UTIL_NAMES)
"""JAX's own ``jax.tree_util`` objects (a namespace; attribute access as on the module)."""

tree = _snapshot(_jax_tree, _jax_src_tree, PUBLIC_TREE_NAMES)
"""JAX's own ``jax.tree`` objects (a namespace; attribute access as on the module)."""

keystr = tree_util.keystr
"""JAX's own ``keystr`` (fastree's is the same function), for modules below ``tree_util``."""

# The module objects install writes to. Only fastree._install uses these.
public_tree_util_module = _jax_tree_util
public_tree_module = _jax_tree

# The classes the aux_data checks recognise (fastree.diagnostics.aux).
Array = jax.Array
Tracer = jax.core.Tracer


def _array_ref_types() -> tuple[type, ...]:
    # jax's mutable array refs (``jax.new_ref``; ``core.MutableArray`` before it was ``Ref``)
    # and their avals: the classes whose instances flax.nnx treats as array refs.
    core = importlib.import_module("jax._src.core")
    found = [getattr(core, name) for name in ("Ref", "MutableArray") if hasattr(core, name)]
    try:
        found.append(importlib.import_module("jax._src.state.types").AbstractRef)
    except (ImportError, AttributeError):
        pass
    return tuple(cls for cls in found if isinstance(cls, type))


ARRAY_REF_TYPES = _array_ref_types()
"""Classes whose instances may be array refs (for fastree.integrations.flax_nnx_graph)."""

ArrayImpl = importlib.import_module("jax._src.array").ArrayImpl
"""jax's concrete array class: a jax.Array that is never a ref."""


def _never_ref_array_types() -> tuple[type, ...]:
    # jax.Array classes whose instances are never refs: the concrete array, and typed PRNG key
    # arrays (``jax.random.key``; their aval is a ShapedArray of a key dtype).
    found = [ArrayImpl]
    for module in ("jax._src.random.prng", "jax._src.prng"):  # moved in jax 0.9
        try:
            key_array = getattr(importlib.import_module(module), "PRNGKeyArray", None)
        except ImportError:
            continue
        if isinstance(key_array, type):
            found.append(key_array)
            break
    return tuple(found)


def opaque_trace_context() -> tuple[Any, str] | None:
    """Where C code reads jax's current trace, ``(holder, attribute)``, when
    ``get_opaque_trace_state()`` is ``OpaqueTraceState(trace_ctx.trace._weakref)`` (so the C
    code can read the current trace's weakref directly: csrc/attr/nnx_shared.h), checked
    on a call; else None.

    ``trace_ctx.trace`` is a Python property over the config state ``trace_state_strong_ref``;
    where it is exactly that (jax 0.5 and later, checked here by its code), the holder is that
    state, read with no Python frame, else ``trace_ctx`` itself."""
    core = importlib.import_module("jax._src.core")
    trace_ctx = getattr(core, "trace_ctx", None)
    opaque_cls = getattr(core, "OpaqueTraceState", None)
    public = getattr(importlib.import_module("jax.extend.core"), "get_opaque_trace_state", None)
    if trace_ctx is None or opaque_cls is None or public is not core.get_opaque_trace_state:
        return None
    try:
        made = public()
        trace = trace_ctx.trace
        expected = {"_trace_ref": trace._weakref}
    except Exception:  # noqa: BLE001 - another jax: the C code asks jax's function instead
        return None
    if type(made) is not opaque_cls or vars(made) != expected:
        return None
    prop = getattr(type(trace_ctx), "trace", None)
    strong_ref = getattr(core, "trace_state_strong_ref", None)
    code = getattr(getattr(prop, "fget", None), "__code__", None)
    if (isinstance(prop, property) and strong_ref is not None and code is not None
            and code.co_names == ("trace_state_strong_ref", "value")
            and getattr(strong_ref, "value", None) is trace):
        return (strong_ref, "value")
    return (trace_ctx, "trace")


NEVER_REF_ARRAY_TYPES = _never_ref_array_types()
"""jax.Array classes that are never array refs (for fastree.integrations.flax_nnx_graph)."""


# ------------------------------------------------------------------------------------------------
# JAX's Python-side registry: {type: _RegistryEntry(to_iter, from_iter)} (every supported JAX)


def jax_registry() -> dict[type, Any]:
    """The live dict in which JAX keeps every type registered through ``jax.tree_util``.

    The core reads it directly (a type registered with JAX alone is adopted on first use), so
    it is this very dict, not a copy. JAX only ever adds to it.

    >>> jax_registry()[list].to_iter([1, 2])
    ([1, 2], None)
    """
    return internal._registry


def jax_registry_entry(tp: type) -> Any:
    """JAX's registry entry for ``tp`` (``.to_iter``, ``.from_iter``), or None.

    >>> jax_registry_entry(int) is None, jax_registry_entry(tuple) is not None
    (True, True)
    """
    return internal._registry.get(tp)


def jax_keypath_registry_entry(tp: type) -> Any:
    """JAX's with-keys registry entry for ``tp`` (``.flatten_with_keys``), or None.

    >>> jax_keypath_registry_entry(int) is None
    True
    """
    return getattr(internal, "_registry_with_keypaths", {}).get(tp)


def jax_registered_types() -> list[type]:
    """Every type in JAX's registry (a snapshot: registrations may run concurrently).

    >>> dict in jax_registered_types()
    True
    """
    return list(internal._registry)


# register_dataclass keeps its data fields only in the closure of the flatten function it puts
# into the registry, a free variable `data_fields` of `register_dataclass.<locals>.flatten_func`
# (before jax 0.12) or of `_register_dataclass.<locals>.flatten_func` (jax 0.12, where the public
# function calls a private one).
_DATACLASS_FLATTEN_QUALNAMES = (
    "register_dataclass.<locals>.flatten_func",
    "_register_dataclass.<locals>.flatten_func",
)
_DATACLASS_FIELDS_CELL = "data_fields"


def is_jax_register_dataclass_entry(entry: Any) -> bool:
    """Whether a registry entry was made by ``jax.tree_util.register_dataclass``.

    >>> import dataclasses, jax
    >>> @jax.tree_util.register_dataclass
    ... @dataclasses.dataclass
    ... class Cell:
    ...     x: int
    >>> is_jax_register_dataclass_entry(jax_registry_entry(Cell))
    True
    >>> is_jax_register_dataclass_entry(jax_registry_entry(tuple))
    False
    """
    to_iter = getattr(entry, "to_iter", None)
    return (
        getattr(to_iter, "__qualname__", None) in _DATACLASS_FLATTEN_QUALNAMES
        and getattr(to_iter, "__module__", None) == internal.__name__
    )


def jax_dataclass_fields(tp: type) -> tuple[str, ...] | None:
    """The data (child) fields of a type registered with ``jax.tree_util.register_dataclass``.

    None if ``tp`` is not such a type, or if the installed JAX keeps its fields elsewhere. What
    is found in the closure is checked (a tuple of str) before it is believed.

    >>> import dataclasses, jax
    >>> @jax.tree_util.register_dataclass
    ... @dataclasses.dataclass
    ... class Cell:
    ...     x: int
    ...     y: int
    >>> jax_dataclass_fields(Cell), jax_dataclass_fields(dict)
    (('x', 'y'), None)
    """
    entry = jax_registry_entry(tp)
    if entry is None or not is_jax_register_dataclass_entry(entry):
        return None
    fn = entry.to_iter
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None)
    if code is None or closure is None or _DATACLASS_FIELDS_CELL not in code.co_freevars:
        return None
    fields = closure[code.co_freevars.index(_DATACLASS_FIELDS_CELL)].cell_contents
    if isinstance(fields, tuple) and all(isinstance(f, str) for f in fields):
        return fields
    return None


# ------------------------------------------------------------------------------------------------
# Building JAX treedefs node by node, per jaxlib version range

JAXLIB_BUILDS_FROM_NODE_DATA = hasattr(tree_util.PyTreeDef, "from_node_data_and_children")
"""jaxlib 0.7 added ``PyTreeDef.from_node_data_and_children``; the newest jax for Python 3.10
(0.6.2) lacks it, and :func:`jax_treedef_from_state` is then the only route."""

jaxlib_is_node: Callable[[type], bool] | None = getattr(tree_util.default_registry, "is_node", None)
"""jaxlib's ``default_registry.is_node`` (jaxlib 0.7 and later), else None."""


def jaxlib_calls_namedtuple_like(tp: type) -> bool:
    """Whether jaxlib's ``is_node`` says yes to ``tp`` without any registration: a tuple
    subclass whose class has a ``_fields`` attribute (jaxlib 0.7 and later; asked of an empty
    registry of jaxlib's own).

    >>> import collections
    >>> Point = collections.namedtuple("Point", "x")
    >>> jaxlib_calls_namedtuple_like(Point) or jaxlib_is_node is None
    True
    >>> jaxlib_calls_namedtuple_like(list)
    False
    """
    if not (isinstance(tp, type) and issubclass(tp, tuple)) or tp is tuple:
        return False
    empty_is_node = getattr(_empty_jaxlib_registry(), "is_node", None)
    return empty_is_node is not None and bool(empty_is_node(tp))


@functools.cache
def _empty_jaxlib_registry() -> Any:
    return type(tree_util.default_registry)()


jaxlib_flatten_one_level_with_keys: Callable[[Any], Any] | None = getattr(
    tree_util.default_registry, "flatten_one_level_with_keys", None
)
"""jaxlib's ``default_registry.flatten_one_level_with_keys`` (jaxlib 0.5 and later), else None:
the key paths of a type registered only with JAX come from it where it exists."""


def jax_treedef_from_node_data(node_data: Any, children: list[Any]) -> Any:
    """jaxlib 0.7 and later: the JAX treedef of one node over JAX treedef ``children``.

    ``node_data`` is ``(type, data)`` as ``PyTreeDef.node_data()`` reports it, or None for a
    leaf. No user code runs (custom types are looked up in JAX's registry).

    >>> leaf = tree_util.tree_structure(0)
    >>> if JAXLIB_BUILDS_FROM_NODE_DATA:
    ...     print(jax_treedef_from_node_data((tuple, None), [leaf, leaf]))
    ... else:  # jaxlib 0.6: the state route (jax_treedef_from_state) is the one in use
    ...     print("PyTreeDef((*, *))")
    PyTreeDef((*, *))
    """
    if node_data is None:
        return tree_util.tree_structure(0)
    return tree_util.PyTreeDef.from_node_data_and_children(
        tree_util.default_registry, node_data, children
    )


JAXLIB_STATE_KINDS = types.SimpleNamespace(
    LEAF=0, NONE=1, TUPLE=2, NAMEDTUPLE=3, LIST=4, DICT=5, CUSTOM=6, DATACLASS=7
)
"""The node kinds of jaxlib's pickled ``PyTreeDef`` state (jaxlib's ``PyTreeKind`` numbers)."""


def jax_treedef_from_state(nodes: list[tuple[Any, ...]]) -> Any:
    """Before jaxlib 0.7 (and still accepted after): a JAX treedef from jaxlib's pickled state.

    ``nodes`` are jaxlib's post-order entries ``(kind, arity, node_data, custom_type,
    num_leaves, num_nodes)`` with ``kind`` from :data:`JAXLIB_STATE_KINDS`. jaxlib looks each
    custom type up in its registry as unpickling does: no user code runs.

    >>> K = JAXLIB_STATE_KINDS
    >>> jax_treedef_from_state([(K.LEAF, 0, None, None, 1, 1), (K.LIST, 1, None, None, 1, 2)])
    PyTreeDef([*])
    """
    converted = tree_util.PyTreeDef.__new__(tree_util.PyTreeDef)
    converted.__setstate__((tree_util.default_registry, nodes))
    return converted


# ------------------------------------------------------------------------------------------------
# Texts that changed between JAX releases, asked of the installed JAX once (see also
# csrc/registry/jax_texts.h, which the core is handed the first two through _core.set_jax_texts)


def _jax_error_text(call: Callable[[], Any]) -> str:
    # A probe asks JAX a question whose answer is an error text; a JAX that answers with another
    # exception (jax 0.4.36-0.6.1 let a raising aux-data comparison escape as it is) simply has
    # not got the text asked about.
    try:
        call()
    except Exception as error:  # noqa: BLE001 - any other exception: the text is absent
        return str(error) if isinstance(error, ValueError) else ""
    return ""


class _Incomparable:
    """A callable whose comparison raises: Partial aux data for probing JAX's error text."""

    def __call__(self) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        raise TypeError("incomparable")

    __ne__ = __eq__
    __hash__ = object.__hash__


JAX_DICT_MISMATCH_SHOWS_DICT = "; dict: " in _jax_error_text(
    lambda: tree_util.tree_structure({"a": 1}).flatten_up_to({"b": 1})
)
"""Before jax 0.7, flatten_up_to's dict-key mismatch printed the dict; later ones list keys."""

JAX_AUX_EQUALITY_NAMES_TYPE = "pytree node of type" in _jax_error_text(
    lambda: (
        tree_util.tree_structure(tree_util.Partial(_Incomparable()))
        == tree_util.tree_structure(tree_util.Partial(_Incomparable()))
    )
)
"""jax 0.12 and later name the node type when comparing aux data raises."""


def _jax_rejects_a_dict_grown_mid_walk() -> bool:
    # jaxlib up to 0.10 records a dict's size after walking its values: a callback that added a
    # key meanwhile leaves a treedef with more arity than children, which JAX then rejects
    # (RuntimeError "Too few elements ..."). Later jaxlib keeps the keys it sorted and builds the
    # structure of the dict as the walk reached it. Asked of the installed JAX once.
    d: dict[str, Any] = {"a": 1}

    def is_leaf(x: Any) -> bool:
        if x == 1 and "b" not in d:
            d["b"] = 2
        return False

    try:
        str(tree_util.tree_structure(d, is_leaf=is_leaf))
    except RuntimeError:
        return True
    return False


JAX_REJECTS_A_DICT_GROWN_MID_WALK = _jax_rejects_a_dict_grown_mid_walk()
"""Whether JAX raises (RuntimeError) for a dict a callback grew while a treedef-building walk was
in it; otherwise JAX gives the structure of the dict as the walk reached it."""

JAX_EXPLAINS_MAP_ERRORS = _jax_error_text(
    lambda: tree_util.tree_map(lambda *_: None, (1,), (1, 2))
).startswith("pytree structure error")
"""jax 0.7 and later explain a tree_map structure mismatch by key path
(fastree.jax_interop.map_errors)."""

JAX_MAP_ERRORS_PRINT_KEY_ENTRIES = "['b']" in _jax_error_text(
    lambda: tree_util.tree_map(lambda *_: None, {"a": 1}, {"a": 1, "b": 2})
)
"""jax 0.11 and later list the child keys of a "different numbers of pytree children" error as
key entries (``['a'] ['b']``, ``.f0``); before, by the entry's ``key`` (``a b``)."""


# ------------------------------------------------------------------------------------------------
# Leaves JAX warns about (jaxlib 0.10.1 and later: "Python iterable type 'dict_values' is treated
# as a leaf in PyTree..."), asked of the installed JAX once per candidate type


def _iterable_leaf_candidates() -> list[Any]:
    # One object of each iterable type jaxlib has been seen to warn about, and of their near
    # relatives it has not (reversed lists, ranges, strings, views other than values): each is
    # asked about, so a release that changes its list is followed without a change here.
    mapping = {0: 0}

    def generator() -> Any:
        yield 0

    return [
        iter([]), iter(()), iter(set()), iter(mapping), iter(mapping.values()),
        iter(mapping.items()), mapping.values(), mapping.keys(), mapping.items(), generator(),
        zip(), map(int, ()), filter(None, ()), enumerate(()), reversed(()), reversed([]),
        reversed(mapping), iter(range(0)), iter(""), iter(b""), range(0), set(), frozenset(),
        collections.OrderedDict().values(), iter(collections.OrderedDict()),
    ]  # fmt: skip


def _iterable_leaf_warnings() -> tuple[tuple[type, ...], str]:
    warned: list[type] = []
    text = ""
    for candidate in _iterable_leaf_candidates():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tree_util.tree_leaves([candidate])
        for warning in caught:
            message = str(warning.message)
            if issubclass(warning.category, DeprecationWarning) and "treated as a leaf" in message:
                kind = type(candidate)
                if kind not in warned:
                    warned.append(kind)
                text = message.replace(f"'{kind.__name__}'", "'{}'", 1)
    return tuple(warned), text


JAX_ITERABLE_LEAF_TYPES, JAX_ITERABLE_LEAF_WARNING = _iterable_leaf_warnings()
"""The leaf types a flatten of the installed JAX warns about (instances of their subclasses too),
empty before jaxlib 0.10.1; and its warning text with ``{}`` for the type's name."""
