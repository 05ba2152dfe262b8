"""Copies around a slow case of ``rep movsb``: a destination 1-31 bytes ahead of its source within a
page (4K aliasing) runs 4-25x slower through it, and glibc's memcpy (so numpy's copies) uses it from a
few KiB to about the L2 size, the kernel's single copies (``cma.py``) at every size. On this project's
machine (AMD EPYC, glibc 2.36) a 256 KiB copy 16 bytes ahead ran at 1.9 GB/s against 36; numpy puts
large arrays 16 bytes into a page, so buffers meet at such distances often. Such a copy goes here in
pieces through a bounce buffer half a page from its source: two copies, both at harmless distances.
(The native executor does the same in C: ``_native.c``, ``short_ahead``.) And the last-level cache's size,
past which the native executor's copies into a call's buffers bypass the cache (``_native.c``, ``nt_bytes``).

>>> import numpy as np
>>> a = np.arange(100_000, dtype=np.float32); b = np.empty_like(a)
>>> copy(b, a); bool((a == b).all())
True
"""
from __future__ import annotations

import mmap
import threading

import numpy as np

PAGE = 4096
SHORT = 32              # distances 1..SHORT-1 ahead are slow (4-28 measured slow, 32 and up not)
MIN_BYTES = 256         # below this memcpy does not use rep movsb
PIECE = 256 << 10       # a piece through the bounce buffer (both copies of it in L2)

_local = threading.local()


def short_ahead(dst_addr: int, src_addr: int) -> bool:
    """Is a copy from ``src_addr`` to ``dst_addr`` one of the slow ones (above)?"""
    return 0 < (dst_addr - src_addr) % PAGE < SHORT


def bounce_at(like: int, nbytes: int) -> tuple[np.ndarray, int]:
    """``nbytes`` (at most PIECE) of this thread's bounce buffer, and their address, half a page from
    ``like`` within a page: a copy between them and ``like`` is at a harmless distance either way, and so
    is one between them and an address 1-31 bytes from ``like``."""
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = np.empty(PIECE + PAGE, np.uint8)
        _local.addr = buf.ctypes.data
    off = (like + PAGE // 2 - _local.addr) % PAGE
    return buf[off:off + nbytes], _local.addr + off


def page_aligned(count: int, fill, dtype=np.float32) -> np.ndarray:
    """``count`` elements set to ``fill`` at the start of a page of their own: what copies between two
    such buffers take is what the engine's take (which go around the slow distances), whatever the heap
    would have put between them (a rate measured 16 bytes apart within a page: 2 GB/s for 9)."""
    a = np.frombuffer(mmap.mmap(-1, max(1, count) * np.dtype(dtype).itemsize), dtype)
    a[:] = fill
    return a


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)``; arrays of one dtype and shape, both contiguous and apart, at a slow
    distance go through the bounce buffer."""
    n = dst.nbytes
    if n >= MIN_BYTES and dst.dtype == src.dtype and dst.shape == src.shape and dst.flags.c_contiguous \
            and src.flags.c_contiguous:
        da, sa = _addr(dst), _addr(src)
        if short_ahead(da, sa) and (da + n <= sa or sa + n <= da):
            d8, s8 = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
            for at in range(0, n, PIECE):
                m = min(PIECE, n - at)
                t, _ = bounce_at(sa + at, m)
                np.copyto(t, s8[at:at + m])
                np.copyto(d8[at:at + m], t)
            return
    np.copyto(dst, src)


def last_level_cache() -> int:
    """Bytes of the largest CPU cache (sysfs), 32 MiB when it cannot be read."""
    best = 0
    for idx in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{idx}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMmGg")
        if digits.isdigit():
            best = max(best, int(digits) * unit)
    return best or 32 << 20
