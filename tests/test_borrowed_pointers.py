"""No borrowed pointer survives Python code; no owned reference leaks when a walk fails.

Every PyTreeDef method and module function that walks a tree,
a treedef or a leaf list is run while Python code it does not expect runs in the middle of it:
finalizers of cyclic garbage collected at every allocation (``gc.set_threshold(1)``; on 3.10/3.11
any allocation of a GC-tracked object can run them), ``__hash__``/``__eq__``/``__iter__`` and
custom flatten/unflatten functions that mutate the very container being walked, and hooks that
replace themselves while they run. Each such case runs in a child process, so a crash fails the
test instead of killing pytest; results are checked against what an unmutated run gives. Owned
references are checked with ``sys.getrefcount`` on success, on error and under ``RLIMIT_AS``
(where a growing C++ vector throws ``std::bad_alloc`` half-way through a walk).
"""

from __future__ import annotations

import collections
import os
import pickle
import sys
import sysconfig
import textwrap

import fastree.tree_util as tu
import pytest
from fastree import _core
from helpers import rlimit_sweep_source, run_script_results

FREE_THREADED_BUILD = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_child(code: str) -> dict[str, str]:
    """Runs `code` in a fresh interpreter; asserts it exits 0; returns its name=value lines."""
    results, proc = run_script_results(textwrap.dedent(code))
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return results


# ------------------------------------------------------------------------------------------------
# Every treedef method under GC pressure, with finalizers that mutate the inputs being walked.

GC_PRESSURE_METHODS = """
import collections, gc, pickle, sys
import fastree
import fastree.tree_util as tu

Point = collections.namedtuple("Point", "x y")

class Shared:  # identity-preserving node
    def __init__(self, v):
        self.v = v

tu.register_pytree_node(Shared, lambda s: ((s.v,), None), lambda _, c: Shared(*c),
                        preserve_identity=True)

victims = []  # containers the finalizers below empty while methods walk them

class Mutator:
    def __init__(self):
        self.me = self  # cyclic: only the collector frees it, at any allocation
    def __del__(self):
        for v in victims:
            v.clear()
        Mutator()  # and the next one
        [bytearray(64) for _ in range(8)]  # the freed memory is reused at once

def fresh_list(n):
    return [bytearray(8) for _ in range(n)]

s = Shared(bytearray(3))
tree = {"a": [bytearray(1), (bytearray(2), None)], "p": Point(bytearray(4), [s, s]),
        "d": collections.OrderedDict(z=bytearray(5))}
td = tu.tree_structure(tree)
n = td.num_leaves
list_td = tu.tree_structure([0] * 16)
dict_td = tu.tree_structure({"k%d" % i: 0 for i in range(16)})

def run_all():
    out = {}
    # unflatten of a list that a finalizer may empty half-way
    leaves = fresh_list(n)
    victims[:] = [leaves]
    try:
        t = td.unflatten(leaves)
        out["unflatten"] = tu.tree_structure(t) == td
    except ValueError as e:
        out["unflatten"] = "Too few leaves" in str(e) or "Too many leaves" in str(e)
    # flatten_up_to of lists and dicts being emptied
    victim = fresh_list(16)
    victims[:] = [victim]
    try:
        got = list_td.flatten_up_to(victim)
        out["up_to_list"] = len(got) == 16 and all(type(x) is bytearray for x in got)
    except ValueError as e:
        out["up_to_list"] = "mismatch" in str(e)
    victim = {"k%d" % i: bytearray(i) for i in range(16)}
    victims[:] = [victim]
    try:
        got = dict_td.flatten_up_to(victim)
        out["up_to_dict"] = len(got) == 16 and all(type(x) is bytearray for x in got)
    except ValueError as e:
        out["up_to_dict"] = "mismatch" in str(e)
    nested = [fresh_list(2), fresh_list(2)]
    victims[:] = [nested, nested[0], nested[1]]
    try:
        got = tu.tree_structure([[0, 0], [0, 0]]).flatten_up_to(nested)
        out["up_to_nested"] = len(got) == 4
    except ValueError as e:
        out["up_to_nested"] = "mismatch" in str(e)
    # from_iterable_tree / walk over a leaf list being emptied (both snapshot their input)
    it = [fresh_list(2), fresh_list(2)]
    victims[:] = [it, it[0], it[1]]
    try:
        got = tu.tree_structure([[0, 0], [0, 0]]).from_iterable_tree(it)
        out["from_iterable"] = isinstance(got, list)
    except ValueError as e:
        out["from_iterable"] = "Arity mismatch" in str(e)
    leaves = fresh_list(n)
    victims[:] = [leaves]
    try:
        got = td.walk(lambda c, d: len(c), lambda x: 1, leaves)
        out["walk"] = got == 3
    except ValueError as e:
        out["walk"] = "Too few leaves" in str(e)
    victims[:] = []
    # treedef-only methods: nothing mutable to lose, but every allocation collects
    kids = td.children()
    out["children"] = len(kids) == 3
    out["compose"] = td.compose(list_td).num_leaves == n * 16
    out["node_data"] = td.node_data()[0] is dict
    out["from_node_data"] = (
        fastree.PyTreeDef.from_node_data_and_children(td.node_data(), kids) == td)
    out["pickle"] = pickle.loads(pickle.dumps(td)) == td
    out["repr"] = repr(td).startswith("PyTreeDef(")
    out["eq_hash"] = (td == tu.tree_structure(tree)) and hash(td) == hash(tu.tree_structure(tree))
    out["treedef_tuple"] = tu.treedef_tuple([td, list_td]).num_leaves == n + 16
    pairs = fresh_list(4)
    victims[:] = [pairs]
    ch, _ = tu.flatten_one_level(pairs)
    out["one_level"] = len(ch) in (0, 4)
    victims[:] = [tree["a"]]
    ch, _ = tu.flatten_one_level_with_keys(tree)
    out["one_level_keys"] = len(ch) == 3
    victims[:] = []
    out["all_leaves"] = tu.all_leaves(fresh_list(8))
    return out

gc.set_threshold(1, 1, 1)
Mutator()
bad = collections.Counter()
for _ in range(40):
    tree["a"][:] = [bytearray(1), (bytearray(2), None)]
    for name, ok in run_all().items():
        if ok is not True:
            bad[name] += 1
gc.set_threshold(700, 10, 10)
victims[:] = []
print("bad=%r" % (sorted(bad.items()),))
"""


