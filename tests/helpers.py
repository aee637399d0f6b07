"""Shared corpus and comparison helpers for the fastree test suite.

Every behaviour is checked differentially against the installed ``jax.tree_util``: a test runs the
same call through JAX and through fastree and compares the results. JAX's side is always JAX's own
functions (``fastree.jax_interop.compat.tree_util`` / ``.tree``), never the module attributes:
under ``python -m fastree.run -m pytest`` those are routed to fastree, and a comparison through
them would compare fastree with itself. The custom node types below are registered through
fastree (which also registers them with JAX), so both libraries see them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import importlib
import importlib.util
import inspect
import itertools
import re
import signal
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any, NamedTuple

import fastree
import fastree.tree_util as tu
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fastree.jax_interop.compat import tree as jt  # JAX's own, installed or not
from fastree.jax_interop.compat import tree_util as jtu  # JAX's own, installed or not

# ------------------------------------------------------------------------------------------------
# parametrize helper


def parametrize(**axes: Any):
    """Cartesian-product ``pytest.mark.parametrize`` over named axes.

    Each axis is a sequence of values, or a dict mapping test ids to values.

    >>> @parametrize(tree=TREES, none_is_leaf=[False, True])  # doctest: +SKIP
    """
    names = list(axes)
    columns = []
    for name in names:
        values = axes[name]
        if isinstance(values, dict):
            columns.append([(str(k), v) for k, v in values.items()])
        else:
            columns.append([(f"{name}{i}", v) for i, v in enumerate(values)])
    params = []
    for combo in itertools.product(*columns):
        ids = "-".join(i for i, _ in combo)
        params.append(pytest.param(*(v for _, v in combo), id=ids))
    return pytest.mark.parametrize(names, params)


_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def stable_id(value: Any) -> str:
    """A pytest id for ``value`` that every process computes alike (for ``ids=``).

    The repr of plain data (scalars, and lists, tuples and dicts of it); otherwise the type's
    name. A default repr holds an object's address, and a set's repr orders strings by the hash
    seed: ids built from either differ between pytest-xdist's workers, which then refuse to run.
    pytest numbers duplicate ids itself.

    >>> stable_id([1, "a"]), stable_id(object()), stable_id(frozenset({"a", "b"}))
    ("[1, 'a']", 'object', 'frozenset')
    """

    def plain(v: Any) -> bool:
        if type(v) in _PLAIN_SCALARS:
            return True
        if type(v) in (list, tuple):
            return all(plain(x) for x in v)
        if type(v) is dict:
            return all(plain(k) and plain(x) for k, x in v.items())
        return False

    return repr(value) if plain(value) else type(value).__name__


# ------------------------------------------------------------------------------------------------
# the installed JAX as the reference


def jax_has(*names: str) -> bool:
    """True if the installed JAX has every dotted name, e.g. "tree_util.is_tree_node".

    Roots: ``tree_util`` and ``tree`` (the modules), ``PyTreeDef`` and ``default_registry``.
    ``"tree_util.keystr(simple)"`` asks for a parameter of the function too.
    """
    roots = {
        "tree_util": jtu,
        "tree": jt,
        "PyTreeDef": jtu.PyTreeDef,
        "default_registry": jtu.default_registry,
    }
    for name in names:
        name, _, param = name.rstrip(")").partition("(")
        root, _, attr = name.partition(".")
        if not hasattr(roots[root], attr):
            return False
        if param:
            try:
                params = inspect.signature(getattr(roots[root], attr)).parameters
            except (TypeError, ValueError):  # a builtin without a signature: assume it has it
                continue
            if param not in params:
                return False
    return True


def requires_jax(*names: str):
    """Skips a test whose reference behaviour is a JAX name the installed JAX lacks.

    fastree offers the name anyway (it follows the newest JAX); older JAX (the newest for Python
    3.10 is 0.6.2) simply has nothing to compare it with.
    """
    missing = [name for name in names if not jax_has(name)]
    return pytest.mark.skipif(
        bool(missing), reason=f"jax {jax.__version__} has no {', '.join(missing)}"
    )


def skip_unless_integration_knows(library: str, integration_name: str | None = None) -> None:
    """Skips (the test, or at import the whole module) unless ``library`` is installed with code
    whose node layout fastree's integration reproduces (fastree.integrations.<library>, or
    ``integration_name`` where it is named otherwise: flax's is ``flax_nnx``): other code keeps
    the library's own functions, and the tests' expectations do not hold."""
    pytest.importorskip(library)
    integration = importlib.import_module(
        f"fastree.integrations.{integration_name or library}"
    )
    for module in sorted({item.module for item in integration.MIRRORED}):
        try:
            importlib.import_module(module)
        except ImportError:  # a release without that module: not code the integration knows
            break
    verdict = integration.code_verdict()
    if not verdict:
        pytest.skip(
            f"the installed {library} is not code the integration reproduces ({verdict.reason}): "
            f"its classes stay {library}'s",
            allow_module_level=True,
        )


def flax_walk_status(**overrides: str) -> dict[str, str]:
    """What ``flax_nnx_graph.status()`` says once fastree is installed and nothing was replaced:
    ``"native"`` for each graph walk whose mirrored code is the loaded flax release's, else that
    walk's verdict (flax 0.12.7 has no ``extract.labeled``, ``apply_updates`` or ``Updates``: its
    alias check and write-back stay flax's). ``overrides`` set what a test changed."""
    import flax.nnx  # noqa: F401  (the modules whose code is fingerprinted)
    from fastree.integrations import _known_flax, _mirrored_code, flax_nnx_graph

    for module in sorted({item.module for item in flax_nnx_graph.MIRRORED}):
        importlib.import_module(module)
    out = {}
    for walk in flax_nnx_graph.WALKS:
        verdict = _mirrored_code.recognise("flax", flax_nnx_graph.walk_mirrored(walk),
                                           _known_flax.KNOWN_CODE)
        out[walk] = "native" if verdict else verdict.reason
    out.update(overrides)
    return out


