"""The registry's tables on many threads: the records, the registered types and the per-type
memo behind one lock (csrc/registry/registry_state.h, RegistryState; docs/threads.md R2-R5, R7).

* Types registered with JAX alone are adopted by the first classification that meets them. JAX's
  registry lookup runs without the lock, so threads meeting the same new types at once each find
  them there; the insert re-checks, and each type is adopted exactly once: one record per type,
  every thread flattening it the same way.
* Many classes registered on several threads at once while the others flatten instances of the
  classes registered so far: a record is published whole, so a walk that finds the new class
  registered never sees a record half filled.
* Classes made and dropped on every thread while the others classify: a dying class's weakref
  callback (made once, at module init) erases its memo entry from whichever thread the collector
  or the last release runs on, and a new class at a dead one's address never inherits its answer
  (a leaf class and a namedtuple class alternate, so an inherited answer would be wrong).
"""

from __future__ import annotations

import collections
import gc
import re

import fastree.tree_util as tu
import jax
from concurrency_harness import THREADS, check, isolated, run_threads
from fastree import _core

ROUNDS = 10
TYPES_PER_ROUND = 150


def _registrations() -> int:
    """The number of records the core holds (its module state's repr)."""
    found = re.search(r"(\d+) registrations", repr(_core._module_state))
    assert found is not None, repr(_core._module_state)
    return int(found.group(1))


def _jax_only_classes(r: int):
    """TYPES_PER_ROUND new classes registered with JAX alone (fastree adopts them)."""
    classes = []
    for i in range(TYPES_PER_ROUND):
        init = lambda self, a, b: setattr(self, "ab", (a, b))  # noqa: E731
        cls = type(f"JaxOnly{r}_{i}", (), {"__init__": init})
        jax.tree_util.register_pytree_node(
            cls, lambda o: (o.ab, None), lambda _, c, cls=cls: cls(*c)
        )
        classes.append(cls)
    return classes


def _adoption_workload():
    for r in range(ROUNDS):
        classes = _jax_only_classes(r)
        before = _registrations()
        tree = [cls(i, [i, r]) for i, cls in enumerate(classes)]
        expected = [x for i in range(TYPES_PER_ROUND) for x in (i, i, r)]

        def work(k, classes=classes, tree=tree, expected=expected):
            # Each thread meets the types from its own starting point (a type is met by the
            # thread starting there and the one before it, about at once): half of them through
            # is_node_type, half through a flatten of the instances in that order.
            start = (k // 2) * 2 * TYPES_PER_ROUND // THREADS
            if k % 2:
                order = classes[start:] + classes[:start]
                check([_core.is_node_type(c) for c in order], [True] * TYPES_PER_ROUND, "nodes")
            else:
                part = tree[start:] + tree[:start]
                check(len(tu.tree_leaves(part)), len(expected), f"round {r} thread {k}: part")
            leaves, td = tu.tree_flatten(tree)
            check(leaves, expected, f"round {r} thread {k}: leaves")
            check(td.num_leaves, len(expected), f"round {r} thread {k}: treedef")
            return True

        run_threads(work)
        check(_registrations() - before, TYPES_PER_ROUND, f"round {r}: records added")


def test_jax_only_types_adopted_once_by_racing_classifications():
    isolated(_adoption_workload)


class _Base:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is type(self) and (self.x, self.y) == (other.x, other.y)


def _registering_workload():
    # Threads 0..REGISTERING-1 register classes; the rest flatten instances of every class
    # published so far (a list that only grows: an append is atomic).
    registering = THREADS // 2
    per_thread = 60
    published: list[type] = []

    def register(k):
        for i in range(per_thread):
            cls = type(f"Reg{k}_{i}", (_Base,), {})
            if i % 3 == 0:
                tu.register_pytree_node(
                    cls, lambda o: ((o.x, o.y), None), lambda _, c, c_=cls: c_(*c)
                )
            elif i % 3 == 1:
                tu.register_dataclass(cls, data_fields=["x", "y"], meta_fields=[])
            else:
                tu.register_pytree_with_keys(
                    cls,
                    lambda o: (((tu.GetAttrKey("x"), o.x), (tu.GetAttrKey("y"), o.y)), None),
                    lambda _, c, c_=cls: c_(*c),
                )
            published.append(cls)
        return per_thread

    def flatten(k):
        seen = 0
        for i in range(per_thread * 2):
            classes = list(published)
            tree = [cls(j, (k, i)) for j, cls in enumerate(classes)]
            leaves = tu.tree_leaves(tree)
            expected = [x for j in range(len(classes)) for x in (j, k, i)]
            check(leaves, expected, f"thread {k}: leaves")
            rebuilt = tu.tree_unflatten(tu.tree_structure(tree), leaves)
            check(rebuilt, tree, f"thread {k}: unflatten")
            seen = max(seen, len(classes))
        return seen

    results = run_threads(lambda k: register(k) if k < registering else flatten(k))
    check(results[:registering], [per_thread] * registering, "registered")
    check(len(published), registering * per_thread, "published")
    every = [cls(1, 2) for cls in published]
    check(tu.tree_leaves(every), [1, 2] * len(published), "afterwards")


def test_registrations_racing_flattens_of_the_new_classes():
    isolated(_registering_workload)


def _type_death_workload():
    iterations = 150

    def work(k):
        for i in range(iterations):
            if (i + k) % 2:
                cls = collections.namedtuple(f"Pair{k}", ["a", "b"])
                check(tu.tree_leaves(cls(k, [i])), [k, i], f"thread {k} step {i}: namedtuple")
            else:
                cls = type(f"Leaf{k}", (), {})
                obj = cls()
                check(tu.tree_leaves([obj, i]), [obj, i], f"thread {k} step {i}: leaf class")
                del obj
            check(_core.is_node_type(cls), bool((i + k) % 2), f"thread {k} step {i}: is_node_type")
            del cls
            if i % 10 == k % 10:
                gc.collect()  # the classes die here (each sits in a cycle), on this thread
        return iterations

    check(run_threads(work), [iterations] * THREADS, "iterations")


def test_classes_dying_while_others_classify():
    isolated(_type_death_workload)