def test_treedef_methods_under_gc_pressure_with_mutating_finalizers():
    results = run_child(GC_PRESSURE_METHODS)
    assert results["bad"] == "[]"


# ------------------------------------------------------------------------------------------------
# User code that mutates the container being walked.


def test_flatten_up_to_dict_whose_key_eq_adds_keys():
    # The fast dict path looks the treedef's keys up in the dict; a key's __eq__ runs during
    # those lookups and grows the dict. Each value is taken when it is found, and the size is
    # checked again afterwards: a dict that grew is a key mismatch, never a silent cut.
    out = run_child(
        """
        import fastree.tree_util as tu

        target = {}

        class K:
            def __init__(self, name, grow):
                self.name, self.grow = name, grow
            def __hash__(self):
                return hash(self.name)
            def __eq__(self, other):
                if self.grow and len(target) == 2:
                    target[K("extra", False)] = bytearray(3)
                return isinstance(other, K) and other.name == self.name
            def __lt__(self, other):
                return self.name < other.name

        td = tu.tree_structure({K("a", False): 0, K("b", False): 0})
        # dict lookups call the stored key's __eq__: these grow the dict when first compared
        target.update({K("a", True): bytearray(1), K("b", True): bytearray(2)})
        try:
            got = td.flatten_up_to(target)
            print("result=ok:%d" % len(got))
        except ValueError as e:
            print("result=" + ("mismatch" if "Dict key mismatch" in str(e) else repr(e)))
        """
    )
    assert out["result"] == "mismatch"


