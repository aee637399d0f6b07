"""Stable fingerprints and a versioned byte format for treedefs.

Both use one canonical, typed, length-prefixed encoding of ``PyTreeDef._state()`` (no pickle,
no repr): the same structure gives the same bytes in every process, on every machine, under
every ``PYTHONHASHSEED``. Values allowed in aux_data, dict keys and node data:

    None, bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset,
    enum members, dataclass instances of these, classes and named functions
    (by module + qualified name).

Anything else raises ``TypeError``. Fingerprints sort dict items and set elements by their
encoding (equal values, equal fingerprint); serialization keeps dict order (it must rebuild the
same object) and sorts sets. Types are encoded, not their equality: ``1``, ``1.0`` and ``True``
compare equal as aux_data but fingerprint differently, so equal fingerprints imply equal
treedefs (not the converse), with one exception: a NaN aux value fingerprints like any other
NaN although NaN != NaN.

Format (version 1)::

    b"FTDF" 0x01  varint(#entries)  entry*          (post-order, root last)
    entry  = b"*"                                   a leaf
           | b"r" varint(index)                     a shared reference to entry `index`
           | b"n" nodetype varint(arity) value      a node and its node data
    nodetype = b"N" | b"t" | b"l" | b"d" | b"o" | b"f"   None tuple list dict OrderedDict
           | b"q" name                                    defaultdict | any other class
    name   = str(module) str(qualname)               (str = varint(len) utf-8)

``deserialize`` imports the modules named in its input (as unpickling does): load only
serialized treedefs you trust.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import importlib
import struct
import sys
import types
from typing import Any

from jax._src import tree_util as _jax_internal

from . import _core, _statetree
from .tree_util import keystr

MAGIC = b"FTDF"
VERSION = 1
_FINGERPRINT_PREFIX = b"fastree-fingerprint\x00\x01"
_MAX_DEPTH = 64  # nesting of values (aux_data is shallow; a cycle must not recurse forever)

_NODE_TAGS: dict[type, bytes] = {
    type(None): b"N",
    tuple: b"t",
    list: b"l",
    dict: b"d",
    collections.OrderedDict: b"o",
    collections.defaultdict: b"f",
}
_TAG_NODES = {tag: tp for tp, tag in _NODE_TAGS.items()}

# Built-in types that are not attributes of the builtins module.
_UNNAMED_BUILTINS: dict[tuple[str, str], type] = {
    ("builtins", "NoneType"): type(None),
    ("builtins", "ellipsis"): type(...),
    ("builtins", "NotImplementedType"): type(NotImplemented),
}


# ------------------------------------------------------------------------------------------------
# names


def _resolve(module: str, qualname: str) -> Any:
    """The object named ``module``.``qualname``; ValueError if it cannot be found."""
    if (module, qualname) in _UNNAMED_BUILTINS:
        return _UNNAMED_BUILTINS[(module, qualname)]
    # Registered node types first (no import needed; also finds classes defined in functions).
    matches = [
        tp
        for tp in list(_jax_internal._registry)
        if getattr(tp, "__module__", None) == module
        and getattr(tp, "__qualname__", None) == qualname
    ]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ValueError(f"ambiguous type name {module}.{qualname}: several registered types")
    if not all(p.isidentifier() for p in module.split(".")) or not all(
        p.isidentifier() for p in qualname.split(".")
    ):
        raise ValueError(f"cannot find {module}.{qualname}: not an importable name")
    try:
        obj = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise ValueError(f"cannot find {module}.{qualname}: {type(e).__name__}: {e}") from None
    return obj


def _name_of(obj: Any, *, resolvable: bool) -> tuple[str, str]:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(f"{obj!r} has no qualified name")
    if resolvable:
        try:
            found = _resolve(module, qualname)
        except ValueError as e:
            raise TypeError(f"{obj!r} cannot be found again by name ({e})") from None
        if found is not obj:
            raise TypeError(f"{module}.{qualname} names another object than {obj!r}")
    return module, qualname


# ------------------------------------------------------------------------------------------------
# encoding


def _varint(out: bytearray, n: int) -> None:
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _str(out: bytearray, s: str) -> None:
    raw = s.encode("utf-8", "surrogatepass")
    _varint(out, len(raw))
    out += raw


class _Encoder:
    """Canonical mode (fingerprints) sorts dict items; serialization mode keeps their order and
    checks that every named object can be found again by name."""

    def __init__(self, canonical: bool) -> None:
        self.canonical = canonical
        self.out = bytearray()

    def name(self, obj: Any) -> None:
        module, qualname = _name_of(obj, resolvable=not self.canonical)
        _str(self.out, module)
        _str(self.out, qualname)

    def encoded(self, value: Any, depth: int) -> bytes:
        sub = _Encoder(self.canonical)
        sub.value(value, depth)
        return bytes(sub.out)

    def value(self, v: Any, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise TypeError("value nested too deeply (or cyclic)")
        out = self.out
        tp = type(v)
        if v is None:
            out += b"N"
        elif tp is bool:
            out += b"T" if v else b"F"
        elif tp is int:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True)
            out += b"i"
            _varint(out, len(raw))
            out += raw
        elif tp is float:
            out += b"g" + struct.pack(">d", v)
        elif tp is complex:
            out += b"c" + struct.pack(">dd", v.real, v.imag)
        elif tp is str:
            out += b"s"
            _str(out, v)
        elif tp is bytes:
            out += b"b"
            _varint(out, len(v))
            out += v
        elif tp is tuple or tp is list:
            out += b"(" if tp is tuple else b"["
            _varint(out, len(v))
            for item in v:
                self.value(item, depth + 1)
        elif tp is dict:
            items = [(self.encoded(k, depth + 1), self.encoded(x, depth + 1)) for k, x in v.items()]
            if self.canonical:
                items.sort()
            out += b"{"
            _varint(out, len(items))
            for k, x in items:
                out += k + x
        elif tp is frozenset or tp is set:
            elements = sorted(self.encoded(x, depth + 1) for x in v)
            out += b"z" if tp is frozenset else b"S"
            _varint(out, len(elements))
            for e in elements:
                out += e
        elif isinstance(v, enum.Enum):
            out += b"e"
            self.name(tp)
            _str(out, v.name)
        elif isinstance(v, type):
            out += b"y"
            self.name(v)
        elif isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
            if "<" in getattr(v, "__qualname__", "<"):
                raise TypeError(f"function {v!r} has no importable name (a lambda or local)")
            out += b"p"
            self.name(v)
        elif dataclasses.is_dataclass(v):
            fields = dataclasses.fields(v)
            out += b"a"
            self.name(tp)
            _varint(out, len(fields))
            for f in fields:
                _str(out, f.name)
                self.value(getattr(v, f.name), depth + 1)
        else:
            raise TypeError(
                f"a {tp.__module__}.{tp.__qualname__} value ({v!r:.60}) has no canonical encoding"
            )

    def node_type(self, tp: type) -> None:
        tag = _NODE_TAGS.get(tp)
        if tag is not None:
            self.out += tag
        else:
            self.out += b"q"
            self.name(tp)

    def state(self, state: Any) -> None:
        entries = state[1]
        _varint(self.out, len(entries))
        for i, (tp, data, arity, ref) in enumerate(entries):
            try:
                if tp is None:
                    if ref >= 0:
                        self.out += b"r"
                        _varint(self.out, ref)
                    else:
                        self.out += b"*"
                    continue
                self.out += b"n"
                self.node_type(tp)
                _varint(self.out, arity)
                self.value(data)
            except TypeError as e:
                path = _statetree.parse_state(state)[i].path
                where = keystr(path) or "(root)"
                raise TypeError(
                    f"cannot encode the {tp.__qualname__} node at {where}: {e}"
                ) from None


def fingerprint(treedef: _core.PyTreeDef) -> str:
    """A sha256 hex digest of the structure, identical across processes and machines.

    >>> import fastree.tree_util as tu
    >>> fp = tu.tree_structure({'a': (1, 2)}).fingerprint()
    >>> len(fp), fp == tu.tree_structure({'a': (3, 4)}).fingerprint()
    (64, True)
    >>> fp == tu.tree_structure({'b': (1, 2)}).fingerprint()
    False
    """
    enc = _Encoder(canonical=True)
    enc.state(treedef._state())
    return hashlib.sha256(_FINGERPRINT_PREFIX + bytes(enc.out)).hexdigest()


def serialize(treedef: _core.PyTreeDef) -> bytes:
    """The treedef as bytes (a versioned format); :func:`deserialize` rebuilds it.

    >>> import fastree, fastree.tree_util as tu
    >>> td = tu.tree_structure({'a': [1, None], 'b': (2,)})
    >>> data = td.serialize()
    >>> data[:5], fastree.deserialize(data) == td
    (b'FTDF\\x01', True)
    """
    enc = _Encoder(canonical=False)
    enc.out += MAGIC + bytes([VERSION])
    enc.state(treedef._state())
    return bytes(enc.out)


# ------------------------------------------------------------------------------------------------
# decoding (never trusts a length: each is checked against the remaining input first)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            raise ValueError("truncated input")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def byte(self) -> bytes:
        return self.take(1)

    def varint(self) -> int:
        n = shift = 0
        for _ in range(10):
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
        raise ValueError("varint too long")

    def count(self) -> int:
        """A number of items that follow; each takes at least one byte."""
        n = self.varint()
        if n > self.remaining():
            raise ValueError("truncated input: a count larger than the remaining input")
        return n

    def str(self) -> str:
        return self.take(self.count()).decode("utf-8", "surrogatepass")

    def name(self) -> Any:
        return _resolve(self.str(), self.str())

    def value(self, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError("value nested too deeply")
        tag = self.byte()
        if tag == b"N":
            return None
        if tag in (b"T", b"F"):
            return tag == b"T"
        if tag == b"i":
            return int.from_bytes(self.take(self.count()), "big", signed=True)
        if tag == b"g":
            return struct.unpack(">d", self.take(8))[0]
        if tag == b"c":
            return complex(*struct.unpack(">dd", self.take(16)))
        if tag == b"s":
            return self.str()
        if tag == b"b":
            return bytes(self.take(self.count()))
        if tag in (b"(", b"["):
            items = [self.value(depth + 1) for _ in range(self.count())]
            return tuple(items) if tag == b"(" else items
        if tag == b"{":
            n = self.count()
            pairs = [(self.value(depth + 1), self.value(depth + 1)) for _ in range(n)]
            return dict(pairs)
        if tag in (b"z", b"S"):
            items = [self.value(depth + 1) for _ in range(self.count())]
            return frozenset(items) if tag == b"z" else set(items)
        if tag == b"e":
            cls = self.name()
            member = self.str()
            if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
                raise ValueError(f"{cls!r} is not an enum class")
            try:
                return cls[member]
            except KeyError:
                raise ValueError(f"{cls.__qualname__} has no member {member!r}") from None
        if tag == b"y":
            cls = self.name()
            if not isinstance(cls, type):
                raise ValueError(f"{cls!r} is not a class")
            return cls
        if tag == b"p":
            fn = self.name()
            if not isinstance(fn, (types.FunctionType, types.BuiltinFunctionType)):
                raise ValueError(f"{fn!r} is not a function")
            return fn
        if tag == b"a":
            return self.dataclass_instance(depth)
        raise ValueError(f"unknown value tag {tag!r}")

    def dataclass_instance(self, depth: int) -> Any:
        cls = self.name()
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"{cls!r} is not a dataclass")
        n = self.count()
        values = {}
        for _ in range(n):
            field = self.str()
            values[field] = self.value(depth + 1)
        expected = [f.name for f in dataclasses.fields(cls)]
        if sorted(values) != sorted(expected) or len(values) != n:
            raise ValueError(f"fields of {cls.__qualname__} do not match: {sorted(values)}")
        # Restore the fields as they were (as unpickling does), without running __init__.
        obj = cls.__new__(cls)
        for field, value in values.items():
            object.__setattr__(obj, field, value)
        return obj

    def node_type(self) -> type:
        tag = self.byte()
        if tag in _TAG_NODES:
            return _TAG_NODES[tag]
        if tag != b"q":
            raise ValueError(f"unknown node tag {tag!r}")
        cls = self.name()
        if not isinstance(cls, type):
            raise ValueError(f"{cls!r} is not a class")
        return cls

    def entries(self) -> tuple[tuple[Any, Any, int, int], ...]:
        n = self.count()
        entries = []
        open_subtrees = 0
        for i in range(n):
            tag = self.byte()
            if tag == b"*":
                entries.append((None, None, 0, -1))
            elif tag == b"r":
                ref = self.varint()
                if ref >= i:
                    raise ValueError("shared reference to a later node")
                entries.append((None, None, 0, ref))
            elif tag == b"n":
                tp = self.node_type()
                arity = self.varint()
                if arity > open_subtrees:
                    raise ValueError("node arity larger than the subtrees before it")
                entries.append((tp, self.value(), arity, -1))
                open_subtrees -= arity
            else:
                raise ValueError(f"unknown entry tag {tag!r}")
            open_subtrees += 1
        if self.remaining():
            raise ValueError("trailing bytes after the last node")
        return tuple(entries)


def deserialize(data: bytes) -> _core.PyTreeDef:
    """Rebuilds a treedef from :meth:`PyTreeDef.serialize` output.

    Raises:
        ValueError: malformed, truncated or unsupported input, or a type that cannot be found.

    >>> import fastree
    >>> fastree.deserialize(b'FTDF\\x01\\x03**\\x00')
    Traceback (most recent call last):
    ValueError: malformed serialized PyTreeDef: unknown entry tag b'\\x00'
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"deserialize() expects bytes, got {type(data).__name__}")
    data = bytes(data)
    if data[:4] != MAGIC:
        raise ValueError("not a serialized PyTreeDef (bad magic bytes)")
    if len(data) < 5 or data[4] != VERSION:
        raise ValueError(f"unsupported serialized PyTreeDef version {data[4:5]!r}")
    try:
        reader = _Reader(data)
        reader.pos = 5
        entries = reader.entries()
        return _core._treedef_from_state((_statetree.STATE_VERSION, entries))
    except RecursionError:
        raise ValueError("malformed serialized PyTreeDef: nested too deeply") from None
    except Exception as e:  # any failure to decode is malformed input, whatever raised it
        detail = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        raise ValueError(f"malformed serialized PyTreeDef: {detail}") from None
