"""Errors: same exception types and message text as JAX; deep/cyclic input; user exceptions."""

import collections
import dataclasses
import re
import sys
import textwrap
import warnings

import fastree
import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not
import numpy as np
import pytest
from helpers import (
    NT,
    NodeClass,
    Pair,
    Point,
    TREE_DICT,
    Triple,
    assert_same_error,
    assert_same_treedef,
    capture,
    parametrize,
    recursion_headroom,
    requires_jax,
    run_script_results,
    stable_id,
)

# ------------------------------------------------------------------------------------------------
# unflatten arity


def test_unflatten_too_few_leaves_pinned():
    td = tu.tree_structure({"a": (1, 2), "b": [3]})
    with pytest.raises(
        ValueError, match=re.escape("Too few leaves for PyTreeDef; expected 3, got 2")
    ):
        td.unflatten([1, 2])


def test_unflatten_too_many_leaves_pinned():
    td = tu.tree_structure({"a": (1, 2), "b": [3]})
    with pytest.raises(ValueError, match=re.escape("Too many leaves for PyTreeDef; expected 3.")):
        td.unflatten([1, 2, 3, 4])


def _wrong_counts():
    for name, tree in TREE_DICT.items():
        n = jtu.tree_structure(tree).num_leaves
        for count in sorted({0, n - 1, n + 1, n + 5} - {n, -1}):
            yield pytest.param(tree, count, id=f"{name}-{count}of{n}")


@pytest.mark.parametrize(("tree", "count"), list(_wrong_counts()))
def test_unflatten_wrong_leaf_count(tree, count):
    leaves = list(range(count))
    assert_same_error(
        lambda: jtu.tree_unflatten(jtu.tree_structure(tree), leaves),
        lambda: tu.tree_unflatten(tu.tree_structure(tree), leaves),
    )
    assert_same_error(
        lambda: jtu.tree_structure(tree).unflatten(iter(leaves)),
        lambda: tu.tree_structure(tree).unflatten(iter(leaves)),
    )


def test_unflatten_non_iterable_leaves_type():
    # the message of this one is the binding library's; only the type is part of the contract
    with pytest.raises(TypeError):
        tu.tree_unflatten(tu.tree_structure([1]), 5)


class _MutatesLeaves:
    """A node whose unflatten function edits the caller's leaves list while it is being read."""

    leaves: list = []
    edit = staticmethod(lambda leaves: None)

    def __init__(self, child):
        self.child = child


tu.register_pytree_node(
    _MutatesLeaves,
    lambda node: ((node.child,), None),
    lambda _, children: (_MutatesLeaves.edit(_MutatesLeaves.leaves), _MutatesLeaves(*children))[1],
)


@pytest.mark.parametrize(
    "edit", [list.clear, lambda leaves: leaves.pop(), lambda leaves: leaves.__delitem__(slice(1, None))]
)
def test_unflatten_leaves_list_shrunk_by_callback(edit):
    # The list is read in place (no snapshot): a callback shrinking it must give JAX's error for
    # running out of leaves, never a read past its end.
    td = tu.tree_structure([_MutatesLeaves(0), 1, 2])
    leaves = [object(), object(), object()]
    _MutatesLeaves.leaves, _MutatesLeaves.edit = leaves, edit
    try:
        with pytest.raises(ValueError, match=r"Too few leaves for PyTreeDef; expected 3, got \d"):
            tu.tree_unflatten(td, leaves)
    finally:
        _MutatesLeaves.leaves, _MutatesLeaves.edit = [], lambda leaves: None


def test_unflatten_leaves_list_replaced_by_callback():
    # Items replaced behind the reader are taken as they are when their position is reached,
    # and the replaced objects are neither leaked nor freed early.
    td = tu.tree_structure([_MutatesLeaves(0), 1, 2])
    first, old, new = object(), object(), object()
    leaves = [first, old, old]
    base_old, base_new = sys.getrefcount(old), sys.getrefcount(new)

    def edit(lst):
        lst[1:] = [new, new]

    _MutatesLeaves.leaves, _MutatesLeaves.edit = leaves, edit
    try:
        out = tu.tree_unflatten(td, leaves)
    finally:
        _MutatesLeaves.leaves, _MutatesLeaves.edit = [], lambda leaves: None
    assert out[0].child is first
    assert out[1] is new and out[2] is new
    assert leaves == [first, new, new]
    assert sys.getrefcount(old) == base_old - 2
    assert sys.getrefcount(new) == base_new + 4  # two in the list, two in the result