def test_unflatten_list_resized_by_a_custom_unflatten():
    # The leaf list is read position by position as unflatten reaches it; a custom unflatten that
    # grows or shrinks it gives JAX's leaf-count errors, never a tree of a shifted list.
    out = run_child(
        """
        import fastree.tree_util as tu

        leaves = []

        class Box:
            def __init__(self, v):
                self.v = v

        def unflatten(mode, children):
            if mode == "grow":
                leaves.insert(0, bytearray(9))
            elif mode == "shrink":
                leaves.clear()
            return Box(*children)

        tu.register_pytree_node(Box, lambda b: ((b.v,), b.mode), unflatten)
        for mode in ("grow", "shrink", "keep"):
            b = Box(0)
            b.mode = mode
            td = tu.tree_structure([b, 1, 2])
            leaves[:] = [bytearray(1), bytearray(2), bytearray(3)]
            try:
                t = td.unflatten(leaves)
                print(mode + "=ok:%d" % len(t))
            except ValueError as e:
                print(mode + "=" + str(e).split(";")[0])
        """
    )
    assert out["grow"] == "Too many leaves for PyTreeDef"
    assert out["shrink"] == "Too few leaves for PyTreeDef"
    assert out["keep"] == "ok:3"


def test_all_leaves_reads_a_list_changed_by_a_type_lookup():
    # all_leaves reads a list by index and takes no reference where a type's answer is memoised.
    # A type's first lookup hashes it, which runs a metaclass's __hash__: here it empties the
    # list and so drops the last reference to the very item under lookup. The read must hold that
    # item and then see the list as its iterator would (ended), never read a freed slot.
    out = run_child(
        """
        import fastree.tree_util as tu

        items, hashed = [], []

        class ClearingMeta(type):
            def __hash__(cls):
                hashed.append(cls.__name__)
                items.clear()
                return id(cls) >> 4

        Fresh = ClearingMeta("Fresh", (), {})
        items[:] = [1, Fresh(), (2,)]
        print("cleared=%s:%s:%s" % (tu.all_leaves(items), items, hashed))

        Later = ClearingMeta("Later", (), {})
        items[:] = [(1,), Later()]
        print("node_first=%s:%s" % (tu.all_leaves(items), hashed))
        """
    )
    assert out["cleared"] == "True:[]:['Fresh']"  # the tuple went with the clear
    assert out["node_first"] == "False:['Fresh']"  # answered at the tuple; Later never looked up


def test_walk_and_from_iterable_tree_snapshot_inputs_mutated_by_callbacks():
    out = run_child(
        """
        import fastree.tree_util as tu

        td = tu.tree_structure([[0, 0], (0, 0)])
        leaves = [bytearray(1), bytearray(2), bytearray(3), bytearray(4)]

        def f_leaf(x):
            leaves.clear()  # the walk reads its own snapshot
            return len(x)

        print("walk=%r" % (td.walk(lambda c, d: sum(c), f_leaf, leaves),))

        class Iterable:
            def __init__(self, items, victim):
                self.items, self.victim = items, victim
            def __iter__(self):
                self.victim.clear()
                return iter(self.items)

        outer = []
        outer[:] = [Iterable([bytearray(1), bytearray(2)], outer), [bytearray(3), bytearray(4)]]
        got = td.from_iterable_tree(outer)
        print("from_iterable=%r" % ([[len(x) for x in c] for c in got],))
        """
    )
    assert out["walk"] == "10"
    assert out["from_iterable"] == "[[1, 2], [3, 4]]"


def test_flatten_up_to_custom_node_whose_flatten_mutates_the_parent():
    out = run_child(
        """
        import gc
        import fastree.tree_util as tu

        parent = []

        class Node:
            def __init__(self, a, b):
                self.a, self.b = a, b

        def flatten(n):
            parent.clear()
            gc.collect()
            return (n.a, n.b), None

        tu.register_pytree_node(Node, flatten, lambda _, c: Node(*c))
        td = tu.tree_structure([Node(0, 0), Node(0, 0)], is_leaf=None)
        parent[:] = [Node(bytearray(1), bytearray(2)), Node(bytearray(3), bytearray(4))]
        got = td.flatten_up_to(parent)
        print("got=%r" % ([len(x) for x in got],))
        """
    )
    assert out["got"] == "[1, 2, 3, 4]"


# ------------------------------------------------------------------------------------------------
# Hooks replaced while they run: the core holds what it calls.


