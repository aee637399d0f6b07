"""install()/uninstall() on one thread while the others flatten through JAX's and fastree's names.

install() replaces module attributes of jax.tree_util and jax.tree (python/fastree/_install.py,
under its lock) and switches the aux_data hooks off for routed calls ("auto"); uninstall() puts
both back. A thread calling ``jax.tree_util.tree_leaves`` meets JAX's function or fastree's,
whichever is there at that moment: either gives the same answer. Threads also open and close
``fastree.installed()`` blocks, which count across threads.
"""

from __future__ import annotations

import fastree
import fastree.tree_util as tu
import jax
from concurrency_harness import THREADS, check, isolated, run_threads
from concurrency_trees import SHARED, make_tree

ITERATIONS = 150
TOGGLES = 150


def _through_jax(tree):
    return {
        "leaves": jax.tree_util.tree_leaves(tree),
        "map": jax.tree.map(lambda x: x * 2, tree),
        "with_path": jax.tree_util.tree_leaves_with_path(tree),
        "map_with_path": jax.tree_util.tree_map_with_path(lambda p, x: (len(p), x), tree),
        "reduce": jax.tree.reduce(lambda a, b: a + 1, tree, 0),
    }


def _through_fastree(tree):
    leaves, td = tu.tree_flatten(tree)
    return {"leaves": leaves, "unflatten": tu.tree_unflatten(td, leaves), "repr": repr(td)}


def _install_workload():
    was_installed = fastree.is_installed()
    trees = SHARED + [make_tree(k) for k in range(THREADS)]
    fastree.uninstall()
    expected_jax = [_through_jax(t) for t in trees]
    expected_fastree = [_through_fastree(t) for t in trees]
    fastree.install()
    # The premise: routed, the answers are the same.
    assert [_through_jax(t) for t in trees] == expected_jax
    assert [_through_fastree(t) for t in trees] == expected_fastree
    fastree.uninstall()

    def toggler():
        for _ in range(TOGGLES):
            fastree.install()
            check(jax.tree.map is fastree.tree.map, True, "installed")
            fastree.uninstall()
        return TOGGLES

    def walker(k):
        for i in range(ITERATIONS):
            j = (k + i) % len(trees)
            if i % 10 == 0:
                with fastree.installed():  # counted: install stays until the last block ends
                    got = _through_jax(trees[j])
            else:
                got = _through_jax(trees[j])
            for name, value in expected_jax[j].items():
                check(got[name], value, f"tree {j} through JAX's names: {name}")
            got = _through_fastree(trees[j])
            for name, value in expected_fastree[j].items():
                check(got[name], value, f"tree {j} through fastree's: {name}")
        return ITERATIONS

    try:
        results = run_threads(lambda k: toggler() if k == 0 else walker(k))
        assert results == [TOGGLES] + [ITERATIONS] * (THREADS - 1)
        # Every block closed and the toggler's last word was uninstall.
        assert not fastree.is_installed()
    finally:
        (fastree.install if was_installed else fastree.uninstall)()


def test_install_uninstall_racing_walks():
    isolated(_install_workload)
