"""flax's ``extract.apply_updates`` served by fastree's core: the function attach binds
(:func:`make_apply_updates`).

After each tree-mode transform call (``nnx.jit(graph=False)``, ``nnx.grad``, ``nnx.vmap``, ...),
flax writes back each Variable the traced function changed: for each ``(path, update)`` of the
returned ``Updates``, ``variables[path].update_from_state(update)``, where ``variables`` is
``check_no_aliases``'s dict. In Python that is two dict lookups by a key path, an ``isinstance``
through ``VariableMeta``, and ``update_from_state``'s two ``Variable.__setattr__`` calls, each
asking JAX for the current trace.

``_core.nnx_apply_updates`` (``csrc/nnx/nnx_tree_variables.cpp``) does the same steps with graph
mode's Variable update (``csrc/nnx/nnx_graph_variables.h``): plain Variable classes natively, the
current trace asked of JAX once per call. It first finds every Variable; where one is missing or
is not a plain Variable, or the arguments are not what flax's transforms pass, it applies nothing
and flax's function runs (and raises its own error, or calls a subclass's own method). flax's
function also runs while another thread holds the graph walks' lock, while the walk is off
(``flax_nnx_graph.status()["apply_updates"]``), and with a user's ``gc.callbacks`` function.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import _core
from ._flax_nnx_graph_tables import Graph, served_now

WALK = "apply_updates"


def make_apply_updates(graph: Graph, extract: Any) -> Any:
    """flax's ``apply_updates`` (as ``graph.flax_apply_updates`` holds it), served here."""
    theirs = graph.flax_apply_updates
    updates_type = extract.Updates
    native = _core.nnx_apply_updates

    @functools.wraps(theirs)
    def apply_updates(variables: Any, updates: Any) -> None:
        if not served_now(graph, WALK) or not graph.lock.acquire(blocking=False):
            return theirs(variables, updates)
        try:
            graph.refresh()
            applied = native(variables, updates, updates_type, graph.unflatten_context)
        finally:
            graph.lock.release()
        if not applied:
            return theirs(variables, updates)
        return None

    return apply_updates