def test_to_jax_hook_replaced_while_it_runs_stays_alive_until_it_returns():
    # A hook that re-installs the JAX bridge (with another to_jax) drops the core's reference to
    # itself; the core holds it for the call. Before: freed while running.
    out = run_child(
        """
        import functools, gc, weakref
        import fastree.tree_util as tu
        from fastree import _core
        from fastree.jax_interop import bridge as _jax_bridge

        def body(td):
            _jax_bridge.install()  # replaces the hook; the partial below loses its last owner
            gc.collect()
            return "alive" if ref() is not None else "freed"

        hook = functools.partial(body)
        ref = weakref.ref(hook)
        _jax_bridge.install()
        # the same arguments as install(), but this partial as to_jax
        import fastree.jax_interop.bridge as jb
        _core.install_jax_bridge(
            jax_registry=jb._jax_internal._registry,
            flatten_one_level=jb._jtu.default_registry.flatten_one_level,
            flatten_one_level_with_keys=jb._jtu.default_registry.flatten_one_level_with_keys,
            DictKey=jb._jtu.DictKey, SequenceKey=jb._jtu.SequenceKey,
            GetAttrKey=jb._jtu.GetAttrKey, FlattenedIndexKey=jb._jtu.FlattenedIndexKey,
            to_jax=hook, map_error=jb._map_errors.explain)
        jb._key_makers.install()
        del hook
        print("during=" + tu.tree_structure([1, 2]).to_jax())
        print("after=%s" % (ref() is None))
        print("works=%s" % (tu.tree_structure([1, 2]).to_jax() is not None))
        """
    )
    assert out["during"] == "alive"
    assert out["after"] == "True"
    assert out["works"] == "True"


def test_jax_registry_replaced_while_its_entries_finalize():
    # Re-installing the bridge drops the old registry dict; its entries' finalizers run then and
    # may flatten (classifying a new type reads the registry's size). The core must already
    # point at the new dict (ASan: heap-use-after-free before).
    out = run_child(
        """
        import gc
        import fastree.tree_util as tu
        from fastree import _core
        from fastree.jax_interop import bridge as _jax_bridge
        import fastree.jax_interop.bridge as jb

        seen = []

        class Finalizes:
            def __del__(self):
                New = type("New", (), {})  # a memo miss: reads the JAX registry's size
                seen.append(tu.tree_leaves([New(), 1]).__len__())

        class Key:
            pass

        old = dict(jb._jax_internal._registry)
        old[Key] = (Finalizes(), None)
        _core.install_jax_bridge(
            jax_registry=old,
            flatten_one_level=jb._jtu.default_registry.flatten_one_level,
            flatten_one_level_with_keys=jb._jtu.default_registry.flatten_one_level_with_keys,
            DictKey=jb._jtu.DictKey, SequenceKey=jb._jtu.SequenceKey,
            GetAttrKey=jb._jtu.GetAttrKey, FlattenedIndexKey=jb._jtu.FlattenedIndexKey,
            to_jax=jb.to_jax, map_error=jb._map_errors.explain)
        del old
        _jax_bridge.install()  # frees `old`, running Finalizes.__del__
        gc.collect()
        print("seen=%r" % (seen,))
        print("leaves=%d" % len(tu.tree_leaves({"a": [1, 2], "b": (3,)})))
        """
    )
    # Free-threaded builds keep a replaced registry for the process (walks on other threads
    # read it per leaf without a reference: docs/threads.md, R8): nothing is finalized.
    assert out["seen"] == ("[]" if FREE_THREADED_BUILD else "[2]")
    assert out["leaves"] == "3"


