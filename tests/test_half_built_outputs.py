"""No output container is reachable from Python code before it is complete.

A list or tuple made with ``PyList_New`` / ``PyTuple_New`` is GC-tracked from birth, with empty
slots. If a walker makes it first and then fills it while running Python code (f, a custom
flatten, a property, a key maker, or any allocation, which can run the cyclic GC and its
finalizers), that code can find it through ``gc.get_referrers`` / ``gc.get_objects``: reading an
empty slot crashes, and resizing it frees the slots the walker writes to. Every walker
makes its outputs' items first and the container last (``NewSequenceOf`` in
``csrc/util/pyutils.h``, ``MapSequence`` in ``csrc/treedef/map_single_pass.cpp``).

These tests play the hostile program in a child interpreter (a crash fails the test instead of
ending the run), over every entry point that builds a container:

* introspecting callbacks: f / flatten / property code that looks for every list and tuple
  referring to its argument, resizes the lists and reads the tuples;
* finalizers: garbage cycles with a ``__del__`` that reads every list and tuple the GC knows,
  collected on every allocation (``gc.set_threshold(1)``) while the walkers run.
"""

from __future__ import annotations

import textwrap

from helpers import run_script_results

_PRELUDE = textwrap.dedent(
    """
    import collections, dataclasses, gc, pickle, sys
    import fastree.tree_util as tu
    import fastree.tree as ft

    Point = collections.namedtuple("Point", "x y")

    PROTECTED = set()  # ids of the inputs' own containers: only the walkers' are meddled with

    def meddle(x):
        # Every list and tuple referring to x: lists are emptied and refilled, tuples read.
        for r in gc.get_referrers(x):
            if id(r) in PROTECTED:
                continue
            if type(r) is list and len(r) >= 3:
                r.clear()
                r.extend(bytearray(8) for _ in range(200))
            elif type(r) is tuple:
                repr(r)

    class Marker:
        pass

    def protect(*trees):
        # The inputs' own containers (lists, tuples, dicts, anything holding a Marker).
        stack = list(trees)
        while stack:
            t = stack.pop()
            if id(t) in PROTECTED or isinstance(t, Marker):
                continue
            PROTECTED.add(id(t))
            if isinstance(t, (list, tuple)):
                stack.extend(t)
            elif isinstance(t, dict):
                stack.extend(t.values())
            elif hasattr(t, "__dict__"):
                stack.append(vars(t))
    """
)


def _run(body: str) -> dict[str, str]:
    results, proc = run_script_results(_PRELUDE + textwrap.dedent(body))
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    return results


def test_tree_map_output_is_not_reachable_from_f():
    results = _run(
        """
        makers = (list, tuple, lambda xs: Point(xs[0], xs[1:]), lambda xs: dict(enumerate(xs)))
        for make in makers:
            for warm in range(2):  # cold (the type memo is empty) and warm (the fast paths)
                items = [Marker() for _ in range(50)]
                src = make(items)
                outer = [src, (src,)]
                PROTECTED.clear()
                protect(items, outer)
                def f(x):
                    meddle(x)
                    return 1
                out = tu.tree_map(f, src)
                assert tu.tree_leaves(out) == [1] * len(tu.tree_leaves(src)), out
                out = tu.tree_map(f, outer)
                assert tu.tree_leaves(out) == [1] * (2 * len(tu.tree_leaves(src)))
        print("ok=1")
        """
    )
    assert results["ok"] == "1"


def test_outputs_are_not_reachable_from_flatten_callbacks_and_properties():
    results = _run(
        """
        class Box:
            def __init__(self, items):
                self.items = items

        def box_flatten(b):
            for item in b.items:
                meddle(item)
            return list(b.items), None

        tu.register_pytree_node(Box, box_flatten, lambda _, c: Box(list(c)))

        @tu.register_dataclass
        @dataclasses.dataclass
        class Cell:
            a: object
            b: object
            c: object

        class MeddlingCell(Cell):
            @property
            def b(self):
                meddle(self.a)
                return self.__dict__["b"]

            @b.setter
            def b(self, value):
                self.__dict__["b"] = value

        tu.register_dataclass(MeddlingCell, data_fields=["a", "b", "c"], meta_fields=[])
        leaves = [Marker() for _ in range(3)]
        tree = [Box(leaves), MeddlingCell(*leaves), (leaves[0], leaves[1], leaves[2])]
        protect(leaves, tree)
        for _ in range(3):
            flat, treedef = tu.tree_flatten(tree)
            assert len(flat) == 9
            tu.tree_map(lambda x: x, tree)
            tu.tree_flatten_with_path(tree)
            tu.tree_structure(tree).children()
            tu.flatten_one_level(tree)
            tu.default_registry.flatten_one_level_with_keys(tree)
        print("ok=1")
        """
    )
    assert results["ok"] == "1"