# ------------------------------------------------------------------------------------------------
# flatten_up_to / tree_map structure mismatches

MISMATCHES = {
    "tuple_len": ((1, 2), (1, 2, 3)),
    "tuple_vs_list": ((1, 2), [1, 2]),
    "list_len": ([1, 2], [1]),
    "list_vs_leaf": ([1], 5),
    "dict_keys": ({"a": 1}, {"b": 1}),
    "dict_extra_key": ({"a": 1}, {"a": 1, "b": 2}),
    "dict_vs_list": ({"a": 1}, [1]),
    "namedtuple_type": (NT(1, 2), Triple(1, 2, 3)),
    "namedtuple_vs_tuple": (NT(1, 2), (1, 2)),
    "none_vs_leaf": (None, 1),
    "none_vs_tuple": (None, (1,)),
    "nested_none": ((None,), (3,)),
    "tuple_vs_none": ((1,), None),
    "custom_aux": (Pair(1, 2, tag="x"), Pair(1, 2, tag="y")),
    "custom_type": (Pair(1, 2), (1, 2)),
    "custom_class_aux": (NodeClass(1, meta=(1,)), NodeClass(1, meta=(2,))),
    "custom_class_arity": (NodeClass(1, 2), NodeClass(1)),
    "dataclass_aux": (Point(1, 2, label="a"), Point(1, 2, label="b")),
    "dataclass_type": (Point(1, 2), (1, 2)),
    "ordered_dict_order": (
        collections.OrderedDict(a=1, b=2),
        collections.OrderedDict([("b", 2), ("a", 1)]),
    ),
    "ordered_dict_vs_dict": (collections.OrderedDict(a=1), {"a": 1}),
    "dict_vs_ordered_dict": ({"a": 1}, collections.OrderedDict(a=1)),
    "defaultdict_vs_dict": (collections.defaultdict(list, a=1), {"a": 1}),
    "dict_vs_defaultdict": ({"a": 1}, collections.defaultdict(list, a=1)),
    "deep": ({"x": [1, {"y": (1, 2)}]}, {"x": [1, {"y": (1,)}]}),
    "deep_custom": ([Pair(1, {"k": 2})], [Pair(1, {"j": 2})]),
    "leaf_vs_node_deep": ({"x": (1, 2)}, {"x": 1}),
    "static_aux": (TREE_DICT["static"], type(TREE_DICT["static"])("other")),
}


@parametrize(case=MISMATCHES)
def test_flatten_up_to_mismatch(case):
    prefix, full = case
    assert_same_error(
        lambda: jtu.tree_structure(prefix).flatten_up_to(full),
        lambda: tu.tree_structure(prefix).flatten_up_to(full),
    )


@parametrize(case=MISMATCHES)
def test_tree_map_mismatch(case):
    prefix, full = case
    f = lambda *xs: None  # noqa: E731
    assert_same_error(lambda: jtu.tree_map(f, prefix, full), lambda: tu.tree_map(f, prefix, full))


@parametrize(case=MISMATCHES)
def test_tree_map_with_path_mismatch(case):
    prefix, full = case
    f = lambda *xs: None  # noqa: E731
    assert_same_error(
        lambda: jtu.tree_map_with_path(f, prefix, full),
        lambda: tu.tree_map_with_path(f, prefix, full),
    )


@parametrize(case=MISMATCHES)
def test_tree_map_mismatch_third_tree(case):
    prefix, full = case
    f = lambda *xs: None  # noqa: E731
    assert_same_error(
        lambda: jtu.tree_map(f, prefix, prefix, full),
        lambda: tu.tree_map(f, prefix, prefix, full),
    )


@parametrize(case={k: MISMATCHES[k] for k in ("tuple_len", "dict_keys", "custom_aux", "deep")})
def test_broadcast_mismatch(case):
    prefix, full = case
    assert_same_error(
        lambda: jtu.tree_broadcast(prefix, full), lambda: tu.tree_broadcast(prefix, full)
    )


@pytest.mark.skipif(
    not fastree.jax_interop.map_errors._ENABLED,
    reason="this JAX (before 0.7) lets the bare flatten_up_to error through tree_map",
)
def test_tree_map_mismatch_message_pinned():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "pytree structure error: different lengths of tuple at key path\n"
            "    tree_map tree['x'][1]['y']\n"
        ),
    ):
        tu.tree_map(lambda *a: 0, {"x": [1, {"y": (1, 2)}]}, {"x": [1, {"y": (1,)}]})


