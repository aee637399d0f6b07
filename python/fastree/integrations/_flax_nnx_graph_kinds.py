"""The kinds of type flax's graph walks meet: the codes of ``enum Kind`` in csrc/nnx/nnx_graph.h,
which the Python side's table (``flax_nnx_graph._Graph``) hands the C walks. Kept here once for
the modules that classify and check (flax_nnx_graph, _flax_nnx_graph_compare,
_flax_nnx_graph_user_code)."""

from __future__ import annotations

LEAF, ARRAY_LEAF, VARIABLE, NNX_PYTREE, GRAPH_NODE, PYTREE_NODE = range(6)
LIST, TUPLE, NONE, DICT, UNSERVED, PYTREE_STATE, GENERIC_PYTREE = range(6, 13)

# Kinds with nothing native to check: the walk calls the type's own (Python) functions, and a
# check would call them a second time (a flatten with side effects would see its own effects).
# Unserved types never reach the walk.
CALLS_ITS_OWN = (GRAPH_NODE, PYTREE_NODE, UNSERVED)
