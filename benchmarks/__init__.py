"""fastree's benchmark suite: fastree against jax.tree_util, optree, dm-tree and torch's pytree.

Run it from the repository root with ``python -m benchmarks`` (``--help`` lists the options). The
package is laid out one concern per module:

- ``cli``: command-line options, parsed before JAX is imported (the sharded leaves need XLA_FLAGS);
  ``selection``: what ``--only`` matches.
- ``settings``: what ``--quick`` and the full run mean (time per repeat, repeats, leaf kinds).
- ``leaves`` / ``trees`` / ``dict_orders`` / ``custom_nodes`` / ``nnx_models``: the inputs.
- ``libraries/``: one adapter per library, all exposing the same ``TreeApi`` (``libraries/base``).
- ``ops``: how each operation is called through a ``TreeApi``.
- ``timing`` / ``memory`` / ``guard``: how a case is measured and checked.
- ``runner``: the loop over cases; ``results``: the records it produces; ``environment``: the
  machine and versions recorded with them; ``unsupported``: the skip-with-a-note exception.
- ``workloads/``: end-to-end program fragments (equinox, optax, flax nnx, jit tracing, a
  checkpoint), each timed plain and inside ``fastree.installed()``, one module per workload.
- ``report/``: stdout table, markdown report, the headline chart (``chart``) and the per-tree one
  (``chart_details``) in one palette (``palette``), and ``--write-results`` (``report/publish``).
"""
