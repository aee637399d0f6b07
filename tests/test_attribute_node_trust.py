"""Attribute nodes read an instance natively only where it is the plain kind the fast path assumes.

A slot descriptor copied from an unrelated class would have a native read look at a foreign
offset (a crash), and an instance whose ``__dict__`` was replaced by a dict subclass, or a class
whose ``__getattribute__`` serves another ``__dict__``, would flatten differently from Python's
own reading. Such instances are read through ``getattr`` (or, for an integration,
by the library's own functions), and the foreign descriptor raises what Python raises.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import fastree
import fastree.tree_util as tu
import pytest
from fastree import _core


def test_a_foreign_slot_descriptor_raises_pythons_type_error_in_a_child():
    child = textwrap.dedent(
        """
        import fastree
        class A:
            __slots__ = tuple("s%d" % i for i in range(8))
        class B:
            pass
        B.s5 = A.__dict__["s5"]
        fastree.register_attribute_node(B, ["s5"])
        outcomes = set()
        for b in [B() for _ in range(500)]:
            b.z = 1.5
            try:
                fastree.tree_util.tree_leaves(b)
                outcomes.add("no error")
            except TypeError as e:
                outcomes.add("TypeError" if "doesn't apply" in str(e) else repr(e))
        print(sorted(outcomes))
        """
    )
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "['TypeError']"


class _GetLies(dict):
    def get(self, key, default=None):  # what `obj.__dict__.get` would answer
        return "from get"

    def __getitem__(self, key):
        return "from getitem"


def test_an_instance_with_a_dict_subclass_is_read_through_getattr():
    class P:
        pass

    fastree.register_attribute_node(P, ["x", "y"], missing=None)
    p = P()
    p.x, p.y = 1, 2
    assert tu.tree_leaves(p) == [1, 2]
    object.__setattr__(p, "__dict__", _GetLies(x=10, y=20))
    # Python's own reading: getattr finds the values in the (subclass) dict.
    assert tu.tree_leaves(p) == [p.x, p.y] == [10, 20]


def test_a_class_serving_another_dict_is_read_through_getattr():
    hidden = {"x": "hidden x", "y": "hidden y"}

    class Q:
        def __getattribute__(self, name):
            if name == "__dict__":
                return hidden
            if name in hidden:
                return hidden[name]
            return object.__getattribute__(self, name)

    fastree.register_attribute_node(Q, ["x", "y"], missing=None)
    q = Q()
    object.__setattr__(q, "x", "stored x")
    object.__setattr__(q, "y", "stored y")
    assert tu.tree_leaves(q) == [q.x, q.y] == ["hidden x", "hidden y"]


def test_an_absent_field_read_through_getattr_is_missing():
    class R:
        def __getattr__(self, name):
            raise AttributeError(name)

    fastree.register_attribute_node(R, ["x"], missing=None)
    r = R()
    assert str(tu.tree_structure(r)) == "PyTreeDef(CustomNode(R[()], [None]))"


def test_a_trusted_getattribute_keeps_the_native_read():
    def passthrough(self, name):
        return object.__getattribute__(self, name)

    class S:
        __getattribute__ = passthrough

    node = _core.AttrNode(S, ["x"], trusted_getattribute=passthrough)
    s = S()
    object.__setattr__(s, "x", 5)
    object.__setattr__(s, "__dict__", _GetLies(x=6))
    # A dict subclass is still not the plain kind, trusted class or not.
    assert node.flatten(s)[0] == (6,)
    object.__setattr__(s, "__dict__", {"x": 7})
    assert node.flatten(s)[0] == (7,)


def test_equinox_instance_with_a_dict_subclass_matches_equinox():
    eqx = pytest.importorskip("equinox")
    from fastree.jax_interop.compat import tree_util as jax_tu

    class M(eqx.Module):
        a: int
        b: int

    m = M(1, 2)
    expected = jax_tu.tree_leaves(m)
    object.__setattr__(m, "__dict__", _GetLies(a=1, b=2))
    assert tu.tree_leaves(m) == jax_tu.tree_leaves(m)
    assert expected == [1, 2]
