"""Resident memory of this process, shared by the long-running measurement scripts."""

from __future__ import annotations

import os


def rss_bytes() -> int:
    """RSS from /proc/self/statm (Linux), else from psutil."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss
