"""Entry point of ``python -m benchmarks``.

Options are parsed before anything imports JAX, because the sharded leaf kind needs
``--xla_force_host_platform_device_count=8`` in XLA_FLAGS before JAX creates its CPU backend.
"""

from __future__ import annotations

import os
import sys

from benchmarks.cli import parse_args
from benchmarks.destination import kind_of_args, refusal

HOST_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"


def main() -> int:
    args = parse_args()
    # Before anything is timed (or JAX imported): a run never overwrites another's results unasked.
    why_not = refusal(args.out, kind_of_args(args), args.overwrite)
    if why_not is not None:
        print(f"python -m benchmarks: refused: {why_not}", file=sys.stderr)
        return 2
    if args.leaves and "sharded" in args.leaves:
        if "jax" in sys.modules:
            print("note: JAX was imported before the suite could set XLA_FLAGS", file=sys.stderr)
        flags = os.environ.get("XLA_FLAGS", "")
        if HOST_DEVICE_FLAG not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICE_FLAG}".strip()
    if args.runs > 1:
        # Each run in a process of its own (which sets XLA_FLAGS for itself); this one only
        # starts them, then pools what they wrote.
        from benchmarks.pooled import run_pooled

        return run_pooled(args)
    # Imported here, after XLA_FLAGS is final: the runner imports JAX.
    from benchmarks.runner import run_from_args

    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
