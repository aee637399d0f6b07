"""Hostile input: programs that attack the walks, each case pinned, and the classes behind them.

* A borrowed pointer kept across code that can run Python: trees mutated by cyclic-GC finalizers
  that run at every allocation (``gc.set_threshold(1)``), over every entry point and node kind.
* Error paths: tree_map's structure explanation never goes back through jaxlib, never loses a
  KeyboardInterrupt, never replaces an exception it did not raise.
* Out of memory: every entry point under ``RLIMIT_AS`` at several headroom levels, in a child
  process: MemoryError, the process alive, no reference leaked.
* Silent differences from JAX: dict keys without a total order (NaN, frozensets) sorted into
  jaxlib's exact order; types registered through every public JAX route; namedtuple decided per
  object; treedef hashing that runs no user code.

The checks that can crash the interpreter (the old failure mode) run in a child process, so a
regression fails a test instead of the whole run.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import random
import sys
import textwrap

import fastree
import fastree.tree_util as tu
import jax
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import pytest
from helpers import capture, rlimit_sweep_source, run_script_results, used_recursion_depth

# The aux_data checks are under test here: on in installed runs too (conftest.py).
AUX_CHECKS = "warn"

JAX_0_7 = hasattr(jtu.PyTreeDef, "from_node_data_and_children")


def run_child(code: str, timeout: int = 240) -> str:
    """Runs `code` in a fresh interpreter; asserts it exits 0; returns its stdout."""
    _, proc = run_script_results(textwrap.dedent(code))
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


# ------------------------------------------------------------------------------------------------
# 1. borrowed pointers across code that can run Python


def test_flatten_up_to_list_emptied_by_a_finalizer_during_allocation():
    # The allocation of flatten_up_to's result runs the cyclic GC, whose finalizer
    # empties the very list being cut: a borrowed item would be a use-after-free.
    out = run_child(
        """
        import gc
        import fastree.tree_util as ftu

        N = 64
        live = []

        class Closer:
            def __init__(self):
                self.me = self
            def __del__(self):
                live.clear()
                [bytes(range(256)) * 2 for _ in range(4 * N)]

        td = ftu.tree_structure([0] * N)
        outcomes, outs, hold = set(), [], []
        gc.disable()
        for attempt in range(60):
            live.clear()
            live.extend(bytearray(100) for _ in range(N))
            Closer()                                 # unreachable cycle with a finalizer
            for _ in range(100):
                hold.append([])                      # empty the list free list
            gc.enable()
            gc.set_threshold(gc.get_count()[0])      # the next GC allocation collects:
            try:                                     # inside flatten_up_to's own PyList_New
                out = td.flatten_up_to(live)
            except ValueError as error:
                out = None
                outcomes.add("mismatch" if "arity mismatch" in str(error) else str(error))
            finally:
                gc.disable()
                gc.set_threshold(700)
            if out is not None:
                assert len(out) == N and all(type(x) is bytearray for x in out), out[:3]
                outcomes.add("ok")
                outs.append(out)
            gc.collect()
        gc.enable()
        print("outcomes=" + ",".join(sorted(outcomes)))
        """
    )
    assert "outcomes=" in out


# Entry points, each a function of (tree, second tree of the same structure).
ENTRY_POINTS = {
    "flatten": lambda t, u: tu.tree_flatten(t),
    "leaves": lambda t, u: tu.tree_leaves(t),
    "structure": lambda t, u: tu.tree_structure(t),
    "flatten_with_path": lambda t, u: tu.tree_flatten_with_path(t),
    "leaves_with_path": lambda t, u: tu.tree_leaves_with_path(t),
    "map": lambda t, u: tu.tree_map(lambda x: x, t),
    "map2": lambda t, u: tu.tree_map(lambda x, y: x, t, u),
    "map_is_leaf": lambda t, u: tu.tree_map(lambda x: x, t, is_leaf=lambda x: False),
    "map_with_path": lambda t, u: tu.tree_map_with_path(lambda p, x: x, t),
    "unflatten": lambda t, u: tu.tree_unflatten(tu.tree_structure(t), tu.tree_leaves(u)),
    "flatten_up_to": lambda t, u: tu.tree_structure(t).flatten_up_to(u),
    "all_leaves": lambda t, u: tu.all_leaves(tu.tree_leaves(t)),
    "hash_eq": lambda t, u: hash(tu.tree_structure(t)) == hash(tu.tree_structure(u)),
    "repr": lambda t, u: repr(tu.tree_structure(t)),
    "children": lambda t, u: tu.tree_structure(t).children(),
    "transpose": lambda t, u: tu.tree_transpose(
        tu.tree_structure([0, 0]), tu.tree_structure(t), [t, u]
    ),
}

GC_PRESSURE_SCRIPT = """
import collections, dataclasses, gc, pickle, sys
import fastree.tree_util as tu
sys.path.insert(0, {tests_dir!r})
import test_hostile as th

