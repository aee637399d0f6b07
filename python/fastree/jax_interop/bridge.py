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

import warnings
from typing import Any

from .. import _core, _statetree
from .._statetree import StateNode
from . import compat as _jax_compat
from . import key_makers as _key_makers
from . import map_errors as _map_errors

# Tests re-create install()'s call to the core through these two names.
from .compat import internal as _jax_internal  # noqa: F401
from .compat import tree_util as _jtu
from .default_registry import PyTreeRegistry

_LEAF_TREEDEF = _jtu.tree_structure(0)


def _check_sharing_fits_jax(treedef: _core.PyTreeDef, nodes: list[StateNode]) -> None:
    """JAX can carry sharing only inside one identity-preserving object (as that object's aux
    data); a shared reference that crosses out of it would be silently dropped: refuse."""
    for node in nodes:
        if not node.is_ref:
            continue
        holder = node.parent
        while holder is not None and not _core.is_identity_type(holder.type):
            holder = holder.parent
        if holder is None or not holder.first <= node.ref <= holder.index:
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
    nodes = _statetree.parse_nodes(treedef)
    _check_sharing_fits_jax(treedef, nodes)
    if _jax_compat.JAXLIB_BUILDS_FROM_NODE_DATA:
        return _to_jax(treedef, nodes)
    return _to_jax_from_state(treedef, nodes)


def _is_identity_node(node: StateNode) -> bool:
    return node.type is not None and _core.is_identity_type(node.type)


def _identity_subtree(treedef: _core.PyTreeDef, nodes: list[StateNode], node: StateNode) -> Any:
    """fastree's treedef of the identity-preserving subtree at ``node`` (sharing included): what
    JAX holds as that node's aux data (see _to_jax)."""
    if node.index == len(nodes) - 1:
        return treedef
    return _core._treedef_from_state(_statetree.subtree_state(nodes, node))


def _to_jax(treedef: _core.PyTreeDef, nodes: list[StateNode]) -> _jtu.PyTreeDef:
    # Bottom-up over the post-order nodes (no recursion: as deep as the treedef goes).
    built: list[Any] = []  # JAX treedefs of the subtrees not yet claimed by a parent
    for node in nodes:
        children = built[len(built) - node.arity :]
        del built[len(built) - node.arity :]
        if node.is_leaf or node.is_ref:
            # A shared reference lies inside an identity-preserving node (checked), which
            # drops its children's conversions: any placeholder does.
            built.append(_LEAF_TREEDEF)
        elif _is_identity_node(node):
            # JAX holds an identity-preserving object as one node over its unique leaves, with
            # fastree's treedef of the whole subtree (sharing included) as aux data.
            data = _identity_subtree(treedef, nodes, node)
            built.append(
                _jax_compat.jax_treedef_from_node_data(
                    (node.type, data), [_LEAF_TREEDEF] * node.num_leaves
                )
            )
        else:
            built.append(_jax_compat.jax_treedef_from_node_data((node.type, node.data), children))
    (root,) = built
    return root


_K = _jax_compat.JAXLIB_STATE_KINDS
# jaxlib's node kind for each of the core's (OrderedDict and defaultdict are custom nodes there).
_JAXLIB_KINDS = {
    "none": _K.NONE,
    "tuple": _K.TUPLE,
    "namedtuple": _K.NAMEDTUPLE,
    "list": _K.LIST,
    "dict": _K.DICT,
    "ordered_dict": _K.CUSTOM,
    "default_dict": _K.CUSTOM,
    "custom": _K.CUSTOM,
    "dataclass": _K.DATACLASS,
    "attribute": _K.CUSTOM,  # registered with JAX as a custom node (the AttrNode's C methods)
}
_JAXLIB_LEAF = (_K.LEAF, 0, None, None, 1, 1)


def _jaxlib_kind(node: StateNode) -> int:
    # A type registered with JAX's own register_dataclass alone is a custom node to the core
    # (it adopts JAX's flatten function) and a dataclass node to jaxlib.
    if node.kind == "custom" and _jax_compat.is_jax_register_dataclass_entry(
        _jax_compat.jax_registry_entry(node.type)  # type: ignore[arg-type]
    ):
        return _K.DATACLASS
    return _JAXLIB_KINDS[node.kind]


def _to_jax_from_state(treedef: _core.PyTreeDef, nodes: list[StateNode]) -> _jtu.PyTreeDef:
    # jaxlib before 0.7 cannot build a treedef from node data, but restores one from its
    # pickling state: (kind, arity, node_data, custom_type, num_leaves, num_nodes) per
    # post-order node, in JAX's terms (an identity-preserving node is one node over its leaves).
    out: list[tuple[Any, ...]] = []
    starts: list[int] = []  # per node: where its subtree's entries begin in `out`
    for node in nodes:
        start = starts[node.first] if node.arity else len(out)
        if node.is_leaf or node.is_ref:  # a reference: inside an identity node (checked)
            out.append(_JAXLIB_LEAF)
        elif _is_identity_node(node):
            leaves = node.num_leaves
            data = _identity_subtree(treedef, nodes, node)
            del out[start:]  # its children's entries: JAX sees only its unique leaves
            out.extend([_JAXLIB_LEAF] * leaves)
            out.append((_K.CUSTOM, leaves, data, node.type, leaves, leaves + 1))
        else:
            kind = _jaxlib_kind(node)
            if kind == _K.NAMEDTUPLE:
                data, custom = node.type, None
            elif kind in (_K.CUSTOM, _K.DATACLASS):
                data, custom = node.data, node.type
            else:
                data, custom = (list(node.data) if kind == _K.DICT else None), None
            num_nodes = len(out) - start + 1
            out.append((kind, node.arity, data, custom, node.num_leaves, num_nodes))
        starts.append(start)
    return _jax_compat.jax_treedef_from_state(out)


