"""Attribute nodes read from many threads while their per-node state changes (issue 45, step 6).

One AttrNode per class is shared by every thread (csrc/registry/attr_node.h). What it keeps
between reads, docs/threads.md rows A4-A7: the last aux tuple and its aux-check stamp, the last
metadata items of a meta_items node, the checker's counters and the switch to the library, the
checker and library functions themselves (replaced by check_with), and the mapping layout's
memo. Here those change while seven other threads read instances:

* classes registered with ``fastree.register_attribute_node`` (equinox-like: data fields and a
  meta field), instances whose meta values differ so the shared last aux tuple is replaced at
  every read, walked by tree_flatten / tree_map / tree_leaves / tree_flatten_with_path;
* a node with a checker (``check_with``): exactly ``checks`` checks run in total, whichever
  threads read the first instances, and one that says "differs" sends the class to its library
  functions for good, with the same results;
* ``check_with`` called again and again while other threads read (the functions swapped under
  them), or switch the node to the library (which registers the functions it holds);
* a meta_items node (flax.nnx's Variable layout) and a mapping node (flax.nnx's Pytree layout)
  whose memos are replaced at every read.

Every result is compared with the single-threaded one, exactly. No library (equinox, flax, chex)
is imported: the layouts are built from ``fastree._core.AttrNode`` as the integrations build them.
"""

from __future__ import annotations

import threading

import fastree
import fastree.tree_util as tu
import jax.tree_util as jtu
from concurrency_harness import THREADS, check, isolated, run_threads
from fastree import _core

ITERATIONS = 300


class Linear:
    """An equinox-like module: children as attributes, a static meta field."""

    def __init__(self, weight, bias, activation):
        self.weight, self.bias, self.activation = weight, bias, activation


fastree.register_attribute_node(Linear, ["weight", "bias"], ["activation"])


def _layers():
    # Meta values alternate between instances: each regular read whose values differ from the
    # last replaces the node's last_aux (A4), on every thread at once.
    return [Linear(k, [k, k + 1], ("relu", "gelu", "tanh")[k % 3]) for k in range(12)]


def _results(tree):
    leaves, treedef = tu.tree_flatten(tree)
    return {
        "flatten": (leaves, treedef),
        "leaves": tu.tree_leaves(tree),
        "paths": tu.tree_flatten_with_path(tree)[0],
        "map": tu.tree_structure(tu.tree_map(lambda x: x, tree)),
        "unflatten": tu.tree_leaves(tu.tree_unflatten(treedef, leaves)),
    }


def _compare(got, expected, what):
    for name, value in expected.items():
        check(got[name], value, f"{what}: {name}")


def _shared_layers_workload():
    layers = _layers()
    expected = [_results(layer) for layer in layers]
    expected_all = _results(layers)

    def work(k):
        for i in range(ITERATIONS):
            j = (k + i) % len(layers)
            _compare(_results(layers[j]), expected[j], f"layer {j}")
            if i % 20 == 0:
                _compare(_results(layers), expected_all, "all layers")
        return ITERATIONS

    assert run_threads(work) == [ITERATIONS] * THREADS


def test_shared_attribute_nodes_with_changing_aux():
    isolated(_shared_layers_workload)


def _checked_class(name):
    return type(name, (), {"__init__": lambda self, a, b: self.__dict__.update(a=a, b=b)})


def _library_functions(cls, via):
    def flatten(obj):
        via.append(1)
        return (obj.a,), (obj.b,)

    def flatten_with_keys(obj):
        via.append(1)
        return ((jtu.GetAttrKey("a"), obj.a),), (obj.b,)

    def unflatten(aux, children):
        out = cls.__new__(cls)
        out.a, out.b = children[0], aux[0]
        return out

    return flatten, flatten_with_keys, unflatten


