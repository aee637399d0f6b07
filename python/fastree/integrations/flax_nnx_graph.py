"""flax.nnx graph mode served natively: ``graphlib.flatten`` (and with it ``nnx.split``,
``nnx.state``, ``nnx.graphdef`` and the flatten inside ``nnx.jit`` and the other nnx transforms).

flax walks a module graph in Python (``flax/nnx/graphlib.py``, ``_graph_flatten``). Once fastree
is installed and flax.nnx is loaded (the first nnx class registration reaches
:func:`fastree.integrations.flax_nnx.native_node`, which calls :func:`attach`), ``graphlib.flatten``
becomes :func:`flatten` below: the same walk in C (``csrc/nnx/nnx_graph_flatten.cpp``), making the same
``GraphDef`` (``NodeDef``/``VariableDef``/``NodeRef``/``Static`` objects, in the same order), the
same leaves and paths, and the same reference-map entries.

Exact, or not used:

- Only flax code fastree was written against is served: every function and class in
  :data:`MIRRORED` (and tree mode's) must be that of a release in ``_known_flax.KNOWN_CODE``, and
  none may be replaced later (:func:`_code_replaced`); the record classes must have the fields
  the C walk sets.
- Per type, :func:`_kind` decides what the C walk may do (``csrc/nnx/nnx_graph.h``, ``Kind``). A
  tracer, an array ref, a hijax Variable, a Variable or Pytree class with its own accessors, a
  key that is not an exact str: flax's own function runs, for the whole call.
- The first walk that meets a type is also run by flax's function, and the two results are
  compared (the same objects, the same records, the same map entries). On a difference, those
  types are left to flax from then on, flax's result is returned, and the reason is kept for
  :func:`status`.

Nothing here imports flax: :func:`attach` finds it in ``sys.modules``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import sys
import threading
import weakref
from typing import Any

from .. import _core
from ..jax_interop import compat as _jax_compat
from . import _flax_nnx_graph_compare as _compare
from . import _flax_nnx_graph_kinds as _kinds
from . import _flax_nnx_graph_replay as _replay
from . import _flax_nnx_graph_user_code as _user_code
from . import _flax_nnx_shared, _known_flax, _mirrored_code
from ._flax_nnx_graph_kinds import (
    ARRAY_LEAF,
    CALLS_ITS_OWN,
    DICT,
    GENERIC_PYTREE,
    GRAPH_NODE,
    LEAF,
    LIST,
    NNX_PYTREE,
    NONE,
    PYTREE_NODE,
    PYTREE_STATE,
    TUPLE,
    UNSERVED,
    VARIABLE,
    TypeTable,
)

_GRAPHLIB = "flax.nnx.graphlib"
# What the graph walks reproduce (csrc/nnx_graph_*.cpp; docs/porting-library-integrations.md
# says which C++ function mirrors which): served only where every one is code of a release in
# _known_flax.KNOWN_CODE, and only while none of them is replaced (checked at each call).
MIRRORED: tuple[_mirrored_code.Mirrored, ...] = tuple(
    _mirrored_code.Mirrored(module, name) for module, names in (
        (_GRAPHLIB, ("flatten", "_graph_flatten", "unflatten", "_graph_unflatten",
                     "_graph_update_dynamic", "_merge_to_flat_state", "get_node_impl",
                     "get_node_impl_for_type", "_flatten_pytree", "_unflatten_pytree",
                     "_get_sorted_leaves", "is_node", "NodeDef", "VariableDef", "NodeRef",
                     "Static", "GraphDef", "IndexMap", "PythonRefMap", "GraphNodeImpl",
                     "PytreeNodeImpl", "GenericPytree", "NodeAttr", "LeafAttr", "DataElem",
                     "StaticElem", "IndexesPytreeDef")),
        ("flax.nnx.pytreelib", ("Pytree._graph_node_flatten", "Pytree._graph_node_create_empty",
                                "Pytree._graph_node_clear", "Pytree._graph_node_init",
                                "PytreeState", "_flatten_pytree_state",
                                "_unflatten_pytree_state")),
        ("flax.nnx.variablelib", ("Variable.get_raw_value", "Variable.get_metadata",
                                  "Variable.var_type", "Variable.__setattr__",
                                  "Variable.from_metadata", "Variable.update_from_state",
                                  "Variable.set_raw_value", "Variable._check_can_update")),
        ("flax.nnx.statelib", ("FlatState", "State.__init__")),
    ) for name in names
)
# The mirrored functions attach() replaces by its own: identity checks skip them.
_REPLACED = frozenset(f"{_GRAPHLIB}:{name}" for name in
                      ("flatten", "unflatten", "_graph_update_dynamic", "_merge_to_flat_state"))
# The fields the C walk sets on each record, in the order their dataclass __init__ sets them.
_RECORD_FIELDS = {
    "NodeDef": ("type", "index", "outer_index", "num_attributes", "metadata"),
    "VariableDef": ("type", "index", "outer_index", "metadata", "array_refdef"),
    "NodeRef": ("index",),
    "Static": ("value",),
    "GraphDef": ("nodes", "attributes", "num_leaves"),
}
_CALLS_ITS_OWN = CALLS_ITS_OWN

_lock = threading.Lock()
# Whether this thread is inside a native update: a subtree the walk hands to flax's function comes
# back to graphlib._graph_update_dynamic (flax's recursion), which must stay flax's from there on
# (each native entry is C stack).
_updating = threading.local()


class _CheckTables:
    """One set of kind tables and first-walk checks.

    ``kinds``: the table of the types flatten and update meet (and unflatten's leaves);
    ``node_kinds``: that of the NodeDef/VariableDef types unflatten meets, as
    get_node_impl_for_type finds their impl. ``pending``/``pending_nodes``: types met by no walk
    that was compared with flax's yet; ``verified``/``verified_nodes``: those that were. The
    graph keeps its own (``_Graph``); merges into the caller's objects keep another
    (``_Graph.outer``): a type verified by a merge into new objects is still pending there until
    a merge into existing ones met it and was compared with flax's
    (``_checked_outer_unflatten``).
    """

    def __init__(self, graph: _Graph) -> None:
        # The graph whose classification and fallbacks these tables use (itself, for its own).
        self.graph = graph
        # No table here keeps a type alive (TypeTable, weak sets): flax lets a class go once
        # nothing uses it. The pending lists hold the types of the walk under way only.
        self.kinds: TypeTable = TypeTable()
        self.node_kinds: TypeTable = TypeTable()
        self.pending: list[type] = []
        self.verified: weakref.WeakSet[type] = weakref.WeakSet()
        self.pending_nodes: list[type] = []
        self.verified_nodes: weakref.WeakSet[type] = weakref.WeakSet()

    def classify(self, cls: type) -> tuple[int, Any, Any]:
        return self._record(cls, self.graph._kind, self.kinds, self.verified, self.pending)

    def classify_node_type(self, cls: type) -> tuple[int, Any, Any]:
        return self._record(cls, self.graph._node_kind, self.node_kinds, self.verified_nodes,
                            self.pending_nodes)

    def _record(self, cls: type, kind_of: Any, table: dict[type, Any], verified: set[type],
                pending: list[type]) -> tuple[int, Any, Any]:
        # `cls`'s entry (unserved once it is left to flax), stored in `table`; pending until a
        # compared walk has met it, unless flax's own function runs for it anyway.
        entry = (UNSERVED, None, None) if cls in self.graph.fallbacks else kind_of(cls)
        table[cls] = entry
        if entry[0] not in _CALLS_ITS_OWN and cls not in verified:
            pending.append(cls)
        return entry

    def forget_pending(self) -> None:
        # A walk that was not served checks nothing: the types it met are classified again
        # (and so pending again) by the next walk that meets them.
        for cls in self.pending:
            self.kinds.pop(cls, None)
        for cls in self.pending_nodes:
            self.node_kinds.pop(cls, None)
        self.pending, self.pending_nodes = [], []


class _Graph(_CheckTables):
    """What the attached walk holds: flax's objects, the per-type tables, the checks."""

    def __init__(self, graphlib: Any) -> None:
        super().__init__(self)
        variablelib = sys.modules["flax.nnx.variablelib"]
        pytreelib = sys.modules["flax.nnx.pytreelib"]
        typing = sys.modules["flax.typing"]
        tracers = sys.modules["flax.nnx.tracers"]
        self.graphlib = graphlib
        self.flax_flatten = graphlib.flatten
        # flatten's recursion, as the code gate fingerprinted it: the replay runs this one's
        # code (_flax_nnx_graph_replay), never what graphlib holds later.
        self.flax_graph_flatten = graphlib._graph_flatten
        self.flax_unflatten = graphlib.unflatten
        self.flax_update = graphlib._graph_update_dynamic
        self.flax_merge_leaves = graphlib._merge_to_flat_state
        self.variable = variablelib.Variable
        self.hijax_variable = getattr(variablelib, "HijaxVariable", None)
        pytree_namespace = vars(pytreelib.Pytree)
        self.pytree_graph_flatten = pytree_namespace["_graph_node_flatten"]
        create_empty = pytree_namespace["_graph_node_create_empty"]
        self.pytree_graph_rebuild = (
            getattr(create_empty, "__func__", create_empty),
            pytree_namespace["_graph_node_clear"],
            pytree_namespace["_graph_node_init"],
        )
        self.pytree_state = pytreelib.PytreeState
        self.pytree_state_flatten = getattr(pytreelib, "_flatten_pytree_state", None)
        self.builtins = {
            cls: (graphlib.PYTREE_REGISTRY[cls], kind)
            for cls, kind in ((list, LIST), (tuple, TUPLE), (type(None), NONE), (dict, DICT))
        }
        self.generation: tuple[int, int, int] = (-1, -1, -1)
        # Native flatten/unflatten calls under way (nested ones included): _walk_in_progress.
        self.walking = 0
        # Types left to flax after a difference: type -> reason.
        self.fallbacks: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()
        # (initializing, is_setup) -> the IndexesPytreeDef flax made for a PytreeState with them.
        self.state_treedefs: dict[tuple[Any, Any], Any] = {}
        self.context = _context(_core.NNX_GRAPH_CONTEXT, {
            "kinds": self.kinds,
            "classify": self.classify,
            "NodeDef": graphlib.NodeDef,
            "VariableDef": graphlib.VariableDef,
            "NodeRef": graphlib.NodeRef,
            "Static": graphlib.Static,
            "HashableMapping": typing.HashableMapping,
            "NODE_ATTR": graphlib.NODE_ATTR,
            "LEAF_ATTR": graphlib.LEAF_ATTR,
            "DataElem": graphlib.DataElem,
            "StaticElem": graphlib.StaticElem,
            "IndexesPytreeDef": graphlib.IndexesPytreeDef,
            "state_treedefs": self.state_treedefs,
        })
        # What a new tracers.TraceState() is made of (csrc/attr/nnx_shared.h, TraceStates).
        self.trace_classes = _flax_nnx_shared.trace_classes(tracers)
        # id(treedef) -> (treedef, aux) for the treedefs of lone PytreeStates (learn_state_aux).
        self.state_auxes: dict[int, tuple[Any, Any]] = {}
        self.pytree_state_unflatten = getattr(pytreelib, "_unflatten_pytree_state", None)
        unflatten_items = {
            "NodeDef": graphlib.NodeDef,
            "VariableDef": graphlib.VariableDef,
            "NodeRef": graphlib.NodeRef,
            "Static": graphlib.Static,
            "NodeAttr": graphlib.NodeAttr,
            "LeafAttr": graphlib.LeafAttr,
            "HashableMapping": typing.HashableMapping,
            "IndexesPytreeDef": graphlib.IndexesPytreeDef,
            "state_auxes": self.state_auxes,
            "learn_state_aux": self.learn_state_aux,
            "PytreeState": pytreelib.PytreeState,
            "trace_classes": self.trace_classes,
            "Variable": self.variable,
            "State": sys.modules["flax.nnx.statelib"].State,
            "update_dynamic": self.flax_update,
            "Mapping": collections.abc.Mapping,
        }
        self.unflatten_context = _context(_core.NNX_GRAPH_UNFLATTEN_CONTEXT, {
            **unflatten_items,
            "leaf_kinds": self.kinds,
            "classify_leaf": self.classify,
            "node_kinds": self.node_kinds,
            "classify_node_type": self.classify_node_type,
        })
        # A merge into the caller's objects (an outer index map: the end of nnx.jit and of every
        # transform) walks with tables of its own, so that its first walks over each type are
        # compared with flax's too (_checked_outer_unflatten).
        self.outer = _CheckTables(self)
        self.outer_unflatten_context = _context(_core.NNX_GRAPH_UNFLATTEN_CONTEXT, {
            **unflatten_items,
            "leaf_kinds": self.outer.kinds,
            "classify_leaf": self.outer.classify,
            "node_kinds": self.outer.node_kinds,
            "classify_node_type": self.outer.classify_node_type,
        })
        self.merge_checked = False
        # flax functions left to flax after a difference: name -> reason ("code": a mirrored
        # function replaced after attach, for every function).
        self.function_fallbacks: dict[str, str] = {}
        # Set by attach(): whether a mirrored flax object was replaced since (_code_replaced).
        self.watch: _mirrored_code.Watch = _mirrored_code.Watch(())
        # Set by attach(): graphlib's name -> (flax's function, this graph's walk), which
        # attach binds and detach takes back.
        self.replacements: dict[str, tuple[Any, Any]] = {}
        # Root node types whose first update was compared with flax's; and how many checks of a
        # root type's update could not decide (_checked_update).
        self.verified_updates: weakref.WeakSet[type] = weakref.WeakSet()
        self.undecided_updates: weakref.WeakKeyDictionary[type, int] = (
            weakref.WeakKeyDictionary())
        # Root node types whose updates are flax's after undecided checks: type -> reason. Their
        # own table: an update that could not be judged says nothing of a split or merge.
        self.update_fallbacks: weakref.WeakKeyDictionary[type, str] = (
            weakref.WeakKeyDictionary())
        # The size of the kind tables at which the entries of types that died are dropped.
        self.prune_at = 256
        self.index_map = graphlib.IndexMap
        self.unserved_types = self._unserved_types() + tuple(
            getattr(graphlib, name) for name in ("NoUpdate", "Repeated", "ArrayRefOutput")
            if isinstance(getattr(graphlib, name, None), type)
        )

    @staticmethod
    def _unserved_types() -> tuple[type, ...]:
        # Types whose instances may be array refs, or Variables only by their aval.
        return (_jax_compat.Tracer, *_jax_compat.ARRAY_REF_TYPES)

    def refresh(self) -> None:
        # A type registered since the table was made is a node now: start the table again.
        graphlib = self.graphlib
        generation = (len(graphlib.GRAPH_REGISTRY), len(graphlib.PYTREE_REGISTRY),
                      len(graphlib.JAX_PYTREE_REGISTRY))
        tables = (self.kinds, self.node_kinds, self.outer.kinds, self.outer.node_kinds)
        if generation != self.generation:
            for table in tables:
                table.clear()
            self.generation = generation
        elif sum(len(table) for table in tables) >= self.prune_at:
            # Between walks (the C walks count entries during one): classes made and dropped
            # one after another leave entries of dead types, dropped here in amortised O(1).
            for table in tables:
                table.prune()
            self.prune_at = max(256, 2 * sum(len(table) for table in tables))

    def fall_back(self, classes: list[type], why: str) -> None:
        """Leaves ``classes``, the types a walk that differed from flax's met unchecked, to flax
        from now on, in every table.

        Where a user's classes are among them, those alone are blamed for the difference: the
        builtins, numpy's, jax's and flax's own types met beside them (a process's first walk
        meets list, dict, jax's array and flax's Variables) leave the tables unverified, so the
        next walk that meets them checks them again, and they go to flax only after a difference
        met among library types alone. Otherwise one odd class of a user's would leave every
        later walk to flax. Every walk in between is still checked: its result is flax's
        wherever the two differ.
        """
        blamed = [cls for cls in classes if not _user_code.library_class(cls)] or classes
        for cls in classes:
            if cls in blamed:
                self.fallbacks[cls] = why
            for table in (self.kinds, self.node_kinds, self.outer.kinds, self.outer.node_kinds):
                table.pop(cls, None)

    def learn_state_aux(self, treedef: Any) -> Any:
        # The (initializing, is_setup) aux data of a treedef that is one PytreeState node with no
        # children (what _flatten_pytree makes for one), or None; kept by the treedef's id.
        states = self.state_auxes
        node_data = getattr(treedef, "node_data", None)
        if node_data is None or not self._pytree_state_registered_plainly():
            return None
        if getattr(treedef, "num_nodes", None) != 1 or getattr(treedef, "num_leaves", None) != 0:
            return None
        data = node_data()
        if type(data) is not tuple or len(data) != 2 or data[0] is not self.pytree_state:
            return None
        aux = data[1]
        if type(aux) is not tuple or len(aux) != 2:
            return None
        if len(states) >= 4096:
            states.clear()
        states[id(treedef)] = (treedef, aux)
        return aux

    def _node_kind(self, cls: type) -> tuple[int, Any, Any]:
        # graphlib.get_node_impl_for_type's order: GenericPytree, PYTREE_REGISTRY, GRAPH_REGISTRY;
        # a VariableDef's type is a Variable class.
        graphlib = self.graphlib
        unserved = (UNSERVED, None, None)
        if cls is graphlib.GenericPytree:
            impl = graphlib.PYTREE_NODE_IMPL
            plain = impl.unflatten is graphlib._unflatten_pytree
            return (GENERIC_PYTREE if plain else PYTREE_NODE, impl, cls)
        impl = graphlib.PYTREE_REGISTRY.get(cls)
        if impl is not None:
            builtin = self.builtins.get(cls)
            if builtin is not None and builtin[0] is impl:
                return (builtin[1], impl, cls)
            return (PYTREE_NODE, impl, cls)
        impl = graphlib.GRAPH_REGISTRY.get(cls)
        if impl is not None:
            if type(impl) is not graphlib.GraphNodeImpl:
                return (PYTREE_NODE, impl, cls)
            rebuild = (impl.create_empty, impl.clear, impl.init)
            if all(ours is theirs for ours, theirs in zip(rebuild, self.pytree_graph_rebuild)):
                if _user_code.attribute_hooks_run_user_code(cls):
                    return unserved  # see _kind
                return (NNX_PYTREE, impl, cls)
            return (GRAPH_NODE, impl, cls)
        if isinstance(cls, type) and issubclass(cls, self.variable):
            if self.hijax_variable is not None and issubclass(cls, self.hijax_variable):
                return unserved
            return (VARIABLE, None, cls) if self._plain_variable(cls) else unserved
        return unserved

    def node_kind_of(self, cls: type) -> tuple[int, Any, Any]:
        """The unflatten table's entry of ``cls``, without recording it."""
        entry = self.node_kinds.get(cls)
        return entry if entry is not None else self._node_kind(cls)

    def kind_of(self, cls: type) -> tuple[int, Any, Any]:
        """The table entry of ``cls`` (its kind, impl, type), without recording it."""
        entry = self.kinds.get(cls)
        return entry if entry is not None else self._kind(cls)

    def _kind(self, cls: type) -> tuple[int, Any, Any]:
        graphlib = self.graphlib
        unserved = (UNSERVED, None, None)
        if issubclass(cls, self.unserved_types):
            return unserved
        if self.hijax_variable is not None and issubclass(cls, self.hijax_variable):
            return unserved
        if issubclass(cls, self.variable):
            return (VARIABLE, None, cls) if self._plain_variable(cls) else unserved
        impl = graphlib.GRAPH_REGISTRY.get(cls)
        if impl is not None:
            if type(impl) is not graphlib.GraphNodeImpl:
                return (PYTREE_NODE, impl, impl.type)
            if impl.flatten is self.pytree_graph_flatten:
                if _user_code.attribute_hooks_run_user_code(cls):
                    # A Pytree whose attribute reads or writes run a user's hook: flax's walks
                    # call it per read, which a native walk would not match call for call.
                    return unserved
                return (NNX_PYTREE, impl, impl.type)
            return (GRAPH_NODE, impl, impl.type)
        impl = graphlib.PYTREE_REGISTRY.get(cls)
        if impl is not None:
            builtin = self.builtins.get(cls)
            if builtin is not None and builtin[0] is impl:
                return (builtin[1], impl, impl.type)
            return (PYTREE_NODE, impl, impl.type)
        if cls in graphlib.JAX_PYTREE_REGISTRY or issubclass(cls, tuple):
            impl = graphlib.PYTREE_NODE_IMPL
            if cls is self.pytree_state and self._plain_pytree_state(impl):
                return (PYTREE_STATE, impl, impl.type)
            return (PYTREE_NODE, impl, impl.type)
        import numpy as np

        if issubclass(cls, np.ndarray) or cls in _jax_compat.NEVER_REF_ARRAY_TYPES:
            return (ARRAY_LEAF, None, None)
        if issubclass(cls, _jax_compat.Array):
            return unserved  # jax's own array is no ref; another jax.Array kind might be one
        return (LEAF, None, None)

    def _pytree_state_registered_plainly(self) -> bool:
        # JAX's registration of PytreeState is flax's own functions, or the native node that
        # stands in for them (integrations/flax_nnx.py, _pytree_state_node): the same output.
        entry = _jax_compat.jax_registry_entry(self.pytree_state)
        if entry is None:
            return False
        if (entry.to_iter is self.pytree_state_flatten
                and entry.from_iter is self.pytree_state_unflatten):
            return True
        node = _core.attribute_node(self.pytree_state)
        return (
            node is not None
            and getattr(entry.to_iter, "__self__", None) is node
            and getattr(entry.to_iter, "__name__", None) == "flatten"
            and getattr(entry.from_iter, "__self__", None) is node
            and getattr(entry.from_iter, "__name__", None) == "unflatten"
        )

    def _plain_pytree_state(self, impl: Any) -> bool:
        # flax's generic impl over a plain registration of PytreeState.
        return (
            impl.flatten is self.graphlib._flatten_pytree
            and self._pytree_state_registered_plainly()
            and inspect.getattr_static(self.pytree_state, "initializing", None)
            is vars(self.pytree_state).get("initializing")
        )

    def _plain_variable(self, cls: type) -> bool:
        # The accessors flax's walk calls are Variable's own, and the state is in its slots.
        base = self.variable
        return type(cls) is type(base) and all(
            inspect.getattr_static(cls, name, None) is inspect.getattr_static(base, name, None)
            for name in ("var_type", "get_raw_value", "get_metadata", "_raw_value",
                         "_var_metadata", "_trace_state", "__getattribute__", "__setattr__",
                         "from_metadata", "_new", "update_from_state", "set_raw_value",
                         "_check_can_update")
        )


def _context(names: tuple[str, ...], items: dict[str, Any]) -> tuple[Any, ...]:
    # The tuple a C walk reads by position, built in the order the C code declares
    # (_core.NNX_GRAPH_CONTEXT, ...): an item the C code names and this side does not give, or
    # the reverse, stops attach() here rather than misleading a walk.
    if set(names) != set(items):
        raise RuntimeError(f"fastree's nnx graph context differs from its C walks': "
                           f"{sorted(set(names) ^ set(items))}")
    return tuple(items[name] for name in names)


_graph: _Graph | None = None
_verdict: _mirrored_code.Verdict | None = None
_NOT_BOUND = "flax: not attached (fastree is not installed, or flax.nnx is not loaded)"
_bound = False  # whether graphlib's names are _graph's walks now (attach, until detach)


def _records_known(graphlib: Any) -> bool:
    for name, fields in _RECORD_FIELDS.items():
        cls = getattr(graphlib, name, None)
        if not dataclasses.is_dataclass(cls):
            return False
        if tuple(field.name for field in dataclasses.fields(cls)) != fields:
            return False
        if "__post_init__" in vars(cls):
            return False
    return True


def attach() -> bool:
    """Serves graphlib's walks natively, once flax.nnx.graphlib is loaded. Idempotent.

    Called while fastree is installed only (``fastree.install()``, and flax's first registration
    under an install): using fastree's own functions leaves flax's as they are. False (and flax's
    functions kept) where the loaded flax is not code fastree knows (:data:`MIRRORED`,
    :func:`code_verdict`), graphlib is not loaded yet, or its records differ from those the C walk
    makes.
    """
    global _graph, _verdict, _bound
    graphlib = sys.modules.get(_GRAPHLIB)
    if _bound or graphlib is None:
        return _bound
    if not _flax_nnx_shared.known_code():
        return False
    with _lock:
        if _bound:
            return True
        if _graph is not None:
            # Attached before and detached by an uninstall: the same walks (and their tables)
            # are bound again.
            _rebind(_graph.replacements, to_ours=True)
            _bound = True
            return True
        if _verdict is None:
            _verdict = _mirrored_code.recognise("flax", MIRRORED, _known_flax.KNOWN_CODE)
        if not _verdict:
            return False
        kinds_differ = _kinds.kinds_differ()
        if kinds_differ is not None:
            _verdict = _mirrored_code.Verdict(None, f"fastree: {kinds_differ}")
            return False
        if not _records_known(graphlib) or graphlib.RefMap is not graphlib.PythonRefMap:
            _verdict = _mirrored_code.Verdict(None, "flax: graphlib's records or RefMap are "
                                              "not the ones the C walk makes")
            return False
        if not all(cls in graphlib.PYTREE_REGISTRY for cls in (list, tuple, dict, type(None))):
            _verdict = _mirrored_code.Verdict(None, "flax: list, tuple, dict or None is not in "
                                              "graphlib.PYTREE_REGISTRY")
            return False
        graph = _Graph(graphlib)
        graph.watch = _verdict.watch(_REPLACED)
        graph.replacements = {"flatten": (graph.flax_flatten, _make_flatten(graph)),
                              "unflatten": (graph.flax_unflatten, _make_unflatten(graph)),
                              "_graph_update_dynamic": (graph.flax_update, _make_update(graph)),
                              "_merge_to_flat_state": (graph.flax_merge_leaves,
                                                       _make_merge_leaves(graph))}
        _rebind(graph.replacements, to_ours=True)
        _graph = graph
        _bound = True
    return True


def detach() -> None:
    """Gives flax its own graph walks back (fastree's uninstall). Idempotent.

    A name someone rebound after :func:`attach` keeps their object. A walk under way finishes
    with the walks it started with; a later :func:`attach` binds the same walks again.
    """
    global _bound
    with _lock:
        if _bound and _graph is not None:
            _rebind(_graph.replacements, to_ours=False)
        _bound = False


def _rebind(replacements: dict[str, tuple[Any, Any]], *, to_ours: bool) -> None:
    # nnx re-exports the functions (flax.nnx.flatten, flax.nnx.graph, compat): each name bound to
    # the other side's function is rebound; graphlib's own callers read the module globals.
    for module_name in (_GRAPHLIB, "flax.nnx", "flax.nnx.graph", "flax.nnx.compat"):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, (theirs, ours) in replacements.items():
            now, then = (ours, theirs) if to_ours else (theirs, ours)
            if getattr(module, name, None) is then:
                setattr(module, name, now)


def code_verdict() -> _mirrored_code.Verdict:
    """Whether graph mode is served: the release whose code the loaded flax has, or why not."""
    if _verdict is not None:
        return _verdict
    tree = _flax_nnx_shared.code_verdict()
    if not tree:
        return tree
    return _mirrored_code.Verdict(None, _NOT_BOUND)


def _walk_in_progress(graph: _Graph) -> bool:
    # Types met and not yet checked belong to the walk that met them: a walk started while one is
    # under way (a split from a pytree's flatten, a GC callback, another thread) would otherwise
    # take them and check them against its own graph, and the first walk's result would go
    # unchecked. Such a walk is flax's function's; the first walk checks its own types.
    return graph.walking > 0 and bool(graph.pending or graph.pending_nodes)


def _walk_done(graph: _Graph) -> None:
    # The last native walk under way has ended: whatever it met and did not check (it raised,
    # or handed the call to flax) is classified again, and so checked, by the next walk.
    graph.walking -= 1
    if graph.walking == 0:
        # The outer tables' too: a merge into the caller's objects that was not served (a type
        # left to flax) would otherwise leave its types pending, and every later such merge
        # would run the check again.
        for checks in (graph, graph.outer):
            if checks.pending or checks.pending_nodes:
                checks.forget_pending()


def _served_now(graph: _Graph) -> bool:
    # Whether this call may be native: the mirrored code is as attach found it, and no user's
    # GC callback could run at other points of a native walk than of flax's
    # (_user_code.gc_callbacks_run_user_code).
    return not _code_replaced(graph) and not _user_code.gc_callbacks_run_user_code()


def _code_replaced(graph: _Graph) -> bool:
    # A mirrored flax function or class replaced since attach (a user's patch, a debugger):
    # flax's own functions from then on, for good, and status() says which.
    if "code" in graph.function_fallbacks:
        return True
    name = graph.watch.replaced()
    if name is None:
        return False
    graph.function_fallbacks["code"] = f"{name} was replaced after fastree attached"
    return True


def fallback_reason(cls: type) -> str | None:
    """Why flax's graph walks run with flax's own functions for ``cls``, or None."""
    graph = _graph
    return None if graph is None else graph.fallbacks.get(cls)


def status() -> dict[str, str]:
    """How flax's graph-mode functions run: ``"native"``, or ``"flax: <why>"``, per function;
    and per type left to flax after a difference, why (``"flax (updates): <why>"`` where only
    its updates are).

    >>> from fastree.integrations import flax_nnx_graph
    >>> sorted(flax_nnx_graph.status())
    ['flatten', 'unflatten', 'update']
    """
    graph = _graph
    if graph is None or not _bound:
        verdict = code_verdict()
        why = _NOT_BOUND if verdict else verdict.reason
        return {"flatten": why, "unflatten": why, "update": why}
    replaced = graph.function_fallbacks.get("code")
    out = {name: "native" if replaced is None else f"flax: {replaced}"
           for name in ("flatten", "unflatten", "update")}
    for name, reason in graph.function_fallbacks.items():
        if name != "code":
            out[name] = f"flax: {reason}"
    for cls, reason in graph.update_fallbacks.items():
        out[f"{cls.__module__}.{cls.__qualname__}"] = f"flax (updates): {reason}"
    for cls, reason in graph.fallbacks.items():
        out[f"{cls.__module__}.{cls.__qualname__}"] = f"flax: {reason}"
    return out


def _make_flatten(graph: _Graph) -> Any:
    graphlib = graph.graphlib
    flax_flatten = graph.flax_flatten
    python_refmap = graphlib.PythonRefMap
    graph_def = graphlib.GraphDef
    flat_state = graphlib.FlatState
    graph_mode = graphlib.set_graph_mode
    native = _core.nnx_graph_flatten

    @functools.wraps(flax_flatten)
    def flatten(node: Any, /, *, with_paths: bool = True, ref_index: Any = None,
                ref_outer_index: Any = None, graph: bool | None = None) -> Any:
        mode = graph_mode.current_value() if graph is None else graph
        if ref_index is None:
            ref_index = python_refmap()
        if (
            not mode
            or not _served_now(_graph_state)
            or _walk_in_progress(_graph_state)
            or type(ref_index) is not python_refmap
            or (ref_outer_index is not None and type(ref_outer_index) is not python_refmap)
        ):
            return flax_flatten(node, with_paths=with_paths, ref_index=ref_index,
                                ref_outer_index=ref_outer_index, graph=graph)
        state = _graph_state
        state.walking += 1
        try:
            state.refresh()
            mapping = ref_index._mapping
            outer = ref_outer_index._mapping if ref_outer_index else None
            try:
                result = native(node, with_paths, mapping, outer, state.context)
            except BaseException:
                state.forget_pending()  # a walk that raised checked nothing
                raise
            if type(result) is list:  # not served: flax's, given the node calls it made
                state.forget_pending()
                theirs = _replay.replaying_flatten(graphlib, flax_flatten,
                                                   state.flax_graph_flatten, result)
                return (theirs or flax_flatten)(node, with_paths=with_paths, ref_index=ref_index,
                              ref_outer_index=ref_outer_index, graph=graph)
            nodes, attributes, leaves, paths, added, called = result
            out = (graph_def(nodes=nodes, attributes=attributes, num_leaves=len(leaves)),
                   flat_state.from_sorted_keys_values(tuple(paths), leaves) if with_paths
                   else leaves)
            if state.pending:
                return _checked_flatten(state, out, added, called, node, with_paths,
                                        ref_index, ref_outer_index)
            mapping.update(added)
            return out
        finally:
            _walk_done(state)

    _graph_state = graph
    return flatten


def _checked_flatten(graph: _Graph, out: Any, added: dict[int, Any], called: list[Any],
                     node: Any, with_paths: bool, ref_index: Any, ref_outer_index: Any) -> Any:
    # The first walk over new types: flax's function runs too, on a copy of the map, and its
    # result is the one returned unless the two are the same. flax's walk is given the results
    # of the node functions the native walk called (_flax_nnx_graph_replay): a user's flatten
    # runs once per node, as under flax alone, and the check compares what both walks made of
    # the same results.
    met = graph.pending
    theirs_map = graph.graphlib.PythonRefMap()
    theirs_map._mapping.update(ref_index._mapping)
    # Strict: flax's walk may not call a user's flatten the native walk did not (_replay).
    user_code = functools.partial(_user_code.flatten_runs_user_code, graph)
    flax_flatten = _replay.replaying_flatten(graph.graphlib, graph.flax_flatten,
                                             graph.flax_graph_flatten, called, user_code)
    try:
        if flax_flatten is None:
            raise _replay.Diverged  # nothing to replay with: no second walk to compare
        theirs = flax_flatten(node, with_paths=with_paths, ref_index=theirs_map,
                              ref_outer_index=ref_outer_index, graph=True)
        ours_map = {**ref_index._mapping, **added}
        why = (_compare.difference(out, theirs, with_paths)
               or _compare.map_difference(ours_map, theirs_map._mapping))
    except _replay.Diverged:
        # A user's flatten changed the graph under the native walk: no second walk can be
        # compared without calling it again. The one walk made, the result flax alone would
        # give, stands; the types stay unverified, checked when next met.
        graph.forget_pending()
        ref_index._mapping.update(added)
        return out
    except BaseException:
        graph.forget_pending()  # nothing compared: the types are checked when next met
        raise
    graph.pending = []
    if why is None:
        graph.verified.update(met)
        ref_index._mapping.update(added)
        return out
    graph.fall_back(met, why)
    ref_index._mapping.clear()
    ref_index._mapping.update(theirs_map._mapping)
    return theirs







def _make_unflatten(graph: _Graph) -> Any:
    graphlib = graph.graphlib
    flax_unflatten = graph.flax_unflatten
    graph_def = graphlib.GraphDef
    flat_state = graphlib.FlatState
    index_map = graph.index_map
    served_roots = (graphlib.NodeDef, graphlib.VariableDef)
    native = _core.nnx_graph_unflatten

    @functools.wraps(flax_unflatten)
    def unflatten(graphdef: Any, state: Any, /, *, index_ref: Any = None,
                  outer_index_outer_ref: Any = None, copy_variables: bool = False,
                  recreate_variables: bool = True) -> Any:
        leaves = state.leaves if type(state) is flat_state else state
        if index_ref is None:
            index_ref = index_map()
        if (
            copy_variables
            or type(graphdef) is not graph_def
            or type(leaves) is not list
            or len(leaves) != graphdef.num_leaves
            or not graphdef.nodes
            or type(graphdef.nodes[0]) not in served_roots
            or type(index_ref) is not index_map
            or (outer_index_outer_ref is not None and type(outer_index_outer_ref) is not index_map)
            or not _served_now(graph)
            or _walk_in_progress(graph)
        ):
            return flax_unflatten(graphdef, state, index_ref=index_ref,
                                  outer_index_outer_ref=outer_index_outer_ref,
                                  copy_variables=copy_variables,
                                  recreate_variables=recreate_variables)
        graph.walking += 1
        try:
            graph.refresh()
            args = (graphdef.nodes, graphdef.attributes, leaves)
            # Into the caller's objects: the outer tables and checks (_Graph.outer).
            into_existing = outer_index_outer_ref is not None
            checks = graph.outer if into_existing else graph
            context = graph.outer_unflatten_context if into_existing else graph.unflatten_context
            checked = _checked_outer_unflatten if into_existing else _checked_unflatten
            for _ in range(2):
                if checks.pending or checks.pending_nodes:
                    return checked(graph, args, state, graphdef, index_ref,
                                   outer_index_outer_ref, recreate_variables)
                try:
                    result = native(*args, index_ref, outer_index_outer_ref, recreate_variables,
                                    context)
                except BaseException:
                    checks.forget_pending()
                    raise
                if result is not False:
                    break
            if not result:
                return flax_unflatten(graphdef, state, index_ref=index_ref,
                                      outer_index_outer_ref=outer_index_outer_ref,
                                      recreate_variables=recreate_variables)
            return result[0]
        finally:
            _walk_done(graph)

    return unflatten


def _checked_unflatten(graph: _Graph, args: tuple[Any, ...], state: Any, graphdef: Any,
                       index_ref: Any, outer: Any, recreate_variables: bool) -> Any:
    # A merge into new objects (no outer map: merges into the caller's objects are
    # _checked_outer_unflatten's) over types no checked walk met: flax's function and the
    # native one each rebuild the graph from a copy of the index map, and the results are
    # compared. The call itself is then served by the native walk if they are the same, else
    # by flax's function from then on for those types.
    index_map = graph.index_map
    if _user_code.in_graphdef(graph, graphdef):
        # Two rebuilds would run a user's create_empty/init (or unflatten) twice: this call is
        # flax's alone, and the types wait for a graph without such nodes.
        graph.forget_pending()
        return graph.flax_unflatten(graphdef, state, index_ref=index_ref,
                                    outer_index_outer_ref=outer,
                                    recreate_variables=recreate_variables)
    ours_map = index_map(index_ref)
    ours = _core.nnx_graph_unflatten(*args, ours_map, None, recreate_variables,
                                     graph.unflatten_context)
    if ours is False:  # more types met: classified now, the second look walks
        ours = _core.nnx_graph_unflatten(*args, ours_map, None, recreate_variables,
                                         graph.unflatten_context)
    if not ours:
        graph.forget_pending()
        return graph.flax_unflatten(graphdef, state, index_ref=index_ref,
                                    outer_index_outer_ref=outer,
                                    recreate_variables=recreate_variables)
    met, met_nodes = graph.pending, graph.pending_nodes
    theirs_map = index_map(index_ref)
    try:
        theirs = graph.flax_unflatten(graphdef, state, index_ref=theirs_map,
                                      recreate_variables=recreate_variables)
        why = (_compare.rebuilt_difference(graph, ours[0], theirs)
               or _compare.index_difference(ours_map, theirs_map))
    except Exception:  # noqa: BLE001 - no comparison: this call is flax's, nothing is decided
        graph.forget_pending()
        return graph.flax_unflatten(graphdef, state, index_ref=index_ref,
                                    outer_index_outer_ref=outer,
                                    recreate_variables=recreate_variables)
    graph.pending, graph.pending_nodes = [], []
    if why is not None:
        graph.fall_back(met + met_nodes, why)
        return graph.flax_unflatten(graphdef, state, index_ref=index_ref,
                                    outer_index_outer_ref=outer,
                                    recreate_variables=recreate_variables)
    graph.verified.update(met)
    graph.verified_nodes.update(met_nodes)
    index_ref.update(ours_map)
    return ours[0]


def _checked_outer_unflatten(graph: _Graph, args: tuple[Any, ...], state: Any, graphdef: Any,
                             index_ref: Any, outer: Any, recreate_variables: bool) -> Any:
    # A merge into the caller's objects over types no such merge met yet. The caller's objects
    # (the outer map's) are copied twice by flax's own flatten and unflatten; the native walk
    # merges into one copy, flax's function into the other, and the results and the two copies
    # are compared. The call itself then merges into the caller's objects, natively if they
    # were the same, else by flax's function from then on for those types. Graphs holding a
    # user's node functions are flax's alone (copies and compares would run them again).
    checks = graph.outer

    def flax_alone() -> Any:
        checks.forget_pending()  # (nothing pending once the check has decided)
        return graph.flax_unflatten(graphdef, state, index_ref=index_ref,
                                    outer_index_outer_ref=outer,
                                    recreate_variables=recreate_variables)

    index_map = graph.index_map
    keys, objects = list(outer.keys()), list(outer.values())
    if _user_code.in_graphdef(graph, graphdef) or _user_code.in_graph(graph, objects):
        return flax_alone()
    try:
        copies = []
        for _ in range(2):
            copy_def, copy_state = graph.flax_flatten(
                objects, ref_index=graph.graphlib.PythonRefMap(), graph=True)
            copies.append(graph.flax_unflatten(copy_def, copy_state, copy_variables=True))
    except Exception:  # noqa: BLE001 - no copies to compare on: this call is flax's
        return flax_alone()
    ours_copy, theirs_copy = copies
    try:
        ours_before = _compare.values_before(graph, ours_copy)
        theirs_before = _compare.values_before(graph, theirs_copy)
    except Exception:  # noqa: BLE001 - nothing to compare on: this call is flax's
        return flax_alone()
    context = graph.outer_unflatten_context
    ours = _core.nnx_graph_unflatten(*args, index_map(index_ref),
                                     index_map(zip(keys, ours_copy)), recreate_variables, context)
    if ours is False:  # more types met: classified now, the second look walks
        ours = _core.nnx_graph_unflatten(*args, index_map(index_ref),
                                         index_map(zip(keys, ours_copy)), recreate_variables,
                                         context)
    if not ours:
        return flax_alone()
    met = checks.pending + checks.pending_nodes
    try:
        theirs = graph.flax_unflatten(graphdef, state, index_ref=index_map(index_ref),
                                      outer_index_outer_ref=index_map(zip(keys, theirs_copy)),
                                      recreate_variables=recreate_variables)
        why = (_compare.merged_copies_difference(graph, ours[0], theirs, ours_before,
                                                 theirs_before)
               or _compare.merged_copies_difference(graph, ours_copy, theirs_copy,
                                                    ours_before, theirs_before))
    except Exception:  # noqa: BLE001 - no comparison: this call is flax's, nothing is decided
        return flax_alone()
    verified, verified_nodes = checks.pending, checks.pending_nodes
    checks.pending, checks.pending_nodes = [], []
    if why is not None:
        graph.fall_back(met, f"merging into existing objects: {why}")
        return flax_alone()
    checks.verified.update(verified)
    checks.verified_nodes.update(verified_nodes)
    result = _core.nnx_graph_unflatten(*args, index_ref, outer, recreate_variables, context)
    # Falsy when the tables changed meanwhile (a registration): flax's function.
    return result[0] if result else flax_alone()





def _make_update(graph: _Graph) -> Any:
    flax_update = graph.flax_update

    @functools.wraps(flax_update)
    def _graph_update_dynamic(node: Any, state: Any) -> None:
        root = type(node)
        if (
            getattr(_updating, "active", False)
            or getattr(_updating, "checking", False)
            or root in graph.fallbacks
            or root in graph.update_fallbacks
            or not _served_now(graph)
        ):
            return flax_update(node, state)
        graph.refresh()
        if root not in graph.verified_updates and not _checked_update(graph, node, state):
            return flax_update(node, state)
        return _native_update(graph, node, state)

    return _graph_update_dynamic


def _native_update(graph: _Graph, node: Any, state: Any) -> None:
    _updating.active = True
    try:
        return _core.nnx_graph_update(node, state, graph.unflatten_context)
    finally:
        _updating.active = False


def _checked_update(graph: _Graph, node: Any, state: Any) -> bool:
    # The first update of a root type: flax's function and the native walk each update a copy
    # of the graph (made by flax's own flatten and unflatten), and the two are compared. True
    # if the native walk may serve the call (and later ones for this root type). flax's update
    # recurses through graphlib._graph_update_dynamic, which is ours: while a check runs, those
    # calls are flax's (no check per level, which made a chain's first update quadratic).
    _updating.checking = True
    try:
        # Copies, two updates and their comparison would run a user's node functions again,
        # and each update compares a Variable's metadata with the state's (a user's ==).
        user_code = _user_code.in_graph(graph, node) or _user_code.in_state(graph, state)
        decided = None if user_code else _compare_update(graph, node, state)
    finally:
        _updating.checking = False
    root = type(node)
    if decided is None:
        # Undecided (no copy could be made, a difference that cannot be judged, or a check
        # that would run a user's functions twice): after a few such checks the root type stays
        # flax's, rather than paying a check per update.
        count = graph.undecided_updates.get(root, 0) + 1
        graph.undecided_updates[root] = count
        if count >= _UNDECIDED_LIMIT:
            graph.update_fallbacks[root] = (
                "its graph or state holds user code a check would run again (a node's own "
                "functions, a metadata value's ==)" if user_code
                else f"the first {count} updates' checks could not decide")
        return False
    return decided


_UNDECIDED_LIMIT = 3


def _compare_update(graph: _Graph, node: Any, state: Any) -> bool | None:
    # True/False: decided (and recorded); None: undecided.
    root = type(node)
    copies = []
    try:
        for _ in range(2):
            graphdef, flat = graph.flax_flatten(node, ref_index=graph.graphlib.PythonRefMap(),
                                                graph=True)
            copies.append(graph.flax_unflatten(graphdef, flat, copy_variables=True))
    except Exception:  # noqa: BLE001 - no copies to compare on: this call is flax's, undecided
        return None
    theirs, ours = copies
    errors = []
    for run, target in ((graph.flax_update, theirs),
                        (lambda n, s: _native_update(graph, n, s), ours)):
        try:
            run(target, state)
            errors.append(None)
        except Exception as error:  # noqa: BLE001 - compared below, then raised by the real call
            errors.append(type(error))
    why = None
    if errors[0] is not errors[1]:
        why = "the update raises differently"
    elif errors[0] is None:
        try:
            why = _compare.rebuilt_difference(graph, ours, theirs)
        except Exception:  # noqa: BLE001 - Undecidable, or flax's flatten of a copy raised
            return None
    if why is None:
        graph.verified_updates.add(root)
        return True
    graph.fallbacks[root] = why
    return False


def _make_merge_leaves(graph: _Graph) -> Any:
    flax_merge_leaves = graph.flax_merge_leaves
    native = _core.nnx_graph_merge_leaves

    @functools.wraps(flax_merge_leaves)
    def _merge_to_flat_state(states: Any) -> Any:
        if (
            type(states) is tuple
            and "_merge_to_flat_state" not in graph.function_fallbacks
            and _served_now(graph)
        ):
            graph.refresh()
            leaves = native(states, graph.unflatten_context)
            if leaves is not None:
                if graph.merge_checked:
                    return leaves
                # The first served call: flax's function too, and the same leaves, or flax's
                # function from then on.
                theirs = flax_merge_leaves(states)
                graph.merge_checked = True
                if len(leaves) == len(theirs) and all(a is b for a, b in zip(leaves, theirs)):
                    return leaves
                graph.function_fallbacks["_merge_to_flat_state"] = "the leaves differ"
                return theirs
        return flax_merge_leaves(states)

    return _merge_to_flat_state
