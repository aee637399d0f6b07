"""Stable fingerprints and a versioned byte format for treedefs.

Both use one canonical, typed, length-prefixed encoding of the treedef's post-order nodes
(``PyTreeDef._nodes()``; no pickle, no repr): the same structure gives the same bytes in every
process, on every machine, under every ``PYTHONHASHSEED``. Values allowed in aux_data, dict
keys and node data:

    None, bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset,
    enum members, dataclass instances of these (not ``eq=False``; for fingerprints, with
    the ``==`` that ``@dataclass`` generates), classes and named functions (by module +
    qualified name).

Anything else raises ``TypeError`` naming the node type, its key path, the value and why; so
does a container that contains itself, or one whose shared sub-values would repeat more than
16 MiB when written out (the encoding is by value, and each distinct container is encoded
once, so the cost stays linear in the distinct values). Fingerprints sort dict items and set
elements by their encoding (equal values, equal fingerprint); serialization keeps dict order
(it must rebuild the same object) and sorts sets.

What a fingerprint guarantees. Within one process, **equal fingerprints imply equal
treedefs**: ``td1.fingerprint() == td2.fingerprint()`` implies ``td1 == td2``. The converse
does not hold (``1``, ``1.0`` and ``True`` compare equal as aux_data but fingerprint
differently: types are encoded, not equality). For that, ``fingerprint()`` refuses
(``TypeError``) what it cannot encode faithfully:

* a NaN (a float, or a complex part): NaN != NaN, so two treedefs holding distinct NaN objects
  are unequal while their encodings match (``serialize`` accepts NaN: it needs no equality);
* a dataclass instance whose ``==`` is not the one ``@dataclass`` generates: with ``eq=False``
  it compares by identity, and a hand-written ``__eq__`` may tell apart what the fields do not
  (``serialize`` refuses the first kind too: a rebuilt instance never equals the original);
* a lambda or a function defined inside another function: it has no name to encode.

Classes (node types included), enum classes and functions are encoded by module and
qualified name, and a name need not identify one object: ``importlib.reload``, a re-run
notebook cell or a class factory makes another object with the same name. So the first object
fingerprinted under a name in this process is encoded by its name alone, and each other
object fingerprinted later under that name gets a per-process number in its encoding (``#``,
below): its fingerprints differ from the first's, and are **not stable across processes**.

Across processes a fingerprint can only speak by name: equal fingerprints from two processes
mean treedefs equal up to what the names denote in each (the same module + qualname for each
node type, class and function; equal values elsewhere).

Format (version 1)::

    b"FTDF" 0x01  varint(#entries)  entry*          (post-order, root last)
    entry  = b"*"                                   a leaf
           | b"r" varint(index)                     a shared reference to entry `index`
           | b"n" nodetype varint(arity) value      a node and its node data
    nodetype = b"N" | b"t" | b"l" | b"d" | b"o" | b"f"   None tuple list dict OrderedDict
           | b"q" name                                    defaultdict | any other class
    name   = str(module) str(qualname)               (str = varint(len) utf-8)

Fingerprints hash the same encoding, with one addition: ``b"#" varint(n)`` before the tag of a
value or node type whose name is the n-th object (n >= 1) of that name met in this process.

``deserialize`` imports the modules named in its input (as unpickling does): load only
serialized treedefs you trust.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import hashlib
import importlib
import math
import struct
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from . import _core, _statetree
from ._values import ATOM, ENTER, LEAVE, REPEAT, ValueWalk
from .diagnostics.audit import short_repr
from .diagnostics.aux import _type_name, items
from .jax_interop import compat as _jax_compat
from .jax_interop.compat import keystr

MAGIC = b"FTDF"
VERSION = 1
_FINGERPRINT_PREFIX = b"fastree-fingerprint\x00\x01"
_MAX_DEPTH = 64  # nesting of values: aux_data is shallow, deeper values are refused
# Bytes a value may repeat by sharing a sub-value: 40 levels of (x, x) pairs are 40 objects
# but 2**40 copies in the encoding. The encoding is by value, so it must write every copy;
# past this it refuses instead of running for days.
_REPEAT_LIMIT = 1 << 24
_CONTAINERS = (tuple, list, dict, set, frozenset)
_SCALARS = (type(None), bool, int, float, complex, str, bytes)

# The built-in node kinds, written by tag; every other node (namedtuple, custom, dataclass) by
# the name of its type. Each of these kinds has exactly one type, so the tag stands for it.
_KIND_TAGS: dict[str, bytes] = {
    "none": b"N",
    "tuple": b"t",
    "list": b"l",
    "dict": b"d",
    "ordered_dict": b"o",
    "default_dict": b"f",
}
_TAG_NODES: dict[bytes, type] = {
    b"N": type(None),
    b"t": tuple,
    b"l": list,
    b"d": dict,
    b"o": collections.OrderedDict,
    b"f": collections.defaultdict,
}

# Built-in types that are not attributes of the builtins module.
_UNNAMED_BUILTINS: dict[tuple[str, str], type] = {
    ("builtins", "NoneType"): type(None),
    ("builtins", "ellipsis"): type(...),
    ("builtins", "NotImplementedType"): type(NotImplemented),
}


# ------------------------------------------------------------------------------------------------
# names


def _resolve(module: str, qualname: str) -> Any:
    """The object named ``module``.``qualname``; ValueError if it cannot be found.

    In order: an attribute of a module already imported (what the name denotes now: after
    ``importlib.reload`` or a re-run cell, the new class, although the old one is still
    registered); the one registered node type of that name (no import needed; finds classes
    defined in functions); an attribute of the module, imported.
    """
    if (module, qualname) in _UNNAMED_BUILTINS:
        return _UNNAMED_BUILTINS[(module, qualname)]
    importable = all(p.isidentifier() for p in module.split(".")) and all(
        p.isidentifier() for p in qualname.split(".")
    )
    if importable and module in sys.modules:
        with contextlib.suppress(Exception):
            return _attribute(sys.modules[module], qualname)
    matches = [
        tp
        for tp in _jax_compat.jax_registered_types()
        if getattr(tp, "__module__", None) == module
        and getattr(tp, "__qualname__", None) == qualname
    ]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ValueError(f"ambiguous type name {module}.{qualname}: several registered types")
    if not importable:
        raise ValueError(f"cannot find {module}.{qualname}: not an importable name")
    try:
        return _attribute(importlib.import_module(module), qualname)
    except Exception as e:
        raise ValueError(f"cannot find {module}.{qualname}: {type(e).__name__}: {e}") from None


def _attribute(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part)
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


class _NameBook:
    """Which objects this process has fingerprinted under each (module, qualname), in order.

    An object's number under its name is its place in that order: 0 for the first (encoded by
    the name alone), n for the n-th other one. Numbers are never reused, even when their object
    is gone: a fingerprint taken of it may still sit in a cache. Entries are weak references
    where the object allows one (classes and functions do), so the book keeps nothing alive.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], list[Callable[[], Any]]] = {}

    def number(self, name: tuple[str, str], obj: Any) -> int:
        with self._lock:  # nothing in here runs user code
            refs = self._seen.setdefault(name, [])
            for n, ref in enumerate(refs):
                if ref() is obj:
                    return n
            try:
                refs.append(weakref.ref(obj))
            except TypeError:  # no weak references to it: keep it
                refs.append(lambda: obj)
            return len(refs) - 1