KEY_CLASS_REINSTALLED = """
import fastree.tree_util as tu
from fastree import _core
from fastree.jax_interop import key_makers as _key_makers
import fastree.jax_interop.bridge as jb

class Other:  # stands in for a re-installed key class (called as the class, without a maker)
    def __init__(self, key):
        self.key = key

def install_bridge(**classes):
    args = dict(DictKey=jb._jtu.DictKey, SequenceKey=jb._jtu.SequenceKey,
                GetAttrKey=jb._jtu.GetAttrKey, FlattenedIndexKey=jb._jtu.FlattenedIndexKey)
    args.update(classes)
    _core.install_jax_bridge(
        jax_registry=jb._jax_internal._registry,
        flatten_one_level=jb._jtu.default_registry.flatten_one_level,
        flatten_one_level_with_keys=jb._jtu.default_registry.flatten_one_level_with_keys,
        to_jax=jb.to_jax, map_error=jb._map_errors.explain, **args)

makers = dict(sequence_block=_key_makers.sequence_block,
              flattened_index_block=_key_makers.flattened_index_block,
              dict_key=_key_makers.dict_key, getattr_key=_key_makers.getattr_key,
              dict_key_block=_key_makers.dict_key_block)
KIND, MAKER, CLASS_ARG = {kind!r}, {maker!r}, {class_arg!r}
TREE = {tree}

FOR_CLASS = {{"SequenceKey": ["sequence_block"], "DictKey": ["dict_key", "dict_key_block"]}}

def evil(arg):
    # Replaces the key class (and leaves no maker for it), then makes entries of the old one.
    install_bridge(**{{CLASS_ARG: Other}})
    _core.set_key_makers(**dict(makers, **dict.fromkeys(FOR_CLASS[CLASS_ARG])))
    return makers[MAKER](arg)

install_bridge()  # empty caches: the walk below misses
_core.set_key_makers(**dict(makers, **{{MAKER: evil}}))
first = tu.tree_flatten_with_path(TREE)[0]
second = tu.tree_flatten_with_path(TREE)[0]
print("first=%s" % sorted({{type(p[0]).__name__ for p, _ in first}}))
print("second=%s" % sorted({{type(p[0]).__name__ for p, _ in second}}))
"""


@pytest.mark.parametrize(
    ("kind", "maker", "class_arg", "tree"),
    [
        ("sequence", "sequence_block", "SequenceKey", "[1, 2]"),
        ("dict, one by one", "dict_key", "DictKey", "{'a': 1}"),
        ("dict, in a block", "dict_key_block", "DictKey", "{f'k{i}': i for i in range(10)}"),
    ],
)
def test_key_class_reinstalled_while_a_maker_runs_keeps_no_stale_entry(
    kind, maker, class_arg, tree
):
    # A maker that re-installs the key classes made its entries for the class being replaced;
    # they must not enter the new class's cache (before: the next walk got the old class's keys).
    out = run_child(
        KEY_CLASS_REINSTALLED.format(kind=kind, maker=maker, class_arg=class_arg, tree=tree)
    )
    assert out["second"] == "['Other']"


# ------------------------------------------------------------------------------------------------
# Hostile pickle states (PyTreeDef.__reduce__ / _treedef_from_state).


class _Index:
    def __init__(self, value, action):
        self.value, self.action = value, action

    def __index__(self):
        self.action()
        return self.value


class _KeysIter:
    """Dict node data whose iteration collects garbage and raises half-way when asked."""

    def __init__(self, keys, fail):
        self.keys, self.fail = keys, fail

    def __iter__(self):
        import gc

        gc.collect()
        for i, k in enumerate(self.keys):
            if self.fail and i == 1:
                raise RuntimeError("boom")
            yield k


def test_pickle_round_trip_and_hostile_states():
    td = tu.tree_structure({"a": [1, (2, None)], "b": collections.OrderedDict(x=3)})
    assert pickle.loads(pickle.dumps(td)) == td
    ctor, (state,) = td.__reduce__()
    assert ctor(state) == td
    version, nodes = state
    leaf = (None, None, 0, -1)
    bad_states = [
        None,
        (1,),
        (2, nodes),
        (10**30, nodes),
        (1, [leaf]),
        (1, (leaf, leaf)),  # two roots
        (1, ((None, None, 0, 0),)),  # a reference to a leaf
        (1, ((None, None, 0, 5),)),  # a dangling reference
        (1, (leaf, (tuple, None, 2, -1))),  # arity past the open subtrees
        (1, (leaf, (tuple, None, -1, -1))),
        (1, (leaf, (dict, ["a", "b"], 1, -1))),  # keys for a different arity
        (1, (leaf, leaf, (dict, _KeysIter(["a", "b"], True), 2, -1))),
        (1, (leaf, (int, None, 1, -1))),  # not a node type
        (1, (leaf, ("tuple", None, 1, -1))),
        (1, (leaf, (tuple, None, _Index(1, lambda: 1 / 0), -1))),
        (1, ("not an entry",)),
    ]
    for bad in bad_states:
        with pytest.raises((ValueError, TypeError, RuntimeError, ZeroDivisionError)):
            ctor(bad)
    # Python code run while a state is read (gc in a key iteration, __index__) is harmless.
    ok = ctor((1, (leaf, leaf, (dict, _KeysIter(["a", "b"], False), _Index(2, lambda: None), -1))))
    assert ok == tu.tree_structure({"a": 0, "b": 0})


