"""What the floor workloads share: a library's tree timed against its builtin-shape twin.

A floor workload (group ``FLOOR``) times one operation twice in the same process, turn by turn:
on a library's tree (an nnx model, an equinox model) and on the same shape built from builtin
containers holding the very same leaves (``Prepared.floor``). builtin containers are JAX's
fastest nodes, read in its C++ with no Python call, so call / floor says how far the library's
nodes are from the best JAX can do with that shape: 1.0x would be no cost at all for being a
library node. The runner reports that ratio in the plain process and in the installed one
(``benchmarks.measure.workloads``), so a row shows how much of the distance installing fastree
closes. The twin is made by each library's ``mirror`` (``nnx_floor``, ``equinox_floor``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.workloads.base import Prepared, values_fingerprint


def mirror_containers(x: Any, node: Callable[[Any], Any | None]) -> Any:
    """``x`` rebuilt from builtin containers: ``node(x)`` for a library node (None for anything
    else); lists, tuples, namedtuples and dicts rebuilt around their mirrored items; leaves kept."""
    mirrored = node(x)
    if mirrored is not None:
        return mirrored
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(mirror_containers(v, node) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(mirror_containers(v, node) for v in x)
    if isinstance(x, dict):
        return {k: mirror_containers(v, node) for k, v in x.items()}
    return x


def check_same_leaves(tree: Any, twin: Any) -> int:
    """The number of leaves, after checking the twin holds the very same leaf objects (in any
    order: a dict's keys may sort differently from a library's fields)."""
    import jax

    ours, theirs = jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(twin)
    if sorted(map(id, ours)) != sorted(map(id, theirs)):
        raise RuntimeError(
            f"the builtin-shape twin holds other leaves ({len(theirs)}) than the tree "
            f"({len(ours)}): the mirror does not follow the library's flatten"
        )
    return len(ours)


def foreign_nodes(twin: Any) -> list[str]:
    """The node types in ``twin`` other than list, tuple, namedtuple, dict and None, by the path
    where each is met (a floor twin must have none: the floor is builtin nodes only). A leaf is
    anything JAX flattens to itself."""
    import jax

    found: list[str] = []
    stack: list[tuple[str, Any]] = [("", twin)]
    while stack:
        path, x = stack.pop()
        if x is None:
            continue
        if type(x) in (list, tuple) or (isinstance(x, tuple) and hasattr(x, "_fields")):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(x))
        elif type(x) is dict:
            stack.extend((f"{path}[{k!r}]", v) for k, v in x.items())
        elif jax.tree_util.tree_leaves(x) != [x] or not jax.tree_util.all_leaves([x]):
            found.append(f"{path or 'the root'}: {type(x).__module__}.{type(x).__qualname__}")
    return found


def check_builtin_twin(tree: Any, twin: Any) -> int:
    """The number of leaves, after checking that ``twin`` holds the very same leaves as
    ``tree``, in builtin nodes only, with as many nodes as ``tree``'s treedef: the floor of the
    same shape. Raises RuntimeError saying what differs."""
    import jax

    leaves = check_same_leaves(tree, twin)
    foreign = foreign_nodes(twin)
    if foreign:
        raise RuntimeError(f"the builtin-shape twin keeps library nodes: {foreign[:3]} "
                           f"({len(foreign)} in all)")
    ours, theirs = jax.tree_util.tree_structure(tree), jax.tree_util.tree_structure(twin)
    if ours.num_nodes != theirs.num_nodes:
        raise RuntimeError(f"the builtin-shape twin has {theirs.num_nodes} nodes, the tree "
                           f"{ours.num_nodes}: the mirror does not follow the library's flatten")
    return leaves


def prepared_against_twin(
    tree: Any, subject: Any, mirror: Callable[[Any], Any],
    make: Callable[[Any, Any], tuple[Callable[[], Any], Callable[[], Any]]], size: str,
) -> Prepared:
    """``make(subject, twin)``'s call and floor, for ``tree`` and its checked twin ``mirror(tree)``
    (``size`` names the model; the leaf count follows)."""
    twin = mirror(tree)
    leaves = check_builtin_twin(tree, twin)
    call, floor = make(subject, twin)
    return with_floor(call, floor, f"{size}, {leaves} leaves")


def with_floor(call: Callable[[], Any], floor: Callable[[], Any], size: str) -> Prepared:
    """A Prepared timing ``call`` against ``floor``; both results are fingerprinted."""

    def fingerprint(result: Any) -> str:
        return values_fingerprint(result) + values_fingerprint(floor())

    return Prepared(call, size, fingerprint=fingerprint, floor=floor)


def flatten_pair(tree: Any, twin: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """``jax.tree_util.tree_flatten``'s leaves, of the tree and of its twin."""
    import jax

    return (
        lambda: jax.tree_util.tree_flatten(tree)[0],
        lambda: jax.tree_util.tree_flatten(twin)[0],
    )


def unflatten_pair(tree: Any, twin: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """``jax.tree_util.tree_unflatten`` of each one's own treedef and leaves."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    twin_leaves, twin_treedef = jax.tree_util.tree_flatten(twin)
    return (
        lambda: jax.tree_util.tree_unflatten(treedef, leaves),
        lambda: jax.tree_util.tree_unflatten(twin_treedef, twin_leaves),
    )


def jit_on_arrays(arrays: list[Any]) -> Callable[[], Any]:
    """The jit floor: a ``jax.jit`` identity called on the arrays in a list (JAX's C++ dispatch
    on builtin containers and nothing else)."""
    import jax

    identity = jax.jit(_identity)
    return lambda: identity(arrays)


def _identity(x: Any) -> Any:
    return x
