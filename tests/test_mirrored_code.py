"""Integrations serve natively only the library code they were written against.

``fastree.integrations._mirrored_code`` fingerprints the functions an integration mirrors and
compares them with the releases in its ``KNOWN_CODE`` table; these tests pin the fingerprint,
the verdict and its reasons, and (in child processes, plain vs installed) that flax code patched
after fastree attached sends every graph-mode call back to flax with the same results.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types

import helpers
import pytest
from fastree.integrations import _known_chex, _known_equinox, _known_flax, _mirrored_code
from fastree.integrations._mirrored_code import Gate, Mirrored, fingerprint, recognise


def _module(name: str, source: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> types.ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = __import__(name)
    return module


def test_fingerprint_names_the_source_and_data():
    def a(x):
        return x + 1

    def b(x):
        return x + 2

    assert fingerprint(a) == fingerprint(a) and len(fingerprint(a)) == 16
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(len) is None  # no Python source
    assert fingerprint(("x", 1)) == fingerprint(("x", 1)) != fingerprint(("x", 2))


def test_fingerprint_is_of_the_object_that_runs():
    import functools

    def walk(x, *, deep=False):
        return [x]

    wrapper = functools.wraps(walk)(lambda *a, **k: walk(*a, **k))
    assert fingerprint(wrapper) != fingerprint(walk)  # never read through __wrapped__
    before = fingerprint(walk)
    walk.__kwdefaults__ = {"deep": True}  # defaults decide what it does too
    assert fingerprint(walk) != before
    walk.__kwdefaults__ = {"deep": False}
    assert fingerprint(walk) == before

    def outer(n):
        def counted(x):
            return x + n
        return counted

    assert fingerprint(outer(1)) != fingerprint(outer(2))  # its closure's cells
    assert fingerprint(outer(object())) is None  # a cell nothing names alike in every process
    copy = types.FunctionType(walk.__code__, {}, "walk", None, None)
    copy.__kwdefaults__ = walk.__kwdefaults__
    assert fingerprint(copy) != fingerprint(walk)  # not its module's namespace
    cached = functools.lru_cache(maxsize=None)(walk)
    assert fingerprint(cached) == fingerprint(walk)  # the C cache runs the function it wraps


def test_a_class_fingerprint_reads_a_function_set_on_it_from_elsewhere():
    class Record:
        def rebuild(self):
            return 1

    before = fingerprint(Record)

    def rebuild(self):
        return 2

    Record.rebuild = rebuild  # defined elsewhere (its qualname is not Record's)
    assert fingerprint(Record) != before


def test_recognise_needs_every_piece_of_one_release(monkeypatch, tmp_path):
    lib = _module("fake_lib_v1", """
        def walk(x):
            return [x]

        class Record:
            def rebuild(self):
                return 1
        """, monkeypatch, tmp_path)
    mirrored = (Mirrored("fake_lib_v1", "walk"), Mirrored("fake_lib_v1", "Record.rebuild"),
                Mirrored("fake_lib_v1", "Record"))
    prints = _mirrored_code.current(mirrored)
    assert None not in prints.values()
    verdict = recognise("fake", mirrored, {"1.0": prints})
    assert verdict and verdict.release == "1.0" and verdict.reason == "native"

    changed = dict(prints, **{"fake_lib_v1:walk": "0" * 16})
    verdict = recognise("fake", mirrored, {"0.9": changed})
    assert not verdict
    assert verdict.reason == ("fake: not code fastree was written against (nearest known release "
                              "0.9 differs in fake_lib_v1:walk)")

    monkeypatch.setattr(lib, "walk", lambda x: [x])  # patched at run time: other code
    assert not recognise("fake", mirrored, {"1.0": prints})


def test_gate_decides_nothing_until_every_name_is_loaded(monkeypatch, tmp_path):
    lib = _module("fake_lib_v2", "def walk(x):\n    return x\n", monkeypatch, tmp_path)
    mirrored = (Mirrored("fake_lib_v2", "walk"), Mirrored("fake_lib_v2", "later"))
    gate = Gate("fake", mirrored, {})
    assert gate.verdict().reason == "fake: missing (or not loaded yet): fake_lib_v2:later"
    assert Gate("fake", (Mirrored("fake_lib_absent", "f"),), {}).verdict().reason == (
        "fake: fake_lib_absent not imported")
    lib.later = lambda: None  # the module finishes loading: now decided, once
    decided = gate.verdict()
    assert not decided and decided.reason == "fake: no known code to compare with"
    del lib.later
    assert gate.verdict() is decided


def test_watch_sees_a_replaced_function(monkeypatch, tmp_path):
    lib = _module("fake_lib_v3", "def walk(x):\n    return x\n", monkeypatch, tmp_path)
    mirrored = (Mirrored("fake_lib_v3", "walk"),)
    verdict = recognise("fake", mirrored, {"1": _mirrored_code.current(mirrored)})
    watch = verdict.watch()
    assert watch.replaced() is None
    monkeypatch.setattr(lib, "walk", lambda x: x)
    assert watch.replaced() == "fake_lib_v3:walk"


def test_watch_sees_code_changed_in_place(monkeypatch, tmp_path):
    lib = _module("fake_lib_v4", "def walk(x):\n    return x\n\ndef keep(x):\n    return x\n",
                  monkeypatch, tmp_path)
    mirrored = (Mirrored("fake_lib_v4", "walk"), Mirrored("fake_lib_v4", "keep"))
    verdict = recognise("fake", mirrored, {"1": _mirrored_code.current(mirrored)})
    # `keep` skipped for rebinding (an integration binds its own there), still watched in place
    watch = verdict.watch(frozenset({"fake_lib_v4:keep"}))
    assert watch.replaced() is None
    lib.keep = lambda x: x
    assert watch.replaced() is None
    original = lib.walk.__code__
    lib.walk.__code__ = (lambda x: [x]).__code__  # as %autoreload updates a function
    assert watch.replaced() == "fake_lib_v4:walk"
    lib.walk.__code__ = original
    assert watch.replaced() is None
    verdict.objects[1][1].__code__ = (lambda x: [x]).__code__
    assert watch.replaced() == "fake_lib_v4:keep"
    del lib.walk
    assert watch.replaced() == "fake_lib_v4:walk"


@pytest.mark.parametrize("table", [_known_flax, _known_equinox, _known_chex])
def test_known_code_tables_are_well_formed(table):
    assert table.KNOWN_CODE, "a table with no release serves nothing natively"
    for release, prints in table.KNOWN_CODE.items():
        assert release and prints
        for name, value in prints.items():
            assert ":" in name and len(value) == 16 and int(value, 16) >= 0, (release, name)


@pytest.mark.parametrize("library, integration", [("flax", "flax_nnx"), ("equinox", "equinox"),
                                                   ("chex", "chex")])
def test_the_installed_library_is_recognised(library, integration):
    # The test environment pins libraries whose code is in the tables (pyproject's test extra
    # takes the newest; a new release must be ported first: docs/porting-library-integrations.md).
    helpers.skip_unless_integration_knows(library, integration)


_PATCHED_AFTER_ATTACH = r"""
import json, sys
import jax.numpy as jnp
from flax import nnx
from flax.nnx import graphlib
calls = []
real = graphlib._graph_unflatten
def spy(*args, **kwargs):  # the user's patch: counts, then runs flax's own code
    calls.append(1)
    return real(*args, **kwargs)
