"""What flax's graph walks hold once attached (:class:`Graph`): flax's objects, the per-type kind
tables the C walks read, the first-walk checks' state, and the bookkeeping every walk does on
entry and exit (:func:`served_now`, :func:`walk_in_progress`, :func:`walk_done`). The walks
themselves are ``_flax_nnx_graph_flatten``, ``_unflatten`` and ``_update``; attaching and
status are :mod:`fastree.integrations.flax_nnx_graph`'s."""

from __future__ import annotations

import collections.abc
import inspect
import sys
import threading
import weakref
from typing import Any

from .. import _core
from ..jax_interop import compat as _jax_compat
from . import _flax_nnx_graph_user_code as _user_code
from . import _flax_nnx_shared, _mirrored_code
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

_CALLS_ITS_OWN = CALLS_ITS_OWN


class CheckTables:
    """One set of kind tables and first-walk checks.

    ``kinds``: the table of the types flatten and update meet (and unflatten's leaves);
    ``node_kinds``: that of the NodeDef/VariableDef types unflatten meets, as
    get_node_impl_for_type finds their impl. ``pending``/``pending_nodes``: types met by no walk
    that was compared with flax's yet; ``verified``/``verified_nodes``: those that were. The
    graph keeps its own (``Graph``); merges into the caller's objects keep another
    (``Graph.outer``): a type verified by a merge into new objects is still pending there until
    a merge into existing ones met it and was compared with flax's
    (``_flax_nnx_graph_unflatten._checked_outer_unflatten``).
    """

    def __init__(self, graph: Graph) -> None:
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

    def _record(self, cls: type, kind_of: Any, table: TypeTable, verified: set[type],
                pending: list[type]) -> tuple[int, Any, Any]:
        # `cls`'s entry (unserved once it is left to flax), stored in `table`; pending until a
        # compared walk has met it, unless flax's own function runs for it anyway.
        version = _core.type_version(cls)  # before anything reads the class
        entry = (UNSERVED, None, None) if cls in self.graph.fallbacks else kind_of(cls)
        table.store(cls, entry, version)
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