# ------------------------------------------------------------------------------------------------
# malformed custom flatten output

MALFORMED_FLATTEN = {
    "list_not_tuple": lambda s: [s.x],
    "tuple_len3": lambda s: ((s.x,), None, 1),
    "tuple_len1": lambda s: ((s.x,),),
    "children_not_iterable": lambda s: (5, None),
    "returns_none": lambda s: None,
    "returns_int": lambda s: 3,
}

OPERATIONS = {
    "flatten": lambda m: m.tree_flatten,
    "leaves": lambda m: m.tree_leaves,
    "structure": lambda m: m.tree_structure,
    "flatten_with_path": lambda m: m.tree_flatten_with_path,
    "leaves_with_path": lambda m: m.tree_leaves_with_path,
    "map": lambda m: lambda t: m.tree_map(lambda x: x, t),
    "map_with_path": lambda m: lambda t: m.tree_map_with_path(lambda p, x: x, t),
    "all": lambda m: m.tree_all,
}


def _malformed_type(name, flatten):
    class Bad:
        def __init__(self, x):
            self.x = x

    Bad.__name__ = Bad.__qualname__ = name
    tu.register_pytree_node(Bad, flatten, lambda a, c: Bad(*c))
    return Bad


MALFORMED_TYPES = {k: _malformed_type(k, f) for k, f in MALFORMED_FLATTEN.items()}


@parametrize(kind=MALFORMED_TYPES, op=OPERATIONS)
def test_malformed_custom_flatten(kind, op):
    tree = [1, {"k": kind(2)}]
    assert_same_error(lambda: op(jtu)(tree), lambda: op(tu)(tree))


MALFORMED_WITH_KEYS = {
    "list_not_tuple": lambda s: [(jtu.GetAttrKey("x"), s.x)],
    "children_not_pairs": lambda s: ([s.x], None),
    "pairs_not_iterable": lambda s: (5, None),
    "triples": lambda s: ([(jtu.GetAttrKey("x"), s.x, 1)], None),
}


def _malformed_keys_type(name, flatten_with_keys):
    class BadK:
        def __init__(self, x):
            self.x = x

    BadK.__name__ = BadK.__qualname__ = name
    tu.register_pytree_with_keys(BadK, flatten_with_keys, lambda a, c: BadK(*c))
    return BadK


MALFORMED_KEYS_TYPES = {k: _malformed_keys_type(k, f) for k, f in MALFORMED_WITH_KEYS.items()}


# Without an explicit flatten_func, JAX derives one in Python, so plain (path-less) flattening
# of a malformed with-keys result fails with Python's own unpacking errors, and two of JAX's path
# messages are garbled ("... tuple where 'child2"). Those texts are accidents, so only the
# exception type is pinned everywhere; the message is pinned where JAX's text is well-formed.
_WELL_FORMED_KEYS_MESSAGES = {
    ("list_not_tuple", "flatten_with_path"),
    ("list_not_tuple", "leaves_with_path"),
    ("list_not_tuple", "map_with_path"),
    ("pairs_not_iterable", "flatten_with_path"),
    ("pairs_not_iterable", "leaves_with_path"),
    ("pairs_not_iterable", "map_with_path"),
}


@parametrize(kind=MALFORMED_KEYS_TYPES, op=OPERATIONS)
def test_malformed_custom_flatten_with_keys(kind, op):
    tree = ({"k": kind(2)},)
    if (kind.__name__, _op_name(op)) in _WELL_FORMED_KEYS_MESSAGES:
        assert_same_error(lambda: op(jtu)(tree), lambda: op(tu)(tree))
    else:
        expected = capture(lambda: op(jtu)(tree))
        got = capture(lambda: op(tu)(tree))
        assert type(got) is type(expected), (got, expected)


def _op_name(op):
    return next(name for name, o in OPERATIONS.items() if o is op)


# ------------------------------------------------------------------------------------------------
# dict keys


@parametrize(op=OPERATIONS, tree={"flat": {1: 2, "a": 3}, "nested": [{"x": {1: 2, "a": 3}}]})
def test_unsortable_dict_keys(op, tree):
    assert_same_error(lambda: op(jtu)(tree), lambda: op(tu)(tree))


def test_unsortable_dict_keys_pinned():
    with pytest.raises(
        ValueError,
        match=re.escape("Comparator raised exception while sorting pytree dictionary keys."),
    ):
        tu.tree_flatten({1: 2, "a": 3})


