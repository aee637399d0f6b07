"""The run's recorded environment carries no path of the machine it ran on (issue 44): the
published results.json is read everywhere, so where fastree came from is recorded as "source
checkout" / "site-packages" and a path relative to it, never as an absolute path. It records how
the interpreter reaches libpython, which moves the ratios on one Python version.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench_results import REPO_ROOT

from benchmarks.measure.environment import fastree_location, libpython_linkage, place


def test_fastree_location_names_its_place_without_the_machines_paths() -> None:
    import fastree

    location = fastree_location()
    assert location is not None
    assert location.startswith(("source checkout: ", "site-packages: ", "elsewhere: "))
    assert "fastree/__init__.py" in location and "_core" in location
    machine = [str(REPO_ROOT), str(Path.home()), sys.prefix, str(Path(fastree.__file__).parent)]
    for path in machine:
        assert path not in location, (path, location)
    assert not any(part.startswith("/") for part in location.replace(";", ",").split(", "))


def test_place_is_relative_to_the_checkout_or_site_packages(tmp_path: Path) -> None:
    checkout = tmp_path / "repo"
    sites = [tmp_path / "venv" / "lib" / "site-packages", checkout / ".venv" / "site-packages"]
    assert place(checkout / "python" / "fastree" / "__init__.py", checkout, sites) == (
        "source checkout",
        "python/fastree/__init__.py",
    )
    assert place(sites[0] / "fastree" / "_core.so", checkout, sites) == (
        "site-packages",
        "fastree/_core.so",
    )
    # A venv inside the checkout is still an install.
    assert place(sites[1] / "fastree" / "__init__.py", checkout, sites) == (
        "site-packages",
        "fastree/__init__.py",
    )
    assert place(tmp_path / "odd" / "fastree" / "__init__.py", checkout, sites) == (
        "elsewhere",
        "fastree/__init__.py",
    )


def test_libpython_linkage_reads_the_process_mappings(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    lib = "7f0-7f1 r-xp 00000000 08:01 42   /root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0"
    exe = "55d-55e r-xp 00000000 08:01 7   /usr/bin/python3.13"
    numpy = "7f2-7f3 r-xp 00000000 08:01 9   /venv/lib/python3.13/site-packages/numpy/_core.so"
    maps.write_text("\n".join([exe, lib, numpy]) + "\n")
    assert libpython_linkage(maps) == "shared"
    free_threaded = lib.replace("libpython3.13.so.1.0", "libpython3.13t.so.1.0")
    maps.write_text("\n".join([exe, free_threaded]) + "\n")
    assert libpython_linkage(maps) == "shared"
    # A path that only contains the name (a venv called libpython3.13.so-env) is not the library.
    maps.write_text("\n".join([exe, numpy, numpy.replace("/venv/", "/libpython3.13.so-env/")]))
    assert libpython_linkage(maps) == "static"
    assert libpython_linkage(tmp_path / "no-such-file") is None


def test_libpython_linkage_of_this_interpreter_is_what_its_executable_needs() -> None:
    """Checked another way: the executable's dynamic dependencies (ldd reads its ELF header)."""
    found = libpython_linkage()
    if not Path("/proc/self/maps").exists():
        assert found is None
        return
    ldd = shutil.which("ldd")
    if ldd is None:
        pytest.skip("no ldd to read the executable's dependencies with")
    # No check: ldd fails on an executable with no dynamic section, which needs no libpython.
    needed = subprocess.run([ldd, sys.executable], capture_output=True, text=True)
    assert found == ("shared" if "libpython3" in needed.stdout else "static"), needed.stdout
