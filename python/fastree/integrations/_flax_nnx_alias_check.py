"""flax's ``extract.check_no_aliases`` served by fastree's own key-path walk: the function attach
binds (:func:`make_check_no_aliases`).

Every tree-mode transform (``nnx.jit(graph=False)``, ``nnx.grad``, ``nnx.vmap``, ...) calls it
on its arguments at each call: a ``jax.tree.leaves_with_path`` with the predicate
``lambda x: isinstance(x, variablelib.Variable)``, then a Python loop over the leaves. Installed,
the walk is already fastree's, but the predicate runs at every node, and ``Variable``'s metaclass
answers ``isinstance`` in Python (``VariableMeta.__instancecheck__``, which asks about
``HijaxVariable`` through a second Python ``__instancecheck__``). On a 20-block MLP with its adam
optimizer that check was two thirds of an installed ``nnx.jit(graph=False)`` call.

Here fastree's core runs the same key-path walk with a predicate in C that gives the same
answer for every object (:func:`_variable_check`), and builds the loop's dict in the same call
(``_core.nnx_variables_by_path``). Exact, or flax's own function:

- ``check=`` given (the transforms' checks of their outputs, at trace time), a walk that is off
  (``flax_nnx_graph.status()``), or a ``gc.callbacks`` function of the user's: flax's function.
- A Variable met twice (an alias): flax's function runs on the same arguments and raises its own
  error, with its own message.
- The first calls (:data:`_CHECKED_CALLS`) also run flax's function and compare: the same paths,
  in the same order, each with the same Variable object. On a difference flax's result is
  returned, and the walk is flax's from then on (``status()`` says why).

Nothing here imports flax: attach passes the modules it found loaded. JAX's ``Tracer`` is
``jax_interop.compat``'s, as for the graph walks.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from .. import _core
from ..jax_interop import compat as _jax_compat
from ._flax_nnx_alias_cache import AliasCache
from ._flax_nnx_graph_tables import Graph, served_now

# How many calls also run flax's check and compare results.
_CHECKED_CALLS = 3

WALK = "check_no_aliases"


def _variable_check(variablelib: Any) -> Any:
    """``isinstance(x, variablelib.Variable)`` as flax's predicate answers it, for one call: a
    builtin function of fastree's core (``csrc/nnx/nnx_tree_variables.cpp``), no Python frame.

    ``VariableMeta.__instancecheck__`` answers True where ``type.__instancecheck__`` does (its
    ``super()`` call); else it looks for a ``jax.core.Tracer`` (``jax.typeof``) or a
    ``HijaxVariable`` (whose metaclass asks ``type.__instancecheck__`` and about tracers again).
    An object that is neither (``Tracer`` has no metaclass of its own, so the plain type check is
    its ``isinstance``) is no Variable. For the rare objects that are, flax's own ``isinstance``
    answers. The core makes each ``type.__instancecheck__`` as CPython does, ``__class__`` read
    included, and each is one flax's path also makes: no user code (a ``__class__`` property)
    runs that flax's would not. The classes are read at each call, as flax's lambda reads them.
    """
    return _core.nnx_variable_check(
        variablelib.Variable, _jax_compat.Tracer, getattr(variablelib, "HijaxVariable", None))


def make_check_no_aliases(graph: Graph, extract: Any, variablelib: Any) -> Any:
    """flax's ``check_no_aliases`` (as ``graph.flax_check_no_aliases`` holds it), served here."""
    theirs = graph.flax_check_no_aliases
    labeled = extract.labeled
    variables_by_path = _core.nnx_variables_by_path
    checked = {"calls": 0}
    lock = threading.Lock()
    cache = AliasCache()

    @functools.wraps(theirs)
    def check_no_aliases(fn_name: str, /, *, check: Any = (), **kwargs: Any) -> Any:
        if check or not served_now(graph, WALK):
            return theirs(fn_name, check=check, **kwargs)
        is_variable = _variable_check(variablelib)
        tree = labeled(**kwargs)
        # The last calls' answer where these arguments still walk to it (_flax_nnx_alias_cache);
        # else the walk, flax's loop and its dict in one call of the core (None: an alias).
        ours = cache.lookup(is_variable, tree)
        fresh = None
        if ours is None:
            ours, treedef, positions = variables_by_path(is_variable, tree, True)
            if ours is None:
                return theirs(fn_name, check=check, **kwargs)  # raises flax's own error
            fresh = (treedef, positions)
        with lock:
            compare = checked["calls"] < _CHECKED_CALLS
            checked["calls"] += 1
        if compare:  # cached or not, the first answers are flax's too
            result = _compared(graph, ours, theirs(fn_name, check=check, **kwargs))
            if result is not ours:
                cache.clear()
                return result
        if fresh is not None:
            cache.store(tree, ours, *fresh)
        return ours

    return check_no_aliases


def _compared(graph: Graph, ours: dict[Any, Any], theirs: dict[Any, Any]) -> dict[Any, Any]:
    # The first calls: the same paths, in the same order, each naming the same object. Else
    # flax's result, and flax's function from now on.
    same = (type(theirs) is dict and list(ours) == list(theirs)
            and all(ours[path] is theirs[path] for path in ours))
    if same:
        return ours
    graph.function_fallbacks.setdefault(
        WALK, "its result differed from flax's on a checked call")
    return theirs