Point = collections.namedtuple("Point", "x y")

@tu.register_dataclass
@dataclasses.dataclass
class Cell:
    a: object
    b: object

class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

tu.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))

victims = []  # containers the finalizers attack

class Vandal:
    # Cyclic garbage: only the cyclic GC frees it, and its finalizer mutates the trees.
    def __init__(self, k):
        self.me, self.k = self, k
    def __del__(self):
        for v in victims:
            if isinstance(v, list):
                v.clear() if self.k % 2 else v.append(self.k)
            elif isinstance(v, dict):
                v.clear() if self.k % 2 else v.update({{"z%d" % self.k: self.k}})
        [Vandal(self.k + 1) for _ in range(2)] if self.k < 3 else None

def make():
    inner = [1.0, 2.0, (3.0, None)]
    d = {{"b": inner, "a": Point(4.0, [5.0]), "c": collections.OrderedDict(q=6.0)}}
    tree = [d, Pair(Cell(7.0, [8.0]), {{"k": 9.0}}), collections.defaultdict(list, r=[10.0])]
    victims[:] = [inner, d, tree, d["a"].y]
    return tree

gc.set_threshold(1, 1, 1)
done = 0
for name, op in th.ENTRY_POINTS.items():
    for round_ in range(40):
        Vandal(0)
        try:
            op(make(), make())
        except (ValueError, TypeError, RuntimeError, KeyError):
            pass  # a mutated tree may legitimately mismatch
        done += 1