_names = _NameBook()


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


_BY_IDENTITY = "compares by identity"


def _dataclass_eq_problem(tp: type) -> str | None:
    """Why instances of dataclass ``tp`` cannot be encoded by their fields, or None.

    Their fields say whether two of them are equal only if ``==`` is the one ``@dataclass``
    generates (the compared fields, in a same-class check). That one is recognised by its
    code: the same as the ``__eq__`` generated now for a dataclass with the same fields.
    """
    definer = next((c for c in tp.__mro__ if "__eq__" in vars(c)), object)
    if definer is object:
        return _BY_IDENTITY + " (a dataclass with eq=False)"
    own = getattr(vars(definer)["__eq__"], "__code__", None)
    try:
        fields = [
            (f.name, Any, dataclasses.field(compare=f.compare)) for f in dataclasses.fields(definer)
        ]
        generated = dataclasses.make_dataclass("_Reference", fields).__eq__.__code__
    except TypeError:  # `definer` is no dataclass: a plain subclass that wrote its own __eq__
        generated = None
    if own is None or generated is None or _code_key(own) != _code_key(generated):
        return f"compares with a hand-written {definer.__qualname__}.__eq__"
    return None


def _code_key(code: types.CodeType) -> tuple[Any, ...]:
    return code.co_code, code.co_names, code.co_consts


_dataclass_eq_problems: weakref.WeakKeyDictionary[type, str | None] = weakref.WeakKeyDictionary()
# A WeakKeyDictionary's bookkeeping (its pending removals, its iteration guard) is not safe for
# two threads at once without the GIL: reads and writes under this lock; a miss is computed
# outside it (it builds a reference dataclass), and two threads computing one answer agree.
_dataclass_eq_lock = threading.Lock()
_MISSING = object()


def _dataclass_problem(tp: type) -> str | None:
    with _dataclass_eq_lock:
        found = _dataclass_eq_problems.get(tp, _MISSING)
    if found is not _MISSING:
        return found
    problem = _dataclass_eq_problem(tp)
    with _dataclass_eq_lock:
        _dataclass_eq_problems[tp] = problem
    return problem


