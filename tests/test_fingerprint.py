"""PyTreeDef.fingerprint / serialize and fastree.deserialize (fastree._serialize)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import pickle
import random
import re
import subprocess
import sys
import textwrap

import fastree
import fastree.tree_util as tu
import numpy as np
import pytest
from fastree.diagnostics import aux as _aux
from helpers import TREE_DICT, NodeClass, Pair, StaticTag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    dims: tuple


class Holder:
    def __init__(self, x, aux):
        self.x, self.aux = x, aux


tu.register_pytree_node(Holder, lambda h: ((h.x,), h.aux), lambda a, c: Holder(c[0], a))

RICH_AUX = (
    None,
    True,
    -(2**70),
    1.5,
    2j,
    "s",
    b"b",
    [1, (2,)],
    {"z": 1, "a": {2, 3}},
    frozenset({"x", "y", "zz"}),
    Mode.EVAL,
    Spec("s", (1, 2)),
    int,
    collections.OrderedDict,
    max,
)


def _fp(tree):
    return tu.tree_structure(tree).fingerprint()


FP_SCRIPT = textwrap.dedent(
    """
    import dataclasses, enum, fastree.tree_util as tu

    class Mode(enum.Enum):
        TRAIN = 1

    @dataclasses.dataclass(frozen=True)
    class Spec:
        name: str
        tags: frozenset

    class Holder:
        def __init__(self, x, aux):
            self.x, self.aux = x, aux

    tu.register_pytree_node(Holder, lambda h: ((h.x,), h.aux), lambda a, c: Holder(c[0], a))
    tags = frozenset(f"tag{i}" for i in range(20))
    tree = {f"key{i}": Holder(i, (tags, Mode.TRAIN, Spec("s", tags), {"d": 1, "c": 2}))
            for i in range(5)}
    print("FP", tu.tree_structure(tree).fingerprint())
    """
)


def test_fingerprint_identical_across_hash_seeds():
    prints = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", FP_SCRIPT], env=env, capture_output=True, text=True, check=True
        ).stdout
        prints.add(re.search(r"^FP ([0-9a-f]{64})$", out, re.MULTILINE).group(1))
    assert len(prints) == 1


def test_fingerprint_is_pinned():
    # The format is part of the contract: same bytes on every machine and in every version.
    assert _fp({"a": (1, None), "b": [2]}) == (
        "a61f0808bf6d9e4f19430ccf04f40770d0e570a08aafabd2d29252fcf2242a61"
    )


def test_fingerprint_depends_only_on_structure():
    assert _fp({"a": [1, 2]}) == _fp({"a": ["x", np.zeros(3)]})
    assert _fp(Holder(1, {"b": 1, "a": 2})) == _fp(Holder(1, {"a": 2, "b": 1}))
    base = _fp({"a": Holder(1, ("x", 1))})
    assert (
        len(
            {
                base,
                _fp({"b": Holder(1, ("x", 1))}),  # key
                _fp({"a": Holder(1, ("y", 1))}),  # aux
                _fp({"a": Holder(1, ("x", True))}),  # aux of another type, although 1 == True
                _fp({"a": Pair(1, None, tag=("x", 1))}),  # node type
                _fp({"a": [Holder(1, ("x", 1))]}),
                _fp([Holder(1, ("x", 1))]),
                _fp((Holder(1, ("x", 1)),)),
            }
        )
        == 8
    )


def test_fingerprint_rejects_other_aux_naming_type_and_path():
    with pytest.raises(TypeError, match=r"Holder node at \['a'\]\[1\].*numpy.float32"):
        _fp({"a": [0, Holder(1, ("x", np.float32(2)))]})
    with pytest.raises(TypeError, match=r"StaticTag"):
        _fp(StaticTag("s"))
    with pytest.raises(TypeError, match=r"lambda"):
        _fp(Holder(1, lambda: 0))


# ------------------------------------------------------------------------------------------------
# serialization


@pytest.mark.parametrize("name", list(TREE_DICT))
def test_round_trip_corpus(name):
    td = tu.tree_structure(TREE_DICT[name])
    try:
        data = td.serialize()
    except TypeError:
        # register_static instances are not canonical values
        assert name in ("static", "static_in_tree", "everything")
        return
    back = fastree.deserialize(data)
    assert back == td and repr(back) == repr(td) and hash(back) == hash(td)
    assert back.fingerprint() == td.fingerprint()
    assert back._state() == td._state()


def test_round_trip_rich_aux_and_local_types():
    @tu.register_pytree_node_class
    class Local:
        def __init__(self, *c, aux=None):
            self.c, self.aux = c, aux

        def tree_flatten(self):
            return self.c, self.aux

        @classmethod
        def tree_unflatten(cls, aux, c):
            return cls(*c, aux=aux)

    tree = {"h": [Holder(i, aux) for i, aux in enumerate(RICH_AUX)], "l": Local(1, aux=RICH_AUX)}
    td = tu.tree_structure(tree)
    back = fastree.deserialize(td.serialize())
    assert back == td
    assert back.unflatten(range(td.num_leaves))["l"].aux == RICH_AUX
    assert back.fingerprint() == td.fingerprint()


def test_deserialize_errors():
    data = tu.tree_structure({"a": Holder(1, "x")}).serialize()
    with pytest.raises(ValueError, match="bad magic"):
        fastree.deserialize(b"XXXX" + data[4:])
    with pytest.raises(ValueError, match="version"):
        fastree.deserialize(data[:4] + b"\x09" + data[5:])
    with pytest.raises(ValueError, match="truncated"):
        fastree.deserialize(data[:-3])
    with pytest.raises(ValueError, match="trailing"):
        fastree.deserialize(data + b"*")
    bad = data.replace(b"Holder", b"Holdex")
    with pytest.raises(ValueError, match=r"cannot find .*Holdex"):
        fastree.deserialize(bad)
    with pytest.raises(TypeError):
        fastree.deserialize("not bytes")


def test_serialize_rejects_unfindable_names():
    def local_fn():
        return 0

    with pytest.raises(TypeError, match="local_fn"):
        tu.tree_structure(Holder(1, local_fn)).serialize()


# ------------------------------------------------------------------------------------------------
# fuzz: past the header, every input is a clear error or a treedef that round-trips

VALID = [
    tu.tree_structure(t).serialize()
    for t in (
        {"a": [1, (2, None)], "b": Holder(1, RICH_AUX[:8])},
        NodeClass(1, meta=(1, 2)),
        collections.OrderedDict(x=1, y=collections.defaultdict(list, z=2)),
        TREE_DICT["namedtuple_nested"],
        TREE_DICT["point"],
    )
]
HEADER = b"FTDF\x01"  # magic bytes and format version: the mutations leave them alone

# What deserialize says about a malformed body: the decoder's own reasons, a name it cannot
# import, text that is not UTF-8, or the core's check of the node entries it rebuilt.
MALFORMED = re.compile(
    r"malformed serialized PyTreeDef: (?:"
    r"truncated input|unknown (?:entry|value|node) tag b|cannot find |'utf-8' codec can't decode"
    r"|node arity larger than the subtrees before it$|shared reference to a later node$"
    r"|trailing bytes after the last node$|varint too long$|(?:value )?nested too deeply$"
    r"|Malformed PyTreeDef (?:pickle )?state|\w+ node data must |None nodes have no children"
    r"|Dataclass node .* expects |attribute node of .* expects )"
)


def _outcome(data: bytes) -> str:
    """``"round trip"`` or the error; fails on anything else (another exception, a vague text,
    a treedef whose own serialization does not rebuild it)."""
    try:
        td = fastree.deserialize(data)
    except ValueError as e:
        assert MALFORMED.match(str(e)), str(e)
        return str(e)
    assert isinstance(td, fastree.PyTreeDef)
    again = td.serialize()
    rebuilt = fastree.deserialize(again)
    assert rebuilt == td and hash(rebuilt) == hash(td) and repr(rebuilt) == repr(td)
    assert rebuilt.serialize() == again
    return "round trip"


def _mutate(valid: bytes, draw) -> bytes:
    # draw(lo, hi): an int in [lo, hi]. One to four edits, each at a position past the header.
    buf = bytearray(valid)
    for _ in range(draw(1, 4)):
        op = ("flip", "truncate", "insert", "delete")[draw(0, 3)]
        pos = draw(len(HEADER), max(len(buf) - 1, len(HEADER)))
        if op == "flip" and pos < len(buf):
            buf[pos] = draw(0, 255)
        elif op == "truncate":
            del buf[pos:]
        elif op == "insert":
            buf[pos:pos] = bytes(draw(0, 255) for _ in range(draw(1, 4)))
        elif pos < len(buf):
            del buf[pos]
    return bytes(buf)


# derandomize: the same examples every run, so the fuzz cannot fail by chance.
FUZZ = settings(
    max_examples=250, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_body(body):
    _outcome(HEADER + body)


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_fuzz_mutated(valid, data):
    _outcome(_mutate(valid, lambda lo, hi: data.draw(st.integers(lo, hi))))


def test_fuzz_mutations_reach_every_part_of_the_format():
    # The mutations above get past the header into entries, node types, names and values:
    # a fixed sample of them meets each of these outcomes.
    rng = random.Random(0)
    outcomes = [_outcome(_mutate(VALID[i % len(VALID)], rng.randint)) for i in range(1500)]
    wanted = [
        "round trip",
        "malformed serialized PyTreeDef: truncated input",
        "malformed serialized PyTreeDef: unknown entry tag",
        "malformed serialized PyTreeDef: unknown value tag",
        "malformed serialized PyTreeDef: unknown node tag",
        "malformed serialized PyTreeDef: node arity larger than the subtrees before it",
        "malformed serialized PyTreeDef: cannot find ",
    ]
    assert [w for w in wanted if not any(o.startswith(w) for o in outcomes)] == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a serialized PyTreeDef (bad magic bytes)"),
        (b"FTDX\x01**", "not a serialized PyTreeDef (bad magic bytes)"),
        (b"FTDF", "unsupported serialized PyTreeDef version b''"),
        (b"FTDF\x02\x01*", "unsupported serialized PyTreeDef version b'\\x02'"),
    ],
    ids=["empty", "bad-magic", "no-version", "unknown-version"],
)
def test_header_errors(data, message):
    with pytest.raises(ValueError) as info:
        fastree.deserialize(data)
    assert str(info.value) == message


def test_pickle_unaffected():
    td = tu.tree_structure({"a": Holder(1, "x")})
    assert pickle.loads(pickle.dumps(td)) == td


class SharedNode:
    def __init__(self, x):
        self.x = x


tu.register_pytree_node(
    SharedNode, lambda s: ((s.x,), None), lambda _, c: SharedNode(*c), preserve_identity=True
)


def test_sharing_in_fingerprint_and_round_trip():
    s = SharedNode(1)
    shared = tu.tree_structure({"a": s, "b": s})
    copied = tu.tree_structure({"a": s, "b": SharedNode(1)})
    assert shared != copied and shared.fingerprint() != copied.fingerprint()
    for td in (shared, copied):
        back = fastree.deserialize(td.serialize())
        assert back == td and back._state() == td._state()
    out = fastree.deserialize(shared.serialize()).unflatten([1])
    assert out["a"] is out["b"]


# ------------------------------------------------------------------------------------------------
# equal fingerprints imply equal treedefs
#
# Lookalikes: values whose encodings would match while treedef equality tells them apart.


@dataclasses.dataclass(eq=False, frozen=True)
class IdCfg:
    """Compares by identity: two instances with equal fields are unequal aux_data."""

    lr: float


@dataclasses.dataclass(frozen=True)
class ValCfg:
    """The dataclass-generated ==: equal fields, equal aux_data."""

    lr: float


@dataclasses.dataclass(frozen=True)
class ValCfgChild(ValCfg):
    """Inherits the generated == (a dataclass subclass without __eq__ of its own)."""


@dataclasses.dataclass(frozen=True)
class StrictCfg:
    """A hand-written == stricter than the fields (identity): must not be encoded by them."""

    lr: float

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)


def make_box():
    """A class factory: each call registers a new node type named make_box.<locals>.Box."""

    class Box:
        def __init__(self, *c):
            self.c = c

    tu.register_pytree_node(Box, lambda n: (n.c, None), lambda a, c: Box(*c))
    return Box


BOX_1, BOX_2 = make_box(), make_box()


def relu(x):
    return max(x, 0)


RELU_OLD = relu


def relu(x):  # noqa: F811 (redefined on purpose, as a re-run notebook cell does)
    return x


PHASE_1 = enum.Enum("Phase", ["A", "B"])  # two enum classes named test_fingerprint.Phase
PHASE_2 = enum.Enum("Phase", ["A", "B"])


def _node(aux, *children):
    return Holder(list(children), aux)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (IdCfg(0.1), IdCfg(0.1)),
        (BOX_1, BOX_2),
        (RELU_OLD, relu),
        (PHASE_1.A, PHASE_2.A),
        (StrictCfg(0.1), StrictCfg(0.1)),
        (float("nan"), float("nan")),
        ((1, float("nan")), (1, float("nan"))),
        (complex(0, float("nan")), complex(0, float("nan"))),
    ],
    ids=[
        "eq-false-dataclass",
        "same-name-class",
        "same-name-function",
        "same-name-enum",
        "hand-written-eq",
        "nan",
        "nan-in-tuple",
        "complex-nan",
    ],
)
def test_lookalike_aux_never_share_a_fingerprint(first, second):
    a, b = tu.tree_structure(_node(first)), tu.tree_structure(_node(second))
    assert a != b
    fingerprints = set()
    for td in (a, b):
        try:
            fingerprints.add(td.fingerprint())
        except TypeError:
            fingerprints.add(None)
    assert None in fingerprints or len(fingerprints) == 2


def test_node_types_with_one_name_have_distinct_fingerprints():
    a, b = tu.tree_structure(BOX_1(1)), tu.tree_structure(BOX_2(1))
    assert a != b and a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == tu.tree_structure(BOX_1(2)).fingerprint()  # stable in-process


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (IdCfg(0.1), "compares by identity (a dataclass with eq=False)"),
        (StrictCfg(0.1), "compares with a hand-written StrictCfg.__eq__"),
        (float("nan"), "is NaN: NaN != NaN"),
    ],
    ids=["eq-false", "hand-written-eq", "nan"],
)
def test_refusal_names_node_path_value_and_why(value, why):
    td = tu.tree_structure({"a": [0, Holder(1, ("x", value))]})
    with pytest.raises(TypeError) as info:
        td.fingerprint()
    message = str(info.value)
    assert message.startswith("cannot fingerprint the test_fingerprint.Holder node at ['a'][1]: ")
    assert f"a {_aux._type_name(type(value))} value ({value!r}) " in message
    assert why in message


def test_value_dataclasses_are_still_encoded():
    assert _fp(Holder(1, ValCfg(0.1))) == _fp(Holder(1, ValCfg(0.1)))
    assert _fp(Holder(1, ValCfg(0.1))) != _fp(Holder(1, ValCfg(0.2)))
    assert _fp(Holder(1, ValCfgChild(0.1))) != _fp(Holder(1, ValCfg(0.1)))
    back = fastree.deserialize(tu.tree_structure(Holder(1, ValCfgChild(0.1))).serialize())
    assert back == tu.tree_structure(Holder(1, ValCfgChild(0.1)))


def test_serialize_refuses_identity_dataclasses_and_keeps_nan():
    with pytest.raises(TypeError, match=r"cannot serialize the .*Holder node at \(root\)"):
        tu.tree_structure(Holder(1, IdCfg(0.1))).serialize()
    # A hand-written == is the class's own business once the fields are restored.
    fastree.deserialize(tu.tree_structure(Holder(1, StrictCfg(0.1))).serialize())
    back = fastree.deserialize(tu.tree_structure(Holder(1, float("nan"))).serialize())
    assert np.isnan(back.node_data()[1])  # a round trip needs no equality


RELOADED = textwrap.dedent(
    """
    import fastree.tree_util as tu

    class Cell:
        def __init__(self, *c):
            self.c = c

    tu.register_pytree_node(Cell, lambda n: (n.c, VERSION), lambda a, c: Cell(*c))
    """
)


def test_reload_gives_the_new_class_another_fingerprint(tmp_path, monkeypatch):
    # A re-run cell or importlib.reload: a new class under the old name. Until now both
    # fingerprinted alike; treedefs built from them are unequal.
    import importlib

    (tmp_path / "fp_reload_mod.py").write_text("VERSION = 1\n" + RELOADED)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("fp_reload_mod")
    try:
        old = tu.tree_structure(mod.Cell(1))
        old_fp = old.fingerprint()
        old.serialize()
        (tmp_path / "fp_reload_mod.py").write_text("VERSION = 1\n" + RELOADED + "\n# again\n")
        mod = importlib.reload(mod)
        new = tu.tree_structure(mod.Cell(1))
        assert new != old
        assert new.fingerprint() != old_fp  # numbered in this process: not stable across them
        assert old.fingerprint() == old_fp  # the first object keeps its name-only encoding
        assert fastree.deserialize(new.serialize()) == new  # the name now finds the new class
        with pytest.raises(TypeError, match="names another object"):
            old.serialize()
    finally:
        sys.modules.pop("fp_reload_mod", None)


# The property, over trees built from the lookalikes above and their honest neighbours.
NAN_1, NAN_2 = float("nan"), float("nan")
LOOKALIKES = [
    [None],
    [0, 0.0, -0.0, False],
    [1, 1.0, True],
    ["a"],
    [b"a"],
    [NAN_1, NAN_2, complex(NAN_1, 0)],
    [(1,), [1], (1.0,)],
    [(NAN_1,), (NAN_2,)],
    [{"k": 1}, {"k": True}],
    [frozenset({1}), {1}],
    [IdCfg(0.1), IdCfg(0.1)],
    [ValCfg(0.1), ValCfg(0.1), ValCfgChild(0.1)],
    [StrictCfg(0.1), StrictCfg(0.1)],
    [BOX_1, BOX_2],
    [RELU_OLD, relu, max],
    [PHASE_1.A, PHASE_2.A, PHASE_1.B],
    [Mode.TRAIN, Mode.EVAL],
]
POOL = [value for group in LOOKALIKES for value in group]
GROUP_OF: dict[int, list[int]] = {}  # pool index -> the pool indices of its group
for _group in LOOKALIKES:
    _members = list(range(len(GROUP_OF), len(GROUP_OF) + len(_group)))
    GROUP_OF.update(dict.fromkeys(_members, _members))


def _specs():
    def extend(children):
        kids = st.lists(children, max_size=2)
        return st.one_of(
            st.tuples(st.just("list"), kids),
            st.tuples(
                st.just("dict"), st.dictionaries(st.sampled_from("ab"), children, max_size=2)
            ),
            st.tuples(st.just("node"), st.integers(0, len(POOL) - 1), kids),
            st.tuples(st.just("box"), st.integers(0, 1), kids),
        )

    return st.recursive(st.just(("leaf",)), extend, max_leaves=4)


def _lookalike(spec, data):
    """The same shape, each aux value swapped for a random member of its lookalike group."""
    kind = spec[0]
    if kind == "leaf":
        return spec
    if kind == "dict":
        return (kind, {k: _lookalike(v, data) for k, v in spec[1].items()})
    kids = [_lookalike(k, data) for k in spec[-1]]
    if kind == "node":
        return (kind, data.draw(st.sampled_from(GROUP_OF[spec[1]])), kids)
    if kind == "box":
        return (kind, data.draw(st.integers(0, 1)), kids)
    return (kind, kids)


def _build(spec):
    kind = spec[0]
    if kind == "leaf":
        return 0
    if kind == "dict":
        return {k: _build(v) for k, v in spec[1].items()}
    kids = [_build(k) for k in spec[-1]]
    if kind == "node":
        return _node(POOL[spec[1]], *kids)
    if kind == "box":
        return (BOX_1, BOX_2)[spec[1]](*kids)
    return kids


def _fingerprint_or_none(td):
    try:
        return td.fingerprint()
    except TypeError:
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(_specs(), st.data())
def test_equal_fingerprints_imply_equal_treedefs(spec, data):
    other = _lookalike(spec, data) if data.draw(st.booleans()) else data.draw(_specs())
    a, b = tu.tree_structure(_build(spec)), tu.tree_structure(_build(other))
    fa, fb = _fingerprint_or_none(a), _fingerprint_or_none(b)
    assert fa == _fingerprint_or_none(a)  # deterministic, refusals included
    if fa is not None and fa == fb:
        assert a == b
