"""fastree's benchmark suite: fastree against jax.tree_util, optree, dm-tree and torch's pytree.

Run it from the repository root with ``python -m benchmarks`` (``--help`` lists the options). The
package is layered; a module imports from its own package or from a layer below it, never above
(tests/test_benchmarks_layout.py checks this and that no import cycle exists):

1. ``data/``: what the benchmarks describe. The trees (``trees``: the recipe catalog, with
   ``leaves``, ``dict_orders``, ``custom_nodes``, ``identity_nodes``, ``nnx_models``) and the
   operations' names (``operations``).
2. ``workloads/``: end-to-end program fragments (equinox, optax, flax nnx, jit tracing, a
   checkpoint, single operations on an equinox model), one module per workload.
   ``libraries/``: the libraries under test, one adapter each, all exposing ``TreeApi``.
3. ``measure/``: the measuring. ``calls`` (how each op is called through an adapter),
   ``guard`` (a library is timed only where its leaves are JAX's), ``timing`` (interleaved
   rounds), ``stats`` (each ratio's interval, and why these statistics), ``memory``,
   ``workloads`` + ``child`` (plain and installed processes), ``results`` (the records),
   ``environment``, ``install``.
4. ``report/``: the stdout table, report.md, the headline chart (``chart``), the per-cell heat
   maps (``chart_details``), ``--publish`` (``publish``: benchmarks/published/ and the README's blocks; ``readme``), ``compare``.
5. The run: ``cli`` (options, parsed before JAX is imported), ``settings`` (what ``--quick``
   means), ``selection`` (``--only``), ``destination`` (each kind of run's folder, and when a
   run may replace what is there), ``runner``, ``__main__``; ``scaling`` and ``threads`` are scripts of
   their own (``python -m benchmarks.scaling``, ``python -m benchmarks.threads``).

``unsupported`` (the skip-with-a-note exception) sits below them all.
"""