@pytest.mark.parametrize(
    "tree",
    [
        collections.OrderedDict([(1, 2), ("a", 3)]),  # insertion order: no sort, no error
        collections.defaultdict(int, {1: 2, "a": 3}),  # JAX lets the TypeError through
    ],
    ids=["ordered_dict", "defaultdict"],
)
def test_unsortable_keys_in_dict_subtypes(tree):
    try:
        expected = jtu.tree_leaves(tree)
    except Exception:  # noqa: BLE001
        assert_same_error(lambda: jtu.tree_leaves(tree), lambda: tu.tree_leaves(tree))
    else:
        assert tu.tree_leaves(tree) == expected


# ------------------------------------------------------------------------------------------------
# is_leaf returning non-bools, other argument errors


@pytest.mark.parametrize("value", [1, 0, "x", [], 1.0], ids=stable_id)
@pytest.mark.parametrize("op", ["tree_flatten", "tree_leaves", "tree_structure", "tree_map"])
def test_is_leaf_non_bool(value, op):
    def call(m):
        if op == "tree_map":
            return m.tree_map(lambda x: x, [1, (2,)], is_leaf=lambda x: value)
        return getattr(m, op)([1, (2,)], is_leaf=lambda x: value)

    assert_same_error(lambda: call(jtu), lambda: call(tu))


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.tree_reduce(lambda a, b: a, []),
        pytest.param(
            lambda m: m.tree_reduce_associative(lambda a, b: a, []),
            marks=requires_jax("tree_util.tree_reduce_associative"),
        ),
        pytest.param(
            lambda m: m.flatten_one_level(1), marks=requires_jax("tree_util.flatten_one_level")
        ),
        pytest.param(
            lambda m: m.flatten_one_level_with_keys("leaf"),
            marks=requires_jax("tree_util.flatten_one_level_with_keys"),
        ),
    ],
    ids=["reduce_empty", "reduce_associative_empty", "one_level", "one_level_keys"],
)
def test_misc_errors(call):
    assert_same_error(lambda: call(jtu), lambda: call(tu))


def test_from_iterable_tree_errors():
    tree = [1, (2,)]
    for bad in ([1], [1, (2, 3)]):
        assert_same_error(
            lambda: jtu.tree_structure(tree).from_iterable_tree(bad),
            lambda: tu.tree_structure(tree).from_iterable_tree(bad),
        )


# JAX 0.10.2 builds (and returns) a broken treedef for a dict with a wrong key count or a leaf
# with children, raising only when it is later printed; only the unregistered-type error is pinned.
@requires_jax("PyTreeDef.from_node_data_and_children")
@pytest.mark.parametrize(
    ("node_data", "children"),
    [((int, None), [[1, (2,)]]), ((float, "aux"), [])],
    ids=["unregistered_type", "unregistered_type_no_children"],
)
def test_from_node_data_and_children_errors(node_data, children):
    assert_same_error(
        lambda: jtu.PyTreeDef.from_node_data_and_children(
            jtu.default_registry, node_data, [jtu.tree_structure(c) for c in children]
        ),
        lambda: fastree.PyTreeDef.from_node_data_and_children(
            node_data, [tu.tree_structure(c) for c in children]
        ),
    )


def test_transpose_error():
    tree = [(1, 2), (3,)]
    assert_same_error(
        lambda: jtu.tree_transpose(jtu.tree_structure([0, 0]), jtu.tree_structure((0, 0)), tree),
        lambda: tu.tree_transpose(tu.tree_structure([0, 0]), tu.tree_structure((0, 0)), tree),
    )


# ------------------------------------------------------------------------------------------------
# register_dataclass argument errors


@dataclasses.dataclass
class _DC:
    a: int
    b: int
    c: int = dataclasses.field(default=0, init=False)


class _NotDC:
    pass


@requires_jax("tree_util.is_tree_node")
@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (_DC, {"data_fields": ["a"], "meta_fields": []}),
        (_DC, {"data_fields": ["a", "b", "c"], "meta_fields": []}),
        (_DC, {"data_fields": ["a", "b"], "meta_fields": ["a"]}),
        (_DC, {"data_fields": ["a", "b"]}),
        (_DC, {"meta_fields": ["a", "b"]}),
        (_NotDC, {}),
    ],
    ids=["missing", "unexpected", "overlap", "data_only", "meta_only", "not_dataclass"],
)
def test_register_dataclass_errors(cls, kwargs):
    # these raise before registering anything, so the same class serves both libraries
    assert_same_error(
        lambda: jtu.register_dataclass(cls, **kwargs), lambda: tu.register_dataclass(cls, **kwargs)
    )
    assert not jtu.is_tree_node(cls)