def skip_unless_flax_serves(*walks: str) -> None:
    """Skips (the test, or at import the whole module) where the loaded flax release's code for
    one of these graph walks is not code fastree mirrors: the walk is flax's own there."""
    status = flax_walk_status()
    unserved = [walk for walk in walks if status[walk] != "native"]
    if unserved:
        pytest.skip(f"this flax's {', '.join(unserved)} is flax's own: "
                    f"{status[unserved[0]]}", allow_module_level=True)


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@contextlib.contextmanager
def script_module(name: str, *siblings: str):
    """scripts/<name>.py imported as the module `name`, registered in sys.modules while in use
    (its dataclasses look their module up there), then forgotten with the `siblings` it imports
    (other scripts, which register themselves)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for loaded in (name, *siblings):
            sys.modules.pop(loaded, None)


def run_json_program(program: str, installed: bool, *args: str) -> Any:
    """Runs ``program`` in a child process, plainly or with fastree installed into JAX before
    anything else is imported (as ``python -m fastree.run`` installs it), with no FASTREE_*
    setting inherited; returns its last line of output, read as JSON."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTREE_")}
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    code = "import fastree; fastree.install()\n" + program if installed else program
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# custom node types, registered through fastree


class Pair:
    """register_pytree_node without keys; aux is a hashable tag."""

    def __init__(self, left: Any, right: Any, tag: str = "pair") -> None:
        self.left, self.right, self.tag = left, right, tag

    def __repr__(self) -> str:
        return f"Pair({self.left!r}, {self.right!r}, tag={self.tag!r})"


tu.register_pytree_node(
    Pair,
    lambda p: ((p.left, p.right), p.tag),
    lambda tag, children: Pair(*children, tag=tag),
)


