"""flax.nnx graph-mode cases, and the child-process runs tests/test_flax_nnx_graph_mode.py reads.

Run as a script (``python nnx_graph_cases.py MODE``), plainly or with ``FASTREE_INSTALL=1``; it
prints one JSON document on stdout and each step's name on stderr (so a crash names its case).

- ``flatten`` (installed): every case in :data:`CASES` calls ``check(node, ...)``, which runs
  fastree's ``graphlib.flatten`` and flax's own (``flax_nnx_graph._graph.flax_flatten``) on the
  same node with equal RefMaps, with and without paths, and records every difference (records,
  leaves by identity, paths, RefMap entries, the exception raised). A third call, with flax's
  Python walk (``graphlib._graph_flatten``) counted, says whether fastree served it natively, and
  its result is compared too: the first walk over a type is checked and might hide a difference.
- ``public`` / ``unknown`` (plain; installed; installed with flax's version unknown to fastree):
  a JSON view of nnx.split/state/merge/update/jit on the models of :func:`public_views` and the
  outcome of each bad input of :func:`bad_inputs`, for the test to compare between runs.

Models are built from constants only: every run makes the same ones.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import sys
import types
from collections.abc import Callable
from typing import Any

# name -> case(env, check); the names are read without importing flax (test parametrization).
CASES: dict[str, Callable[[Any, Callable[..., None]], None]] = {}


def case(fn: Callable) -> Callable:
    CASES[fn.__name__] = fn
    return fn


def _env() -> Any:
    import jax
    import jax.numpy as jnp
    import nnx_random_models
    import numpy as np
    import optax
    from flax import nnx
    from flax.nnx import graphlib, pytreelib

    return types.SimpleNamespace(
        jax=jax,
        jnp=jnp,
        np=np,
        nnx=nnx,
        optax=optax,
        graphlib=graphlib,
        pytreelib=pytreelib,
        random_models=nnx_random_models,
    )


def _no_keys(e: Any, node: Any) -> bool | None:
    """True, or None (served or not, both right) for a node holding PRNG key arrays: fastree
    leaves key arrays (a jax.Array other than jax's own) to flax's function for now."""
    leaves = [x for _, x in e.nnx.iter_graph(node)]
    dtypes = [getattr(x, "dtype", None) for x in e.jax.tree_util.tree_leaves(leaves)]
    keyed = any(
        dtype is not None and e.jnp.issubdtype(dtype, e.jax.dtypes.prng_key) for dtype in dtypes
    )
    return None if keyed else True


def _progress(name: str) -> None:
    print(name, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# comparing two flatten results


def _same_scalar(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an == that raises is a difference here
        return False


def _record_diffs(a: Any, b: Any, where: str, out: list[str], identical: bool = False) -> None:
    """Field by field: the same record classes, the same objects where flax passes them on (leaf
    values, static values, types), equal ints and strs where it makes them anew."""
    if a is b:
        return
    if type(a) is not type(b):
        out.append(f"{where}: {type(a).__name__} vs {type(b).__name__}: {a!r:.200} vs {b!r:.200}")
        return
    if type(a) in (int, str, bool, float) and not identical:
        if a != b:
            out.append(f"{where}: {a!r} vs {b!r}")
        return
    if identical:
        out.append(f"{where}: not the same object: {a!r:.200} vs {b!r:.200}")
        return
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for field in dataclasses.fields(a):
            _record_diffs(
                getattr(a, field.name),
                getattr(b, field.name),
                f"{where}.{field.name}",
                out,
                identical=type(a).__name__ == "Static",
            )
        return
    if type(a).__name__ == "HashableMapping":
        x, y = a._mapping, b._mapping
        if type(x) is not type(y) or list(x) != list(y):
            out.append(f"{where}: mapping keys {list(x)!r:.200} vs {list(y)!r:.200}")
            return
        for key in x:
            _record_diffs(x[key], y[key], f"{where}[{key!r}]", out)
        return
    if isinstance(a, (tuple, list)):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} vs {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _record_diffs(x, y, f"{where}[{i}]", out)
        return
    if not _equal(a, b):  # made anew by flax on each walk (a treedef): flax's == decides
        out.append(f"{where}: {a!r:.200} != {b!r:.200}")


def _hash_outcome(obj: Any) -> Any:
    try:
        return hash(obj)
    except Exception as error:  # noqa: BLE001 - unhashable metadata: both must raise alike
        return type(error).__name__


def _tracer_statics(graphdef: Any) -> bool:
    import jax

    return any(
        isinstance(getattr(attr, "value", None), jax.core.Tracer) for _, attr in graphdef.attributes
    )


def result_diffs(ours: Any, theirs: Any, with_paths: bool) -> list[str]:
    """What differs between two graphlib.flatten results (GraphDef, FlatState or leaf list)."""
    out: list[str] = []
    ours_def, ours_state = ours
    theirs_def, theirs_state = theirs
    # GraphDef == compares static values with ==; a tracer's == is no bool, and from Python 3.13
    # dataclasses compare field by field (no identity shortcut), so flax's own GraphDef is not ==
    # to an equal copy of itself then. The records are compared one by one below in any case.
    if not _tracer_statics(theirs_def) and not _equal(ours_def, theirs_def):
        out.append("GraphDef == is False")
    if _hash_outcome(ours_def) != _hash_outcome(theirs_def):
        out.append("GraphDef hashes differ")
    if repr(ours_def) != repr(theirs_def):
        out.append(f"GraphDef reprs differ:\n{ours_def!r:.3000}\n---\n{theirs_def!r:.3000}")
    _record_diffs(type(ours_def.nodes), type(theirs_def.nodes), "type(nodes)", out)
    _record_diffs(type(ours_def.attributes), type(theirs_def.attributes), "type(attrs)", out)
    _record_diffs(ours_def.nodes, theirs_def.nodes, "nodes", out)
    _record_diffs(ours_def.attributes, theirs_def.attributes, "attributes", out)
    _record_diffs(ours_def.num_leaves, theirs_def.num_leaves, "num_leaves", out)
    if type(ours_state) is not type(theirs_state):
        out.append(f"state types {type(ours_state).__name__} vs {type(theirs_state).__name__}")
        return out
    if with_paths:
        _record_diffs(type(ours_state._keys), type(theirs_state._keys), "type(paths)", out)
        _record_diffs(ours_state.paths, theirs_state.paths, "paths", out)
        ours_leaves, theirs_leaves = ours_state.leaves, theirs_state.leaves
    else:
        ours_leaves, theirs_leaves = ours_state, theirs_state
    _record_diffs(type(ours_leaves), type(theirs_leaves), "type(leaves)", out)
    if len(ours_leaves) != len(theirs_leaves):
        out.append(f"leaves: {len(ours_leaves)} vs {len(theirs_leaves)}")
    for i, (x, y) in enumerate(zip(ours_leaves, theirs_leaves)):
        if type(x).__name__ == "ArrayRefOutput" and type(y) is type(x):
            continue  # made anew by each walk from the ref's value
        _record_diffs(x, y, f"leaves[{i}]", out, identical=True)
    return out


def map_diffs(ours: Any, theirs: Any) -> list[str]:
    """What differs between two RefMaps: the same ids in the same order, each to the same object
    and an equal int index."""
    x, y = ours._mapping, theirs._mapping
    if list(x) != list(y):
        return [f"RefMap ids differ ({len(x)} vs {len(y)} entries)"]
    out: list[str] = []
    for i, key in enumerate(x):
        if x[key][0] is not y[key][0] or not _same_scalar(x[key][1], y[key][1]):
            out.append(f"RefMap entry {i}: {x[key]!r:.120} vs {y[key]!r:.120}")
    return out


# ------------------------------------------------------------------------------------------------
# the flatten mode: fastree's graphlib.flatten against flax's, call by call


class Checker:
    """``check(node, ...)`` for the cases: runs both functions and keeps what differs."""

    def __init__(self, env: Any) -> None:
        from fastree.integrations import flax_nnx_graph

        self.env = env
        self.graphlib = env.graphlib
        self.patched = env.graphlib.flatten
        self.flax = flax_nnx_graph._graph.flax_flatten
        self.walks = 0  # calls of flax's Python walk (graphlib._graph_flatten)
        # Counted by a profile hook on its code, not by replacing it: a replaced mirrored
        # function sends every call back to flax (_flax_nnx_graph_tables.code_replaced).
        self.walk_code = env.graphlib._graph_flatten.__code__
        self.report: dict[str, dict[str, list]] = {}
        self.case = ""
        self.maps: dict[str, Any] = {}  # shared RefMaps by name (flax's; ours are equal)

    def _counting_walks(self, call: Callable[[], Any]) -> Any:
        self.walks = 0
        code = self.walk_code

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code is code:
                self.walks += 1

        sys.setprofile(profile)
        try:
            return call()
        finally:
            sys.setprofile(None)

    def _copy(self, refmap: Any) -> Any:
        new = self.graphlib.RefMap()
        if refmap is not None:
            new._mapping.update(refmap._mapping)
        return new

    def __call__(
        self,
        node: Any,
        label: str = "",
        *,
        ref: str | None = None,
        outer: str | None = None,
        served: bool | None = True,
        graph: bool | None = None,
        reset: Callable[[], None] | None = None,
    ) -> None:
        entry = self.report.setdefault(self.case, {"diffs": [], "served": [], "notes": []})
        label = label or type(node).__name__
        before = self.maps.get(ref) if ref is not None else None
        outer_map = self.maps.setdefault(outer, self.graphlib.RefMap()) if outer else None
        kept = None
        for with_paths in (True, False):
            tag = f"{label} (with_paths={with_paths})"
            kwargs = {"with_paths": with_paths, "graph": graph}
            ours_map, theirs_map = self._copy(before), self._copy(before)
            ours = self._call(self.patched, node, ours_map, outer_map, kwargs, reset)
            theirs = self._call(self.flax, node, theirs_map, outer_map, kwargs, reset)
            # The third call: natively served (no Python walk) or not, and its result; with no
            # map given, through the function's own default RefMap.
            probe_map = None if ref is None and outer is None else self._copy(before)
            probe = self._counting_walks(
                lambda probe_map=probe_map, kwargs=kwargs: self._call(
                    self.patched, node, probe_map, outer_map, kwargs, reset))
            walked = self.walks
            for name, got, got_map in (("first", ours, ours_map), ("again", probe, probe_map)):
                found = self._diffs(got, theirs, with_paths, got_map, theirs_map, entry, tag)
                entry["diffs"].extend(f"{tag} {name}: {d}" for d in found)
            if theirs[0] == "ok":
                entry["served"].append([tag, served, walked == 0])
            if with_paths:
                kept = theirs_map
        if ref is not None:
            self.maps[ref] = kept

    def _call(
        self,
        fn: Callable,
        node: Any,
        ref_index: Any,
        outer_map: Any,
        kwargs: dict,
        reset: Callable[[], None] | None,
    ) -> tuple[str, Any]:
        if ref_index is not None or outer_map is not None:
            kwargs = {
                **kwargs,
                "ref_index": ref_index,
                "ref_outer_index": None if outer_map is None else self._copy(outer_map),
            }
        try:
            return "ok", fn(node, **kwargs)
        except Exception as error:  # noqa: BLE001 - the error is the outcome compared
            return "raised", error
        finally:
            if reset is not None:
                reset()

    def _diffs(
        self,
        got: tuple,
        theirs: tuple,
        with_paths: bool,
        got_map: Any,
        theirs_map: Any,
        entry: dict,
        tag: str,
    ) -> list[str]:
        if got[0] != theirs[0] or (got[0] == "raised" and type(got[1]) is not type(theirs[1])):
            return [f"outcome {got[0]} {got[1]!r:.300} vs flax's {theirs[0]} {theirs[1]!r:.300}"]
        if got[0] == "raised":
            if str(got[1]) != str(theirs[1]):
                return [f"error messages differ: {got[1]} vs {theirs[1]}"]
            if got_map is not None and map_diffs(got_map, theirs_map):
                # flax leaves the entries of the nodes it met before the error; not compared.
                entry["notes"].append(
                    f"{tag}: after {type(theirs[1]).__name__} the RefMaps differ "
                    f"({len(got_map)} vs {len(theirs_map)} entries)"
                )
            return []
        out = result_diffs(got[1], theirs[1], with_paths)
        if got_map is not None:
            out.extend(map_diffs(got_map, theirs_map))
        return out


def nnx_linear(e: Any, width: int) -> Any:
    return e.nnx.Linear(width, width, rngs=e.nnx.Rngs(0))


def run_flatten_cases() -> dict:
    env = _env()
    from fastree.integrations import flax_nnx_graph

    check = Checker(env)
    for name, fn in CASES.items():
        _progress(name)
        check.case = name
        check.maps = {}
        try:
            fn(env, check)
        except Exception as error:  # noqa: BLE001 - a case that cannot run is a failure of it
            entry = check.report.setdefault(name, {"diffs": [], "served": [], "notes": []})
            entry["diffs"].append(f"the case itself raised {error!r}")
    # the comparison itself: a difference is seen, and none where there is none
    one, two = nnx_linear(env, 1), nnx_linear(env, 2)
    sanity = [
        bool(result_diffs(check.flax(one), check.flax(two), True)),
        result_diffs(check.flax(one), check.flax(one), True) == [],
    ]
    modules = ("flax.nnx", "flax.nnx.graph", "flax.nnx.graphlib")
    return {
        "comparator_sanity": sanity,
        "cases": check.report,
        "status": flax_nnx_graph.status(),
        "rebound": {
            m: getattr(sys.modules[m], "flatten", None) is env.graphlib.flatten
            for m in modules
            if m in sys.modules
        },
        "is_flax_function": env.graphlib.flatten is check.flax,
    }


# ------------------------------------------------------------------------------------------------
# the cases (each builds its models and calls check)


@case
def standard_layers(e, check):
    nnx, jnp, jax = e.nnx, e.jnp, e.jax
    rngs = nnx.Rngs(0, params=1, dropout=2)
    layers = [
        nnx.Linear(3, 4, rngs=rngs),
        nnx.Linear(3, 4, use_bias=False, rngs=rngs),
        nnx.Conv(2, 3, (3,), rngs=rngs),
        nnx.Embed(5, 3, rngs=rngs),
        nnx.LayerNorm(3, rngs=rngs),
        nnx.BatchNorm(3, rngs=rngs),
        nnx.Dropout(0.5, rngs=rngs),
        nnx.RMSNorm(3, rngs=rngs),
        nnx.MultiHeadAttention(num_heads=2, in_features=4, qkv_features=4, decode=False, rngs=rngs),
        nnx.Sequential(nnx.Linear(2, 2, rngs=rngs), jax.nn.relu, nnx.Linear(2, 1, rngs=rngs)),
        nnx.LSTMCell(2, 3, rngs=rngs),
        nnx.LoRALinear(3, 2, lora_rank=1, rngs=rngs),
        nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss")),
        rngs,
    ]
    rngs.params()  # a stream whose count moved
    for layer in layers:
        check(layer, served=_no_keys(e, layer))
    check(layers, "a list of layers", served=None)
    check(nnx.Param(jnp.ones(2)), "a Variable as the root")
    check(jnp.ones(2), "an array as the root")
    check({"b": layers[0], "a": (layers[1], None)}, "a dict as the root")
    check(None, "None as the root")


@case
def random_models(e, check):
    for seed in range(8):
        model, optimizer, _ = e.random_models.build(random.Random(seed), e.nnx, e.jnp)
        served = _no_keys(e, model)
        check(model, f"seed {seed} model", served=served)
        if optimizer is not None:
            check(optimizer, f"seed {seed} optimizer")
            check(model, f"seed {seed} model, map shared", ref=f"s{seed}", served=served)
            check(optimizer, f"seed {seed} optimizer, map shared", ref=f"s{seed}")
            check((model, optimizer), f"seed {seed} (model, optimizer)", served=served)


def _shared(nnx, jnp, rngs):
    class Shared(nnx.Module):
        def __init__(self):
            self.a = nnx.Linear(2, 2, rngs=rngs)
            self.b = self.a
            self.p = nnx.Param(jnp.ones(3))
            self.q = self.p
            self.layers = nnx.List([self.a, nnx.Linear(2, 2, rngs=rngs), self.a])
            self.group = nnx.Dict({"x": self.p, "y": self.b})
            self.kernel_again = self.a.kernel  # a Variable also inside a submodule
            self.pair = nnx.data((self.p, self.p, [self.a.bias]))

        def __call__(self, x):
            self.q[...] = self.q[...] + 1
            return self.b(x) + self.layers[1](x)

    return Shared()


@case
def shared_references(e, check):
    check(_shared(e.nnx, e.jnp, e.nnx.Rngs(0)))


def _cycle(nnx, jnp):
    class Node(nnx.Module):
        def __init__(self, v):
            self.v = nnx.Param(jnp.full((1,), v))
            self.next = nnx.data(None)

    a, b, c = Node(1.0), Node(2.0), Node(3.0)
    a.next, b.next, c.next = b, c, a
    a.me = a
    a.others = nnx.List([c, b, a])
    return a


@case
def cycles(e, check):
    a = _cycle(e.nnx, e.jnp)
    check(a, "three modules in a ring, one holding itself")
    check(a.next, "the same ring from another module")


@case
def containers(e, check):
    nnx, jnp = e.nnx, e.jnp
    rngs = nnx.Rngs(0)

    class Key(str):  # a str subclass as a dict key: flax's own dict flatten serves it
        pass

    class Containers(nnx.Module):
        def __init__(self):
            self.lst = nnx.List([nnx.Param(jnp.full((1,), i)) for i in range(12)])
            self.dct = nnx.Dict(
                {
                    "b": nnx.Param(jnp.ones(1)),
                    "a": nnx.Linear(1, 1, rngs=rngs),
                    "é": nnx.Param(jnp.zeros(1)),
                    "Z": nnx.Param(jnp.zeros(2)),
                }
            )
            self.plain_list = nnx.data([nnx.Param(jnp.ones(1)), 1, "s", None, [jnp.ones(1)]])
            self.plain_tuple = nnx.data((nnx.Param(jnp.ones(2)), (1, 2), ()))
            self.plain_dict = nnx.data(
                {"z": 1, "a": jnp.ones(2), "m": {"k": nnx.Param(jnp.ones(1))}}
            )
            self.int_dict = nnx.data({10: nnx.Param(jnp.ones(1)), 2: jnp.ones(1), 0: None})
            self.tuple_keys = nnx.data({(1, 2): jnp.ones(1), (0, 5): nnx.Param(jnp.ones(1))})
            self.unicode = nnx.data(
                {
                    "é": jnp.ones(1),
                    "e": 2,
                    "😀": jnp.ones(1),
                    "\uffff": 3,
                    "_": 4,
                    "A": jnp.ones(1),
                    "": 5,
                }
            )
            self.subclass_keys = nnx.data({Key("b"): jnp.ones(1), "a": jnp.ones(1)})
            self.ordered = nnx.data(
                collections.OrderedDict(b=jnp.ones(1), a=nnx.Param(jnp.ones(1)))
            )
            self.default = nnx.data(collections.defaultdict(list, {"k": jnp.ones(1)}))
            self.empties = nnx.data(([], {}, (), None))
            self.nothing = None

    check(Containers())
    check(nnx.List([nnx.Linear(1, 1, rngs=rngs) for _ in range(11)]), "an nnx.List of 11")


@case
def dict_keys_other_than_str(e, check):
    nnx, jnp = e.nnx, e.jnp

    class Mixed(nnx.Module, pytree=False):
        def __init__(self, keys):
            self.first = nnx.Param(jnp.ones(1))
            self.mixed = {k: nnx.Param(jnp.ones(1)) for k in keys}

    # keys that do not sort (flax raises TypeError: so must fastree) and some that do
    for keys in ((1, "a"), ("a", None), (1.5, 2), ((1,), "x")):
        check(Mixed(keys), f"keys {keys!r}", served=None)


@case
def rngs_batchnorm_dropout(e, check):
    nnx, jnp = e.nnx, e.jnp

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(3, 3, rngs=rngs)
            self.bn = nnx.BatchNorm(3, rngs=rngs)
            self.dropout = nnx.Dropout(0.5, rngs=rngs)
            self.rngs = rngs

        def __call__(self, x):
            return self.dropout(self.bn(self.linear(x)))

    net = Net(nnx.Rngs(0, params=1, dropout=2))
    check(net, "before a call", served=None)
    net(jnp.ones((2, 3)))  # batch stats and the dropout stream move
    check(net, "after a call", served=None)
    net.eval()  # static flags change
    check(net, "in eval mode", served=None)


@case
def optimizers(e, check):
    nnx, optax = e.nnx, e.optax
    model = nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.BatchNorm(3, rngs=nnx.Rngs(1)))
    for tx in (optax.adam(1e-3), optax.chain(optax.clip(1.0), optax.sgd(0.1, momentum=0.9))):
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        check(optimizer, f"{type(tx).__name__} before an update")
        grads = nnx.state(model, nnx.Param)
        optimizer.update(model, grads)
        check(optimizer, "after an update")
    both = nnx.ModelAndOptimizer(model, optax.sgd(0.1))
    check(both, "ModelAndOptimizer")
    check(model, "the model, map shared", ref="shared")
    check(both, "ModelAndOptimizer, map shared", ref="shared")


@case
def variables_with_metadata(e, check):
    nnx, jnp = e.nnx, e.jnp

    class Custom(nnx.Variable):
        pass

    class Meta(nnx.Module):
        def __init__(self):
            self.sharded = nnx.Param(jnp.ones(2), sharding_names=("a",), eager_sharding=False)
            self.tagged = nnx.Param(jnp.ones(1), foo="bar", z=1, a=(1, 2))
            self.unhashable = nnx.Param(jnp.ones(1), tag=[1, 2])  # GraphDef hash raises
            self.custom = Custom(jnp.ones(1), note={"k": "v"})
            self.stat = nnx.BatchStat(jnp.zeros(1))
            self.cache = nnx.Cache(jnp.zeros(1))
            self.inter = nnx.Intermediate((jnp.zeros(1),))
            self.scalar = nnx.Variable(3.0)  # a Python float inside a Variable
            self.text = nnx.Variable("not an array")
            self.none = nnx.Variable(None)

    m = Meta()
    m.tagged.set_metadata(extra=2)
    check(m)


@case
def static_attributes(e, check):
    nnx, jnp, np = e.nnx, e.jnp, e.np

    class Statics(nnx.Module):
        def __init__(self):
            self.name = "s"
            self.n = 3
            self.big = 2**70
            self.f = 1.5
            self.flag = True
            self.fn = jnp.tanh
            self.cls = nnx.Linear
            self.t = nnx.static((1, "a"))
            self.np_scalar = np.float32(2.0)
            self.data_int = nnx.data(7)
            self.data_str = nnx.data("data")
            self.np_arr = nnx.data(np.arange(3))
            self.jarr = jnp.ones(2)
            self.jscalar = jnp.float32(1)
            self.none = None
            self.w = nnx.Param(jnp.ones(1))

    s = Statics()
    check(s)

    class NotPytree(nnx.Module, pytree=False):
        def __init__(self):
            self.arr = jnp.ones(2)
            self.np_arr = np.ones(2)
            self.layers = [nnx.Linear(1, 1, rngs=nnx.Rngs(0)), 3, "x"]
            self.name = "n"
            self.d = {"k": nnx.Param(jnp.ones(1)), "j": 1}

    check(NotPytree(), "a Module with pytree=False")

    class Thing(nnx.Pytree):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(1))
            self.arr = jnp.zeros(1)
            self.label = "t"

    check(Thing(), "an nnx.Pytree")


Pair = collections.namedtuple("Pair", "first second")


@case
def namedtuples_and_dataclasses(e, check):
    nnx, jnp, jax = e.nnx, e.jnp, e.jax
    import flax.struct

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Box:
        x: Any
        y: Any
        meta: str = dataclasses.field(default="m", metadata={"static": True})

    @flax.struct.dataclass
    class SBox:
        a: Any
        name: str = flax.struct.field(pytree_node=False, default="n")

    @jax.tree_util.register_pytree_with_keys_class
    class Keyed:
        def __init__(self, x, y, aux="k"):
            self.x, self.y, self.aux = x, y, aux

        def tree_flatten_with_keys(self):
            keys = jax.tree_util.GetAttrKey
            return ((keys("x"), self.x), (keys("y"), self.y)), self.aux

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children, aux)

    class Holder(nnx.Module):
        def __init__(self):
            self.pair = nnx.data(Pair(nnx.Param(jnp.ones(1)), jnp.ones(2)))
            self.empty_pair = nnx.data(Pair(None, None))
            self.box = nnx.data(Box(nnx.Param(jnp.ones(1)), (jnp.ones(1), 2)))
            self.sbox = nnx.data(SBox(jnp.ones(3)))
            self.keyed = nnx.data(Keyed(jnp.ones(1), nnx.Param(jnp.zeros(1))))
            self.partial = nnx.data(jax.tree_util.Partial(jnp.add, jnp.ones(1)))

    check(Holder())


@case
def registered_node_types(e, check):
    nnx, jnp, graphlib = e.nnx, e.jnp, e.graphlib

    class PT:
        def __init__(self, a, b):
            self.a, self.b = a, b

    graphlib.register_pytree_node_type(
        PT,
        flatten=lambda x: ([("b", x.b), ("a", x.a)], "meta"),
        unflatten=lambda items, meta: PT(dict(items)["a"], dict(items)["b"]),
    )

    class GN:
        def __init__(self):
            self.items = {
                "w": nnx.Param(jnp.ones(1)),
                "n": 3,
                "s": jnp.ones(1),
                "l": [1, jnp.zeros(1)],
            }

    graphlib.register_graph_node_type(
        GN,
        flatten=lambda x: (
            (
                ("w", x.items["w"]),
                ("n", graphlib.DataElem(x.items["n"])),
                ("s", graphlib.StaticElem(x.items["s"])),
                ("l", x.items["l"]),
            ),
            ("aux",),
        ),
        set_key=lambda x, k, v: x.items.__setitem__(k, v),
        pop_key=lambda x, k: x.items.pop(k),
        create_empty=lambda aux: GN(),
        clear=lambda x: x.items.clear(),
        init=lambda x, items: x.items.update(items),
    )

    class Holder(nnx.Module):
        def __init__(self):
            self.pt = nnx.data(PT(nnx.Param(jnp.ones(1)), jnp.ones(2)))
            self.gn = nnx.data(GN())
            self.gn_again = self.gn

    check(Holder())

    class Reordered(nnx.Module):  # its own _graph_node_flatten: a GraphNodeImpl flax calls
        def __init__(self):
            self.a = nnx.Param(jnp.ones(1))
            self.b = nnx.Param(jnp.zeros(1))

        def _graph_node_flatten(self):
            nodes, meta = super()._graph_node_flatten()
            return nodes[::-1], meta

    check(Reordered(), "a Module with its own _graph_node_flatten")

    class Late:  # a leaf, then a node once registered
        def __init__(self):
            self.x = jnp.ones(1)

    holder = Holder()
    holder.late = nnx.data(Late())
    check(holder, "before Late is registered")
    graphlib.register_pytree_node_type(
        Late, flatten=lambda x: ([("x", x.x)], None), unflatten=lambda items, _: Late()
    )
    check(holder, "after Late is registered")


@case
def refmaps_given(e, check):
    nnx, jnp = e.nnx, e.jnp
    rngs = nnx.Rngs(0)
    sub = nnx.Linear(2, 2, rngs=rngs)
    first, second = nnx.Sequential(sub, nnx.Linear(2, 2, rngs=rngs)), nnx.Dict({"s": sub})
    second.p = nnx.Param(jnp.ones(1))
    check(first, "first model, prepopulating", ref="shared")
    check(second, "second model: NodeRefs", ref="shared")
    check(first, "first model again: one NodeRef", ref="shared")
    check(first, "as the outer map", ref="outer")
    check(first, "with ref_outer_index", ref="inner", outer="outer")
    check(second, "with ref_outer_index, partly known", ref="inner2", outer="outer")
    check(second, "with an empty ref_outer_index", ref="inner3", outer="empty")


@case
def changed_between_calls(e, check):
    nnx, jnp = e.nnx, e.jnp
    rngs = nnx.Rngs(0)
    model = nnx.Sequential(nnx.Linear(2, 2, rngs=rngs), nnx.Linear(2, 2, rngs=rngs))
    model.extra = nnx.Param(jnp.ones(1))
    check(model, "with an extra attribute")
    model.extra2 = nnx.data([model.extra])
    check(model, "with a list sharing it")
    del model.extra
    check(model, "extra removed")
    model.layers[0] = nnx.Linear(2, 2, use_bias=False, rngs=rngs)
    check(model, "a Linear replaced")
    model.layers.append(nnx.BatchNorm(2, rngs=rngs))
    check(model, "a layer appended")
    model.layers[1].kernel = nnx.BatchStat(jnp.zeros((2, 2)))
    check(model, "a Variable replaced by another kind")
    model.layers[1].kernel[...] = jnp.ones((2, 2))
    check(model, "a Variable's value set")
    model.layers[1].in_features = 7
    check(model, "a static attribute changed")
    model.__class__ = type("Renamed", (type(model),), {})
    check(model, "its class changed")


@case
def state_flags(e, check):
    nnx, pytreelib = e.nnx, e.pytreelib
    layers = [nnx.Linear(1, 1, rngs=nnx.Rngs(0)) for _ in range(4)]
    for layer, flags in zip(layers, ((False, False), (True, False), (False, True), (True, True))):
        object.__setattr__(layer, "_pytree__state", pytreelib.PytreeState(*flags))
    check(nnx.List(layers), "PytreeStates with each (initializing, is_setup)")


@case
def array_refs(e, check):
    nnx, jnp, jax = e.nnx, e.jnp, e.jax
    if not hasattr(jax, "new_ref"):
        return

    class WithRefs(nnx.Module):
        def __init__(self):
            self.a_plain = nnx.Param(jnp.ones(1))
            self.m_param = nnx.Param(jnp.ones(2), ref=True)  # a Variable over an array ref
            self.r = nnx.data(jax.new_ref(jnp.zeros(2)))  # an array ref as an attribute
            self.r_again = self.r
            self.z_plain = nnx.Linear(1, 1, rngs=nnx.Rngs(0))

    m = WithRefs()
    raw = m.m_param.get_raw_value()

    def reset():  # flax's walk with ref_outer_index writes ArrayRefOutputs into the Variable
        m.m_param.set_raw_value(raw)

    check(m, served=False)
    check(m.r, "an array ref as the root", served=False)
    check(m, "map shared", ref="shared", served=False)
    check(m, "as the outer map", ref="outer", served=False)
    check(m, "with ref_outer_index", ref="inner", outer="outer", served=False, reset=reset)
    check(
        m, "with an empty ref_outer_index", ref="inner2", outer="empty", served=False, reset=reset
    )


@case
def unserved_types(e, check):
    nnx, jnp, jax = e.nnx, e.jnp, e.jax

    class OwnMetadata(nnx.Variable):
        def get_metadata(self, *args, **kwargs):
            return {"own": True}

    class M(nnx.Module):
        def __init__(self):
            self.a = nnx.Linear(1, 1, rngs=nnx.Rngs(0))
            self.own = OwnMetadata(jnp.ones(1))

    check(M(), "a Variable class with its own get_metadata", served=False)
    hijax = M()
    hijax.own = nnx.Param(jnp.ones(2), hijax=True)
    check(hijax, "a hijax Variable", served=False)

    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    @jax.jit
    def traced(state):
        inner = nnx.merge(graphdef, state)
        check(inner, "Variables over tracers", served=False)
        check(nnx.Dict({"t": state["kernel"][...], "m": inner}), "a tracer attribute", served=False)
        return state

    traced(state)


@case
def graph_mode_off(e, check):
    nnx = e.nnx
    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    # tree mode: flax's _tree_flatten, which the served probe does not see
    check(model, "graph=False", graph=False, served=None)
    with e.graphlib.set_graph_mode(False):
        check(model, "set_graph_mode(False)", served=None)


@case
def reentrant_flatten(e, check):
    nnx, jnp, graphlib = e.nnx, e.jnp, e.graphlib

    class Outer:  # a graph node whose flatten runs graphlib.flatten itself
        def __init__(self):
            self.inner = nnx.Linear(1, 1, rngs=nnx.Rngs(0))

    def flatten(x):
        graphdef, _ = graphlib.flatten(x.inner)
        return [("inner", x.inner), ("n", graphlib.DataElem(graphdef.num_leaves))], None

    graphlib.register_graph_node_type(
        Outer, flatten, set_key=None, pop_key=None, create_empty=None, clear=None, init=None
    )
    check(nnx.Dict({"o": Outer(), "p": nnx.Param(jnp.ones(1))}))


@case
def bad_inputs_flattened(e, check):
    for name, make in bad_inputs(e).items():
        if name.startswith(("deep", "raises", "flatten_mutates")):
            continue  # compared between processes (public mode): a second walk differs
        try:
            node = make()
        except Exception as error:  # noqa: BLE001
            check.report[check.case]["notes"].append(f"{name}: not built: {error!r}")
            continue
        check(node, name, served=None)


# ------------------------------------------------------------------------------------------------
# bad input: each outcome compared between a plain and an installed process


class Interrupt(BaseException):
    """A KeyboardInterrupt-like exception raised by a node's flatten."""


class Custom(Exception):
    pass


RAISED: dict[str, BaseException] = {}


def bad_inputs(e) -> dict[str, Callable[[], Any]]:
    """Bad input, by name: each a function making the node (built lazily, after registrations)."""
    nnx, jnp, graphlib = e.nnx, e.jnp, e.graphlib
    out: dict[str, Callable[[], Any]] = {}

    def linear():
        return nnx.Linear(1, 1, rngs=nnx.Rngs(0))

    def with_vars(**items):
        def make():
            m = linear()
            vars(m).update(items)
            return m

        return make

    def non_str_key():
        m = linear()
        vars(m)[1] = 2
        return m

    class Name(str):
        pass

    def str_subclass_name():
        m = linear()
        vars(m)[Name("zz")] = jnp.ones(1)
        return m

    def nodes_not_hashable_mapping():
        m = linear()
        object.__setattr__(m, "_pytree__nodes", dict(m._pytree__nodes))
        return m

    def odd_flags():
        m = linear()
        flags = dict(m._pytree__nodes)
        flags["kernel"], flags["bias"], flags["in_features"] = 1, 0, "yes"
        object.__setattr__(m, "_pytree__nodes", type(m._pytree__nodes)(flags))
        return m

    def odd_metadata():
        m = linear()
        object.__setattr__(m.kernel, "_var_metadata", types.MappingProxyType({"a": 1}))
        return m

    def module_in_a_variable():
        m = linear()
        m.kernel.set_raw_value(linear())
        return m

    out.update(
        non_str_key_in_vars=non_str_key,
        str_subclass_name=str_subclass_name,
        nodes_not_a_hashable_mapping=nodes_not_hashable_mapping,
        flags_not_bools=odd_flags,
        metadata_not_a_dict=odd_metadata,
        module_inside_a_variable=module_in_a_variable,
    )

    class TupleSub(tuple):  # a tuple subclass JAX does not know: flax's generic impl fails
        pass

    out["tuple_subclass"] = lambda: nnx.Dict({"t": TupleSub((jnp.ones(1), 2))})

    one, param = jnp.ones(1), nnx.Param(jnp.ones(1))  # the same objects on every call
    flattens = {
        "generator": lambda x: ((("a", v) for v in (one,)), None),
        "three_items": lambda x: ([("a", one)], None, None),
        "not_iterable": lambda x: (5, None),
        "triples": lambda x: ([("a", one, 3)], None),
        "list_pairs": lambda x: ([["a", one], ["b", param]], None),
        "dict_values": lambda x: ({"ab": 1}, None),
        "raises_custom": _raiser("raises_custom", Custom),
        "raises_interrupt": _raiser("raises_interrupt", Interrupt),
    }
    for name, flatten in flattens.items():
        cls = type(f"Node_{name}", (), {})
        graphlib.register_graph_node_type(
            cls, flatten, set_key=None, pop_key=None, create_empty=None, clear=None, init=None
        )
        out[f"{name}_flatten"] = _holding(nnx, jnp, cls)

    class Mutating:  # its flatten empties its parent's dict mid-walk
        parent: Any = None

    def mutating_flatten(x):
        vars(x.parent).clear()
        return [], None

    graphlib.register_graph_node_type(
        Mutating,
        mutating_flatten,
        set_key=None,
        pop_key=None,
        create_empty=None,
        clear=None,
        init=None,
    )

    def mutating():
        m = nnx.Dict({"a": Mutating(), "z": nnx.Param(jnp.ones(1))})
        m.a.parent = m
        return m

    out["flatten_mutates_its_parent"] = mutating

    def deep():
        x: Any = None
        for _ in range(5000):
            x = [x]
        d = nnx.Dict()
        vars(d)["x"] = x  # past nnx's own attribute check, which recurses too
        d._pytree__nodes = type(d._pytree__nodes)({**d._pytree__nodes, "x": True})
        return d

    out["deep_list"] = deep
    out["deep_modules"] = _deep_modules(nnx, 3000)
    out.update(with_vars_extra=with_vars(extra=None))
    return out


def _holding(nnx, jnp, cls: type) -> Callable[[], Any]:
    def make():
        return nnx.Dict({"n": cls(), "w": nnx.Param(jnp.ones(1))})

    return make


def _raiser(name: str, cls: type) -> Callable:
    def flatten(x):
        error = RAISED[name] = cls(name)
        raise error

    return flatten


def _deep_modules(nnx, depth: int) -> Callable[[], Any]:
    def make():
        class Chain(nnx.Module, pytree=False):
            pass

        top = node = Chain()
        for _ in range(depth):
            node.child = Chain()
            node = node.child
        return top

    return make


def _describe_outcome(e, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    text = e.random_models._text
    try:
        out = fn(*args, **kwargs)
    except RecursionError:
        return ["RecursionError"]  # the message names the walk that gave up
    except BaseException as error:  # noqa: BLE001 - the outcome compared, KeyboardInterrupt-like too
        # the same type and message, and for a node's own exception the very object it raised
        return [
            "raised",
            type(error).__name__,
            text(str(error)).splitlines()[:1],
            any(error is raised for raised in RAISED.values()),
        ]
    graphdef, state = out
    leaves = e.jax.tree_util.tree_leaves(state)
    return ["ok", text(repr(graphdef)), [e.random_models._describe_leaf(x) for x in leaves]]


def bad_input_outcomes(e) -> dict:
    out = {}
    for name, make in bad_inputs(e).items():
        _progress(f"bad {name}")
        RAISED.clear()
        try:
            node = make()
        except Exception as error:  # noqa: BLE001
            out[name] = ["not built", type(error).__name__]
            continue
        calls = {
            "flatten": (e.graphlib.flatten, {}),
            "flatten_no_paths": (e.graphlib.flatten, {"with_paths": False}),
            "split": (e.nnx.split, {}),
        }
        out[name] = {
            what: _describe_outcome(e, fn, node, **kwargs) for what, (fn, kwargs) in calls.items()
        }
    return out


# ------------------------------------------------------------------------------------------------
# public APIs: a JSON view, compared between a plain and an installed process


def public_views(e) -> dict:
    """What nnx.split/state/graphdef/merge/update/clone/jit make of the models above, and what
    their in-place updates leave on the caller's objects."""
    nnx, jnp, jax, optax = e.nnx, e.jnp, e.jax, e.optax
    describe, text = e.random_models._describe_leaf, e.random_models._text
    out: dict[str, Any] = {}

    def leaves(tree):
        return [describe(x) for x in jax.tree_util.tree_leaves(tree)]

    def views(name, model):
        _progress(f"public {name}")
        graphdef, state = nnx.split(model)
        params, rest = nnx.state(model, nnx.Param, ...)
        merged = nnx.merge(graphdef, state)
        out[name] = {
            "graphdef": text(repr(graphdef)),
            "state": leaves(state),
            "paths": [str(p) for p, _ in nnx.to_flat_state(state)],
            "params": leaves(params),
            "rest": leaves(rest),
            "graphdef_only": text(repr(nnx.graphdef(model))),
            "split_filtered": [text(repr(nnx.split(model, nnx.Param, ...)[0]))],
            "merged_identity": e.random_models._identity_pattern(
                [x for _, x in nnx.iter_graph(merged)]
            ),
            "clone_identity": e.random_models._identity_pattern(
                [x for _, x in nnx.iter_graph(nnx.clone(model))]
            ),
        }
        return out[name]

    # shared submodules and Variables: an in-place update through one name is seen by the other
    shared = _shared(nnx, jnp, nnx.Rngs(0))
    view = views("shared", shared)

    @nnx.jit
    def step(m, x):
        return m(x)

    view["jit"] = describe(step(shared, jnp.ones((1, 2))))
    view["after_jit"] = [
        describe(shared.p[...]),
        shared.p is shared.q,
        shared.pair[0] is shared.p,
        shared.kernel_again is shared.a.kernel,
    ]
    _, state = nnx.split(shared)
    nnx.update(shared, jax.tree.map(lambda x: x * 3, state))
    view["after_update"] = leaves(nnx.state(shared))

    # a cycle
    ring = _cycle(nnx, jnp)
    view = views("cycle", ring)
    merged = nnx.merge(*nnx.split(ring))
    view["merged_cycle"] = [
        merged.me is merged,
        merged.next.next.next is merged,
        merged.others[2] is merged,
    ]

    @nnx.jit
    def bump(m):
        m.next.v[...] = m.next.v[...] + m.me.v[...]
        return m.next.next.next.v[...]

    view["jit"] = describe(bump(ring))
    view["after_jit"] = [describe(ring.next.v[...]), ring.me is ring]

    # Dropout and BatchNorm with rngs: the streams and statistics move in place
    net = nnx.Sequential(
        nnx.Linear(3, 3, rngs=nnx.Rngs(0)),
        nnx.BatchNorm(3, rngs=nnx.Rngs(1)),
        nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=2)),
    )
    view = views("dropout", net)
    view["jit"] = [describe(step(net, jnp.ones((2, 3)))) for _ in range(3)]
    view["after_jit"] = leaves(nnx.state(net))

    # an optimizer updated inside nnx.jit
    model = nnx.Sequential(
        nnx.Linear(2, 3, rngs=nnx.Rngs(0)),
        nnx.BatchNorm(3, rngs=nnx.Rngs(1)),
        nnx.Linear(3, 1, rngs=nnx.Rngs(2)),
    )
    model.layers[2].kernel_alias = model.layers[0].kernel  # a shared Param the optimizer sees once
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    view = views("optimizer", optimizer)

    @nnx.jit
    def train(model, optimizer, x, y):
        def loss_fn(model):
            return ((model(x) - y) ** 2).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    x, y = jnp.linspace(0, 1, 8).reshape(4, 2), jnp.ones((4, 1))
    view["losses"] = [describe(train(model, optimizer, x, y)) for _ in range(3)]
    view["after_jit"] = [
        leaves(nnx.state(model)),
        leaves(nnx.state(optimizer)),
        model.layers[2].kernel_alias is model.layers[0].kernel,
    ]

    # two arguments sharing a submodule, and a model made inside nnx.jit
    a = nnx.Linear(2, 2, rngs=nnx.Rngs(3))
    holder = nnx.Dict({"a": a, "count": nnx.Variable(jnp.zeros(()))})

    @nnx.jit
    def both(layer, holder):
        holder.count[...] += 1
        holder.a.bias[...] = holder.a.bias[...] + 1
        return layer.bias[...]

    out["two_arguments"] = [
        describe(both(a, holder)),
        describe(a.bias[...]),
        describe(holder.count[...]),
        holder.a is a,
    ]
    made = nnx.jit(lambda: _shared(nnx, jnp, nnx.Rngs(5)))()
    views("made_in_jit", made)
    out["eval_shape"] = text(
        repr(nnx.graphdef(nnx.eval_shape(lambda: _shared(nnx, jnp, nnx.Rngs(5)))))
    )
    for seed in range(8, 10):
        model, optimizer, _ = e.random_models.build(random.Random(seed), nnx, jnp)
        views(f"random {seed}", model if optimizer is None else optimizer)
    return out


def run_public(unknown: bool = False) -> dict:
    if unknown:  # before flax is imported: the integration knows no flax code
        from fastree.integrations import _known_flax

        _known_flax.KNOWN_CODE.clear()
    e = _env()
    import fastree
    from fastree.integrations import flax_nnx_graph

    return {
        "views": public_views(e),
        "bad": bad_input_outcomes(e),
        "status": flax_nnx_graph.status(),
        "installed": fastree.is_installed(),
        # flax's own function object (functools.wraps copies __module__, not __code__)
        "flax_function": flax_nnx_graph._graph is None
        and e.graphlib.flatten.__code__.co_filename.endswith("graphlib.py"),
    }


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "flatten":
        result = run_flatten_cases()
    elif mode in ("public", "unknown"):
        result = run_public(unknown=mode == "unknown")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result))