# ------------------------------------------------------------------------------------------------
# deep and cyclic input: RecursionError, never a crash. Run in a fresh interpreter so that a crash
# is reported as a failing test rather than taking the session down.

_DEEP_SCRIPT = textwrap.dedent(
    """
    import fastree, fastree.tree_util as tu

    def deep_list(n):
        root = x = []
        for _ in range(n):
            y = []
            x.append(y)
            x = y
        return root

    deep = deep_list(100_000)
    cyclic = []
    cyclic.append(cyclic)
    cyclic_dict = {}
    cyclic_dict["a"] = cyclic_dict
    cases = {
        "flatten": lambda t: tu.tree_flatten(t),
        "leaves": lambda t: tu.tree_leaves(t),
        "structure": lambda t: tu.tree_structure(t),
        "flatten_with_path": lambda t: tu.tree_flatten_with_path(t),
        "map": lambda t: tu.tree_map(lambda x: x, t),
        "all": lambda t: tu.tree_all(t),
        "flatten_is_leaf": lambda t: tu.tree_flatten(t, is_leaf=lambda x: False),
    }
    for tname, tree in [("deep", deep), ("cyclic", cyclic), ("cyclic_dict", cyclic_dict)]:
        for cname, fn in cases.items():
            try:
                fn(tree)
                result = "no error"
            except BaseException as e:
                result = type(e).__name__
            # one line per case, flushed at once, so a later crash cannot hide earlier results
            print(f"{tname}-{cname}={result}", flush=True)
    """
)

_DEEP_KEYS = [
    f"{t}-{c}"
    for t in ("deep", "cyclic", "cyclic_dict")
    for c in (
        "flatten",
        "leaves",
        "structure",
        "flatten_with_path",
        "map",
        "all",
        "flatten_is_leaf",
    )
]


@pytest.fixture(scope="module")
def deep_results():
    return run_script_results(_DEEP_SCRIPT)


@pytest.mark.parametrize("key", _DEEP_KEYS)
def test_deep_and_cyclic_raise_recursion_error(deep_results, key):
    results, proc = deep_results
    assert key in results, f"interpreter died (rc={proc.returncode}): {proc.stderr[-2000:]}"
    assert results[key] == "RecursionError"


def test_deep_and_cyclic_interpreter_survives(deep_results):
    _, proc = deep_results
    assert proc.returncode == 0, proc.stderr[-2000:]


# A depth beyond the default recursion limit (1000) that only a raised limit lets through. From
# 3.12 CPython also applies a fixed C recursion budget that no limit raises (1,500 levels in
# 3.12.1), so the depth there stays under that budget.
RAISED_DEPTH = 3000 if sys.version_info < (3, 12) else 1200


def _nest(n, leaf=1):
    x = leaf
    for _ in range(n):
        x = [x]
    return x


def test_honours_lowered_recursion_limit():
    tree = _nest(1000)
    with recursion_headroom(5000):
        assert tu.tree_leaves(tree) == [1]  # fine under a generous limit
    with recursion_headroom(300):
        with pytest.raises(RecursionError):
            tu.tree_leaves(tree)
        with pytest.raises(RecursionError):
            tu.tree_structure(tree)
        with pytest.raises(RecursionError):
            tu.tree_flatten_with_path(tree)
        assert tu.tree_leaves(_nest(100)) == [1]


def test_honours_raised_recursion_limit():
    with recursion_headroom(8000):
        tree = _nest(RAISED_DEPTH)
        leaves, td = tu.tree_flatten(tree)
        assert leaves == [1]
        assert td.to_jax() == jtu.tree_structure(tree)
        assert td == tu.tree_structure(_nest(RAISED_DEPTH))
        assert hash(td) == hash(tu.tree_structure(_nest(RAISED_DEPTH)))
        assert repr(td) == repr(jtu.tree_structure(tree))
        assert td.unflatten([2]) == _nest(RAISED_DEPTH, leaf=2)
        paths = tu.tree_leaves_with_path(tree)
        assert len(paths[0][0]) == RAISED_DEPTH