class Keyed:
    """register_pytree_node with a flatten_with_keys_func; children as a list."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def __repr__(self) -> str:
        return f"Keyed({self.a!r}, {self.b!r})"


tu.register_pytree_node(
    Keyed,
    lambda k: ([k.a, k.b], None),
    lambda _, children: Keyed(*children),
    lambda k: ([(tu.GetAttrKey("a"), k.a), (tu.GetAttrKey("b"), k.b)], None),
)


@tu.register_pytree_node_class
class NodeClass:
    """register_pytree_node_class; aux is a tuple of ints, children a variable-length tuple."""

    def __init__(self, *items: Any, meta: tuple = (1, 2)) -> None:
        self.items, self.meta = items, meta

    def tree_flatten(self):
        return self.items, self.meta

    @classmethod
    def tree_unflatten(cls, meta, children):
        return cls(*children, meta=meta)

    def __repr__(self) -> str:
        return f"NodeClass{self.items!r}"


@tu.register_pytree_with_keys_class
class KeysClass:
    """register_pytree_with_keys_class with DictKey/custom-style keys."""

    def __init__(self, x: Any, y: Any, name: str = "k") -> None:
        self.x, self.y, self.name = x, y, name

    def tree_flatten_with_keys(self):
        return ((tu.DictKey("x"), self.x), (tu.DictKey("y"), self.y)), self.name

    @classmethod
    def tree_unflatten(cls, name, children):
        return cls(*children, name=name)

    def __repr__(self) -> str:
        return f"KeysClass({self.x!r}, {self.y!r})"


class WithKeys:
    """register_pytree_with_keys (function form) with an explicit flatten_func."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def __repr__(self) -> str:
        return f"WithKeys({self.first!r}, {self.second!r})"


tu.register_pytree_with_keys(
    WithKeys,
    lambda w: (((tu.SequenceKey(0), w.first), (tu.SequenceKey(1), w.second)), "wk"),
    lambda aux, children: WithKeys(*children),
    lambda w: ((w.first, w.second), "wk"),
)


@dataclasses.dataclass
class Point:
    """register_dataclass with explicit data/meta fields."""

    x: Any
    y: Any
    label: str = "p"


tu.register_dataclass(Point, data_fields=["x", "y"], meta_fields=["label"])


@tu.register_dataclass
@dataclasses.dataclass
class Inferred:
    """register_dataclass inferring meta fields from field(metadata={'static': True})."""

    weights: Any
    mode: str = dataclasses.field(default="train", metadata={"static": True})
    bias: Any = None


@dataclasses.dataclass
class WithDropped:
    """register_dataclass with drop_fields (dropped field falls back to its default)."""

    value: Any
    cache: int = 0


def served_and_given_back(module: str, name: str) -> list[str]:
    """The file defining ``module.name`` installed, after ``fastree.uninstall()``, and installed
    again, in a child process that installs by hand (``run_json_program``, plainly)."""
    program = f"""
import json
import fastree
fastree.install()
import {module} as module
served = module.{name}.__code__.co_filename
fastree.uninstall()
back = module.{name}.__code__.co_filename
fastree.install()
again = module.{name}.__code__.co_filename
print(json.dumps([served, back, again]))
"""
    return run_json_program(program, False)


def _jax_drop_fields_work() -> bool:
    # jax < 0.7 (the newest for Python 3.10 is 0.6.2) unpacks each dropped name into its
    # characters and so rejects every drop_fields; fastree, which lets JAX validate, does too.
    @dataclasses.dataclass
    class Probe:
        kept: Any
        dropped: int = 0

    try:
        jtu.register_dataclass(Probe, data_fields=["kept"], meta_fields=[], drop_fields=["dropped"])
    except ValueError:
        return False
    return True


JAX_DROP_FIELDS_WORK = _jax_drop_fields_work()
if JAX_DROP_FIELDS_WORK:
    tu.register_dataclass(WithDropped, data_fields=["value"], meta_fields=[], drop_fields=["cache"])