def _has_nan(v: complex) -> bool:  # a float or a complex
    return math.isnan(v) if type(v) is float else math.isnan(v.real) or math.isnan(v.imag)


def _by_id_and_depth(value: Any, depth: int) -> tuple[int, int]:
    # Each distinct container is encoded once per depth: the depth limit depends on it.
    return id(value), depth


class _Encoder:
    """Canonical mode (fingerprints) sorts dict items and numbers names met under another
    object before; serialization mode keeps dict order and checks that every named object can
    be found again by name.

    Values are walked by ``_values.ValueWalk`` (one walk for the whole treedef): each distinct
    container is encoded once per depth, and a repeat copies its bytes, up to ``_REPEAT_LIMIT``
    in all, so the cost stays linear in the distinct values. A container met inside itself is
    refused.
    """

    def __init__(self, canonical: bool) -> None:
        self.canonical = canonical
        self.out = bytearray()
        self.walk = ValueWalk(self._looked_into, self._items, memo_key=_by_id_and_depth)
        self.encodings: dict[tuple[int, int], bytes] = {}  # walk's memo key -> encoding
        self.repeated = 0  # bytes copied for repeats so far
        self.names: dict[int, tuple[Any, bytes]] = {}  # id -> (object, tag + name encoding)

    def named(self, tag: bytes, obj: Any) -> bytes:
        """``tag`` and the name of ``obj`` (with its number in this process, canonically)."""
        known = self.names.get(id(obj))
        if known is None:
            name = _name_of(obj, resolvable=not self.canonical)
            head = bytearray()
            if self.canonical:
                number = _names.number(name, obj)
                if number:
                    head += b"#"
                    _varint(head, number)
            head += tag
            _str(head, name[0])
            _str(head, name[1])
            known = self.names[id(obj)] = (obj, bytes(head))
        return known[1]

    # ---- the value walk: what is a container, its items, and how results combine

    @staticmethod
    def _is_dataclass_instance(v: Any) -> bool:
        # What _scalar would reach its dataclass branch with: enum members and classes first.
        return dataclasses.is_dataclass(v) and not isinstance(v, (type, enum.Enum))

    def _looked_into(self, v: Any, depth: int) -> bool:
        if depth > _MAX_DEPTH:
            raise TypeError("value nested too deeply (more than 64 levels)")
        tp = type(v)
        if tp in _CONTAINERS:
            return True
        return tp not in _SCALARS and self._is_dataclass_instance(v)

    def _items(self, v: Any) -> list[Any]:
        tp = type(v)
        if tp in _CONTAINERS:
            return items(v)
        problem = _dataclass_problem(tp)
        # Serialization needs no equality, only that the rebuilt value equals the original:
        # an identity-compared one never does; a hand-written == may.
        if problem is not None and (self.canonical or problem.startswith(_BY_IDENTITY)):
            raise TypeError(
                f"{_value_text(v)} {problem}: equal-looking instances are unequal "
                "treedefs, so its fields cannot stand for it"
            )
        self.named(b"a", tp)  # its name is checked before its fields are encoded
        return [getattr(v, f.name) for f in dataclasses.fields(v)]

    def value(self, v: Any) -> None:
        """Appends the encoding of node data ``v``."""
        if not self._looked_into(v, 0):  # most nodes' data (None, a scalar): no walk needed
            self.out += self._scalar(v, type(v))
            return
        done: list[list[bytes]] = [[]]  # per open container: its items' encodings
        for event, item, _, key in self.walk.events(v):
            if event == ATOM:
                done[-1].append(self._scalar(item, type(item)))
            elif event == ENTER:
                done.append([])
            elif event == LEAVE:
                data = self._container(item, done.pop())
                self.encodings[key] = data
                done[-1].append(data)
            elif event == REPEAT:
                data = self.encodings[key]
                self.repeated += len(data)
                if self.repeated > _REPEAT_LIMIT:
                    raise TypeError(
                        f"{_value_text(item)} is shared so often that the encoding would repeat "
                        f"more than {_REPEAT_LIMIT} bytes (a DAG of shared containers, written "
                        "out by value)"
                    )
                done[-1].append(data)
            else:  # CYCLE
                raise TypeError(f"{_value_text(item)} contains itself (a cycle)")
        (encoding,) = done[0]
        self.out += encoding

    def _container(self, v: Any, parts: list[bytes]) -> bytes:
        """The encoding of container ``v`` from its items' encodings (in ``_items`` order)."""
        out = bytearray()
        tp = type(v)
        if tp is tuple or tp is list:
            out += b"(" if tp is tuple else b"["
            _varint(out, len(parts))
            out += b"".join(parts)
        elif tp is dict:  # parts: key, value, key, value, ...
            starts: Iterable[int] = range(0, len(parts), 2)
            if self.canonical:
                starts = sorted(starts, key=lambda n: (parts[n], parts[n + 1]))
            pairs = [parts[n] + parts[n + 1] for n in starts]
            out += b"{"
            _varint(out, len(pairs))
            out += b"".join(pairs)
        elif tp is frozenset or tp is set:
            out += b"z" if tp is frozenset else b"S"
            _varint(out, len(parts))
            out += b"".join(sorted(parts))
        else:  # a dataclass instance
            fields = dataclasses.fields(v)
            out += self.named(b"a", tp)
            _varint(out, len(fields))
            for f, part in zip(fields, parts):
                _str(out, f.name)
                out += part
        return bytes(out)

    def _scalar(self, v: Any, tp: type) -> bytes:
        """The encoding of anything but a container (a dataclass instance is one)."""
        if v is None:
            return b"N"
        if tp is bool:
            return b"T" if v else b"F"
        out = bytearray()
        if tp is int:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True)
            out += b"i"
            _varint(out, len(raw))
            out += raw
        elif (tp is float or tp is complex) and self.canonical and _has_nan(v):
            raise TypeError(
                f"{_value_text(v)} is NaN: NaN != NaN, so two treedefs holding distinct NaN "
                "objects are unequal while their encodings match"
            )
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
        elif isinstance(v, enum.Enum):
            out += self.named(b"e", tp)
            _str(out, v.name)
        elif isinstance(v, type):
            out += self.named(b"y", v)
        elif isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
            if "<" in getattr(v, "__qualname__", "<"):
                raise TypeError(f"function {v!r} has no importable name (a lambda or local)")
            out += self.named(b"p", v)
        else:
            raise TypeError(f"{_value_text(v)} has no canonical encoding")
        return bytes(out)

    def node_type(self, kind: str, tp: type) -> None:
        tag = _KIND_TAGS.get(kind)
        self.out += tag if tag is not None else self.named(b"q", tp)

    def nodes(self, treedef: _core.PyTreeDef) -> None:
        """The entries of ``treedef``'s post-order node list (the core's ``_nodes()``)."""
        records = treedef._nodes()
        _varint(self.out, len(records))
        for i, (kind, tp, data, arity, _, ref, _) in enumerate(records):
            try:
                if kind == "shared_ref":
                    self.out += b"r"
                    _varint(self.out, ref)
                    continue
                if kind == "leaf":
                    self.out += b"*"
                    continue
                self.out += b"n"
                self.node_type(kind, tp)
                _varint(self.out, arity)
                self.value(data)
            except TypeError as e:
                path = _statetree.parse_nodes(treedef)[i].path
                where = keystr(path) or "(root)"
                what = "fingerprint" if self.canonical else "serialize"
                raise TypeError(
                    f"cannot {what} the {_type_name(tp)} node at {where}: {e}"
                ) from None


