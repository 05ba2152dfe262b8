"""The one-host fast path: running segment schedules on the ranks' shared segment, and setting
the segment up.

Each step of a segment schedule is a round on the ``HostSegment``: begin (the
window of this parity is free again), write the window, publish it with the
call's fingerprint, then read the windows (or the buffers posted for
single-copy reads) of others. The order is the walker's, the same the checker
proves. In a call's first round a rank compares its fingerprint with that of
every peer already in the round, and with that of every peer it waits for
before reading a byte of it: of two ranks the later one sees the earlier, so
a disagreement is always found, by at least one rank, which tells the others.
"""
from __future__ import annotations

import os

import numpy as np

from ..schedule import Copy, Get, Post, Schedule
from ..walk import Semantics, walk
from .messages import copy


class _Segment(Semantics):
    blocking = True
    __slots__ = ("ctx", "seg", "bufs", "reduce", "dt", "me", "parity", "mine", "posted")

    def __init__(self, ctx, bufs, reduce, mine, dt):
        self.ctx, self.seg, self.bufs, self.reduce, self.mine = ctx, ctx.segment, bufs, reduce, mine
        self.dt, self.me, self.parity, self.posted = dt, ctx.rank, 0, None

    def begin(self, r, k):
        self.parity, self.posted = self.seg.begin(), None
        self.bufs["win"] = self.seg.window(self.parity, self.me, self.dt)
        return True

    def local(self, r, k, o):
        t = type(o)
        if t is Copy:
            copy(self.bufs, o, self.reduce)
        elif t is Post:
            self.posted = self.bufs[o.buf][o.off:o.off + o.count]
            self.seg.post(self.parity, self.posted)
        else:
            self._get(o, self.parity ^ 1)

    def publish(self, r, k):
        seg = self.seg
        seg.publish(*self.mine)
        if k == 0:
            if self.ctx.error is not None:      # aborted meanwhile (another rank found a disagreement)
                raise self.ctx.error
            seg.fence()
            for p in range(seg.n):              # the peers already in this round: do they make my call?
                if p != self.me and seg.reached(p):
                    self._agree(p)

    def _agree(self, p: int) -> None:
        """Rank ``p`` has published this round: raise unless it makes the same call. (Of two ranks,
        the one that publishes later sees the other's round, so every pair is compared.)"""
        theirs = self.seg.call_of(p, self.parity)
        if theirs != self.mine:
            raise self.ctx.mismatch(p, self.mine[0], theirs[1:], their_seq=theirs[0])

    def take(self, r, k, o):
        if o.peer != self.me:
            self.seg.wait(o.peer)
            if k == 0:
                self._agree(o.peer)             # before a byte of its window is read
        if type(o) is Get:
            self._get(o, self.parity)
        return True

    def _get(self, o: Get, parity: int) -> None:
        dst = self.bufs[o.buf][o.off:o.off + o.count]
        seg = self.seg
        if o.peer == self.me and self.posted is not None and parity == self.parity:
            src = self.posted[o.src_off:o.src_off + o.count]          # my own posted buffer: a plain copy
        elif seg.posted(o.peer, parity):
            target = np.empty_like(dst) if o.reduce else dst
            seg.read(o.peer, parity, target, o.src_off * dst.itemsize)
            if o.reduce:
                self.reduce(dst, target)
            return
        else:
            src = seg.window(parity, o.peer, self.dt)[o.src_off:o.src_off + o.count]
        if o.reduce:
            self.reduce(dst, src)
        else:
            np.copyto(dst, src)


def run(ctx, s: Schedule, bufs: dict, reduce, seq: int, call, op: str, deadline: float, dt) -> None:
    """Run this rank's segment schedule ``s`` of collective ``seq``; ``call``: its fingerprint words."""
    seg = ctx.segment
    seg.deadline, seg.op, seg.seq = deadline, op, seq
    walk([s], _Segment(ctx, bufs, reduce, (seq, *call), dt))


def attach_segment(ctx, broadcast_object, allgather_object) -> None:
    """Collective: give a one-host communicator its shared segment (rank 0 makes it, the others open
    it through /proc/<pid>/fd; every rank must manage, or none uses it). The object collectives are
    the communicator's own."""
    if ctx.size < 2 or len(set(ctx.hosts)) > 1 or any(ctx.link_class(0, p) != "shm" for p in range(1, ctx.size)):
        return
    from ..transport.cma import works
    from ..transport.segment import HostSegment
    area = int(os.environ.get("PYXCCL_SHM_AREA_BYTES", 2 << 20)) if ctx.rank == 0 else 0
    seg = HostSegment(0, ctx.size, area) if ctx.rank == 0 else None
    where = broadcast_object((os.getpid(), seg.fd, seg.area) if seg else None)
    try:
        if seg is None:
            seg = HostSegment.open(ctx.rank, ctx.size, where[2], where[0], where[1])
        ok = True
    except OSError:     # /proc/<pid>/fd not openable here (ptrace rules): no fast path
        ok = False
    cma = ok and (ctx.rank == 0 or works(*(int(x) for x in seg.pids[0])))
    oks = allgather_object((ok, cma))
    if not all(o for o, _ in oks):
        if seg is not None:
            seg.close()
        return
    seg.cma = all(c for _, c in oks) and os.environ.get("PYXCCL_CMA", "1") != "0"
    seg.check_alive = ctx.check_alive
    ctx.use_segment(seg)
