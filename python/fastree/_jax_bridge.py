"""The bridge between fastree and JAX, in both directions.

* JAX -> fastree: the core is handed JAX's Python-side registry dict, so a type registered only
  with JAX (flax, equinox, optax, user code; before or after ``import fastree``) is found on first
  use, and JAX's ``flatten_one_level_with_keys`` for the key paths of such types. The key classes
  (``DictKey``, ...) are JAX's own, so ``isinstance`` checks in user code hold.
* fastree -> JAX: every registration made through fastree is also made with JAX (see
  ``_registration.py``), so ``jax.jit``/``grad``/``vmap`` accept fastree types; treedefs convert
  both ways with :func:`to_jax` / :func:`from_jax`, and JAX's protocol-buffer encoding of a
  treedef (``serialize_using_proto``) goes through that conversion.
* Errors: a tree_map structure mismatch is explained with JAX's own key-path message, computed
  only on the error path.
"""

from __future__ import annotations

from typing import Any

from . import _core, _key_makers, _map_errors
from ._jax_compat import internal as _jax_internal
from ._jax_compat import tree_util as _jtu
from ._default_registry import PyTreeRegistry


def _check_sharing_fits_jax(treedef: _core.PyTreeDef) -> None:
    """JAX can carry sharing only inside one identity-preserving object (as that object's aux
    data); a shared reference that crosses out of it would be silently dropped: refuse."""
    from ._statetree import parse_state

    nodes = parse_state(treedef._state())
    if all(node.ref < 0 for node in nodes):
        return
    parent = {child: node.index for node in nodes for child in node.children}
    size = [1] * len(nodes)
    for node in nodes:  # post-order: children first
        size[node.index] += sum(size[child] for child in node.children)
    for node in nodes:
        if node.ref < 0:
            continue
        holder = parent.get(node.index, -1)
        while holder >= 0 and not _core.is_identity_type(nodes[holder].type):
            holder = parent.get(holder, -1)
        if holder < 0 or not holder - size[holder] < node.ref <= holder:
            raise ValueError(
                "This treedef shares an identity-preserving object across built-in containers, "
                f"which a JAX treedef cannot express: {treedef}. Use fastree.jit, or keep the "
                "shared objects inside one identity-preserving node."
            )


def to_jax(treedef: _core.PyTreeDef) -> _jtu.PyTreeDef:
    """Converts a fastree treedef to the equal ``jax.tree_util.PyTreeDef``.

    Raises ValueError for sharing that JAX cannot represent (see the README's identity section).

    >>> import fastree
    >>> fastree.tree_util.tree_structure({'a': (1, 2)}).to_jax()
    PyTreeDef({'a': (*, *)})
    """
    _check_sharing_fits_jax(treedef)
    return _to_jax(treedef)


# jaxlib added PyTreeDef.from_node_data_and_children in 0.7; the newest jax for Python 3.10
# (0.6.2) lacks it.
_JAX_BUILDS_FROM_NODE_DATA = hasattr(_jtu.PyTreeDef, "from_node_data_and_children")


# Node kinds in jaxlib's PyTreeDef state (its pickling format before from_node_data_and_children
# existed): the state is (registry, [(kind, arity, node_data, custom_type, num_leaves,
# num_nodes), ...]) in post-order.
_LEAF, _NONE, _TUPLE, _NAMEDTUPLE, _LIST, _DICT, _CUSTOM, _DATACLASS = range(8)
_BUILTIN_KINDS = {type(None): _NONE, tuple: _TUPLE, list: _LIST, dict: _DICT}


def _jax_kind(node_type: type) -> int:
    entry = _jax_internal._registry.get(node_type)
    if entry is not None:  # registered with JAX: through register_dataclass, or as a custom node
        is_dataclass = getattr(entry.to_iter, "__qualname__", "").startswith("register_dataclass.")
        return _DATACLASS if is_dataclass else _CUSTOM
    if _core.dataclass_fields(node_type) is not None:  # default_registry.register_dataclass_node
        return _DATACLASS
    if issubclass(node_type, tuple) and hasattr(node_type, "_fields"):
        return _NAMEDTUPLE
    return _CUSTOM  # default_registry.register_node