def _value_text(v: Any) -> str:
    """``a <type> value (<repr, shortened>)`` for error messages; never raises."""
    return f"a {_type_name(type(v))} value ({short_repr(v, 60)})"


def fingerprint(treedef: _core.PyTreeDef) -> str:
    """A sha256 hex digest of the structure, identical across processes and machines.

    Within one process, equal fingerprints imply equal treedefs; across processes they imply
    treedefs equal by name (see the module docstring for both statements and their limits).

    Raises:
        TypeError: the treedef holds a value that cannot be encoded faithfully (the message
            names the node type, its key path, the value and why): one outside the supported
            kinds, a NaN, a dataclass instance without dataclass-generated ``==``, a lambda.

    >>> import dataclasses, fastree.tree_util as tu
    >>> fp = tu.tree_structure({'a': (1, 2)}).fingerprint()
    >>> len(fp), fp == tu.tree_structure({'a': (3, 4)}).fingerprint()
    (64, True)
    >>> fp == tu.tree_structure({'b': (1, 2)}).fingerprint()
    False
    >>> class Box:
    ...     def __init__(self, meta): self.meta = meta
    >>> tu.register_pytree_node(Box, lambda b: ((), b.meta), lambda m, _: Box(m))
    >>> @dataclasses.dataclass(eq=False)
    ... class Opaque:
    ...     x: int
    >>> tu.tree_structure({'b': Box(Opaque(1))}).fingerprint()
    Traceback (most recent call last):
    TypeError: cannot fingerprint the ...Box node at ['b']: ... compares by identity ...
    """
    enc = _Encoder(canonical=True)
    enc.nodes(treedef)
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
    enc.nodes(treedef)
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
        # Python's one check of the post-order arity invariant. The core checks the whole state
        # again (_treedef_from_state); this running count refuses a malformed input before
        # reading, and importing the modules named in, what follows.
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