graphlib._graph_unflatten = spy
model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
graphdef, state = nnx.split(model)
merged = nnx.merge(graphdef, state)
out = {"kernel": float(jnp.sum(merged.kernel[...])), "patched_ran": len(calls) > 0}
try:
    from fastree.integrations import flax_nnx_graph
    out["status"] = flax_nnx_graph.status() if "fastree" in sys.modules else None
except ImportError:
    out["status"] = None
print(json.dumps(out))
"""


def test_flax_code_patched_after_attach_goes_back_to_flax():
    helpers.skip_unless_integration_knows("flax", "flax_nnx")
    plain = helpers.run_json_program(_PATCHED_AFTER_ATTACH, False)
    installed = helpers.run_json_program(_PATCHED_AFTER_ATTACH, True)
    assert plain["patched_ran"] and installed["patched_ran"]  # the user's patch runs, as plain
    assert installed["kernel"] == plain["kernel"]
    # Only the walks that depend on _graph_unflatten (both merges; the update's check copies
    # the graph with flax's unflatten) go back to flax.
    reason = "flax: flax.nnx.graphlib:_graph_unflatten was replaced after fastree attached"
    assert installed["status"] == helpers.flax_walk_status(
        unflatten=reason, unflatten_into_existing=reason, update=reason)


def test_status_before_attach_names_the_reason_and_never_raises():
    from fastree.integrations import flax_nnx_graph

    status = flax_nnx_graph.status()
    assert set(status) >= set(flax_nnx_graph.WALKS)
    assert all(isinstance(v, str) and v for v in status.values())
    json.dumps(status)


def test_a_class_fingerprint_leaves_out_methods_made_at_run_time():
    # Which methods a decorator generates depends on the Python version (dataclasses add
    # __replace__ on 3.13): a release must have one fingerprint on every Python.
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Record:
        a: int

        def describe(self) -> str:
            return f"a={self.a}"

    before = fingerprint(Record)
    namespace: dict = {}
    exec("def __replace__(self, **changes):\n    return self\n", namespace)  # noqa: S102
    namespace["__replace__"].__qualname__ = "Record.__replace__"
    Record.__replace__ = namespace["__replace__"]
    assert fingerprint(Record) == before
    Record.describe = lambda self: "patched"  # a method with other source: another class
    assert fingerprint(Record) != before


def test_a_class_fingerprint_leaves_out_its_compiled_annotations(monkeypatch, tmp_path):
    # From 3.14 a class's annotations become a function in its namespace (__annotate__); the
    # same class must have one fingerprint on every Python, so it is left out.
    annotated = _module("annotated_record", """
        class Record:
            size: int
            names: "list[str]"

            def describe(self):
                return "record"
    """, monkeypatch, tmp_path)
    plain = _module("plain_record", """
        class Record:
            def describe(self):
                return "record"
    """, monkeypatch, tmp_path)
    assert fingerprint(annotated.Record) is not None
    assert fingerprint(annotated.Record) == fingerprint(plain.Record)


def _release_tuple(release: str) -> tuple[int, ...]:
    # A pre-release or local version ("0.13.9.dev0") sorts before every numbered release here.
    try:
        return tuple(int(part) for part in release.strip().split("."))
    except ValueError:
        return ()


def _table_entry(table, version: str) -> dict[str, str] | None:
    # A key names releases one by one ("0.12.10, 0.12.12") or as a range ("0.13.5 to 0.13.8").
    for key, prints in table.KNOWN_CODE.items():
        for part in key.split(","):
            low, _, high = part.partition(" to ")
            if high:
                if _release_tuple(low) <= _release_tuple(version) <= _release_tuple(high):
                    return prints
            elif part.strip() == version:
                return prints
    return None


@pytest.mark.parametrize("library, table", [("flax", _known_flax), ("equinox", _known_equinox),
                                            ("chex", _known_chex)])
def test_a_known_release_has_its_fingerprints_on_this_python(library, table):
    # A release in a table is recognised on every supported Python: each piece of its code the
    # table names fingerprints here as it did where the table was made. (A fingerprint that
    # depends on the Python version would leave that release's classes to the library there.)
    import importlib
    import importlib.metadata

    pytest.importorskip(library)
    version = importlib.metadata.version(library)
    prints = _table_entry(table, version)
    if prints is None:
        pytest.skip(f"{library} {version} is not in fastree's table")
    mirrored = [Mirrored(*name.split(":", 1)) for name in sorted(prints)]
    for item in mirrored:
        importlib.import_module(item.module)
    verdict = recognise(library, mirrored, {version: prints})
    assert verdict, f"{library} {version} on Python {sys.version.split()[0]}: {verdict.reason}"


def test_the_porting_guide_release_table_lists_the_known_code_tables():
    # docs/porting-library-integrations.md's table names, per library, each KNOWN_CODE entry in
    # order, separated by ";" before any parenthesis: it cannot drift from the tables.
    from pathlib import Path

    guide = (Path(__file__).resolve().parent.parent / "docs"
             / "porting-library-integrations.md").read_text()
    rows = {}
    for line in guide.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ("flax", "equinox", "chex"):
            rows[cells[0]] = [part.strip() for part in cells[1].split(" (")[0].split(";")]
    assert rows == {"flax": list(_known_flax.KNOWN_CODE),
                    "equinox": list(_known_equinox.KNOWN_CODE),
                    "chex": list(_known_chex.KNOWN_CODE)}