# ------------------------------------------------------------------------------------------------
# Owned references: none leaked on success or on any error path.


class _Shared:
    def __init__(self, v):
        self.v = v


tu.register_pytree_node(
    _Shared, lambda s: ((s.v,), None), lambda _, c: _Shared(*c), preserve_identity=True
)


def _refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


def _shared_tree():
    s = _Shared(object())
    return [s, {"x": s, "y": object()}, (s, object())]


def _expect_error(errors, f, *args):
    # Not pytest.raises: that snapshots the caller's frame locals (f_locals), whose dict then
    # holds references that the refcount checks below would count as leaks.
    try:
        f(*args)
    except errors:
        return
    raise AssertionError("%r accepted %r" % (f, args))


def _exercise_walk_and_from_iterable(td, leaves, marker):
    for fail_at in range(4):  # the treedef has four nodes that call f_node
        calls = []

        def f_node(children, data, calls=calls, fail_at=fail_at):
            calls.append(1)
            if len(calls) > fail_at:
                raise KeyError("stop")
            return marker

        _expect_error(KeyError, td.walk, f_node, None, leaves)
    _expect_error(ZeroDivisionError, td.walk, lambda c, d: marker, lambda x: 1 / 0, leaves)
    if td.walk(lambda c, d: marker, None, leaves) is not marker:
        raise AssertionError("walk")
    # from_iterable_tree failing at every depth (arity mismatch, not iterable, too short)
    _expect_error((ValueError, TypeError), td.from_iterable_tree, [leaves[0]])
    _expect_error(
        (ValueError, TypeError), td.from_iterable_tree, [[leaves[0]], [None, leaves[1]], 5]
    )
    _expect_error(
        (ValueError, TypeError), td.from_iterable_tree, [[leaves[0]], [None, leaves[1]], [None]]
    )
    rebuilt = td.from_iterable_tree([[leaves[0]], [None, leaves[1]], [None, leaves[2]]])
    if not (rebuilt[0] is rebuilt[1]["x"] is rebuilt[2][0] and rebuilt[0].v is leaves[0]):
        raise AssertionError("from_iterable_tree lost the sharing")


def test_walk_and_from_iterable_tree_release_shared_results_on_errors():
    td = tu.tree_structure(_shared_tree())
    leaves = [object() for _ in range(td.num_leaves)]
    marker = object()
    before = _refcounts(leaves + [marker])
    _exercise_walk_and_from_iterable(td, leaves, marker)
    after = _refcounts(leaves + [marker])  # (outside the assert, which keeps temporaries)
    assert after == before


class _Boom:
    def __init__(self, v):
        self.v = v


def _boom_unflatten(aux, children):
    if aux == "fail":
        raise KeyError("stop")
    return _Boom(*children)


tu.register_pytree_node(_Boom, lambda b: ((b.v,), b.aux), _boom_unflatten)


def _exercise_unflatten(leaves):
    for aux in ("ok", "fail"):
        b = _Boom(0)
        b.aux = aux
        s = _Shared(0)
        td = tu.tree_structure([s, {"a": s, "b": 0}, (s, b)])
        try:
            t = td.unflatten(leaves)
        except KeyError:
            continue
        if not (t[0] is t[1]["a"] is t[2][0] and t[0].v is leaves[0]):
            raise AssertionError("unflatten lost the sharing")