def _append_jax_state(treedef: _core.PyTreeDef, out: list[tuple[Any, ...]]) -> None:
    node_data = treedef.node_data()
    if node_data is None:
        out.append((_LEAF, 0, None, None, 1, 1))
        return
    node_type, data = node_data
    leaves = treedef.num_leaves
    if _core.is_identity_type(node_type):  # one node over its unique leaves (see _to_jax)
        out.extend([(_LEAF, 0, None, None, 1, 1)] * leaves)
        out.append((_CUSTOM, leaves, treedef, node_type, leaves, leaves + 1))
        return
    start = len(out)
    children = treedef.children()
    for child in children:
        _append_jax_state(child, out)
    kind = _BUILTIN_KINDS.get(node_type)
    if kind is None:
        kind = _jax_kind(node_type)
    if kind == _NAMEDTUPLE:
        data, custom = node_type, None
    elif kind in (_CUSTOM, _DATACLASS):
        custom = node_type
    else:
        data, custom = (list(data) if kind == _DICT else None), None
    out.append((kind, len(children), data, custom, leaves, len(out) - start + 1))


def _to_jax_from_state(treedef: _core.PyTreeDef) -> _jtu.PyTreeDef:
    # jaxlib before 0.7 cannot build a treedef from node data, but restores one from its
    # pickling state, looking each custom type up in the registry as unpickling does: no user
    # code runs.
    nodes: list[tuple[Any, ...]] = []
    _append_jax_state(treedef, nodes)
    converted = _jtu.PyTreeDef.__new__(_jtu.PyTreeDef)
    converted.__setstate__((_jtu.default_registry, nodes))
    return converted


def _to_jax(treedef: _core.PyTreeDef) -> _jtu.PyTreeDef:
    if not _JAX_BUILDS_FROM_NODE_DATA:
        return _to_jax_from_state(treedef)
    node_data = treedef.node_data()
    if node_data is None:
        return _jtu.tree_structure(0)
    if _core.is_identity_type(node_data[0]):
        # JAX holds an identity-preserving object as one node over its unique leaves, with
        # fastree's treedef of the whole subtree (sharing included) as aux data.
        leaf = _jtu.tree_structure(0)
        return _jtu.PyTreeDef.from_node_data_and_children(
            _jtu.default_registry, (node_data[0], treedef), [leaf] * treedef.num_leaves
        )
    children = [_to_jax(child) for child in treedef.children()]
    return _jtu.PyTreeDef.from_node_data_and_children(
        _jtu.default_registry, node_data, children
    )


def from_jax(treedef: _jtu.PyTreeDef) -> _core.PyTreeDef:
    """Converts a ``jax.tree_util.PyTreeDef`` to the equal fastree treedef.

    >>> import jax, fastree
    >>> fastree.from_jax(jax.tree_util.tree_structure([1, None]))
    PyTreeDef([*, None])
    """
    if not isinstance(treedef, _jtu.PyTreeDef):
        raise TypeError(f"from_jax() expects a jax.tree_util.PyTreeDef, got {treedef!r}.")
    node_data = treedef.node_data()
    if node_data is not None and _core.is_identity_type(node_data[0]):
        return node_data[1]  # the subtree treedef fastree handed JAX (see to_jax)
    children = [from_jax(child) for child in treedef.children()]
    return _core.PyTreeDef.from_node_data_and_children(node_data, children)


def serialize_using_proto(treedef: _core.PyTreeDef) -> bytes:
    """JAX's protocol-buffer encoding of ``treedef`` (``PyTreeDef.serialize_using_proto``).

    As in JAX, only built-in nodes and str dict keys can be encoded (otherwise ValueError).

    >>> import fastree
    >>> td = fastree.tree_util.tree_structure({'a': [1, None]})
    >>> fastree.PyTreeDef.deserialize_using_proto(
    ...     fastree.tree_util.default_registry, td.serialize_using_proto()) == td
    True
    """
    return to_jax(treedef).serialize_using_proto()


