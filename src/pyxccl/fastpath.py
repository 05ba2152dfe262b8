"""One-host collectives on a HostSegment: the shared-memory fast path.

Each function moves data in rounds (see transport/segment.py); a message
larger than a rank's area goes in pieces, one or two rounds each. Reductions
run with numpy straight on the shared areas, in rank order, so every rank
gets bit-identical results; large allreduce and reduce split the work so that
every rank reduces its own share at the same time (each core busy).

The matching Schedules (for the checker, the simulator and the cost model)
are the direct algorithms in algorithms/shm.py.
"""
from __future__ import annotations

import numpy as np

from .schedule import offsets, split_counts

ONESHOT_BYTES = 64 << 10       # up to this, every rank reduces everything (one round, least latency)
CMA_BYTES = 256 << 10          # from this size, data moves by single-copy reads when the kernel allows


def _single_copy(seg, nbytes: int) -> bool:
    return seg.cma and nbytes >= CMA_BYTES


def _finish(seg, wait_for) -> None:
    """A last round so that no rank returns (and lets its buffer change) while others still read it."""
    seg.begin()
    seg.publish()
    for p in wait_for:
        seg.wait(p)


def _pieces(count: int, per: int):
    for a in range(0, count, per):
        yield a, min(count, a + per)


def _typed(area: np.ndarray, dt: np.dtype, n: int) -> np.ndarray:
    return area[:n * dt.itemsize].view(dt)


def allreduce(seg, inp, out, reduce, root=None):
    """Every rank gets the reduction (or only ``root``: reduce)."""
    dt, L, me = inp.dtype, seg.n, seg.rank
    per = seg.area // dt.itemsize
    big = inp.nbytes > ONESHOT_BYTES and L > 1
    for a, b in _pieces(inp.size, per):
        mine = _typed(seg.begin(), dt, b - a)
        np.copyto(mine, inp[a:b])
        seg.publish()
        for p in range(L):
            seg.wait(p)
        src = [_typed(seg.area_of(p), dt, b - a) for p in range(L)]
        if not big:
            if root is None or me == root:
                res = out[a:b]
                np.copyto(res, src[0])
                for p in range(1, L):
                    reduce(res, src[p])
            continue
        shares = split_counts(b - a, L)
        off = offsets(shares)
        s0, s1 = off[me], off[me + 1]
        part = _typed(seg.begin(), dt, s1 - s0)       # next round: my reduced share
        np.copyto(part, src[0][s0:s1])
        for p in range(1, L):
            reduce(part, src[p][s0:s1])
        seg.publish()
        if root is not None and me != root:
            continue
        for p in range(L):
            seg.wait(p)
            np.copyto(out[a + off[p]:a + off[p + 1]], _typed(seg.area_of(p), dt, shares[p]))


def reduce_scatter(seg, inp, out, reduce, counts):
    """Rank p's area holds, for each piece, block q's piece at q * per (a fixed stride)."""
    dt, L, me = inp.dtype, seg.n, seg.rank
    per = max(1, seg.area // dt.itemsize // L)
    off = offsets(counts)
    for a in range(0, max(counts, default=0), per):
        area = seg.begin()
        for q in range(L):
            k = max(0, min(counts[q], a + per) - a)
            np.copyto(_typed(area[q * per * dt.itemsize:], dt, k), inp[off[q] + a:off[q] + a + k])
        seg.publish()
        k = max(0, min(counts[me], a + per) - a)
        res = out[a:a + k]
        for p in range(L):
            seg.wait(p)
            src = _typed(seg.area_of(p)[me * per * dt.itemsize:], dt, k)
            if p == 0:
                np.copyto(res, src)
            else:
                reduce(res, src)


def allgather(seg, inp, out, counts, root=None):
    """Every rank (or only ``root``: gather) gets every rank's block."""
    dt, L, me = inp.dtype, seg.n, seg.rank
    if _single_copy(seg, max(counts, default=0) * dt.itemsize):
        off = offsets(counts)
        seg.begin()
        seg.post(inp)
        seg.publish()
        if root is None or me == root:
            np.copyto(out[off[me]:off[me + 1]], inp)
            for p in range(L):
                if p != me:
                    seg.wait(p)
                    seg.read(p, out[off[p]:off[p + 1]])
        _finish(seg, range(L) if root is None else [root] if me != root else [])
        return
    per = seg.area // dt.itemsize
    off = offsets(counts)
    for a in range(0, max(counts, default=0), per):
        n_me = max(0, min(counts[me], a + per) - a)
        np.copyto(_typed(seg.begin(), dt, n_me), inp[a:a + n_me])
        seg.publish()
        if root is not None and me != root:
            continue
        for p in range(L):
            n_p = max(0, min(counts[p], a + per) - a)
            if n_p:
                seg.wait(p)
                np.copyto(out[off[p] + a:off[p] + a + n_p], _typed(seg.area_of(p), dt, n_p))


def alltoall(seg, inp, out, send_counts, recv_counts, most: int, root=None):
    """Block q of my input to rank q (alltoall); with ``root``, only the root's input (scatter).
    Each area holds the piece for rank q at q * per (a fixed stride), so a reader needs
    only its own receive counts. ``most``: the largest block of any rank (the same on all ranks,
    so that all run the same number of rounds)."""
    dt, L, me = out.dtype, seg.n, seg.rank
    soff, roff = offsets(send_counts), offsets(recv_counts)
    if _single_copy(seg, most * dt.itemsize):
        seg.begin()
        if root is None or me == root:
            seg.post(inp)
        seg.publish()
        for p in ([root] if root is not None else range(L)):
            if p == me:
                np.copyto(out[roff[p]:roff[p + 1]], inp[soff[me]:soff[me + 1]])
            elif recv_counts[p]:
                seg.wait(p)
                seg.read(p, out[roff[p]:roff[p + 1]], offset=me * most * dt.itemsize)   # equal blocks
        _finish(seg, range(L) if root is None else ([p for p in range(L) if p != me] if me == root else []))
        return
    per = max(1, seg.area // dt.itemsize // L)
    for a in range(0, most, per):
        area = seg.begin()
        if root is None or me == root:
            for q in range(L):
                k = max(0, min(send_counts[q], a + per) - a)
                np.copyto(_typed(area[q * per * dt.itemsize:], dt, k), inp[soff[q] + a:soff[q] + a + k])
        seg.publish()
        for p in ([root] if root is not None else range(L)):
            k = max(0, min(recv_counts[p], a + per) - a)
            if k:
                seg.wait(p)
                np.copyto(out[roff[p] + a:roff[p] + a + k], _typed(seg.area_of(p)[me * per * dt.itemsize:], dt, k))


def broadcast(seg, buf, root):
    dt, me = buf.dtype, seg.rank
    if _single_copy(seg, buf.nbytes):
        seg.begin()
        if me == root:
            seg.post(buf)
        seg.publish()
        if me != root:
            seg.wait(root)
            seg.read(root, buf)
        _finish(seg, [p for p in range(seg.n) if p != me] if me == root else [])
        return
    per = seg.area // dt.itemsize
    for a, b in _pieces(buf.size, per):
        area = seg.begin()
        if me == root:
            np.copyto(_typed(area, dt, b - a), buf[a:b])
        seg.publish()
        if me != root:
            seg.wait(root)
            np.copyto(buf[a:b], _typed(seg.area_of(root), dt, b - a))


def barrier(seg):
    seg.begin()
    seg.publish()
    for p in range(seg.n):
        seg.wait(p)
