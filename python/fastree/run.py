"""``python -m fastree.run``: run an unchanged program with fastree installed into JAX.

    python -m fastree.run script.py [args...]
    python -m fastree.run -m module [args...]      (e.g. python -m fastree.run -m pytest -q)

Like ``python -m cProfile``: :func:`fastree.install` runs first, before the program imports
anything, so libraries that bind ``from jax.tree_util import tree_map`` at their import time get
fastree's function too. Child processes (pytest-xdist workers, multiprocessing, subprocess) are
covered as well: the command sets ``FASTREE_INSTALL=1`` in the environment they inherit, and
fastree's start-up hook (``fastree_install.pth``) installs it in each of them.
"""

from __future__ import annotations

import os
import runpy
import sys

from ._install import install

USAGE = (
    "usage: python -m fastree.run script.py [args...]\n"
    "       python -m fastree.run -m module [args...]\n"
)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    # Inherited by every child process the program starts: the .pth hook installs fastree there.
    os.environ["FASTREE_INSTALL"] = "1"
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        raise SystemExit(0)
    if not args or args == ["-m"]:
        sys.stderr.write(USAGE)
        raise SystemExit(2)
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        install()
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
