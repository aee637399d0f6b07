"""PyTreeDef.fingerprint / serialize and fastree.deserialize (fastree._serialize)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import TREE_DICT, NodeClass, Pair, StaticTag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastree
import fastree.tree_util as tu


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
# fuzz: never crash, never hang; ValueError or a valid treedef

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


def _check(data: bytes) -> None:
    try:
        td = fastree.deserialize(data)
    except ValueError:
        return
    assert isinstance(td, fastree.PyTreeDef)
    repr(td), hash(td), td.num_leaves


FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.binary(max_size=200), st.booleans())
def test_fuzz_random_bytes(data, with_header):
    _check((b"FTDF\x01" if with_header else b"") + data)


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_fuzz_mutated(valid, data):
    buf = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del buf[pos:]
        elif op == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
        elif buf:
            del buf[pos]
    _check(bytes(buf))


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