def deserialize_using_proto(registry: Any, data: bytes) -> _core.PyTreeDef:
    """The treedef encoded by :func:`serialize_using_proto` (``PyTreeDef.deserialize_using_proto``).

    ``registry`` is fastree's ``tree_util.default_registry`` or, as in JAX, a jaxlib registry.
    """
    if isinstance(registry, PyTreeRegistry):
        registry = _jtu.default_registry
    return from_jax(_jtu.PyTreeDef.deserialize_using_proto(registry, data))


def _jax_error_text(call: Any) -> str:
    try:
        call()
    except ValueError as error:
        return str(error)
    return ""


class _Incomparable:
    """A callable whose comparison raises: Partial aux data for probing JAX's error text."""

    def __call__(self) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        raise TypeError("incomparable")

    __ne__ = __eq__
    __hash__ = object.__hash__


# Texts that changed between JAX releases, asked of the installed JAX once (see also
# csrc/jax_texts.h): jax 0.7 began to list a mismatching dict's keys rather than print the dict;
# jax 0.12 names the node type when comparing aux data raises. (Whether tree_map explains a
# mismatch by key path is asked in _map_errors.py.)
_JAX_DICT_MISMATCH_SHOWS_DICT = "; dict: " in _jax_error_text(
    lambda: _jtu.tree_structure({"a": 1}).flatten_up_to({"b": 1})
)
_JAX_AUX_EQUALITY_NAMES_TYPE = "pytree node of type" in _jax_error_text(
    lambda: _jtu.tree_structure(_jtu.Partial(_Incomparable()))
    == _jtu.tree_structure(_jtu.Partial(_Incomparable()))
)


_JAXLIB_IS_NODE = getattr(_jtu.default_registry, "is_node", None)  # jaxlib 0.7 and later
_LEAF_TREEDEF = _jtu.tree_structure(0)


def _adopt_jaxlib_node(node_type: type) -> tuple[Any, Any] | None:
    """(flatten, unflatten) for a type registered only in jaxlib's C++ registry, else None.

    ``jax.tree_util.default_registry.register_node`` / ``register_dataclass_node`` register with
    jaxlib alone (JAX's Python-side dict never sees them). The core asks here once per type it
    has not classified yet; the answer flattens with jaxlib's ``flatten_one_level`` and rebuilds
    through a one-node JAX treedef, so the same user functions run as under JAX. Needs jaxlib's
    ``is_node`` and ``from_node_data_and_children`` (jaxlib 0.7+); before that such types stay
    leaves.
    """
    if _JAXLIB_IS_NODE is None or not _JAX_BUILDS_FROM_NODE_DATA:
        return None
    if not _JAXLIB_IS_NODE(node_type):
        return None
    registry = _jtu.default_registry
    build = _jtu.PyTreeDef.from_node_data_and_children

    def unflatten(aux_data: Any, children: Any) -> Any:
        children = tuple(children)
        one_node = build(registry, (node_type, aux_data), [_LEAF_TREEDEF] * len(children))
        return one_node.unflatten(children)

    return registry.flatten_one_level, unflatten


def install() -> None:
    _core.install_jax_bridge(
        jax_registry=_jax_internal._registry,
        flatten_one_level=_jtu.default_registry.flatten_one_level,
        flatten_one_level_with_keys=_jtu.default_registry.flatten_one_level_with_keys,
        DictKey=_jtu.DictKey,
        SequenceKey=_jtu.SequenceKey,
        GetAttrKey=_jtu.GetAttrKey,
        FlattenedIndexKey=_jtu.FlattenedIndexKey,
        to_jax=to_jax,
        map_error=_map_errors.explain,
    )
    _key_makers.install()
    _core.set_jaxlib_adopter(_adopt_jaxlib_node)
    _core.set_jax_texts(
        dict_mismatch_shows_dict=_JAX_DICT_MISMATCH_SHOWS_DICT,
        aux_equality_names_type=_JAX_AUX_EQUALITY_NAMES_TYPE,
    )
