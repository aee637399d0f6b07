"""Packaging metadata: the version is written once, and the license pyproject declares ships."""

import importlib.metadata
import pathlib
import re

import fastree

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_version_is_the_installed_distributions():
    assert fastree.__version__ == importlib.metadata.version("fastree")


def test_version_is_written_once():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.MULTILINE)
    assert not re.search(r"^version\s*=", pyproject, re.MULTILINE)
    assert 'input = "python/fastree/__init__.py"' in pyproject


def test_license_file_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