@tu.register_static
class StaticTag:
    """register_static: a hashable node without children."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StaticTag) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("StaticTag", self.name))

    def __repr__(self) -> str:
        return f"StaticTag({self.name!r})"


CUSTOM_TYPES = [
    Pair,
    Keyed,
    NodeClass,
    KeysClass,
    WithKeys,
    Point,
    Inferred,
    *([WithDropped] if JAX_DROP_FIELDS_WORK else []),
    StaticTag,
]


# ------------------------------------------------------------------------------------------------
# namedtuples and leaf subclasses


class NT(NamedTuple):
    a: Any
    b: Any


class NTNested(NamedTuple):
    inner: Any
    extra: Any = None


Empty = collections.namedtuple("Empty", [])
Triple = collections.namedtuple("Triple", "x y z")


class TupleLeaf(tuple):
    """A plain tuple subclass (no _fields): a leaf for JAX."""


class DictLeaf(dict):
    """A dict subclass: a leaf for JAX."""


class ListLeaf(list):
    """A list subclass: a leaf for JAX."""


def _f(a, b, c=0):
    return a + b + c


# ------------------------------------------------------------------------------------------------
# the corpus


def _trees() -> dict[str, Any]:
    od = collections.OrderedDict()
    od["z"] = 1
    od["a"] = (2, 3)
    od["m"] = None
    dd = collections.defaultdict(list)
    dd["b"] = [1, 2]
    dd["a"] = 3
    return {
        "none": None,
        "int": 1,
        "float": 2.5,
        "str": "leaf",
        "bytes": b"raw",
        "bool": True,
        "complex": 1 + 2j,
        "np_scalar": np.float32(3.0),
        "np_array": np.arange(6).reshape(2, 3),
        "jax_array": jnp.ones((2, 2)),
        "empty_tuple": (),
        "empty_list": [],
        "empty_dict": {},
        "tuple": (1, 2, 3),
        "list": [1, "a", 2.0],
        "dict": {"b": 1, "a": 2, "c": 3},
        "dict_int_keys": {3: "c", 1: "a", 2: "b"},
        "dict_nested": {"x": {"y": {"z": [1, (2, None)]}}, "w": {}},
        "dict_tuple_keys": {(1, 2): 1, (0, 5): 2},
        "nested_mixed": [(1, [2, {"k": 3}]), None, {"l": [4, 5], "a": (6,)}],
        "none_in_containers": [None, (None,), {"n": None}, [None, 1]],
        "ordered_dict": od,
        "ordered_dict_empty": collections.OrderedDict(),
        "defaultdict": dd,
        "defaultdict_empty": collections.defaultdict(int),
        "namedtuple": NT(1, [2, 3]),
        "namedtuple_nested": NTNested(NT((1, 2), {"q": 3}), NT(None, 4)),
        "namedtuple_empty": Empty(),
        "namedtuple_collections": Triple(1, (2,), [3]),
        "partial": jtu.Partial(_f, 1, c=np.float32(2.0)),
        "partial_no_args": jtu.Partial(_f),
        "array_leaves": {"w": np.zeros(3), "b": jnp.arange(2), "s": np.int64(7)},
        "tuple_subclass_leaf": [TupleLeaf((1, 2)), 3],
        "dict_subclass_leaf": (DictLeaf(a=1), {"b": DictLeaf()}),
        "list_subclass_leaf": {"x": ListLeaf([1, 2])},
        "pair": Pair(1, (2, 3)),
        "pair_nested": Pair(Pair(1, 2, tag="in"), [Pair(None, {"a": 4})]),
        "keyed": Keyed({"a": 1}, [2, 3]),
        "node_class": NodeClass(1, (2, 3), meta=("m", 0)),
        "node_class_empty": NodeClass(),
        "keys_class": KeysClass([1, 2], {"b": 3}),
        "with_keys": WithKeys(1, (2, NT(3, 4))),
        "point": Point(1.0, np.ones(2), label="q"),
        "inferred": Inferred(weights=[1, 2], mode="eval", bias=(3,)),
        "static": StaticTag("s"),
        "static_in_tree": {"t": StaticTag("a"), "v": [StaticTag("b"), 1]},
        "everything": {
            "a": [Pair(1, NT(2, Point(3, 4))), KeysClass(5, Inferred(6))],
            "b": (od, dd, jtu.Partial(_f, 7)),
            "c": [NodeClass(8, WithKeys(9, Keyed(10, None))), StaticTag("z"), Empty()],
            "d": "str-leaf",
        },
    } | ({"with_dropped": WithDropped(value={"v": 1}, cache=5)} if JAX_DROP_FIELDS_WORK else {})


TREE_DICT: dict[str, Any] = _trees()
TREE_IDS: list[str] = list(TREE_DICT)
TREES: list[Any] = list(TREE_DICT.values())

# is_leaf predicates exercised against the whole corpus
PREDICATES: dict[str, Any] = {
    "none": None,
    "is_none": lambda x: x is None,
    "is_tuple": lambda x: isinstance(x, tuple),
    "is_list": lambda x: isinstance(x, list),
    "is_dict": lambda x: isinstance(x, dict),
    "is_pair": lambda x: isinstance(x, Pair),
    "is_int": lambda x: type(x) is int,
    "always": lambda x: True,
    "never": lambda x: False,
}


def is_leaf_grid(
    trees: dict[str, Any],
    predicates: dict[str, Any],
    *,
    takes_path: bool = False,
    names: tuple[str, str] = ("tree", "is_leaf"),
):
    """``parametrize(tree=trees, is_leaf=predicates)`` without the items that repeat another.

    A predicate that answers False for every object a walk meets under ``never`` (every node
    and leaf: the walk is then the whole tree) makes every walker do exactly what ``never``
    makes it do: call it on the same objects in the same order, get False each time, return the
    same result. Such an item (``is_pair`` on a tree without a Pair, ``is_dict`` on one without
    a dict, ...) is left out: the tree's ``never`` item covers its code path. ``None`` (no
    predicate), ``never`` and every predicate that is True somewhere stay. ``takes_path``: the
    predicates take ``(key_path, x)``.
    """
    assert "never" in predicates, "the grid's never item is what covers the items left out"
    # JAX's walk gives the objects met; a JAX without path-taking predicates (the tests of
    # those skip there) gives nothing to trim by.
    trim = not takes_path or jax_has("tree_util.tree_flatten_with_path(is_leaf_takes_path)")
    params = []
    for tree_id, tree in trees.items():
        met: list[tuple[Any, Any]] = []
        if not trim:
            pass
        elif takes_path:
            jtu.tree_flatten_with_path(
                tree, is_leaf=lambda p, x: met.append((p, x)) or False, is_leaf_takes_path=True
            )
        else:
            jtu.tree_flatten(tree, is_leaf=lambda x: met.append(((), x)) or False)
        for pred_id, pred in predicates.items():
            fires = not trim or pred is None or pred_id == "never" or any(
                pred(p, x) if takes_path else pred(x) for p, x in met
            )
            if fires:
                params.append(pytest.param(tree, pred, id=f"{tree_id}-{pred_id}"))
    return pytest.mark.parametrize(list(names), params)


# ------------------------------------------------------------------------------------------------
# comparison helpers


def leaf_equal(x: Any, y: Any) -> bool:
    """Leaves are equal when they are the same object, or equal values of the same type."""
    if x is y:
        return True
    if type(x) is not type(y):
        return False
    if isinstance(x, (np.ndarray, jax.Array, np.generic)):
        return bool(np.shape(x) == np.shape(y) and np.array_equal(np.asarray(x), np.asarray(y)))
    return bool(x == y)


def assert_leaves_identical(got: list, expected: list) -> None:
    """Same length and each leaf is the very same object."""
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g is e, f"leaf {i}: {g!r} is not {e!r}"


def assert_leaves_equal(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert leaf_equal(g, e), f"leaf {i}: {g!r} != {e!r}"


def assert_trees_equal(got: Any, expected: Any, *, identical_leaves: bool = False) -> None:
    """Same type, same JAX structure (node types and aux data) and equal (or identical) leaves."""
    assert type(got) is type(expected)
    assert jtu.tree_structure(got) == jtu.tree_structure(expected)
    gl, el = jtu.tree_leaves(got), jtu.tree_leaves(expected)
    if identical_leaves:
        assert_leaves_identical(gl, el)
    else:
        assert_leaves_equal(gl, el)


# Every walk of the API, as `walk(lib, tree, is_leaf=None)` for `lib` fastree.tree_util or JAX's
# own: each result compares with == between the two (a treedef as its str, paths as keystr). The
# tests of walks that meet changing input (a dict changed, a type registered mid-walk) pick theirs.
TREE_WALKS = {
    "leaves": lambda lib, t, il=None: lib.tree_leaves(t, is_leaf=il),
    "flatten": lambda lib, t, il=None: lib.tree_flatten(t, is_leaf=il)[0],
    "structure": lambda lib, t, il=None: str(lib.tree_structure(t, is_leaf=il)),
    "with_path": lambda lib, t, il=None: [
        (lib.keystr(p), x) for p, x in lib.tree_flatten_with_path(t, is_leaf=il)[0]
    ],
    "leaves_with_path": lambda lib, t, il=None: [
        (lib.keystr(p), x) for p, x in lib.tree_leaves_with_path(t, is_leaf=il)
    ],
    "map": lambda lib, t, il=None: lib.tree_map(lambda x: ("m", x), t, is_leaf=il),
    "map_with_path": lambda lib, t, il=None: lib.tree_map_with_path(
        lambda p, x: ("m", x), t, is_leaf=il
    ),
    "all": lambda lib, t, il=None: lib.tree_all(t, is_leaf=il),
    "reduce": lambda lib, t, il=None: lib.tree_reduce(lambda a, b: (a, b), t, is_leaf=il),
}


def tree_walks(*names: str) -> dict[str, Any]:
    """The named entries of TREE_WALKS."""
    return {name: TREE_WALKS[name] for name in names}


def assert_same_treedef(ftd: Any, jtd: Any) -> None:
    """A fastree treedef and a JAX treedef describe the same structure (converted both ways)."""
    assert isinstance(ftd, fastree.PyTreeDef)
    assert isinstance(jtd, jtu.PyTreeDef)
    assert ftd.to_jax() == jtd
    assert fastree.from_jax(jtd) == ftd
    assert repr(ftd) == repr(jtd)
    assert ftd.num_leaves == jtd.num_leaves
    assert ftd.num_nodes == jtd.num_nodes


def capture(fn, *args, **kwargs) -> BaseException:
    """Run ``fn`` expecting it to raise; return the exception."""
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - we want whatever the callee raised
        return e
    raise AssertionError(f"{fn} did not raise")


def assert_same_error(jax_fn, fastree_fn) -> BaseException:
    """Run the JAX call, then check fastree raises the same type with the same message.

    Returns the fastree exception for further checks.
    """
    expected = capture(jax_fn)
    with pytest.raises(type(expected), match=re.escape(str(expected))) as info:
        fastree_fn()
    got = info.value
    assert type(got) is type(expected)
    assert str(got) == str(expected)
    return got


# ------------------------------------------------------------------------------------------------
# recursion headroom


def used_recursion_depth() -> int:
    """How much of the interpreter's recursion budget is in use right now.

    Tests that need a given nesting depth set the limit relative to this rather than absolutely:
    the budget in use is not just the pytest stack, because some JAX error paths (malformed custom
    flatten output, unsortable dict keys; JAX 0.10.2) leave the thread's recursion counter raised,
    and the differential tests run those paths many times over a session.
    """

    def probe(n: int) -> int:
        try:
            return probe(n + 1)
        except RecursionError:
            return n

    return sys.getrecursionlimit() - probe(0)


@contextlib.contextmanager
def recursion_headroom(depth: int):
    """Set the recursion limit to leave ``depth`` levels free; restore it afterwards."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(used_recursion_depth() + depth)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def run_script_results(script: str) -> tuple[dict[str, str], subprocess.CompletedProcess]:
    """Runs `script` in a fresh interpreter (so a crash fails a test instead of the run) and
    parses its `name=result` output lines."""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    results = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return results, proc