def from_jax(treedef: _jtu.PyTreeDef) -> _core.PyTreeDef:
    """Converts a ``jax.tree_util.PyTreeDef`` to the equal fastree treedef.

    >>> import jax, fastree
    >>> fastree.from_jax(jax.tree_util.tree_structure([1, None]))
    PyTreeDef([*, None])
    """
    if not isinstance(treedef, _jtu.PyTreeDef):
        raise TypeError(f"from_jax() expects a jax.tree_util.PyTreeDef, got {treedef!r}.")
    # Post-order with an explicit stack (no recursion: as deep as the JAX treedef goes).
    built: list[_core.PyTreeDef] = []  # fastree treedefs of the subtrees not yet claimed
    stack: list[tuple[Any, Any, int]] = [(treedef, None, -1)]  # (JAX treedef, node data, arity)
    while stack:
        jax_treedef, node_data, arity = stack.pop()
        if arity >= 0:  # its children are built: the node itself
            children = built[len(built) - arity :]
            del built[len(built) - arity :]
            built.append(_core.PyTreeDef.from_node_data_and_children(node_data, children))
            continue
        node_data = jax_treedef.node_data()
        if node_data is not None and _core.is_identity_type(node_data[0]):
            built.append(node_data[1])  # the subtree treedef fastree handed JAX (see to_jax)
            continue
        children = jax_treedef.children()
        stack.append((jax_treedef, node_data, len(children)))
        stack.extend((child, None, -1) for child in reversed(children))
    (root,) = built
    return root


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


def _adopt_jaxlib_node(node_type: type) -> tuple[Any, Any] | None:
    """(flatten, unflatten) for a type registered only in jaxlib's C++ registry, else None.

    ``jax.tree_util.default_registry.register_node`` / ``register_dataclass_node`` register with
    jaxlib alone (JAX's Python-side dict never sees them). The core asks here once per type it
    has not classified yet; the answer flattens with jaxlib's ``flatten_one_level`` and rebuilds
    through a one-node JAX treedef, so the same user functions run as under JAX. Needs jaxlib's
    ``is_node`` and ``from_node_data_and_children`` (jaxlib 0.7+); before that such types stay
    leaves.
    """
    is_node = _jax_compat.jaxlib_is_node
    if is_node is None or not _jax_compat.JAXLIB_BUILDS_FROM_NODE_DATA:
        return None
    if not is_node(node_type):
        return None
    if _jax_compat.jaxlib_calls_namedtuple_like(node_type):
        # is_node says yes to every tuple subclass whose class has a `_fields` (a property too),
        # registered or not; jaxlib then decides per object, as the core does for tuple
        # subclasses. Adopted, a tuple whose `_fields` raises would fail its flatten (jaxlib's
        # answer for it is "a leaf"). Such a class registered on jaxlib's registry alone is
        # therefore read as a namedtuple.
        return None
    build = _jax_compat.jax_treedef_from_node_data

    def unflatten(aux_data: Any, children: Any) -> Any:
        children = tuple(children)
        one_node = build((node_type, aux_data), [_LEAF_TREEDEF] * len(children))
        return one_node.unflatten(children)

    return _jtu.default_registry.flatten_one_level, unflatten


def _warn_iterable_leaf(leaf: Any) -> None:
    """The installed JAX's warning for a leaf of a type it warns about (called by the core's
    flattens). stacklevel=2 names the code that called fastree, as jaxlib's names its caller."""
    warnings.warn(
        _jax_compat.JAX_ITERABLE_LEAF_WARNING.format(type(leaf).__name__),
        DeprecationWarning,
        stacklevel=2,
    )


def install() -> None:
    _core.install_jax_bridge(
        jax_registry=_jax_compat.jax_registry(),
        flatten_one_level=_jtu.default_registry.flatten_one_level,
        flatten_one_level_with_keys=_jax_compat.jaxlib_flatten_one_level_with_keys,
        DictKey=_jtu.DictKey,
        SequenceKey=_jtu.SequenceKey,
        GetAttrKey=_jtu.GetAttrKey,
        FlattenedIndexKey=_jtu.FlattenedIndexKey,
        to_jax=to_jax,
        map_error=_map_errors.explain,
    )
    _key_makers.install()
    _core.set_jaxlib_adopter(_adopt_jaxlib_node)
    _core.set_iterable_leaf_warning(
        _jax_compat.JAX_ITERABLE_LEAF_TYPES or None, _warn_iterable_leaf
    )
    _core.set_jax_texts(
        dict_mismatch_shows_dict=_jax_compat.JAX_DICT_MISMATCH_SHOWS_DICT,
        aux_equality_names_type=_jax_compat.JAX_AUX_EQUALITY_NAMES_TYPE,
        dict_grown_mid_walk_raises=_jax_compat.JAX_REJECTS_A_DICT_GROWN_MID_WALK,
    )
