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

Two executors run the same schedules: ``_Segment`` here, in Python, and
``pyxccl._native`` (C, without the GIL), which runs a schedule compiled by
walking it once (``program``): the same operations in the walker's order.
The native one is used when it was built and knows the call's dtype and op;
``PYXCCL_NATIVE=0`` turns it off (CI runs the one-host tests both ways).
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..ops import ReduceOp
from ..schedule import Copy, Get, Post, Schedule, Sync
from ..walk import Semantics, walk
from .messages import copy

try:
    from .. import _native
except ImportError:         # not built (no C compiler at install): the Python executor runs everything
    _native = None

_DTYPES = {np.dtype(t): i for i, t in enumerate((np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                                  np.uint8, np.uint16, np.uint32, np.uint64))}
_OPS = {ReduceOp.SUM: 0, ReduceOp.AVG: 0, ReduceOp.PROD: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3, ReduceOp.BAND: 4,
        ReduceOp.BOR: 5, ReduceOp.BXOR: 6, ReduceOp.LAND: 7, ReduceOp.LOR: 8}
_BUFS = {"in": 0, "out": 1, "tmp": 2, "win": 3}
_BEGIN, _COPY, _POST, _PUBLISH, _GET, _SYNC = range(1, 7)
_DONE, _NAPPED, _MISMATCH, _BOUNDS, _CMA_FAILED = range(5)


def native_codes(dt: np.dtype, op) -> tuple[int, int] | None:
    """(dtype, op) codes for the native executor, or None when a call of ``dt`` and ``op`` runs in
    Python (not built, turned off, or a dtype or reduction the C code does not know)."""
    if _native is None or os.environ.get("PYXCCL_NATIVE", "1") == "0":
        return None
    if op is None:
        return (-1, -1) if dt.type.__module__ == "numpy" else None     # ml_dtypes' arrays export no buffer
    codes = _DTYPES.get(dt, -1), _OPS.get(op, -1)
    return codes if _native.can_reduce(*codes) else None


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


class _Compile(Semantics):
    """Records what the walker runs, in its order, as instructions of the native executor."""
    blocking = True

    def __init__(self, itemsize: int):
        self.b, self.code = itemsize, []

    def _add(self, *ins) -> None:
        self.code.append(ins + (0,) * (9 - len(ins)))

    def begin(self, r, k):
        self._add(_BEGIN)
        return True

    def local(self, r, k, o):
        b, t = self.b, type(o)
        if t is Copy:
            self._add(_COPY, _BUFS[o.src], o.src_off * b, _BUFS[o.dst], o.dst_off * b, o.count * b, o.reduce)
        elif t is Post:
            self._add(_POST, _BUFS[o.buf], o.off * b, o.count * b)
        else:
            self.take(r, k, o)

    def publish(self, r, k):
        self._add(_PUBLISH, k)

    def take(self, r, k, o):
        if type(o) is Sync:
            self._add(_SYNC, o.peer, k)
        else:
            b = self.b
            self._add(_GET, o.peer, o.src_off * b, _BUFS[o.buf], o.off * b, o.count * b, o.reduce, o.prev, k)
        return True


def program(s: Schedule, itemsize: int) -> bytes:
    """``s`` compiled for the native executor (once per schedule: plans keep their schedules)."""
    prog = s.__dict__.get("_program")
    if prog is None:
        c = _Compile(itemsize)
        walk([s], c)
        prog = s.__dict__["_program"] = np.array(c.code, np.int64).tobytes()
    return prog


def run(ctx, s: Schedule, bufs: dict, reduce, seq: int, call, op: str, deadline: float, dt, codes=None) -> None:
    """Run this rank's segment schedule ``s`` of collective ``seq``; ``call``: its fingerprint words;
    ``codes``: the native executor's (dtype, op) codes, None to run it in Python."""
    seg = ctx.segment
    if codes is None:
        seg.deadline, seg.op, seg.seq = deadline, op, seq       # its waits name the call (native: on a stop)
        walk([s], _Segment(ctx, bufs, reduce, (seq, *call), dt))
        return
    native(ctx, program(s, dt.itemsize), (seq, *call), (bufs.get("in"), bufs.get("out"), bufs.get("tmp")),
           (*seg.waits, *codes), deadline, op)


def overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """Do contiguous arrays ``a`` and ``b`` share memory?"""
    return _native.overlap(a, b) if _native is not None else np.shares_memory(a, b)


def native(ctx, prog: bytes, mine: tuple, where: tuple, settings: tuple, deadline: float, op: str,
           done=None) -> None:
    """Run ``prog`` natively on ``where`` = (in, out, tmp) for call ``op`` whose fingerprint is ``mine``;
    between sleeps of a wait, check the deadline and the peers. ``done``: what a first run returned."""
    seg = ctx.segment
    if done is None:
        done = _native.run(prog, 0, seg.layout, seg.round, mine, where, settings)
    while type(done) is not int:            # (status, pc, round, peer, err): it stopped
        status, pc, seg.round, peer, err = done
        seg.deadline, seg.op, seg.seq = deadline, op, mine[0]      # named in the errors below
        if status == _NAPPED:       # a wait slept: is the call still alive? (then wait without spinning)
            if time.monotonic() > deadline:
                raise seg.timed_out(peer)
            seg.check_alive(peer, mine[0])
            settings = (0, 0, *settings[2:])
        elif status == _MISMATCH:
            theirs = seg.call_of(peer, seg.round & 1)
            raise ctx.mismatch(peer, mine[0], theirs[1:], their_seq=theirs[0])
        elif status in (_BOUNDS, _CMA_FAILED):
            raise seg.read_error(peer, seg.round & 1, err, OSError(err, os.strerror(err))
                                 if status == _CMA_FAILED else None)
        else:
            raise RuntimeError(f"rank {ctx.rank}: {op}: the native executor cannot run this call (status "
                               f"{status}); set PYXCCL_NATIVE=0 and report it")
        done = _native.run(prog, pc, seg.layout, seg.round, mine, where, settings)
    seg.round = done


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
