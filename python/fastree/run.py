"""``python -m fastree.run``: run an unchanged program with fastree installed into JAX.

    python -m fastree.run script.py [args...]
    python -m fastree.run -m module [args...]      (e.g. python -m fastree.run -m pytest -q)

Like ``python -m cProfile``: :func:`fastree.install` runs first, before the program imports
anything, so libraries that bind ``from jax.tree_util import tree_map`` at their import time get
fastree's function too. Child processes (pytest-xdist workers, multiprocessing, subprocess) are
covered as well: the command sets ``FASTREE_INSTALL=1`` in the environment they inherit, and
fastree's start-up hook (``fastree_install.pth``) installs it in each of them.

Bad arguments are answered as ``python`` answers them: a one-line error and the usage on stderr,
status 2 (an unknown option, a missing script, nothing to run); a module ``-m`` cannot find, one
line and status 1. ``--`` before the script is accepted, as ``python -- script.py`` accepts it.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys

from ._install import install

PROG = "python -m fastree.run"
USAGE = (
    f"usage: {PROG} script.py [args...]\n"
    f"       {PROG} -m module [args...]\n"
)
HELP = USAGE + (
    "\n"
    "Runs the program with fastree installed into JAX (fastree.install() before anything is\n"
    "imported), like `python script.py` or `python -m module`. Sets FASTREE_INSTALL=1 in the\n"
    "environment, so that child processes the program starts (pytest-xdist workers,\n"
    "multiprocessing, subprocess) install fastree too; FASTREE_INSTALL=1 set by hand does the\n"
    "same for any Python program.\n"
)


def _usage_error(message: str, status: int = 2) -> SystemExit:
    # As `python` does on bad arguments: one line saying what is wrong, the usage, status 2.
    sys.stderr.write(f"{PROG}: {message}\n{USAGE}Try '{PROG} --help' for more information.\n")
    return SystemExit(status)


def _module_found(module: str) -> bool:
    # As `python -m` does, a dotted name imports its parent packages to be found.
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or an empty name
        return False


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(HELP)
        raise SystemExit(0)
    if args[:1] == ["--"]:  # as `python -- script.py`: what follows is the script
        args = args[1:]
        if not args:
            raise _usage_error("a script is expected after --")
    elif not args:
        raise _usage_error("a script or -m module is expected")
    elif args[0] == "-m":
        if len(args) < 2:
            raise _usage_error("a module name is expected after -m")
    elif args[0].startswith("-"):
        raise _usage_error(f"unknown option {args[0]}")
    if args[0] != "-m" and not os.path.exists(args[0]):
        raise _usage_error(
            f"can't open file {os.path.abspath(args[0])!r}: [Errno 2] No such file or directory"
        )
    # Inherited by every child process the program starts: the .pth hook installs fastree there.
    os.environ["FASTREE_INSTALL"] = "1"
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        install()  # first: finding a dotted name imports its parent packages
        if not _module_found(module):
            # As `python -m` answers a missing module: one line, status 1.
            sys.stderr.write(f"{PROG}: No module named {module}\n")
            raise SystemExit(1)
        # As `python -m module`: sys.path[0] stays the current directory (as under -m fastree.run)
        # and runpy sets sys.argv[0] to the module's file.
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script = args[0]
    install()
    # As `python script.py`: the script's directory replaces ours at the front of sys.path.
    sys.argv = args
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
