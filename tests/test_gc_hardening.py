"""GC hardening: every cycle through a fastree object is collectable, the collector may run at any
point inside a callback, and the interpreter shuts down cleanly with treedefs still in cycles.

(test_refcount_gc.py covers the basic aux-data / dict-key cycles; this file covers the remaining
places a treedef or key path can hold a reference.)

The tests here run with the objects that existed before this file's first test frozen
(``gc.freeze()``): their collections then scan only what the file's tests made (trees, cycles,
garbage, and every object fastree makes during the walks), not the whole session's heap, which
cost a full collection hundreds of milliseconds late in a run and made this file a quarter of the
suite's time. Nothing checked here lives in the frozen part.
"""

import collections
import gc
import subprocess
import sys
import textwrap
import weakref

import pytest
from helpers import (
    Keyed,
    NodeClass,
    Pair,
    Point,
    parametrize,
    skip_unless_classes_are_collectable,
)

import fastree.tree_util as tu


class Box:
    """Any object that can point back at a treedef (or at anything else)."""

    def __init__(self, name="box"):
        self.name = name
        self.back = None

    def __eq__(self, other):
        return isinstance(other, Box) and other.name == self.name

    def __lt__(self, other):
        return self.name < other.name

    def __hash__(self):
        return hash(self.name)

    def __call__(self):  # usable as a defaultdict factory
        return None


@pytest.fixture(autouse=True, scope="module")
def _scan_only_what_this_file_makes():
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _assert_collected(make):
    """``make()`` builds a cycle and returns one object in it; after a collection it is gone."""
    ref = weakref.ref(make())
    gc.collect()
    assert ref() is None, "cycle survived gc.collect()"


# ------------------------------------------------------------------------------------------------
# Cycles: object -> treedef -> object, through every place a treedef keeps a reference.


def _cycle_ordered_dict_key():
    box = Box("k")
    box.back = tu.tree_structure(collections.OrderedDict([(box, 1), (Box("j"), 2)]))
    return box


def _cycle_defaultdict_factory():
    box = Box("factory")
    box.back = tu.tree_structure(collections.defaultdict(box, {"a": 1}))
    return box


def _cycle_defaultdict_key():
    box = Box("k")
    box.back = tu.tree_structure(collections.defaultdict(list, {box: 1}))
    return box


def _cycle_namedtuple_class():
    # A namedtuple class created at runtime (a heap type, collectable), whose class attribute
    # holds a treedef that refers back to the class.
    cls = collections.namedtuple("Dyn", ["a", "b"])
    cls.td = tu.tree_structure(cls(1, 2))
    return cls


def _cycle_dataclass_meta():
    box = Box("meta")
    box.back = tu.tree_structure(Point(1, 2, label=box))
    return box


def _cycle_node_class_meta_of_child():
    box = Box("deep")
    tree = {"x": [Keyed(NodeClass(1, meta=box), None)]}
    box.back = tu.tree_structure(tree).children()[0]
    return box


def _cycle_composed():
    box = Box("composed")
    outer = tu.tree_structure([1, 2])
    box.back = outer.compose(tu.tree_structure(Pair(1, 2, tag=box)))
    return box


def _cycle_from_node_data():
    box = Box("nd")
    td = tu.tree_structure(Pair(1, 2))
    box.back = td.from_node_data_and_children((Pair, box), td.children())
    return box


def _cycle_unpickled():
    import pickle

    # Unpickling rebuilds the treedef through the validating constructor: its nodes own their
    # aux data the same way, so the cycle aux -> treedef -> aux is still collectable.
    box = Box("pickled")
    td = pickle.loads(pickle.dumps(tu.tree_structure({"a": Pair(1, 2, tag=Box("t"))})))
    aux = td.children()[0].node_data()[1]
    aux.back = (td, box)
    box.back = aux
    return box


def _cycle_treedef_in_its_own_leaves_tree():
    # A treedef stored in a tree whose aux data is a list holding that very tree.
    holder = []
    tree = Pair(1, 2, tag=Box("t"))
    tree.tag.back = holder
    td = tu.tree_structure(tree)
    holder.append(td)
    holder.append(tree)
    return tree.tag


def _cycle_key_path():
    # Key paths hold the dict keys: key -> paths -> DictKey(key) -> key.
    box = Box("pathkey")
    box.back = tu.tree_flatten_with_path({box: [1, 2]})
    return box


def _cycle_key_path_getattr():
    box = Box("attr")
    tree = Keyed(box, [3])
    box.back = tu.tree_leaves_with_path(tree)
    return box


def _cycle_map_result():
    box = Box("mapped")
    box.back = tu.tree_map_with_path(lambda p, x: (p, x, box), {"a": [box]})
    return box


CYCLES = {
    "ordered_dict_key": _cycle_ordered_dict_key,
    "defaultdict_factory": _cycle_defaultdict_factory,
    "defaultdict_key": _cycle_defaultdict_key,
    "namedtuple_class": _cycle_namedtuple_class,
    "dataclass_meta": _cycle_dataclass_meta,
    "child_treedef": _cycle_node_class_meta_of_child,
    "compose": _cycle_composed,
    "from_node_data": _cycle_from_node_data,
    "unpickled": _cycle_unpickled,
    "aux_holds_treedef_list": _cycle_treedef_in_its_own_leaves_tree,
    "key_path_dict_key": _cycle_key_path,
    "key_path_getattr": _cycle_key_path_getattr,
    "map_with_path_result": _cycle_map_result,
}


@parametrize(make=CYCLES)
def test_cycle_is_collected(make):
    if make is _cycle_namedtuple_class:
        skip_unless_classes_are_collectable()  # the cycle goes through a class made here
    _assert_collected(make)


