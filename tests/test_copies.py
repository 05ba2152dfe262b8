"""Copies around rep movsb's slow distances (transport/copies.py; the C executor's are
tests/test_buffers.py's): the right bytes at every distance near a page's, in one piece and in several."""
import os

import numpy as np
import pytest

from pyxccl.transport import cma, copies

SIZES = (255, 256, 5000, 3 * copies.PIECE + 13)
DISTANCES = (0, 1, 8, 16, 31, 32, 48, copies.PAGE - 16)


def _pair(nbytes: int, dist: int, seed: int):
    """src and dst of ``nbytes``, dst ``dist`` bytes ahead of src within a page."""
    src = copies.page_aligned(nbytes + 2 * copies.PAGE, 0, np.uint8)[100:100 + nbytes]
    src[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    base = copies.page_aligned(nbytes + 2 * copies.PAGE, 0, np.uint8)
    off = (100 + dist) % copies.PAGE
    return src, base[off:off + nbytes]


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("dist", DISTANCES)
def test_copy_at_every_distance(nbytes, dist):
    src, dst = _pair(nbytes, dist, nbytes + dist)
    assert copies.short_ahead(dst.ctypes.data, src.ctypes.data) == (0 < dist < copies.SHORT)
    copies.copy(dst, src)
    assert np.array_equal(dst, src)
    f_src, f_dst = src[:nbytes // 4 * 4].view(np.float32), dst[:nbytes // 4 * 4].view(np.float32)
    f_dst[:] = 0
    copies.copy(f_dst, f_src)       # another dtype, through the same bytes
    assert np.array_equal(f_dst.view(np.uint8), f_src.view(np.uint8))


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("dist", (0, 16, 24))
def test_single_copies_at_every_distance(nbytes, dist):
    """cma.read, cma.write and cma.reader (this process as the other one: the kernel's copy all the same)."""
    src, dst = _pair(nbytes, dist, 7 * nbytes + dist)
    if not cma.works(os.getpid(), src.ctypes.data):
        pytest.skip("process_vm_readv is not allowed here")
    cma.read(os.getpid(), dst.ctypes.data, src.ctypes.data, nbytes)
    assert np.array_equal(dst, src)
    dst[:] = 0
    cma.write(os.getpid(), dst.ctypes.data, src.ctypes.data, nbytes)
    assert np.array_equal(dst, src)
    dst[:] = 0
    one = cma.reader(os.getpid(), dst.ctypes.data, src.ctypes.data, nbytes)     # calibrate's timed read
    assert one() and np.array_equal(dst, src)
    assert not cma.reader(os.getpid(), dst.ctypes.data, 0, nbytes)()             # a bad address: False
