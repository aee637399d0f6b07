"""Recognising a library by the code fastree mirrors, not by its version number.

An integration's native code reproduces particular functions of its library (flax's
``_graph_flatten``, equinox's ``generate_flatten_functions``, ...). A version range says nothing
about that code: flax 0.12.5 and 0.12.7 share a minor version and differ in ``unflatten``'s
signature. So each integration lists what it mirrors (:class:`Mirrored`) and the fingerprints of
that code in each release it was written and tested against (its ``KNOWN_CODE`` table).
:func:`recognise` fingerprints the loaded code and serves natively only when every mirrored piece
matches one known release; anything else, an unknown release or code patched at run time, keeps
the library's own functions, and the verdict says why.

A fingerprint is 16 hex digits of SHA-256 over the source text (``inspect.getsource``, dedented,
trailing blanks dropped), so it is the same on every Python version, and changes when the code
that runs changes: a function replaced at run time has other source (or none, and then it is not
recognised). A class is fingerprinted by its name, its dataclass fields (if any) and the sources
of the functions its body defines, in name order (reading a whole class's source means parsing
its module on Python < 3.13).

``python -m fastree.integrations._mirrored_code flax`` prints the loaded library's fingerprints as
a ``KNOWN_CODE`` entry (what a porter pastes once the new release passes the tests:
docs/porting-library-integrations.md).

Nothing here imports a library: the modules are looked up in ``sys.modules``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import sys
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


def _source(obj: Any) -> str | None:
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    return "\n".join(line.rstrip() for line in textwrap.dedent(text).splitlines())


def _generated(function: Any, cls: type) -> bool:
    filename = inspect.unwrap(function).__code__.co_filename
    module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return filename.startswith("<") or filename != module_file


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
        if inspect.isfunction(member) and member.__qualname__.startswith(cls.__qualname__ + "."):
            if _generated(member, cls):
                # Made at run time (a dataclass's __init__, __eq__, __repr__; 3.13's
                # __replace__): left out, since which ones there are depends on the Python
                # version; the fields above and the decorator's code decide what they do.
                continue
            text = _source(member)
            if text is None:
                return None
            parts.append(text)
    return "\n".join(parts)


_DATA = (str, bytes, int, float, bool, tuple, frozenset, type(None))


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
    else:
        text = _source(obj)
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
        """A cheap test, for every call, that none of the objects (but ``skip``) was replaced."""
        slots = []
        for item, obj in self.objects:
            if item.name in skip:
                continue
            owner: Any = sys.modules.get(item.module)
            *path, last = item.qualname.split(".")
            for part in path:
                owner = vars(owner)[part]
            # The namespace itself (a module's dict, a class's live mappingproxy) and the object
            # as it held it: stored as first read, unwrapped objects compared after unwrapping.
            slots.append((vars(owner), last, vars(owner).get(last), item.name))
        return Watch(tuple(slots))


@dataclasses.dataclass(frozen=True)
class Watch:
    """Namespaces and the objects they held when a :class:`Verdict` was made."""

    slots: tuple[tuple[Mapping[str, Any], str, Any, str], ...]

    def replaced(self) -> str | None:
        """The name of the first object no longer held as it was, or None (about 50 ns each)."""
        for namespace, key, held, name in self.slots:
            if namespace.get(key) is not held:
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
    """Prints the loaded library's fingerprints as a KNOWN_CODE entry (for porters)."""
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

    print(json.dumps({metadata.version(argv[0]): current(mirrored)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
