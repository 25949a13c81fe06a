"""Large buffers straight from the system in a CLI process that scores page after page.

glibc serves a freed buffer of up to 32 MB from its heap afterwards (its mmap threshold rises to the
largest buffer freed), so the canvases and texture planes of page after page (8 to 26 MB each, A4
at 150 dpi) are carved from a heap that only grows: ``look`` over 64 A4 pages peaked at 3216 MB
that way, and at 20 pages 1833 MB against 1347 MB with buffers of 4 MB and up mapped on their own
(``benchmarks/bench_memory_contexts.py``). The CLI process is the command's own, so it sets this
for itself; library code never does.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD = 4 * 2**20


def map_large_buffers(threshold: int = THRESHOLD) -> bool:
    """Buffers of ``threshold`` bytes and up mapped on their own and unmapped when freed (glibc only).

    Returns whether it was set (False off Linux or without glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    return bool(mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))