gc.set_threshold(700, 10, 10)
print("done=%d" % done)
"""


def test_entry_points_survive_finalizers_mutating_trees_at_every_allocation():
    out = run_child(
        GC_PRESSURE_SCRIPT.format(tests_dir=str(__import__("pathlib").Path(__file__).parent))
    )
    assert f"done={40 * len(ENTRY_POINTS)}" in out


def test_unflatten_raises_when_an_unflatten_function_resizes_the_leaf_list():
    # Before: a custom unflatten inserting into the list being consumed made a shifted tree.
    for mutate, jax_text_start in [
        (lambda leaves: leaves.insert(0, 99), "Too many leaves for PyTreeDef; expected 3."),
        (lambda leaves: leaves.append(99), "Too many leaves for PyTreeDef; expected 3."),
        (lambda leaves: leaves.pop(), "Too few leaves for PyTreeDef; expected 3, got 2"),
    ]:
        holder: list = []

        class Box:
            def __init__(self, v):
                self.v = v

        def unflatten(_, children, mutate=mutate, holder=holder):
            mutate(holder[0])
            return Box(children[0])

        tu.register_pytree_node(Box, lambda b: ((b.v,), None), unflatten)
        treedef = tu.tree_structure([Box(1), 2, 3])
        holder[:] = [[1, 2, 3]]
        with pytest.raises(ValueError) as info:
            tu.tree_unflatten(treedef, holder[0])
        assert str(info.value) == jax_text_start
        holder[:] = [[1, 2, 3]]
        assert str(capture(jtu.tree_unflatten, treedef.to_jax(), holder[0])) == jax_text_start


def test_dict_sort_survives_an_inconsistent_comparator():
    # A __lt__ answering at random violates every sort's assumptions; the replica of libstdc++'s
    # stable_sort is bounds-checked where the original is not.
    rng = random.Random(0)

    class Liar:
        def __init__(self, n):
            self.n = n

        def __lt__(self, other):
            return rng.random() < 0.5

        def __hash__(self):
            return self.n

        def __eq__(self, other):
            return self is other

    for size in (2, 7, 8, 15, 64, 300):
        d = {Liar(i): i for i in range(size)}
        leaves, treedef = tu.tree_flatten(d)
        assert sorted(leaves) == list(range(size))
        assert tu.tree_unflatten(treedef, leaves).keys() == d.keys()


# ------------------------------------------------------------------------------------------------
# 2. error paths


def _mismatched_pair():
    return (1, [2, 3]), (1, [2, 3, 4])


def test_map_mismatch_is_explained_without_jaxlib(monkeypatch):
    from jax._src import tree_util as jax_internal

    def forbidden(*args, **kwargs):
        raise AssertionError("the explanation must not go through JAX")

    monkeypatch.setattr(jax_internal, "prefix_errors", forbidden)
    monkeypatch.setattr(jax_internal, "_prefix_error", forbidden)
    x, y = _mismatched_pair()
    error = capture(tu.tree_map, lambda a, b: a, x, y)
    assert isinstance(error, ValueError)
    if fastree.jax_interop.map_errors._ENABLED:
        assert str(error).startswith("pytree structure error: different lengths of list")


def test_map_mismatch_keeps_the_recursion_budget():
    # A failing multi-tree tree_map whose second tree contains itself left the
    # interpreter's recursion counter corrupted if the error path went through jaxlib's flatten.
    class Loop:
        pass

    tu.register_pytree_node(Loop, lambda n: ((n.me,), None), lambda _, c: Loop())
    node = Loop()
    node.me = node
    before = used_recursion_depth()
    with pytest.raises((ValueError, RecursionError)):
        tu.tree_map(lambda *a: None, [1, [2]], [1, [node, 3]])
    assert used_recursion_depth() == before


@pytest.mark.skipif(
    not fastree.jax_interop.map_errors._ENABLED, reason=f"jax {jax.__version__} does not explain mismatches"
)
def test_keyboard_interrupt_inside_the_explanation_propagates():
    calls = {"n": 0}

    class Touchy:
        def __init__(self, v):
            self.v = v

    def flatten(t):
        calls["n"] += 1
        if calls["n"] > 1:  # flatten's own call passes; the explanation's walk is interrupted
            raise KeyboardInterrupt
        return (t.v,), None

    tu.register_pytree_node(Touchy, flatten, lambda _, c: Touchy(*c))
    with pytest.raises(KeyboardInterrupt):
        # flatten_up_to meets the mismatch in (2, 3) before Touchy; the explanation, walking
        # left to right, flattens Touchy first.
        tu.tree_map(lambda a, b: a, (Touchy(1), (2,)), (Touchy(1), (2, 3)))


def test_keyboard_interrupt_inside_flatten_up_to_is_not_replaced():
    class Trap:
        def __init__(self, v, armed=False):
            self.v, self.armed = v, armed

    def flatten(t):
        if t.armed:
            t.armed = False  # one Ctrl-C: a later flatten of the same node (an explanation) passes
            raise KeyboardInterrupt
        return (t.v,), None

    tu.register_pytree_node(Trap, flatten, lambda _, c: Trap(*c))
    # Only `other`'s Trap is armed, and it is last: flatten_up_to visits it before the mismatch
    # in (2, 3, 4), which the old error path then "explained" over the KeyboardInterrupt.
    tree = [(2, 3), Trap(1)]
    other = [(2, 3, 4), Trap(1, armed=True)]
    with pytest.raises(KeyboardInterrupt):
        tu.tree_map(lambda a, b: a, tree, other, is_leaf=lambda x: False)


@pytest.mark.skipif(
    not fastree.jax_interop.map_errors._ENABLED, reason=f"jax {jax.__version__} does not explain mismatches"
)
def test_an_error_raised_while_explaining_propagates_with_the_mismatch_as_context():
    class Odd:
        def __init__(self, v):
            self.v = v

    state = {"n": 0}

    def flatten(t):
        state["n"] += 1
        if state["n"] > 1:
            raise LookupError("flatten broke while explaining")
        return (t.v,), None

    tu.register_pytree_node(Odd, flatten, lambda _, c: Odd(*c))
    with pytest.raises(LookupError) as info:
        tu.tree_map(lambda a, b: a, (Odd(1), (2,)), (Odd(1), (2, 3)))
    assert isinstance(info.value.__context__, ValueError)


def test_explanation_honours_is_leaf_below_the_root():
    # JAX applies is_leaf to the root only; fastree at every level, as flatten does.
    x = {"a": [1, 2], "b": (3,)}
    y = {"a": [1, 2, 9], "b": (3, 4)}  # "a" is a leaf for is_leaf; only "b" mismatches
    error = capture(tu.tree_map, lambda a, b: a, x, y, is_leaf=lambda t: isinstance(t, list))
    if fastree.jax_interop.map_errors._ENABLED:
        assert "tree_map tree['b']" in str(error)


# ------------------------------------------------------------------------------------------------
# 3. out of memory

OOM_SCRIPT = """
import gc, resource, sys
import fastree.tree_util as tu
import collections