def test_recursion_error_under_default_limit():
    # The same depth without the raised limit fails cleanly (on 3.12+ through fastree's own
    # count against sys.getrecursionlimit(), which CPython no longer applies there).
    with recursion_headroom(500):
        for op in (tu.tree_leaves, tu.tree_structure, tu.tree_flatten_with_path):
            with pytest.raises(RecursionError, match="maximum recursion depth exceeded"):
                op(_nest(RAISED_DEPTH))


def test_a_dict_refused_at_the_recursion_limit_keeps_every_reference():
    # A dict's pairs are gathered (borrowed, on GIL builds) before its level is counted: a dict
    # refused there must drop them as gathered, not release references it never took (that
    # freed the pairs under the dict and crashed a later walk, tests/test_limits.py). Each dict
    # is held ten times more here, so such a release shows in the counts instead of freeing one.
    key, value = "refused-level-key", object()
    chain = [{key: value, "child": None}]
    for _ in range(2000):
        chain.append({key: value, "child": None})
        chain[-2]["child"] = chain[-1]
    held = chain * 10  # noqa: F841 (the extra references)
    before = [sys.getrefcount(d) for d in chain] + [sys.getrefcount(value)]
    with recursion_headroom(300):
        for op in (tu.tree_flatten, tu.tree_leaves, tu.tree_structure,
                   lambda t: tu.tree_map(lambda x: x, t), tu.tree_flatten_with_path):
            with pytest.raises(RecursionError):
                op(chain[0])
    assert [sys.getrefcount(d) for d in chain] + [sys.getrefcount(value)] == before


_DEEP_TREEDEF_UNDER_LOWER_LIMIT = """
import sys
import fastree.tree_util as tu
from fastree.jax_interop.compat import tree_util as jtu

def nest(n, leaf):
    x = leaf
    for _ in range(n):
        x = [x]
    return x

raised = sys.getrecursionlimit() + 8000
sys.setrecursionlimit(raised)
td = tu.tree_structure(nest({depth}, 1))
jax_repr = repr(jtu.tree_structure(nest({depth}, 1)))
checks = {{
    "unflatten": (lambda: td.unflatten([2]), lambda out: out == nest({depth}, 2)),
    "repr": (lambda: repr(td), lambda out: out == jax_repr),
    "eq": (lambda: td == tu.tree_structure(1), lambda out: out is False),
}}
for name, (op, right) in checks.items():
    sys.setrecursionlimit(500)
    try:
        out = op()
    except RecursionError as error:
        outcome = "RecursionError" if "maximum recursion depth" in str(error) else repr(error)
    else:
        sys.setrecursionlimit(raised)  # the check compares nested lists
        outcome = "right" if right(out) else "wrong"
    sys.setrecursionlimit(raised)
    print(f"{{name}}={{outcome}}", flush=True)
"""


def test_deep_treedef_under_lower_limit_does_not_crash():
    # A treedef built under a raised limit, used under a low one: each operation answers
    # rightly or raises RecursionError; anything else, a crash above all, is a bug. In a child
    # process, so that a crash fails this test instead of ending the run.
    results, proc = run_script_results(
        _DEEP_TREEDEF_UNDER_LOWER_LIMIT.format(depth=RAISED_DEPTH)
    )
    assert proc.returncode == 0, proc.stderr
    assert list(results) == ["unflatten", "repr", "eq"], proc.stdout
    assert set(results.values()) <= {"right", "RecursionError"}, results


# ------------------------------------------------------------------------------------------------
# exceptions raised by user callbacks propagate unchanged


class UserError(Exception):
    pass


def _raiser(err):
    def f(*args):
        raise err

    return f


class _RaisesOnFlatten:
    pass


class _RaisesOnUnflatten:
    pass


_FLATTEN_ERR = UserError("flatten", 1)
_UNFLATTEN_ERR = UserError("unflatten", 2)
tu.register_pytree_node(_RaisesOnFlatten, _raiser(_FLATTEN_ERR), lambda a, c: None)
tu.register_pytree_node(_RaisesOnUnflatten, lambda o: ((1,), None), _raiser(_UNFLATTEN_ERR))