# ------------------------------------------------------------------------------------------------
# out-of-memory sweeps (child-process scripts)


def rlimit_sweep_source(headrooms_mib: tuple[int, ...], calls: int) -> str:
    """The tail of a child script that runs ``op()`` under ``RLIMIT_AS`` at each headroom.

    The script before it defines ``op`` (warmed once), ``leaf_objects`` and ``before`` (their
    refcounts). Prints ``failures=N`` (how many headrooms ended in MemoryError) and
    ``leaked=[...]`` (refcount changes of ``leaf_objects``, at most five).
    """
    return f"""
def vm_bytes():
    return int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024

failures = 0
for headroom_mib in {headrooms_mib!r}:
    hold = []
    resource.setrlimit(
        resource.RLIMIT_AS, (vm_bytes() + (headroom_mib << 20), resource.RLIM_INFINITY)
    )
    try:
        for _ in range({calls}):
            hold.append(op())
    except MemoryError:
        failures += 1
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    hold = None
    gc.collect()
after = [sys.getrefcount(x) for x in leaf_objects]
print("failures=%d" % failures)
print("leaked=%r" % ([a - b for a, b in zip(after, before) if a != b][:5],))
"""


def classes_are_collectable() -> bool:
    """Whether a class made now is freed once unreachable.

    Free-threaded CPython 3.13 makes every class created after the process's first thread
    started immortal (its stand-in for deferred reference counting, which 3.14 has): there a
    test that a class dies when fastree lets go of it cannot pass, with or without fastree.
    """
    probe = weakref.ref(type("Probe", (), {}))
    gc.collect()
    return probe() is None