def test_outputs_survive_finalizers_that_read_every_container():
    # A garbage cycle whose finalizer reads every young list and tuple the GC tracks, collected as
    # often as the interpreter lets a collection run while each entry point runs. Only calls
    # that run in fastree's core: CPython itself is not safe against such a reader (zip() builds
    # its tuple of iterators half-filled while it allocates them), so Python-level functions such
    # as tree_transpose would crash it inside CPython, not fastree.
    results = _run(
        """
        import sysconfig

        ACTIVE = [False]
        SCANS = [0]
        PENDING = [False]  # a Reader is garbage, waiting for the next collection

        class Reader:
            # A garbage cycle whose finalizer reads every list and tuple the GC tracks, then
            # leaves a new such cycle behind: while ACTIVE, every collection has one to finalize.
            # One at a time: each finalizer's scan reads what a second one's would, and on a
            # free-threaded build, whose collections are rarer and every one a full one, a pile
            # of them scanning the whole heap each made this test run for many minutes.
            def __init__(self):
                self.cycle = self
                PENDING[0] = True

            def __del__(self):
                PENDING[0] = False
                if not ACTIVE[0]:
                    return
                SCANS[0] += 1
                for o in gc.get_objects(generation=1):  # where gen 0 survivors just went
                    if type(o) in (list, tuple):
                        for item in o:  # an empty slot here would crash
                            pass
                Reader()

        def litter(x):
            if not PENDING[0]:
                Reader()
            return x

        class Box:
            def __init__(self, items):
                self.items = items

        tu.register_pytree_node(
            Box, lambda b: (litter(list(b.items)), None), lambda _, c: Box(list(c))
        )

        @tu.register_dataclass
        @dataclasses.dataclass
        class Cell:
            a: object
            b: object

        tree = {
            "box": Box([1.0, 2.0, (3.0, 4.0)]),
            "cell": Cell([5.0, 6.0], {"k": 7.0}),
            "pt": Point(8.0, [9.0]),
            "seq": [float(i) for i in range(20)],
        }
        treedef = tu.tree_structure(tree)
        leaves = tu.tree_leaves(tree)
        ops = {
            "flatten": lambda: tu.tree_flatten(tree),
            "map": lambda: tu.tree_map(litter, tree),
            "map_seq": lambda: tu.tree_map(litter, tree["seq"]),
            "map2": lambda: tu.tree_map(lambda a, b: litter(a), tree, tree),
            "with_path": lambda: tu.tree_flatten_with_path(tree),
            "unflatten": lambda: tu.tree_unflatten(treedef, leaves),
            "children": lambda: treedef.children(),
            "pickle": lambda: pickle.loads(pickle.dumps(treedef)),
            "one_level": lambda: tu.default_registry.flatten_one_level_with_keys(tree),
            "flatten_up_to": lambda: treedef.flatten_up_to(tree),
            "node_data": lambda: [t.node_data() for t in treedef.children()],
        }
        gc.collect()
        old = gc.get_threshold()
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            # There a collection is due once a thread's allocations less its deallocations since
            # the last one pass the threshold (counted in batches of a few hundred) and, unless
            # the second threshold is 0, a quarter of the objects alive: the loops below keep
            # what they make until the entry point is done.
            gc.set_threshold(1, 0, 0)
        else:
            gc.set_threshold(1, 1000, 1000)
        try:
            # Start the chain of finalizers before the first measured call: on 3.14 the young
            # collections right after a full one find no garbage to finalize (they ran, and
            # collected nothing, during the first call), so the first entry point measured went
            # unchecked. Once one Reader is finalized, each leaves the next behind.
            ACTIVE[0] = True
            kept = []
            for _ in range(100_000):  # bounded: without a finalizer the checks below fail
                if SCANS[0] >= 3:
                    break
                kept.append(litter([]))
            for name, op in ops.items():
                ACTIVE[0] = True
                litter(None)
                before = SCANS[0]
                calls = 0
                # At least 3 calls, and on until a collection ran (bounded: without one the
                # check below fails).
                while calls < 3 or (SCANS[0] == before and calls < 5_000):
                    kept.append(op())
                    calls += 1
                ACTIVE[0] = False
                kept.clear()
                gc.collect()
                print(f"{name}=ok" if SCANS[0] > before else f"{name}=no collection ran")
        finally:
            ACTIVE[0] = False
            gc.set_threshold(*old)
        """
    )
    for name in (
        "flatten",
        "map",
        "map_seq",
        "map2",
        "with_path",
        "unflatten",
        "children",
        "pickle",
        "one_level",
        "flatten_up_to",
        "node_data",
    ):
        assert results.get(name) == "ok", name