class Graph(CheckTables):
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
        # The transforms' alias check (tree mode), where its module is loaded.
        self.flax_check_no_aliases = getattr(sys.modules.get("flax.nnx.extract"),
                                             "check_no_aliases", None)
        # And the transforms' write-back of the Variables a traced function changed (tree mode).
        self.flax_apply_updates = getattr(sys.modules.get("flax.nnx.extract"),
                                          "apply_updates", None)
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
        # Held by the one thread whose native walks use this graph's tables and checks now, from
        # a walk's entry to its end (enter_walk, walk_done; nested walks of that thread take it
        # again). Another thread's call meanwhile is flax's own function: it never waits, so no
        # lock order against flax's, a user's or the C walks' locks can deadlock. The checks
        # need it: a type one walk met and has not checked yet must not serve another thread's
        # walk unchecked, nor be verified by a walk that never met it.
        self.lock = threading.RLock()
        # Native flatten/unflatten calls under way (nested ones included): walk_in_progress.
        self.walking = 0
        # Types left to flax after a difference: type -> reason.
        self.fallbacks: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()
        # (initializing, is_setup) -> the IndexesPytreeDef flax made for a PytreeState with them.
        self.state_treedefs: dict[tuple[Any, Any], Any] = {}
        self.context = context(_core.NNX_GRAPH_CONTEXT, {
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
        self.unflatten_context = context(_core.NNX_GRAPH_UNFLATTEN_CONTEXT, {
            **unflatten_items,
            "leaf_kinds": self.kinds,
            "classify_leaf": self.classify,
            "node_kinds": self.node_kinds,
            "classify_node_type": self.classify_node_type,
        })
        # A merge into the caller's objects (an outer index map: the end of nnx.jit and of every
        # transform) walks with tables of its own, so that its first walks over each type are
        # compared with flax's too (_flax_nnx_graph_unflatten).
        self.outer = CheckTables(self)
        self.outer_unflatten_context = context(_core.NNX_GRAPH_UNFLATTEN_CONTEXT, {
            **unflatten_items,
            "leaf_kinds": self.outer.kinds,
            "classify_leaf": self.outer.classify,
            "node_kinds": self.outer.node_kinds,
            "classify_node_type": self.outer.classify_node_type,
        })
        self.merge_checked = False
        # Walks (flax_nnx_graph.WALKS' keys) left to flax: walk -> reason (its code is no known
        # release's, a name it mirrors was replaced after attach, or its check found a difference).
        self.function_fallbacks: dict[str, str] = {}
        # Set by attach(), per served walk: whether a flax object it mirrors was replaced since
        # (walk_replaced).
        self.watches: dict[str, _mirrored_code.Watch] = {}
        # Set by attach(): graphlib's name -> (flax's function, this graph's walk), which
        # attach binds and detach takes back.
        self.replacements: dict[str, tuple[Any, Any]] = {}
        # Root node types whose first update was compared with flax's; and how many checks of a
        # root type's update could not decide (_flax_nnx_graph_update).
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


def context(names: tuple[str, ...], items: dict[str, Any]) -> tuple[Any, ...]:
    # The tuple a C walk reads by position, built in the order the C code declares
    # (_core.NNX_GRAPH_CONTEXT, ...): an item the C code names and this side does not give, or
    # the reverse, stops attach() here rather than misleading a walk.
    if set(names) != set(items):
        raise RuntimeError(f"fastree's nnx graph context differs from its C walks': "
                           f"{sorted(set(names) ^ set(items))}")
    return tuple(items[name] for name in names)



def enter_walk(graph: Graph) -> bool:
    """Whether this call may walk natively: then it holds ``graph.lock`` and counts as walking
    until :func:`walk_done`. False, holding nothing, while another thread walks or this one's
    walk under way has types it has not checked yet (:func:`walk_in_progress`)."""
    if not graph.lock.acquire(blocking=False):
        return False
    if walk_in_progress(graph):
        graph.lock.release()
        return False
    graph.walking += 1
    return True


def walk_in_progress(graph: Graph) -> bool:
    # Types met and not yet checked belong to the walk that met them: a walk started while one is
    # under way (a split from a pytree's flatten, a GC callback, another thread) would otherwise
    # take them and check them against its own graph, and the first walk's result would go
    # unchecked. Such a walk is flax's function's; the first walk checks its own types.
    return graph.walking > 0 and bool(graph.pending or graph.pending_nodes)


def walk_done(graph: Graph) -> None:
    # The end of a walk enter_walk let in. The last native walk under way has ended: whatever
    # it met and did not check (it raised, or handed the call to flax) is classified again, and
    # so checked, by the next walk.
    try:
        graph.walking -= 1
        if graph.walking == 0:
            # The outer tables' too: a merge into the caller's objects that was not served (a
            # type left to flax) would otherwise leave its types pending, and every later such
            # merge would run the check again.
            for checks in (graph, graph.outer):
                if checks.pending or checks.pending_nodes:
                    checks.forget_pending()
    finally:
        graph.lock.release()


def served_now(graph: Graph, walk: str) -> bool:
    # Whether this call of `walk` (a key of flax_nnx_graph.WALKS) may be native: the code it
    # mirrors is as attach found it, and no user's GC callback could run at other points of a
    # native walk than of flax's (_user_code.gc_callbacks_run_user_code).
    return not walk_replaced(graph, walk) and not _user_code.gc_callbacks_run_user_code()


def walk_replaced(graph: Graph, walk: str) -> bool:
    # Whether `walk` is left to flax: not served since attach, or a flax function or class it
    # mirrors was replaced since (a user's patch, a debugger): flax's own function from then on,
    # for good, and status() says which. Other walks keep their own verdicts.
    if walk in graph.function_fallbacks:
        return True
    watch = graph.watches.get(walk)
    name = "its code" if watch is None else watch.replaced()
    if name is None:
        return False
    graph.function_fallbacks[walk] = f"{name} was replaced after fastree attached"
    return True