def test_unflatten_with_shared_nodes_releases_everything_on_errors():
    leaves = [object() for _ in range(3)]
    before = _refcounts(leaves)
    _exercise_unflatten(leaves)
    assert _refcounts(leaves) == before


def _exercise_flatten_up_to(leaves):
    s = _Shared(0)
    td = tu.tree_structure([s, {"a": 0, "b": [0, 0]}, s, (0, None)])
    s1, s2 = _Shared(leaves[0]), _Shared(leaves[0])
    good = [s1, {"a": leaves[1], "b": [leaves[2], leaves[3]]}, s1, (leaves[4], None)]
    if len(td.flatten_up_to(good)) != td.num_leaves:
        raise AssertionError("flatten_up_to")
    bads = [
        [s1, {"a": leaves[1], "b": [leaves[2], leaves[3]]}, s2, (leaves[4], None)],  # sharing
        [s1, {"a": leaves[1], "c": [leaves[2], leaves[3]]}, s1, (leaves[4], None)],  # keys
        [s1, {"a": leaves[1], "b": [leaves[2]]}, s1, (leaves[4], None)],  # arity
        [s1, {"a": leaves[1], "b": [leaves[2], leaves[3]]}, s1, (leaves[4], leaves[5])],
        [s1, {"a": leaves[1], "b": [leaves[2], leaves[3]], "z": 0}, s1, (leaves[4], None)],
    ]
    for bad in bads:
        _expect_error(ValueError, td.flatten_up_to, bad)


def test_flatten_up_to_releases_everything_on_mismatch_paths():
    leaves = [object() for _ in range(6)]
    before = _refcounts(leaves)
    _exercise_flatten_up_to(leaves)
    assert _refcounts(leaves) == before


# ------------------------------------------------------------------------------------------------
# Out of memory in the middle of a treedef method: MemoryError, nothing leaked.

OOM_METHODS = """
import collections, gc, pickle, resource, sys
import fastree.tree_util as tu

class Shared:
    def __init__(self, v):
        self.v = v

tu.register_pytree_node(Shared, lambda s: ((s.v,), None), lambda _, c: Shared(*c),
                        preserve_identity=True)
leaf_objects = [object() for _ in range(64)]

def row(i):
    s = Shared(leaf_objects[i % 64])
    return {{"w": leaf_objects[(i + 1) % 64], "s": [s, s],
             "o": collections.OrderedDict(x=leaf_objects[(i + 2) % 64])}}

tree = [row(i) for i in range(3000)]
td = tu.tree_structure(tree)
leaves = tu.tree_leaves(tree)
small = tu.tree_structure([0, 0])
ops = {{
    "walk": lambda: td.walk(lambda c, d: c[0] if c else None, None, leaves),
    "from_iterable_tree": lambda: td.children()[0].from_iterable_tree(
        [[leaf_objects[0]], [[leaf_objects[1]], None], leaf_objects[2]]),
    "unflatten": lambda: td.unflatten(leaves),
    "flatten_up_to": lambda: td.flatten_up_to(tree),
    "compose": lambda: small.compose(td),
    "children": lambda: td.children(),
    "pickle": lambda: pickle.loads(pickle.dumps(td)),
    "repr": lambda: repr(td),
}}
op = ops[{op!r}]
op()
gc.collect()
before = [sys.getrefcount(x) for x in leaf_objects]

"""


@pytest.mark.skipif(
    sys.platform != "linux" or os.environ.get("FASTREE_SANITIZED") == "1",
    reason="RLIMIT_AS sweeps need Linux and no sanitizer shadow memory",
)
@pytest.mark.parametrize(
    "op",
    [
        "walk",
        "from_iterable_tree",
        "unflatten",
        "flatten_up_to",
        "compose",
        "children",
        "pickle",
        "repr",
    ],
)
def test_treedef_methods_out_of_memory_leak_nothing(op):
    results, proc = run_script_results(
        OOM_METHODS.format(op=op) + rlimit_sweep_source((1, 2, 4, 8, 16, 32), calls=100)
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    assert results["leaked"] == "[]"


def test_core_module_is_importable():  # the file's own import smoke check
    assert hasattr(_core, "PyTreeDef")