Point = collections.namedtuple("Point", "x y")
op_name = sys.argv[1] if len(sys.argv) > 1 else {op!r}

leaf_objects = [object() for _ in range(64)]

def make(n):
    # Wide and nested, every node kind; past 2**17 children so key paths leave the key cache.
    row = lambda i: {{"w": leaf_objects[i % 64], "b": (leaf_objects[(i + 1) % 64], None),
                     "p": Point(leaf_objects[(i + 2) % 64], [leaf_objects[(i + 3) % 64]])}}
    return [row(i) for i in range(n)] + [leaf_objects[i % 64] for i in range(140_000)]

tree = make(20_000)
other = make(20_000)
treedef = tu.tree_structure(tree)
leaves = tu.tree_leaves(tree)
ops = {{
    "flatten": lambda: tu.tree_flatten(tree),
    "leaves": lambda: tu.tree_leaves(tree),
    "structure": lambda: tu.tree_structure(tree),
    "flatten_with_path": lambda: tu.tree_flatten_with_path(tree),
    "map": lambda: tu.tree_map(lambda x: x, tree),
    "map2": lambda: tu.tree_map(lambda x, y: x, tree, other),
    "map_with_path": lambda: tu.tree_map_with_path(lambda p, x: x, tree),
    "unflatten": lambda: tu.tree_unflatten(treedef, leaves),
    "flatten_up_to": lambda: treedef.flatten_up_to(other),
}}
op = ops[op_name]
op()  # warm every cache first: what stays cached is not a leak
gc.collect()
before = [sys.getrefcount(x) for x in leaf_objects]