@pytest.mark.parametrize(
    ("call", "err"),
    [
        (lambda: tu.tree_leaves([1, _RaisesOnFlatten()]), _FLATTEN_ERR),
        (lambda: tu.tree_structure({"a": _RaisesOnFlatten()}), _FLATTEN_ERR),
        (lambda: tu.tree_flatten_with_path((_RaisesOnFlatten(),)), _FLATTEN_ERR),
        (lambda: tu.tree_map(lambda x: x, [_RaisesOnUnflatten()]), _UNFLATTEN_ERR),
        (
            lambda: tu.tree_structure(_RaisesOnUnflatten()).unflatten([5]),
            _UNFLATTEN_ERR,
        ),
        (lambda: tu.tree_leaves([1], is_leaf=_raiser(UserError("is_leaf"))), None),
        (
            lambda: tu.tree_leaves_with_path(
                [1], is_leaf=_raiser(UserError("is_leaf_path")), is_leaf_takes_path=True
            ),
            None,
        ),
        (lambda: tu.tree_map(_raiser(UserError("f")), {"a": 1}), None),
        (lambda: tu.tree_map_with_path(_raiser(UserError("fp")), {"a": 1}), None),
        (lambda: tu.tree_reduce(_raiser(UserError("r")), [1, 2]), None),
        (
            lambda: tu.tree_structure([1, 2]).walk(_raiser(UserError("w")), lambda x: x, [1, 2]),
            None,
        ),
    ],
    ids=[
        "flatten_leaves",
        "flatten_structure",
        "flatten_with_path",
        "unflatten_in_map",
        "unflatten",
        "is_leaf",
        "is_leaf_path",
        "map_f",
        "map_with_path_f",
        "reduce_f",
        "walk_f_node",
    ],
)
def test_user_exceptions_propagate_unchanged(call, err):
    with pytest.raises(UserError) as info:
        call()
    assert type(info.value) is UserError
    if err is not None:
        assert info.value is err
        assert info.value.args == err.args


def test_user_exception_object_identity():
    err = UserError("same object")
    with pytest.raises(UserError) as info:
        tu.tree_map(_raiser(err), [1, (2,)])
    assert info.value is err
    with pytest.raises(UserError) as info:
        tu.tree_flatten([1, (2,)], is_leaf=_raiser(err))
    assert info.value is err


def test_base_exceptions_propagate():
    class Stop(BaseException):
        pass

    with pytest.raises(Stop):
        tu.tree_map(_raiser(Stop()), [1])
    with pytest.raises(KeyboardInterrupt):
        tu.tree_leaves([1, (2,)], is_leaf=_raiser(KeyboardInterrupt()))


# ------------------------------------------------------------------------------------------------
# Registering something that is not a type: refused before anything is registered anywhere.

_NOT_TYPES = {"int": 5, "str": "name", "function": lambda: 0, "instance": object()}
_REGISTER_CALLS = {
    "register_pytree_node": lambda x: tu.register_pytree_node(x, lambda o: ((), None), None),
    "register_pytree_with_keys": lambda x: tu.register_pytree_with_keys(
        x, lambda o: ((), None), None
    ),
    "register_dataclass": lambda x: tu.register_dataclass(x, ["a"], []),
    "register_static": lambda x: tu.register_static(x),
    "register_node": lambda x: tu.default_registry.register_node(x, lambda o: ((), None), None),
    "register_dataclass_node": lambda x: tu.default_registry.register_dataclass_node(x, [], []),
}


@parametrize(not_a_type=_NOT_TYPES, register=_REGISTER_CALLS)
def test_registering_a_non_type_is_refused_and_registers_nothing(not_a_type, register):
    for _ in range(2):  # the second try would say "Duplicate" had JAX registered the first
        with pytest.raises(TypeError, match="expected a type to register, got"):
            register(not_a_type)


def test_register_dataclass_reads_one_shot_field_iterables_once():
    @dataclasses.dataclass
    class Once:
        x: int
        y: int
        tag: str

    tu.register_dataclass(Once, data_fields=(f for f in ["x", "y"]), meta_fields=iter(["tag"]))
    tree = Once(1, 2, "t")
    assert tu.tree_leaves(tree) == jtu.tree_leaves(tree) == [1, 2]
    assert_same_treedef(tu.tree_structure(tree), jtu.tree_structure(tree))
    assert tu.tree_unflatten(tu.tree_structure(tree), [3, 4]) == Once(3, 4, "t")


def test_register_dataclass_node_reads_one_shot_field_iterables_once():
    @dataclasses.dataclass
    class OnceNode:
        x: int
        tag: str

    tu.default_registry.register_dataclass_node(OnceNode, iter(["x"]), iter(["tag"]))
    tree = OnceNode(1, "t")
    assert tu.tree_leaves(tree) == jtu.tree_leaves(tree) == [1]
    assert tu.tree_unflatten(tu.tree_structure(tree), [3]) == OnceNode(3, "t")