def test_get_referents_has_aux_and_dict_keys():
    aux, key, okey, factory = Box("aux"), Box("key"), Box("okey"), Box("factory")
    tree = {
        key: Pair(1, 2, tag=aux),
        Box("z"): [collections.OrderedDict([(okey, 3)]), collections.defaultdict(factory)],
    }
    td = tu.tree_structure(tree)
    referents = gc.get_referents(td)
    for obj in (aux, key, okey, factory):
        assert any(r is obj for r in _flat(referents)), obj


def _flat(objs, depth=2):
    # OrderedDict / defaultdict node data are tuples of keys: look one level into tuples.
    out = list(objs)
    if depth:
        for o in objs:
            if isinstance(o, tuple):
                out += _flat(list(o), depth - 1)
    return out


def test_namedtuple_class_is_a_referent():
    NT = collections.namedtuple("NT", "a")
    assert any(r is NT for r in gc.get_referents(tu.tree_structure([NT(1)])))


# ------------------------------------------------------------------------------------------------
# The collector running inside user callbacks.


class Collecting:
    """A custom node whose flatten and unflatten run a full collection (with garbage around)."""

    def __init__(self, kids):
        self.kids = list(kids)


COLLECTED: list[int] = []  # what each collection in a callback found unreachable


def _make_garbage_and_collect():
    # A cycle holding a treedef, so the collection has fastree objects to traverse and clear.
    box = Box("garbage")
    box.back = (tu.tree_structure({"a": Pair(1, 2, tag=box)}), box)
    del box
    COLLECTED.append(gc.collect())


def _collecting_flatten(node):
    _make_garbage_and_collect()
    return node.kids, None


def _collecting_unflatten(aux, children):
    _make_garbage_and_collect()
    return Collecting(children)


tu.register_pytree_node(Collecting, _collecting_flatten, _collecting_unflatten)


def _gc_tree():
    return {"a": [Collecting([1, Collecting([2, (3,)])]), {"b": Collecting([])}], "c": (4,)}


OPERATIONS_WITH_CALLBACKS = {
    "flatten": lambda t: tu.tree_flatten(t),
    "flatten_with_path": lambda t: tu.tree_flatten_with_path(t),
    "structure": lambda t: tu.tree_structure(t),
    "unflatten": lambda t: tu.tree_unflatten(*reversed(tu.tree_flatten(t))),
    "map": lambda t: tu.tree_map(lambda x: x, t),
    "map_two": lambda t: tu.tree_map(lambda x, y: y, t, t),
    "flatten_up_to": lambda t: tu.tree_structure(t).flatten_up_to(t),
    "walk": lambda t: tu.tree_structure(t).walk(lambda c, d: c, None, range(4)),
    "is_leaf": lambda t: tu.tree_leaves(t, is_leaf=lambda x: gc.collect() < 0),
    "map_f": lambda t: tu.tree_map(lambda x: (gc.collect(), x)[1], t),
}


@parametrize(op=OPERATIONS_WITH_CALLBACKS)
def test_gc_collect_inside_callbacks(op):
    tree = _gc_tree()
    expected = tu.tree_leaves(tree)
    COLLECTED.clear()
    for _ in range(3):
        op(tree)
    assert tu.tree_leaves(tree) == expected
    # Every collection ran, and found the garbage cycle (treedef included) made just before it.
    assert COLLECTED and min(COLLECTED) > 0, COLLECTED


def test_gc_inside_callbacks_while_treedefs_die():
    """A flatten callback that drops the last reference to other treedefs and collects."""
    pool = [tu.tree_structure({"k": Pair(i, i, tag=Box(str(i)))}) for i in range(50)]

    class Dropper:
        pass

    def flatten(node):
        if pool:
            del pool[: len(pool) // 2 + 1]
        gc.collect()
        return (1, 2), None

    tu.register_pytree_node(Dropper, flatten, lambda aux, ch: Dropper())
    tree = [Dropper() for _ in range(8)]
    leaves, td = tu.tree_flatten(tree)
    assert leaves == [1, 2] * 8
    assert not pool
    assert td.num_leaves == 16


# ------------------------------------------------------------------------------------------------
# Interpreter shutdown with live treedefs in cycles.

SHUTDOWN_SCRIPT = textwrap.dedent(
    """
    import collections, gc, sys
    import fastree.tree_util as tu
    # An editable install may rebuild on import and log to stderr: only what follows counts.
    print("--- imported", file=sys.stderr, flush=True)

    class Box:
        def __init__(self):
            self.back = None
        def __eq__(self, other):
            return isinstance(other, Box)
        def __hash__(self):
            return 1

    class Node:
        def __init__(self, kids, box):
            self.kids, self.box = kids, box

    tu.register_pytree_node(
        Node, lambda n: (n.kids, n.box), lambda box, kids: Node(list(kids), box))

    keep = []
    for i in range(200):
        box = Box()
        tree = {"d": {box: [Node([i, (None, i)], box)]}, "od": collections.OrderedDict(a=box)}
        td = tu.tree_structure(tree)
        box.back = (td, tu.tree_flatten_with_path(tree), td.children(), tree)
        keep.append(box)
    # A cycle through the module namespace and one through a registered class attribute.
    Node.td = tu.tree_structure(Node([1], keep[0]))
    sys.modules[__name__].cycle = keep
    gc.disable()  # leave the cycles for interpreter finalisation to tear down
    """
)


@pytest.mark.parametrize("gc_enabled", [True, False], ids=["gc_on", "gc_off"])
def test_interpreter_shutdown_with_live_cycles(gc_enabled):
    script = SHUTDOWN_SCRIPT if not gc_enabled else SHUTDOWN_SCRIPT.replace("gc.disable()", "")
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.partition("--- imported\n")[2] == ""
