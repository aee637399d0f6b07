"""flax's graph flatten, given the node functions' results a native walk already got.

Twice flax's ``graphlib.flatten`` runs over a graph the native walk (``csrc/nnx``) has just
walked: a first walk's check compares the two results, and a walk the native code does not
serve (an array ref, a Variable with its own accessors...) hands the whole call to flax. In both,
each node's ``node_impl.flatten(node)`` would run a second time. For flax's own impls that is a
read nobody sees; for a user's (a custom graph node, a jax pytree registered with Python
functions) it is a second call that counts, allocates or logs, which flax alone never makes.

So flax's function runs here as it is (its own code objects) over a namespace in which
``get_node_impl`` hands out, for each node the native walk flattened, the impl with a ``flatten``
that returns the native walk's results for that node, in the order they were made. A node the
native walk did not flatten (or flattened fewer times) gets its impl's own function; a check's
replay is strict there, and stops (:class:`Diverged`) rather than call a user's function. Nothing
global is changed: other threads, and other walks on this one, see flax's module as it is.

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Impl:  # stands in for flax's frozen impl dataclasses
...     flatten: object
>>> calls = []
>>> impl = Impl(lambda node: calls.append(node) or ([("a", 1)], None))
>>> node = object()
>>> replayed = _replayed_impl(impl, node, [([("a", 2)], "native")])
>>> type(replayed) is Impl, replayed.flatten(node), calls
(True, ([('a', 2)], 'native'), [])
>>> replayed.flatten(node) == ([("a", 1)], None), len(calls)  # the results ran out
(True, 1)
>>> strict = _replayed_impl(impl, node, [], user_code=lambda impl, target: True)
>>> try:
...     strict.flatten(node)
... except Diverged:
...     print("Diverged, and still", len(calls), "call")
Diverged, and still 1 call
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any


class Diverged(Exception):
    """flax's replayed walk reached a node the native walk never flattened, whose flatten is a
    user's: the graph changed under the native walk (a user's flatten edited a part already
    walked), and that call would be one flax alone never makes. Raised instead of making it."""


def _replayed_impl(impl: Any, node: Any, results: list[Any], user_code: Any = None) -> Any:
    # A copy of flax's impl, of the same class (the walk tests `type(node_impl) is ...`).
    # `results` is consumed front to back, one per call on `node` (the native walk flattens a
    # pytree node met twice twice, as flax's does). `user_code(impl, node)`, where given: whether
    # a call beyond the results would run a user's function (then Diverged).
    own_flatten = impl.flatten

    def flatten(target: Any) -> Any:
        if target is node and results:
            return results.pop(0)
        if user_code is not None and user_code(impl, target):
            raise Diverged
        return own_flatten(target)

    return dataclasses.replace(impl, flatten=flatten)


def replaying_flatten(graphlib: Any, flax_flatten: Any, flax_graph_flatten: Any,
                      called: list[Any], user_code: Any = None) -> Any:
    """``flax_flatten`` (graphlib's own ``flatten``) run over a namespace whose
    ``get_node_impl`` replays ``called`` ([node, result, ...], a native walk's calls).

    ``flax_flatten`` and ``flax_graph_flatten`` are the functions the code gate fingerprinted
    (``flatten`` and ``_graph_flatten`` as attach found them): module functions of graphlib,
    with no closure, whose copies here run the same code over a namespace of graphlib's. A
    function that is not so (never one the gate let through) is not copied: None is returned,
    and the caller runs no replay.

    ``user_code(impl, node)``, where given, makes the replay strict: a node flattened beyond
    what the native walk recorded, by a user's function, raises :class:`Diverged` rather than
    run it."""
    if not called:
        # No node function ran in the native walk: nothing to replay, and no user's code that
        # could have changed the graph since.
        return flax_flatten
    own_functions = {"flatten": flax_flatten, "_graph_flatten": flax_graph_flatten}
    if any(type(own) is not types.FunctionType or own.__closure__ is not None
           or own.__globals__ is not vars(graphlib) for own in own_functions.values()):
        return None
    # id -> (the node, its results). The node is held here, so no other object takes its id
    # while the walk runs: an id found is that node.
    results: dict[int, tuple[Any, list[Any]]] = {}
    for node, result in zip(called[0::2], called[1::2]):
        results.setdefault(id(node), (node, []))[1].append(result)
    flax_get_node_impl = graphlib.get_node_impl

    def get_node_impl(x: Any) -> Any:
        impl = flax_get_node_impl(x)
        if impl is None:
            return impl
        entry = results.get(id(x))
        if entry is None or not entry[1]:
            return impl if user_code is None else _replayed_impl(impl, x, [], user_code)
        return _replayed_impl(impl, x, entry[1], user_code)

    namespace = dict(vars(graphlib))
    namespace["get_node_impl"] = get_node_impl
    for name, own in own_functions.items():
        copy = types.FunctionType(own.__code__, namespace, own.__name__, own.__defaults__)
        copy.__kwdefaults__ = own.__kwdefaults__
        namespace[name] = copy
    return namespace["flatten"]
