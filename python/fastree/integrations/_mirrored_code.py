"""Recognising a library by the code fastree mirrors, not by its version number.

An integration's native code reproduces particular functions of its library (flax's
``_graph_flatten``, equinox's ``generate_flatten_functions``, ...). A version range says nothing
about that code: flax 0.12.5 and 0.12.7 share a minor version and differ in ``unflatten``'s
signature. So each integration lists what it mirrors (:class:`Mirrored`) and the fingerprints of
that code in each release it was written and tested against (its ``KNOWN_CODE`` table).
:func:`recognise` fingerprints the loaded code and serves natively only when every mirrored piece
matches one known release; anything else, an unknown release or code patched at run time, keeps
the library's own functions, and the verdict says why.

A fingerprint is 16 hex digits of SHA-256 over a text naming the object that will run: for a
function, the source of its own code object (read at the code's file and first line, dedented,
trailing blanks dropped; never the text a ``__wrapped__`` chain points to, so a
``functools.wraps`` wrapper reads as itself), then whatever else decides what it does: its
defaults and keyword defaults, its closure cells, and a namespace that is not its module's. Data
are named by their repr, classes and functions by where they are defined, other objects by the
module global holding them; a value with no such name leaves the function unrecognised. So a
fingerprint is the same on every Python version and changes when the code that runs changes:
a function replaced at run time has other source (or none). A class is fingerprinted by its
name, its dataclass fields (if any) and the texts of the functions in its namespace, in name
order, less those the standard library's decorators made (which depend on the Python
version); reading a whole class's source means parsing its module on Python < 3.13.

A :class:`Watch` then tells, on every call, whether any fingerprinted name was rebound or any
fingerprinted function's code was changed in place since (``f.__code__ = ...``, as IPython's
``%autoreload`` updates functions).

``python -m fastree.integrations._mirrored_code flax`` prints the loaded library's fingerprints
(for flax as lines of ``_known_flax.CODE``, :func:`known_code_table`; for equinox and chex as a
``KNOWN_CODE`` entry): what a porter adds once the new release passes the tests
(docs/porting-library-integrations.md).

Nothing here imports a library: the modules are looked up in ``sys.modules``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import functools
import inspect
import operator
import os
import sys
import sysconfig
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

_ABSENT = object()


@dataclasses.dataclass(frozen=True)
class Mirrored:
    """One function or class of a library whose behaviour fastree's native code reproduces."""

    module: str
    """The module that defines it, e.g. ``"flax.nnx.graphlib"``."""
    qualname: str
    """Its name in that module: ``"_graph_flatten"``, or ``"Pytree._graph_node_flatten"``."""

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}"

    def lookup(self) -> Any:
        """The object as the module holds it now (a classmethod or property unwrapped), or
        ``_ABSENT``.

        Read with ``vars()``, never ``getattr``: no descriptor or module ``__getattr__`` runs.
        """
        obj: Any = sys.modules.get(self.module, _ABSENT)
        for part in self.qualname.split("."):
            if obj is _ABSENT:
                return _ABSENT
            try:
                obj = vars(obj).get(part, _ABSENT)
            except TypeError:
                return _ABSENT
        if isinstance(obj, (classmethod, staticmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            obj = obj.fget
        return obj


def _code_source(code: Any) -> str | None:
    # The text of the code object itself (its file at its first line): never a `__wrapped__`
    # chain's, which `inspect.getsource(function)` follows.
    try:
        text = inspect.getsource(code)
    except (OSError, TypeError):
        return None
    return "\n".join(line.rstrip() for line in textwrap.dedent(text).splitlines())


def _name_of(value: Any, namespace: Mapping[str, Any]) -> str | None:
    # A default's or a closure cell's value, named alike in every process: plain data by its
    # repr, a class or function by where it is defined, anything else by the global of the
    # function's module that holds it; None where it has no such name.
    if type(value) in _DATA and (type(value) is not tuple and type(value) is not frozenset):
        return repr(value)
    if type(value) in (tuple, frozenset):
        names = [_name_of(item, namespace) for item in value]
        if None in names:
            return None
        return ("(" if type(value) is tuple else "frozenset(") + ", ".join(
            names if type(value) is tuple else sorted(names)) + ",)"
    if isinstance(value, type) or inspect.isfunction(value):
        return f"{value.__module__}.{value.__qualname__}"
    held = sorted(name for name, item in namespace.items() if item is value)
    return f"global {held[0]}" if held else None


def _function_text(function: Any) -> str | None:
    """The source of ``function``'s own code object, with what else decides what it does:
    defaults, keyword defaults, closure cells and a namespace other than its module's. A
    function with none of these is named by its source alone."""
    code = function.__code__
    text = _code_source(code)
    if text is None:
        return None
    namespace = function.__globals__
    named: list[tuple[str, Any]] = []
    if function.__defaults__ is not None:
        named.append(("defaults", function.__defaults__))
    named += [(f"kwdefault {name}", value)
              for name, value in sorted((function.__kwdefaults__ or {}).items())]
    parts = [text]
    owner = function.__qualname__.rpartition(".")[0]
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:
            parts.append(f"cell {name} empty")
            continue
        if name == "__class__" and getattr(contents, "__qualname__", None) == owner:
            continue  # super()'s cell: the class the source defines it in
        named.append((f"cell {name}", contents))
    for label, value in named:
        value_name = _name_of(value, namespace)
        if value_name is None:
            return None  # a value no process names alike: nothing to recognise it by
        parts.append(f"{label} {value_name}")
    module = sys.modules.get(namespace.get("__name__"))  # type: ignore[arg-type]
    if module is None or vars(module) is not namespace:
        parts.append("globals not a module's")
    return "\n".join(parts)


_STDLIB = sysconfig.get_paths()["stdlib"]


def _generated(function: Any) -> bool:
    # Made by a decorator of the standard library: exec'd (a dataclass's __init__, __eq__,
    # __repr__; 3.13's __replace__), possibly behind a wrapper of its own (reprlib's
    # recursive_repr), or its own functions (a dataclass's __getstate__, a namedtuple's
    # _make). Which ones there are depends on the Python version. A function of anyone else's
    # set on the class is not generated: it is fingerprinted as the class's own are.
    filename = inspect.unwrap(function).__code__.co_filename
    return filename.startswith("<") or os.path.commonpath(
        [os.path.abspath(filename), _STDLIB]) == _STDLIB


def _made_from_annotations(function: Any) -> bool:
    # From 3.14 (PEP 649) a class body's annotations are compiled into a function of their own,
    # kept in the class's namespace (``__annotate_func__``, named ``__annotate__``); before 3.14
    # there is none. What it returns decides nothing a class's functions do, and a dataclass's
    # fields are named with the class: left out, so a release has one fingerprint on every Python.
    return function.__code__.co_name == "__annotate__"


def _class_text(cls: type) -> str | None:
    parts = [f"class {cls.__qualname__}"]
    if dataclasses.is_dataclass(cls):
        parts.append("fields " + " ".join(f.name for f in dataclasses.fields(cls)))
    for name in sorted(vars(cls)):
        member = vars(cls)[name]
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if not inspect.isfunction(member):
            continue
        if _generated(member):
            # Left out, since which ones there are depends on the Python version; the fields
            # above and the decorator's code decide what they do.
            continue
        if _made_from_annotations(member):
            continue
        text = _function_text(member)
        if text is None:
            return None
        if not member.__qualname__.startswith(cls.__qualname__ + "."):
            # A function defined elsewhere and set on the class: named with its place.
            text = f"{name} = {member.__module__}.{member.__qualname__}\n{text}"
        parts.append(text)
    return "\n".join(parts)


_DATA = (str, bytes, int, float, bool, tuple, frozenset, type(None))
_LRU_CACHE_WRAPPER = type(functools.lru_cache(maxsize=1)(len))


def fingerprint(obj: Any) -> str | None:
    """16 hex digits naming ``obj``'s code, or None when it has no readable source.

    Plain data (a code template string, a tuple of names) is named by its ``repr``.

    >>> import json
    >>> fingerprint(json.dumps) == fingerprint(json.dumps)
    True
    >>> fingerprint(len) is None   # a builtin has no Python source
    True
    >>> fingerprint(("a", "b")) != fingerprint(("a", "c"))
    True
    """
    if type(obj) in _DATA:
        text: str | None = f"data {obj!r}"
    elif isinstance(obj, type):
        text = _class_text(obj)
    elif inspect.isfunction(obj):
        text = _function_text(obj)
    elif type(obj) is _LRU_CACHE_WRAPPER and inspect.isfunction(obj.__wrapped__):
        # functools.lru_cache's C wrapper runs the function it was made with (which
        # `__wrapped__` names, as functools.wraps set it). Its cache
        # settings change how often that runs, not what it returns.
        text = _function_text(obj.__wrapped__)
    else:
        text = None
    if text is None:
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def current(mirrored: Sequence[Mirrored]) -> dict[str, str | None]:
    """{name: fingerprint} of the code loaded now; None for what is missing or has no source."""
    out: dict[str, str | None] = {}
    for item in mirrored:
        obj = item.lookup()
        out[item.name] = None if obj is _ABSENT else fingerprint(obj)
    return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the loaded code is one a table knows, and which release's it is."""

    release: str | None
    """The known release whose code this is (``"0.12.8"``), or None."""
    reason: str
    """Why not, when ``release`` is None; ``"native"`` otherwise."""
    objects: tuple[tuple[Mirrored, Any], ...] = dataclasses.field(default=(), repr=False)
    """The objects fingerprinted, to tell later whether one was replaced (:meth:`watch`)."""

    def __bool__(self) -> bool:
        return self.release is not None

    def watch(self, skip: frozenset[str] = frozenset()) -> Watch:
        """A cheap test, for every call, that none of the objects (but ``skip``) was replaced,
        and that no function among them (``skip``'s included) had its code changed in place."""
        slots = []
        functions = []
        for item, obj in self.objects:
            function = _running_function(obj)
            if function is not None:
                functions.append((function, function.__code__, item.name))
            if item.name in skip:
                continue
            owner: Any = sys.modules.get(item.module)
            *path, last = item.qualname.split(".")
            for part in path:
                owner = vars(owner)[part]
            # The namespace itself (a module's dict, a class's live mappingproxy) and the object
            # as it held it: stored as first read, unwrapped objects compared after unwrapping.
            slots.append((vars(owner), last, vars(owner).get(last), item.name))
        return Watch(tuple(slots), tuple(functions))


def _running_function(obj: Any) -> Any:
    # The Python function whose code runs when `obj` is called: itself, or the one
    # functools.lru_cache's wrapper was made with; None for a class or data.
    if inspect.isfunction(obj):
        return obj
    if type(obj) is _LRU_CACHE_WRAPPER and inspect.isfunction(obj.__wrapped__):
        return obj.__wrapped__
    return None


_CODE = operator.attrgetter("__code__")


@dataclasses.dataclass(frozen=True)
class Watch:
    """Namespaces and the objects they held when a :class:`Verdict` was made, and the code
    objects of its functions.

    Two kinds of change are seen, each as cheaply as the other: a name rebound (``graphlib.f =
    g``, a wrapper put in its place) and a function changed in place (``f.__code__ = ...``, as
    IPython's ``%autoreload`` and other hot reloaders update functions): an identity check each.
    A class's methods are fingerprinted once, when the verdict is made; a method replaced inside
    a class after that is not looked at again here.
    """

    slots: tuple[tuple[Mapping[str, Any], str, Any, str], ...]
    functions: tuple[tuple[Any, Any, str], ...] = ()
    """(function, its code object then, its name)."""
    _held: tuple[tuple[Any, ...], ...] = dataclasses.field(init=False, repr=False,
                                                           compare=False)

    def __post_init__(self) -> None:
        # Columns, so that a check is two map()s of C functions over tuples, no Python step per
        # name: namespaces, keys, the objects held; functions, their code objects then.
        columns = tuple(zip(*self.slots)) or ((), (), (), ())
        object.__setattr__(self, "_held", (*columns[:3],
                                           tuple(f for f, _, _ in self.functions),
                                           tuple(c for _, c, _ in self.functions)))

    def replaced(self) -> str | None:
        """The name of the first object no longer held as it was, or whose code changed in
        place; None if none (a few µs for flax's 40 names and 27 functions)."""
        namespaces, keys, held, functions, codes = self._held
        try:
            if all(map(operator.is_, map(operator.getitem, namespaces, keys), held)) and all(
                    map(operator.is_, map(_CODE, functions), codes)):
                return None
        except KeyError:  # a name deleted
            pass
        return self._which()

    def _which(self) -> str | None:
        # The slow path, once something differs: which name.
        for namespace, key, held, name in self.slots:
            if namespace.get(key) is not held:
                return name
        for function, code, name in self.functions:
            if function.__code__ is not code:
                return name
        return None


def recognise(library: str, mirrored: Sequence[Mirrored],
              known: Mapping[str, Mapping[str, str]]) -> Verdict:
    """The release in ``known`` whose fingerprints the loaded code has, every one of them.

    ``known`` maps a release (as the library names it) to ``{Mirrored.name: fingerprint}``.
    When none matches, the reason names the release that differs least and what differs in it.
    """
    objects = tuple((item, item.lookup()) for item in mirrored)
    missing = [item.name for item, obj in objects if obj is _ABSENT]
    if missing:
        return Verdict(None, f"{library}: code fastree mirrors is missing ({', '.join(missing)})")
    got = {item.name: fingerprint(obj) for item, obj in objects}
    best: tuple[int, str, list[str]] | None = None
    for release, prints in known.items():
        differ = [name for name, value in got.items() if prints.get(name) != value]
        if not differ:
            return Verdict(release, "native", objects)
        if best is None or len(differ) < best[0]:
            best = (len(differ), release, differ)
    if best is None:
        return Verdict(None, f"{library}: no known code to compare with")
    _, release, differ = best
    shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
    return Verdict(
        None, f"{library}: not code fastree was written against (nearest known release "
        f"{release} differs in {shown})")


def known_code_table(text: str) -> dict[str, dict[str, str]]:
    """A ``KNOWN_CODE`` table from lines of ``module:qualname fingerprint release...``.

    Releases whose fingerprints are the same for every name are one entry, named by them all
    (``"0.12.7, 0.12.8"``), in the order the releases first appear.

    >>> known_code_table('''
    ... lib:f  0123456789abcdef  1.0 1.1 1.2
    ... lib:g  aaaaaaaaaaaaaaaa  1.0 1.1
    ... lib:g  bbbbbbbbbbbbbbbb  1.2
    ... ''')
    {'1.0, 1.1': {'lib:f': '0123456789abcdef', 'lib:g': 'aaaaaaaaaaaaaaaa'}, '1.2': {'lib:f': \
'0123456789abcdef', 'lib:g': 'bbbbbbbbbbbbbbbb'}}
    """
    per_release: dict[str, dict[str, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#")[0].split()
        if not fields:
            continue
        if len(fields) < 3 or ":" not in fields[0] or len(fields[1]) != 16:
            raise ValueError(f"known code, line {number}: expected 'module:qualname "
                             f"fingerprint release...', got {line!r}")
        name, value, *releases = fields
        for release in releases:
            prints = per_release.setdefault(release, {})
            if prints.setdefault(name, value) != value:
                raise ValueError(f"known code, line {number}: {release} has two codes of {name}")
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for release, prints in per_release.items():
        groups.setdefault(tuple(sorted(prints.items())), []).append(release)
    return {", ".join(releases): per_release[releases[0]] for releases in groups.values()}


def table_lines(release: str, prints: Mapping[str, str | None]) -> str:
    """``prints`` as lines of :func:`known_code_table` for ``release`` (what a porter merges)."""
    width = max((len(name) for name in prints), default=0)
    return "\n".join(f"{name:<{width}} {value or 'null':<16} {release}"
                     for name, value in prints.items())


class Gate:
    """An integration's :func:`recognise`, made once every mirrored name is loaded.

    Until then :meth:`verdict` answers "missing (or not loaded yet)" and decides nothing; from
    then on it answers the one verdict made. (A release that never defines one of the names
    stays so, and is served by the library's own functions, as any release not recognised.)
    """

    def __init__(self, library: str, mirrored: Sequence[Mirrored],
                 known: Mapping[str, Mapping[str, str]]) -> None:
        self.library = library
        self.mirrored = tuple(mirrored)
        self.known = known
        self._verdict: Verdict | None = None

    def verdict(self) -> Verdict:
        if self._verdict is None:
            # A module still being imported (its classes registering as they are defined) may
            # lack a name it will have: nothing is decided until every name is there.
            unimported = sorted({m.module for m in self.mirrored if m.module not in sys.modules})
            if unimported:
                return Verdict(None, f"{self.library}: {', '.join(unimported)} not imported")
            absent = [m.name for m in self.mirrored if m.lookup() is _ABSENT]
            if absent:
                shown = ", ".join(absent[:3]) + (
                    f" and {len(absent) - 3} more" if len(absent) > 3 else "")
                return Verdict(None, f"{self.library}: missing (or not loaded yet): {shown}")
            self._verdict = recognise(self.library, self.mirrored, self.known)
        return self._verdict

    def __bool__(self) -> bool:
        return bool(self.verdict())


def main(argv: Sequence[str]) -> int:
    """Prints the loaded library's fingerprints as table lines or a KNOWN_CODE entry (porters)."""
    import importlib
    import json

    from . import chex, equinox, flax_nnx, flax_nnx_graph

    tables = {"flax": (flax_nnx.MIRRORED + flax_nnx_graph.MIRRORED, "flax.nnx"),
              "equinox": (equinox.MIRRORED, "equinox"), "chex": (chex.MIRRORED, "chex")}
    if len(argv) != 1 or argv[0] not in tables:
        print(f"usage: python -m fastree.integrations._mirrored_code {{{','.join(tables)}}}")
        return 2
    mirrored, module = tables[argv[0]]
    importlib.import_module(module)
    for name in sorted({item.module for item in mirrored}):
        try:  # the modules a mirrored name lives in; a release may lack one (then: null)
            importlib.import_module(name)
        except ImportError:
            pass
    from importlib import metadata

    if argv[0] == "flax":  # _known_flax.CODE's lines: merge each into the line with its code
        print(table_lines(metadata.version(argv[0]), current(mirrored)))
    else:
        print(json.dumps({metadata.version(argv[0]): current(mirrored)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
