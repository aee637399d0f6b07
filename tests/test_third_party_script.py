"""scripts/run_third_party_suites.py's own logic (its suites run by hand: docs/testing.md)."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import script_module


@pytest.fixture(scope="module")
def suites():
    with script_module("run_third_party_suites") as module:
        yield module


def test_a_missing_test_import_is_named_by_what_pip_installs(suites, monkeypatch):
    monkeypatch.setitem(suites.TEST_ONLY_IMPORTS, "demo", ("json", "no_such_module_xyz", "tree"))
    monkeypatch.setitem(suites.PIP_NAMES, "no_such_module_xyz", "no-such-dist")
    missing = suites.missing_test_imports("demo")
    assert "no-such-dist" in missing and "json" not in missing
    # dm-tree is a `test` extra: present where the suite's dependencies are
    assert ("dm-tree" in missing) == (importlib.util.find_spec("tree") is None)


def test_every_project_with_a_suite_is_checked(suites):
    assert set(suites.TEST_ONLY_IMPORTS) <= set(suites.SUITES)
    assert suites.missing_test_imports("optax") == []  # nothing beyond optax itself
