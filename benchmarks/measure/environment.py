"""The run's environment, recorded with the results: timings mean little without it."""

from __future__ import annotations

import datetime
import os
import platform
import re
import site
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_revision() -> str | None:
    """``git describe``-style revision of the checkout the suite runs from (``+dirty`` when it has
    uncommitted changes), so a published run says which code it timed; None outside git."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository this suite runs from."""


def fastree_location() -> str | None:
    """Where the fastree that ran was imported from, its package and its compiled core, without
    the machine's own paths (the published results.json is read on other machines): e.g.
    ``source checkout: python/fastree/__init__.py, build/.../_core....so`` for an editable build,
    ``site-packages: fastree/__init__.py, fastree/_core....so`` for a wheel."""
    modules = [sys.modules.get(name) for name in ("fastree", "fastree._core")]
    files = [getattr(module, "__file__", None) for module in modules]
    places: dict[str, list[str]] = {}
    for file in filter(None, files):
        where, relative = place(Path(file), CHECKOUT, site_dirs())
        places.setdefault(where, []).append(relative)
    return "; ".join(f"{where}: {', '.join(paths)}" for where, paths in places.items()) or None


def site_dirs() -> list[Path]:
    """This interpreter's site-packages folders (an installed wheel's home)."""
    paths = sysconfig.get_paths()
    found = [paths.get("purelib"), paths.get("platlib"), *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return [Path(path).resolve() for path in dict.fromkeys(filter(None, found))]


def place(path: Path, checkout: Path, sites: list[Path]) -> tuple[str, str]:
    """(``site-packages``, ``source checkout`` or ``elsewhere``; the path relative to it). A
    site-packages folder inside the checkout (a venv in it) counts as site-packages."""
    path = path.resolve()
    for where, roots in (("site-packages", sites), ("source checkout", [checkout])):
        for root in roots:
            if path.is_relative_to(root):
                return where, path.relative_to(root).as_posix()
    return "elsewhere", f"{path.parent.name}/{path.name}"


MACHINE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.+@~-]+/)+[\w.+@~-]*")
"""An absolute path of two parts or more (``/home/me/x``), not ``op/tree`` nor a URL's ``//``."""


def without_machine_paths(text: str) -> str:
    """``text`` with every absolute path made relative to where it lies, as ``place`` says:
    ``/home/me/fastree/python/fastree/__init__.py`` -> ``source checkout: python/...`` when the
    whole text is the path (an older results.json's ``fastree_location``), else the path alone,
    relative (``python/fastree/__init__.py``, ``site-packages/fastree/_core.so``, or
    ``.../parent/name`` for anywhere else). A published results.json is read on other machines."""
    whole = MACHINE_PATH.fullmatch(text)
    sites = site_dirs()
    if whole:
        where, relative = place(Path(text), CHECKOUT, sites)
        return f"{where}: {relative}"

    def relative(match: re.Match[str]) -> str:
        where, path = place(Path(match.group(0)), CHECKOUT, sites)
        return {"source checkout": path, "site-packages": f"site-packages/{path}"}.get(
            where, f".../{path}"
        )

    return MACHINE_PATH.sub(relative, text)


LIBPYTHON = re.compile(r"/libpython3\.\d+t?\.so(?:\.[\d.]+)?$")
"""A CPython shared library in a line of ``/proc/self/maps``: ``.../libpython3.13.so.1.0``."""


def libpython_linkage(maps: Path = Path("/proc/self/maps")) -> str | None:
    """How this interpreter reaches libpython: ``"shared"`` when the process has a libpython
    shared object mapped (pyenv's ``--enable-shared`` builds: the ``python`` executable loads
    ``libpython3.x.so``), ``"static"`` when none is (libpython linked into the executable, as in
    Debian's and Ubuntu's own builds), None where the process's mappings cannot be read (not
    Linux).

    From Python 3.12 CPython keeps the current thread state in a thread-local variable. Inside a
    shared libpython every read of it is a ``__tls_get_addr`` call, and calls between its own
    exported functions go through the PLT; linked into the executable, both are plain
    instructions. C extensions that make many objects (fastree, jaxlib) spend most of their time
    inside libpython, so the same Python version gives other ratios to jax.tree_util on the two
    linkages (docs/performance-history.md, "How libpython is linked")."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    return "shared" if any(LIBPYTHON.search(line) for line in lines) else "static"


def package_version(name: str) -> str | None:
    """The installed distribution's version, or None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def missing_device(device: str) -> str | None:
    """Why the run cannot put its leaves on ``device`` (None: it can): a "gpu" run on a machine
    whose JAX sees no GPU would time the host and label it gpu."""
    if device != "gpu":
        return None
    import jax

    try:
        jax.devices("gpu")
    except RuntimeError as error:
        return (
            f"--device gpu asked for a GPU, but JAX sees none: jax.devices() is "
            f"{jax.devices()} (default backend {jax.default_backend()!r}; {error}). Install a "
            "jaxlib with GPU support, or run without --device gpu (the default is cpu)"
        )
    return None


def describe(device: str, versions: dict[str, str], memory_method: str | None) -> dict[str, Any]:
    import jax

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "libpython": libpython_linkage(),
        # The stack the figures come from (the README's first screen names it): JAX and flax
        # whether or not this run imported them (flax only loads for the nnx cells and workloads).
        "jax": package_version("jax"),
        "jaxlib": package_version("jaxlib"),
        "flax": package_version("flax"),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(d) for d in jax.devices()],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "libraries": versions,
        "memory_method": memory_method,
        "source_revision": source_revision(),
        "fastree_location": fastree_location(),
    }
