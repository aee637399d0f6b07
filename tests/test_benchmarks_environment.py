"""The run's recorded environment carries no path of the machine it ran on (issue 44): the
published results.json is read everywhere, so where fastree came from is recorded as "source
checkout" / "site-packages" and a path relative to it, never as an absolute path.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_results import REPO_ROOT

from benchmarks.measure.environment import fastree_location, place


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