"""


@pytest.mark.skipif(
    sys.platform != "linux" or __import__("os").environ.get("FASTREE_SANITIZED") == "1",
    reason="RLIMIT_AS sweeps need Linux and no sanitizer shadow memory",
)
@pytest.mark.parametrize(
    "op",
    [
        "flatten",
        "leaves",
        "structure",
        "flatten_with_path",
        "map",
        "map2",
        "map_with_path",
        "unflatten",
        "flatten_up_to",
    ],
)
def test_out_of_memory_is_a_memory_error_and_leaks_nothing(op):
    # 2000 calls is a bound, not a count: each headroom ends at its first MemoryError. Free-threaded
    # builds' allocator reserves address space ahead (VmSize counts it), so there the first failure
    # comes hundreds of calls later than on GIL builds.
    results, proc = run_script_results(
        OOM_SCRIPT.format(op=op) + rlimit_sweep_source((2, 6, 16, 40, 96), calls=2000)
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    assert results["leaked"] == "[]"
    assert int(results["failures"]) >= 1  # the limits were tight enough to fail


# ------------------------------------------------------------------------------------------------
# 4. silent differences from JAX


def _unorderable_dict(rng: random.Random, size: int) -> dict:
    d: dict = {}
    kind = rng.random()
    while len(d) < size:
        if kind < 0.5:  # float("nan") is a new object each time: distinct keys
            key = float("nan") if rng.random() < 0.25 else float(rng.randint(0, 10 * size))
        else:
            key = frozenset(rng.sample(range(24), rng.randint(0, 4)))
        d[key] = len(d)
    return d


def test_dict_keys_without_a_total_order_follow_jaxs_order():
    # JAX sorts with libstdc++'s stable_sort over `<`; list.sort gives another order.
    rng = random.Random(5)
    for _ in range(400):
        d = _unorderable_dict(rng, rng.randint(0, 80))
        assert tu.tree_leaves(d) == jtu.tree_leaves(d)
        assert [p for p, _ in tu.tree_leaves_with_path(d)] == [
            p for p, _ in jtu.tree_leaves_with_path(d)
        ]
        assert tu.tree_map(lambda x: x, [d]) == [d]
        assert tu.tree_structure(d).flatten_up_to(d) == jtu.tree_leaves(d)
    big = _unorderable_dict(rng, 3000)
    assert tu.tree_leaves(big) == jtu.tree_leaves(big)


@pytest.mark.parametrize(
    "order",
    [
        "natural",
        "sorted",
        "reversed",
        "nearly",
        "runs",
        "descending runs",
        "random",
        "ints",
        "latin1",
        "unicode",
        "prefixes",
    ],
)
def test_dict_keys_in_every_insertion_order_sort_as_jax_does(order):
    rng = random.Random(order)
    keys: list = [f"k{i}" for i in range(3000)]
    if order == "sorted":
        keys.sort()
    elif order == "reversed":
        keys.sort(reverse=True)
    elif order == "nearly":
        keys.sort()
        for _ in range(30):
            i, j = rng.randrange(3000), rng.randrange(3000)
            keys[i], keys[j] = keys[j], keys[i]
    elif order in ("runs", "descending runs"):
        # Sorted (or reversed) runs of very unequal lengths, shuffled: merged run by run, the
        # shorter of two runs on either side.
        keys.sort()
        cuts = sorted(rng.sample(range(1, 3000), 12))
        runs = [keys[a:b] for a, b in zip([0, *cuts], [*cuts, 3000])]
        if order == "descending runs":
            runs = [run[::-1] for run in runs]
        rng.shuffle(runs)
        keys = [key for run in runs for key in run]
    elif order == "random":
        rng.shuffle(keys)
    elif order in ("latin1", "unicode"):
        # Prefix-sorted one-byte strings (ASCII, Latin-1), NUL and shared prefixes included;
        # "unicode" mixes in wider kinds, which take the plain comparison path.
        alphabet = ["a", "b", "\x00", "é", "ÿ", "Z", "ab"] + (
            ["中", "\U0001f600"] * (order == "unicode")
        )
        keys = list(
            {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(3000)}
        )
    elif order == "ints":
        keys = [rng.randrange(-(2**70), 2**70) for _ in range(500)] + list(range(2000))
    elif order == "prefixes":
        # Long shared prefixes, differing before, at and after each 8-byte word boundary (str
        # keys compare a word at a time), one key a prefix of another, bytes above 127.
        stems = ["", "p" * 7, "p" * 8, "p" * 9, "q" * 15, "q" * 16, "q" * 17, "\xff" * 8]
        keys = list(
            {
                stem + "".join(rng.choice("a\x00\x7f\x80\xffz") for _ in range(rng.randint(0, 10)))
                for stem in stems
                for _ in range(400)
            }
        )
        rng.shuffle(keys)
        # Small dicts too (their sort is a different routine), from 2 to 17 keys.
        for n in range(2, 18):
            small = {k: i for i, k in enumerate(rng.sample(keys, n))}
            assert tu.tree_leaves(small) == jtu.tree_leaves(small)
    d = {k: i for i, k in enumerate(keys)}
    assert tu.tree_leaves(d) == jtu.tree_leaves(d)


def test_type_registered_on_jaxlibs_registry_object_is_a_node():
    # default_registry.register_node registers with jaxlib only: the core must see it too.
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def __eq__(self, other):
            return type(other) is Pair and (self.a, self.b) == (other.a, other.b)

    jtu.default_registry.register_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
    p = Pair(1, [2, 3])
    if not JAX_0_7:
        pytest.skip("jaxlib before 0.7 cannot be asked whether a type is a node")
    assert tu.tree_leaves(p) == jtu.tree_leaves(p) == [1, 2, 3]
    assert str(tu.tree_structure(p)) == str(jtu.tree_structure(p))
    assert tu.tree_map(lambda x: x * 10, p) == jtu.tree_map(lambda x: x * 10, p)
    assert tu.tree_leaves_with_path(p) == jtu.tree_leaves_with_path(p)
    assert tu.tree_unflatten(tu.tree_structure(p), [7, 8, 9]) == Pair(7, [8, 9])


def test_dataclass_registered_on_jaxlibs_registry_object_is_a_node():
    if not JAX_0_7:
        pytest.skip("jaxlib before 0.7 cannot be asked whether a type is a node")

    @dataclasses.dataclass
    class Cell:
        x: object
        tag: str

    jtu.default_registry.register_dataclass_node(Cell, ["x"], ["tag"])
    c = Cell([1, 2], "t")
    assert tu.tree_leaves(c) == jtu.tree_leaves(c)
    assert str(tu.tree_structure(c)) == str(jtu.tree_structure(c))
    assert tu.tree_map(lambda v: v + 1, c) == Cell([2, 3], "t")
    assert tu.tree_leaves_with_path(c) == jtu.tree_leaves_with_path(c)


def test_namedtuple_is_decided_per_object():
    class Row(tuple):
        pass

    plain = Row((1, 2))
    fielded = Row((3, 4))
    fielded._fields = ("x", "y")  # type: ignore[attr-defined]
    tree = [plain, fielded, plain]
    assert tu.tree_leaves(tree) == jtu.tree_leaves(tree)
    assert str(tu.tree_structure(tree)) == str(jtu.tree_structure(tree))
    assert tu.tree_leaves_with_path(tree) == jtu.tree_leaves_with_path(tree)


def test_treedef_hash_runs_no_key_hash():
    class Key:
        armed = False

        def __init__(self, name):
            self.name = name

        def __hash__(self):
            if Key.armed:
                raise RuntimeError("hash called")
            return hash(self.name)

        def __eq__(self, other):
            return isinstance(other, Key) and other.name == self.name

        def __lt__(self, other):
            return self.name < other.name

    treedef = tu.tree_structure({Key("a"): 1, Key("b"): 2})
    Key.armed = True
    hash(treedef)  # JAX's hash does not call it either
    Key.armed = False


def test_equal_treedefs_hash_equal_for_equal_keys_of_different_types():
    class Colour(str, enum.Enum):
        RED = "red"

    a = tu.tree_structure({Colour.RED: 1, "x": 2})
    b = tu.tree_structure({"red": 1, "x": 2})
    assert a == b
    assert hash(a) == hash(b)
    assert tu.tree_structure({1: 0}) == tu.tree_structure({1.0: 0})
    assert hash(tu.tree_structure({1: 0})) == hash(tu.tree_structure({1.0: 0}))


# ------------------------------------------------------------------------------------------------
# 5. differential fuzz: random trees, registrations through every public route


@dataclasses.dataclass
class _ViaJaxDataclass:
    a: object
    b: object


class _ViaJaxNode:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return type(other) is type(self) and (self.a, self.b) == (other.a, other.b)


@jtu.register_pytree_node_class
class _ViaJaxClass:
    def __init__(self, *items):
        self.items = items

    def tree_flatten(self):
        return self.items, len(self.items)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def __eq__(self, other):
        return type(other) is type(self) and self.items == other.items


class _ViaJaxKeys(_ViaJaxNode):
    pass


class _ViaJaxlib(_ViaJaxNode):
    pass


@dataclasses.dataclass
class _ViaJaxlibDataclass:
    a: object
    b: object


class _ViaFastree(_ViaJaxNode):
    pass


@jtu.register_static
class _Static:
    def __eq__(self, other):
        return type(other) is _Static

    def __hash__(self):
        return 7


jtu.register_dataclass(_ViaJaxDataclass, ["a", "b"], [])
jtu.register_pytree_node(_ViaJaxNode, lambda n: ((n.a, n.b), None), lambda _, c: _ViaJaxNode(*c))
jtu.register_pytree_with_keys(
    _ViaJaxKeys,
    lambda n: (((jtu.GetAttrKey("a"), n.a), (jtu.GetAttrKey("b"), n.b)), "k"),
    lambda _, c: _ViaJaxKeys(*c),
)
jtu.default_registry.register_node(
    _ViaJaxlib, lambda n: ((n.a, n.b), 0), lambda _, c: _ViaJaxlib(*c)
)
jtu.default_registry.register_dataclass_node(_ViaJaxlibDataclass, ["a", "b"], [])
tu.register_pytree_node(_ViaFastree, lambda n: ((n.a, n.b), None), lambda _, c: _ViaFastree(*c))

_NamedPair = collections.namedtuple("_NamedPair", "first second")


def _random_tree(rng: random.Random, depth: int):
    if depth <= 0 or rng.random() < 0.25:
        return rng.choice([rng.random(), rng.randint(0, 9), None, "s", _Static()])
    kids = [_random_tree(rng, depth - 1) for _ in range(2)]
    makers = [
        lambda: list(kids),
        lambda: tuple(kids),
        lambda: {"b": kids[0], "a": kids[1]},
        lambda: {float("nan"): kids[0], 1.0: kids[1], 0.5: 0, float("nan"): 1},
        lambda: {frozenset({1, 2}): kids[0], frozenset({3}): kids[1], frozenset(): 0},
        lambda: collections.OrderedDict([("z", kids[0]), ("y", kids[1])]),
        lambda: collections.defaultdict(int, {2: kids[0], 1: kids[1]}),
        lambda: _NamedPair(*kids),
        lambda: _ViaJaxDataclass(*kids),
        lambda: _ViaJaxNode(*kids),
        lambda: _ViaJaxClass(*kids),
        lambda: _ViaJaxKeys(*kids),
        lambda: _ViaFastree(*kids),
        lambda: jax.tree_util.Partial(print, *kids),
    ]
    if JAX_0_7:
        makers += [lambda: _ViaJaxlib(*kids), lambda: _ViaJaxlibDataclass(*kids)]
    return rng.choice(makers)()


def test_differential_fuzz_against_jax():
    rng = random.Random(12)
    for _ in range(300):
        tree = _random_tree(rng, 4)
        fleaves, ftd = tu.tree_flatten(tree)
        jleaves, jtd = jtu.tree_flatten(tree)
        assert len(fleaves) == len(jleaves)
        assert all(a is b for a, b in zip(fleaves, jleaves))
        assert str(ftd) == str(jtd)
        assert ftd.num_nodes == jtd.num_nodes
        fpaths = [p for p, _ in tu.tree_leaves_with_path(tree)]
        jpaths = [p for p, _ in jtu.tree_leaves_with_path(tree)]
        assert fpaths == jpaths
        marker = object()
        fmapped = tu.tree_leaves(tu.tree_map(lambda x, m=marker: m, tree))
        assert len(fmapped) == len(jleaves) and all(x is marker for x in fmapped)
        assert str(tu.tree_structure(tu.tree_unflatten(ftd, jleaves))) == str(jtd)
        assert ftd.flatten_up_to(tree) == jtd.flatten_up_to(tree)
        assert hash(ftd) == hash(tu.tree_structure(tree))


# ------------------------------------------------------------------------------------------------
# 6. the aux_data reporter is told where the node is


def test_aux_report_takes_the_key_path_from_a_walk_that_keeps_one(monkeypatch):
    import warnings

    import numpy as np
    from fastree.diagnostics import aux as _aux

    class Holder:
        def __init__(self, v):
            self.v = v

    tu.register_pytree_node(Holder, lambda h: ((h.v,), np.zeros(1)), lambda _, c: Holder(*c))

    def no_walk(*args, **kwargs):
        raise AssertionError("the reporter must not walk the tree when the key path is known")

    monkeypatch.setattr(_aux, "_locate", no_walk)
    _aux._reset_warnings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        tu.tree_flatten_with_path({"a": [0, Holder(1.0)]})
    _aux._reset_warnings()
    assert "Holder node at key path ['a'][1] holds a numpy.ndarray" in str(record[0].message)


# ------------------------------------------------------------------------------------------------
# 5. a tuple subclass whose `_fields` raises


class _FieldsRaise(tuple):
    @property
    def _fields(self):
        raise AttributeError("computed, and absent here")


def test_tuple_subclass_whose_fields_raise_is_a_leaf_as_in_jax():
    # jaxlib's is_node says yes for the class (it has `_fields`), its flatten no for the object:
    # the core's own per-object test decides, and the class is not adopted from jaxlib.
    tree = [_FieldsRaise((1, 2)), {"k": _FieldsRaise(())}]
    leaves, treedef = tu.tree_flatten(tree)
    jax_leaves, jax_treedef = jtu.tree_flatten(tree)
    assert leaves == jax_leaves
    assert repr(treedef) == repr(jax_treedef)
    assert tu.tree_map(lambda x: x, tree) == tree
    assert [p for p, _ in tu.tree_leaves_with_path(tree)] == [
        p for p, _ in jtu.tree_leaves_with_path(tree)
    ]


# ------------------------------------------------------------------------------------------------
# 6. flatten_up_to of a namedtuple of a registered namedtuple type


_NTExpected = collections.namedtuple("_NTExpected", "x y")
_NTRegistered = collections.namedtuple("_NTRegistered", "x y")
tu.register_pytree_node(_NTRegistered, lambda b: (tuple(b), None), lambda _, c: _NTRegistered(*c))


def test_flatten_up_to_namedtuple_of_a_registered_namedtuple_type_is_jaxs_error():
    # JAX's testFlattenUpToErrors41: JAX asks the object (a tuple with `_fields`), not the
    # registry, so the error is the type mismatch, not "Expected named tuple".
    jax_error = capture(
        lambda: jtu.tree_structure(_NTExpected(1, 2)).flatten_up_to(_NTRegistered(1, 2))
    )
    error = capture(lambda: tu.tree_structure(_NTExpected(1, 2)).flatten_up_to(_NTRegistered(1, 2)))
    assert type(error) is type(jax_error) is ValueError
    assert str(error) == str(jax_error)
    assert str(error).startswith("Named tuple type mismatch: expected type:")