def skip_unless_classes_are_collectable() -> None:
    """Skips the calling test where new classes are immortal (see classes_are_collectable)."""
    if not classes_are_collectable():
        pytest.skip("new classes are immortal here (free-threaded 3.13, once a thread ran)")


# ------------------------------------------------------------------------------------------------
# Walker tests: a time bound, and one plain and one identity-preserving node type.

WALK_TIME_BOUND = 60  # seconds; every walker case takes well under one


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so no `except Exception` in a walker eats it."""


@contextlib.contextmanager
def bounded(seconds: int = WALK_TIME_BOUND):
    """Raises Hang in the block once ``seconds`` have passed (SIGALRM)."""

    def on_alarm(*_):
        raise Hang(f"still running after {seconds} s: a hang or a blowup")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Plain:
    """A plain custom node (duplicated at every path, as in JAX)."""

    def __init__(self, *kids, aux=None):
        self.kids, self.aux = list(kids), aux


tu.register_pytree_node(Plain, lambda n: (tuple(n.kids), n.aux), lambda a, c: Plain(*c, aux=a))


class Shared:
    """An identity-preserving node (one node however many paths reach it)."""

    def __init__(self, *kids, aux=None):
        self.kids, self.aux = list(kids), aux


tu.register_pytree_node(
    Shared,
    lambda n: (tuple(n.kids), n.aux),
    lambda a, c: Shared(*c, aux=a),
    preserve_identity=True,
)