def _checker_counts_workload():
    cls = _checked_class("CheckedTogether")
    node = _core.AttrNode(cls, ["a"], ["b"])
    calls = []
    lock = threading.Lock()

    def checker(obj):
        with lock:
            calls.append(obj.a)
        return True  # the same as the library: stays native

    checks = 5
    node.check_with(checker, *_library_functions(cls, []), checks=checks)
    jtu.register_pytree_with_keys(cls, node.flatten_with_keys, node.unflatten, node.flatten)
    _core.register_attribute_node(node)
    objs = [cls(k, "static") for k in range(THREADS * 4)]
    expected = [_results(o) for o in objs]  # runs the checks single-threaded: reset after
    node.check_with(checker, *_library_functions(cls, []), checks=checks)
    calls.clear()

    def work(k):
        for i in range(ITERATIONS // 3):
            j = (k * 4 + i) % len(objs)
            _compare(_results(objs[j]), expected[j], f"instance {j}")
        return True

    assert run_threads(work) == [True] * THREADS
    # Each check taken once (A5): never more than asked, whatever the interleaving.
    assert len(calls) == checks, calls
    assert node.checks_left == 0
    assert not node.use_library


def test_checks_on_first_instances_counted_across_threads():
    isolated(_checker_counts_workload)


def _checker_switches_workload():
    cls = _checked_class("SwitchedTogether")
    node = _core.AttrNode(cls, ["a"], ["b"])
    via = []
    verdicts = iter([True] + [False] * 1000)
    lock = threading.Lock()

    def checker(obj):
        with lock:
            return next(verdicts)

    node.check_with(checker, *_library_functions(cls, via), checks=4)
    jtu.register_pytree_with_keys(cls, node.flatten_with_keys, node.unflatten, node.flatten)
    _core.register_attribute_node(node)
    objs = [cls(k, ("x", k % 2)) for k in range(16)]
    # What the native node and the library both give (same layout): computed with a plain
    # native node of another class, then compared by leaves and aux.
    expected = [([o.a], (o.b,)) for o in objs]

    def work(k):
        for i in range(ITERATIONS // 3):
            j = (k + i) % len(objs)
            leaves, treedef = tu.tree_flatten(objs[j])
            check(leaves, expected[j][0], f"instance {j} leaves")
            check(treedef.node_data()[1], expected[j][1], f"instance {j} aux")
            rebuilt = tu.tree_unflatten(treedef, leaves)
            check((rebuilt.a, rebuilt.b), (objs[j].a, objs[j].b), f"instance {j} rebuilt")
        return True

    assert run_threads(work) == [True] * THREADS
    assert node.use_library  # the second check said "differs"
    assert via, "the library's functions never ran after the switch"


def test_a_failed_check_switches_every_thread_to_the_library():
    isolated(_checker_switches_workload)


SWITCH_ROUNDS = 24


def _switch_met_midway_workload():
    # Every thread reads one instance until it has seen the switch, while the checks fail: with
    # one check, the others meet the switch set by a thread still publishing the class's custom
    # record; with a check per thread, several threads switch at once. Each thread's read after
    # it saw the switch must find the one custom record the switch published (never a
    # SystemError, never a second record: treedefs of two records differ).
    for round_ in range(SWITCH_ROUNDS):
        cls = _checked_class(f"MetMidway{round_}")
        node = _core.AttrNode(cls, ["a"], ["b"])
        node.check_with(lambda obj: False, *_library_functions(cls, []),
                        checks=1 if round_ % 2 == 0 else THREADS)
        jtu.register_pytree_with_keys(cls, node.flatten_with_keys, node.unflatten, node.flatten)
        _core.register_attribute_node(node)
        obj = cls(round_, "static")

        def work(k, obj=obj, node=node):
            for reads in range(1, 100_000):
                seen = node.use_library
                leaves, treedef = tu.tree_flatten(obj)
                check(leaves, [obj.a], f"round {round_} read {reads} leaves")
                if seen:
                    return treedef
            raise AssertionError(f"round {round_}: the switch was never seen")

        treedefs = run_threads(work)
        final = tu.tree_structure(obj)
        for k, treedef in enumerate(treedefs):
            check(treedef, final, f"round {round_}, thread {k}'s treedef after the switch")
        check(tu.tree_unflatten(final, [7]).a, 7, f"round {round_} rebuilt")


def test_threads_that_meet_the_switch_midway_find_its_one_record():
    isolated(_switch_met_midway_workload)


def _check_with_swapped_workload():
    # Thread 0 replaces the checker and the library functions again and again (A6) while the
    # others read instances the library answers for (irregular: an extra attribute) and ask the
    # node's unflatten; each call must find a live function, never one just released.
    cls = _checked_class("Swapped")
    node = _core.AttrNode(cls, ["a"], ["b"])
    jtu.register_pytree_with_keys(cls, node.flatten_with_keys, node.unflatten, node.flatten)
    _core.register_attribute_node(node)
    regular = [cls(k, "s") for k in range(8)]
    irregular = []
    for k in range(8):
        obj = cls(k, "s")
        obj.extra = k  # its __dict__ holds other than the fields
        irregular.append(obj)

    def install():
        # Fresh closures each time: the old ones die when replaced.
        node.check_with(lambda obj: True, *_library_functions(cls, []), checks=1,
                        irregular_checks=1)

    install()
    expected = [([o.a], (o.b,)) for o in regular + irregular]

    def work(k):
        if k == 0:
            for _ in range(ITERATIONS * 4):
                install()
            return True
        for i in range(ITERATIONS):
            j = (k + i) % len(expected)
            obj = (regular + irregular)[j]
            leaves, treedef = tu.tree_flatten(obj)
            check(leaves, expected[j][0], f"object {j} leaves")
            check(treedef.node_data()[1], expected[j][1], f"object {j} aux")
            children, aux = node.flatten(obj)
            check((list(children), aux), expected[j], f"object {j} node.flatten")
            check(node.unflatten(aux, children).a, obj.a, f"object {j} node.unflatten")
        return True

    assert run_threads(work) == [True] * THREADS


def test_check_with_replaced_during_reads():
    isolated(_check_with_swapped_workload)


def _switch_while_swapped_workload():
    # Thread 0 replaces the library functions again and again while the others switch the node
    # to the library (use_library = True registers the library's functions for the class, read
    # from the node): the registration must take functions that stay alive while it runs, never
    # ones check_with has just released (ThreadSanitizer found them read borrowed).
    cls = _checked_class("Switched")
    node = _core.AttrNode(cls, ["a"], ["b"])
    jtu.register_pytree_with_keys(cls, node.flatten_with_keys, node.unflatten, node.flatten)
    _core.register_attribute_node(node)
    objs = [cls(k, "s") for k in range(8)]

    def install():
        node.check_with(lambda obj: True, *_library_functions(cls, []), checks=1)

    install()

    def work(k):
        if k == 0:
            for _ in range(ITERATIONS * 2):
                install()
            return True
        for i in range(ITERATIONS // 2):
            node.use_library = True
            obj = objs[(k + i) % len(objs)]
            leaves, treedef = tu.tree_flatten(obj)
            check(leaves, [obj.a], "leaves after the switch")
            check(tu.tree_unflatten(treedef, leaves).a, obj.a, "rebuilt after the switch")
        return True

    assert run_threads(work) == [True] * THREADS


def test_switching_to_the_library_while_check_with_replaces_it():
    isolated(_switch_while_swapped_workload)


class Var:
    """flax.nnx's Variable layout: a value slot and a metadata dict."""

    __slots__ = ("_raw_value", "_var_metadata")

    @classmethod
    def _new(cls, value, metadata):
        obj = object.__new__(cls)
        obj._raw_value, obj._var_metadata = value, metadata
        return obj


class Flags:
    def __init__(self, mapping):
        self._mapping = dict(mapping)


class Holder:
    _pytree__has_int_keys = False


def _holder(flags, attrs):
    obj = object.__new__(Holder)
    obj.__dict__["_pytree__nodes"] = Flags(flags)
    obj.__dict__.update(attrs)
    return obj


def _memo_nodes_workload():
    var_node = _core.AttrNode(
        Var, ("_raw_value",), ("_var_metadata",), meta_items=True, key_names=("value",),
        rebuild_with="_new",
    )
    map_node = _core.AttrNode(
        Holder, (), mapping=("_pytree__nodes", Flags, "_mapping", "_pytree__has_int_keys")
    )
    # Metadata of immortal values, in two shapes: each read of the other shape replaces the
    # node's kept items (A4); Holder instances in three layouts replace the mapping memo (A7).
    variables = [
        Var._new(k, {"ref": False, "tag": None} if k % 2 else {"n": k % 3, "hijax": True})
        for k in range(12)
    ]
    holders = [
        _holder({"w": True, "b": True}, {"w": 1, "b": 2, "name": "x"}),
        _holder({"w": True}, {"w": 3, "name": "y", "scale": 4}),
        _holder({"a": True, "z": True}, {"z": 5, "a": 6}),
    ]
    expected_vars = [var_node.flatten(v) for v in variables]
    expected_holders = [map_node.flatten(h) for h in holders]

    def work(k):
        for i in range(ITERATIONS * 2):
            j = (k + i) % len(variables)
            check(var_node.flatten(variables[j]), expected_vars[j], f"variable {j}")
            h = (k + i) % len(holders)
            check(map_node.flatten(holders[h]), expected_holders[h], f"holder {h}")
        return True

    assert run_threads(work) == [True] * THREADS


def test_meta_items_and_mapping_memos_replaced_during_reads():
    isolated(_memo_nodes_workload)