# ------------------------------------------------------------------------------------------------
# tree_unflatten with something other than a fastree treedef: JAX's `treedef.unflatten(leaves)`.


def test_tree_unflatten_takes_a_jax_treedef_as_jax_does():
    jax_treedef = jtu.tree_structure({"a": (1, 2)})
    assert tu.tree_unflatten(jax_treedef, [3, 4]) == jtu.tree_unflatten(jax_treedef, [3, 4])


@pytest.mark.parametrize("not_a_treedef", [None, [1], 3, "td"], ids=stable_id)
def test_tree_unflatten_with_a_non_treedef_fails_as_in_jax(not_a_treedef):
    assert_same_error(
        lambda: jtu.tree_unflatten(not_a_treedef, [1]),
        lambda: tu.tree_unflatten(not_a_treedef, [1]),
    )


# ------------------------------------------------------------------------------------------------
# Treedef equality whose aux comparison raises: JAX's ValueError, the original as its cause.


class _EqRaises:
    def __eq__(self, other):
        raise RuntimeError("eq failed")

    def __ne__(self, other):
        raise RuntimeError("ne failed")

    __hash__ = object.__hash__


class _AuxHolder:
    def __init__(self, aux):
        self.aux = aux


tu.register_pytree_node(_AuxHolder, lambda h: ((), h.aux), lambda aux, _: _AuxHolder(aux))


@pytest.mark.parametrize("op", ["eq", "ne"])
@pytest.mark.parametrize(
    "make_aux", [_EqRaises, lambda: np.zeros(2)], ids=["eq_raises", "array"]
)
def test_treedef_equality_error_in_aux_is_jax_value_error(op, make_aux):
    def compare(module):
        a = module.tree_structure(_AuxHolder(make_aux()))
        b = module.tree_structure(_AuxHolder(make_aux()))
        return a == b if op == "eq" else a != b

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastree.AuxDataWarning)  # arrays as aux are flagged
        error = assert_same_error(lambda: compare(jtu), lambda: compare(tu))
    assert error.__cause__ is not None


class _ReprMeta(type):
    def __repr__(cls):  # Python code the error message runs: never with an error pending
        return "<node type with its own repr>"


class _AuxHolderWithMeta(metaclass=_ReprMeta):
    def __init__(self, aux):
        self.aux = aux


tu.register_pytree_node(
    _AuxHolderWithMeta, lambda h: ((), h.aux), lambda aux, _: _AuxHolderWithMeta(aux)
)


def test_treedef_equality_error_keeps_its_cause_when_the_type_repr_is_python():
    # The message names the type by repr(); that repr runs only once the comparison's own error
    # is set aside (it was once run with it pending: a SystemError, and the cause lost).
    a = tu.tree_structure(_AuxHolderWithMeta(_EqRaises()))
    b = tu.tree_structure(_AuxHolderWithMeta(_EqRaises()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastree.AuxDataWarning)
        with pytest.raises(ValueError, match="metadata fields") as info:
            _ = a == b
    cause = info.value.__cause__
    assert isinstance(cause, RuntimeError) and str(cause) == "ne failed"
    assert not isinstance(info.value.__context__, SystemError)


# ------------------------------------------------------------------------------------------------
# Hand-made "namedtuples" (a tuple subclass with _fields): JAX's checks on key paths.


class _ShortFields(tuple):
    _fields = ("a",)


class _IntFields(tuple):
    _fields = 5


class _NonStrFields(tuple):
    _fields = (1, 2)


@requires_jax("tree_util.flatten_one_level_with_keys")
@pytest.mark.parametrize("cls", [_ShortFields, _IntFields], ids=lambda c: c.__name__)
@pytest.mark.parametrize("fn", ["tree_leaves_with_path", "flatten_one_level_with_keys"])
def test_fields_of_the_wrong_size(cls, fn):
    assert_same_error(lambda: getattr(jtu, fn)(cls((1, 2))), lambda: getattr(tu, fn)(cls((1, 2))))
    assert tu.tree_leaves(cls((1, 2))) == jtu.tree_leaves(cls((1, 2)))


def test_non_str_field_names_key_as_their_str():
    got = tu.tree_flatten_with_path(_NonStrFields((1, 2)))[0]
    assert got == jtu.tree_flatten_with_path(_NonStrFields((1, 2)))[0]
    assert [p for p, _ in got] == [(jtu.GetAttrKey("1"),), (jtu.GetAttrKey("2"),)]
