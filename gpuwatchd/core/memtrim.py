"""Give freed heap memory back to the kernel once start-up is over.

Start-up allocates and frees a lot (rule files parsed, the XID catalog built, the first
poll decoded). glibc keeps the freed pages in the process unless they sit at the very top
of the heap, so the daemon's RSS stays megabytes above what it uses. ``malloc_trim(0)``
releases every free page (madvise on the holes, since glibc 2.8). The daemon calls
``trim()`` after its first evaluation and after a reload; elsewhere (musl, no libc) it does
nothing and says so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_libc: ctypes.CDLL | bool | None = False  # False: not looked up yet


def _load() -> ctypes.CDLL | None:
    global _libc
    if _libc is False:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
            libc.malloc_trim.restype = ctypes.c_int
            _libc = libc
        except (OSError, AttributeError):
            _libc = None
    return _libc if isinstance(_libc, ctypes.CDLL) else None


def trim() -> bool:
    """Return free heap pages to the kernel; True if glibc's ``malloc_trim`` ran."""
    libc = _load()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
