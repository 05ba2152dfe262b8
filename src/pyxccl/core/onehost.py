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
``PYXCCL_NATIVE=0`` turns it off (CI runs the one-host tests both ways, and
tests/test_executors.py runs every segment schedule through both). What the
two share (opcodes, statuses, buffer ids, header fields, dtype and op codes,
the segment's layout) is written on both sides; at import the C module's
``tables()`` are compared with this module's and ``transport/segment.py``'s,
and a module built from another ``_native.c`` is refused (a warning says
so; the Python executor runs everything).
"""
from __future__ import annotations

import os
import time
import warnings

import numpy as np

from .. import _env
from .._errors import ProtocolError
from ..ops import ReduceOp
from ..schedule import Copy, Get, Post, Put, Schedule, Sync
from ..transport import copies
from ..transport import segment as _layout
from ..walk import Semantics, walk
from .messages import copy

try:
    from .. import _native
except ImportError:         # not built (no C compiler at install): the Python executor runs everything
    _native = None

# What this module and _native.c must agree on (see tables() there)
_WIDTH = 9                  # int64 per instruction: the opcode and 8 arguments
_OPCODES = {"BEGIN": 1, "COPY": 2, "POST": 3, "PUBLISH": 4, "GET": 5, "SYNC": 6, "PUT": 7}
_STATUS = {"DONE": 0, "NAPPED": 1, "MISMATCH": 2, "BOUNDS": 3, "CMA_FAILED": 4, "UNSUPPORTED": 5, "BUFFER": 6}
_BUFS = {"in": 0, "out": 1, "tmp": 2, "win": 3}
_DTYPE_NAMES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_DTYPES = {np.dtype(t): i for i, t in enumerate(_DTYPE_NAMES)}
_OPS = {ReduceOp.SUM: 0, ReduceOp.AVG: 0, ReduceOp.PROD: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3, ReduceOp.BAND: 4,
        ReduceOp.BOR: 5, ReduceOp.BXOR: 6, ReduceOp.LAND: 7, ReduceOp.LOR: 8}     # AVG: a SUM, divided after
_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
_BEGIN, _COPY, _POST, _PUBLISH, _GET, _SYNC, _PUT = (_OPCODES[k] for k in ("BEGIN", "COPY", "POST", "PUBLISH", "GET",
                                                                         "SYNC", "PUT"))
_DONE, _NAPPED, _MISMATCH, _BOUNDS, _CMA_FAILED, _UNSUPPORTED, _BUFFER = _STATUS.values()


_WINDOW_WAYS = {"never": 0, "always": 1, "auto": 2}      # PYXCCL_NT_WINDOWS: _native.set_nt_windows()'s ways


def tables() -> dict:
    """What the native executor must say its ``tables()`` are, as this side has them."""
    return {"width": _WIDTH, "opcodes": _OPCODES, "status": _STATUS, "buffers": _BUFS,
            "header": {k: getattr(_layout, k) for k in ("SEQ", "W0", "W1", "ADDR", "NBYTES")},
            "dtypes": {dt.name: code for dt, code in _DTYPES.items()},
            "ops": {op.value: code for op, code in _OPS.items() if op is not ReduceOp.AVG},
            "segment": _layout.LAYOUT, "layout": _layout.LAYOUT_FIELDS, "windows": _WINDOW_WAYS}


def native_mismatch(mod) -> str | None:
    """Why the compiled module ``mod`` cannot run this package's programs (it was built from another
    ``_native.c``), or None when its tables are this side's."""
    where = getattr(mod, "__file__", mod)
    if not hasattr(mod, "tables"):
        return f"{where} was built from an older _native.c (it has no tables())"
    theirs, ours = mod.tables(), tables()
    diff = [f"{k}: C has {theirs.get(k)!r}, Python {v!r}" for k, v in ours.items() if theirs.get(k) != v]
    return f"{where} was built from another _native.c than this pyxccl's: " + "; ".join(diff) if diff else None


NATIVE_REFUSED = None if _native is None else native_mismatch(_native)
if NATIVE_REFUSED is not None:
    warnings.warn(f"pyxccl: the native executor is off, the Python one runs every one-host call: {NATIVE_REFUSED}. "
                  f"Rebuild it (`python setup.py build_ext --inplace` in a checkout, or reinstall pyxccl)",
                  RuntimeWarning, stacklevel=2)
    _native = None
if _native is not None:     # non-temporal copies into a call's buffers that together pass the cache (_native.c)
    _nt = _env.get("PYXCCL_NT_BYTES")
    _native.nt_threshold(copies.last_level_cache() if _nt is None else _nt)
    # ... and into windows: plainly, by such stores, or (auto) each prepared call the way that costs less
    _native.set_nt_windows(_WINDOW_WAYS[_env.get("PYXCCL_NT_WINDOWS")])


def numpy_differs(mod) -> frozenset:
    """The (dtype, op) codes for which the C loops of ``mod`` do not give numpy's bits on the float
    values where the two could part: signed zeros, quiet and signalling NaNs of either sign,
    infinities (numpy has changed which of -0.0 and +0.0 np.minimum returns). Calls of those run in
    Python. Left out: which NaN a sum or product of two NaNs gives (numpy's own loops pick one by
    position in the array); integer ops have one answer (wrap-around)."""
    differs = set()
    for t, u, snan in ((np.float32, np.uint32, 0x7FA00001), (np.float64, np.uint64, 0x7FF4000000000001)):
        sign = np.array(1, u) << (8 * np.dtype(u).itemsize - 1)
        signalling = np.array([snan, snan | sign], u).view(t)       # (a copy keeps their bits)
        v = np.concatenate([np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.5, -1.0, 3e38], t), signalling])
        a, b = np.repeat(v, v.size), np.tile(v, v.size)         # every pair, both ways round
        for op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX):
            x, y = (a, b) if op in (ReduceOp.MIN, ReduceOp.MAX) else (a[(a == a) | (b == b)], b[(a == a) | (b == b)])
            codes = _DTYPES[np.dtype(t)], _OPS[op]
            want, got = x.copy(), x.copy()
            with np.errstate(all="ignore"):
                _UFUNCS[op](want, y, out=want)
            if not mod.reduce_into(*codes, got, y) or want.tobytes() != got.tobytes():
                differs.add(codes)
    return frozenset(differs)


_DIFFERS = numpy_differs(_native) if _native is not None else frozenset()


def native_codes(dt: np.dtype, op) -> tuple[int, int] | None:
    """(dtype, op) codes for the native executor, or None when a call of ``dt`` and ``op`` runs in
    Python (not built, turned off, a dtype or reduction the C code does not know, or one where it
    would not give numpy's bits: ``numpy_differs``)."""
    if _native is None or not _env.get("PYXCCL_NATIVE"):
        return None
    if op is None:
        return (-1, -1) if dt.type.__module__ == "numpy" else None     # ml_dtypes' arrays export no buffer
    codes = _DTYPES.get(dt, -1), _OPS.get(op, -1)
    return codes if _native.can_reduce(*codes) and codes not in _DIFFERS else None


class _Segment(Semantics):
    blocking = True
    __slots__ = ("ctx", "seg", "bufs", "reduce", "dt", "me", "parity", "mine", "posted", "free")

    def __init__(self, ctx, bufs, reduce, mine, dt):
        self.ctx, self.seg, self.bufs, self.reduce, self.mine = ctx, ctx.segment, bufs, reduce, mine
        self.dt, self.me, self.parity, self.posted, self.free = dt, ctx.rank, 0, None, False

    def begin(self, r, k, free):
        self.parity, self.posted, self.free = self.seg.begin(free), None, free
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
        seg.publish(*self.mine, header=not self.free)
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
        t = type(o)
        if t is Get:
            self._get(o, self.parity)
        elif t is Put:
            self._put(o)
        return True

    def _put(self, o: Put) -> None:
        src = self.bufs[o.buf][o.off:o.off + o.count]
        if o.peer != self.me:
            self.seg.write(o.peer, self.parity, src, o.dst_off * src.itemsize)
            return
        posted = self.posted        # into my own posted buffer: a plain copy
        if posted is None or o.dst_off < 0 or o.dst_off + o.count > len(posted):
            raise self.seg.read_error(self.me, self.parity, (o.dst_off + o.count) * src.itemsize, writing=True)
        copies.copy(posted[o.dst_off:o.dst_off + o.count], src)

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
            copies.copy(dst, src)


class _Compile(Semantics):
    """Records what the walker runs, in its order, as instructions of the native executor."""
    blocking = True

    def __init__(self, itemsize: int):
        self.b, self.code = itemsize, []

    def _add(self, *ins) -> None:
        self.code.append(ins + (0,) * (_WIDTH - len(ins)))

    def begin(self, r, k, free):
        self._add(_BEGIN, int(free))
        return True

    def local(self, r, k, o):
        b, t = self.b, type(o)
        if t is Copy:
            self._add(_COPY, _BUFS[o.src], o.src_off * b, _BUFS[o.dst], o.dst_off * b, o.count * b, o.reduce)
        elif t is Post:
            self._add(_POST, _BUFS[o.buf], o.off * b, o.count * b, o.writes)
        else:
            self.take(r, k, o)

    def publish(self, r, k):
        self._add(_PUBLISH, k)

    def take(self, r, k, o):
        t = type(o)
        if t is Sync:
            self._add(_SYNC, o.peer, k)
        elif t is Put:
            b = self.b
            self._add(_PUT, o.peer, o.dst_off * b, _BUFS[o.buf], o.off * b, o.count * b, k)
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
        try:
            walk([s], _Segment(ctx, bufs, reduce, (seq, *call), dt))
        except BaseException:
            if any(type(o) is Post and o.writes for step in s.steps for o in step):
                seg.revoke()    # what I posted goes back to my caller now: no peer may write into it
            raise
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
    if type(done) is not int:
        try:
            _stopped(ctx, seg, prog, mine, where, settings, deadline, op, done)
        except BaseException:
            code = np.frombuffer(prog, np.int64).reshape(-1, _WIDTH)
            if ((code[:, 0] == _POST) & (code[:, 4] != 0)).any():
                seg.revoke()    # what I posted goes back to my caller now: no peer may write into it
            raise
    else:
        seg.round = done


def _stopped(ctx, seg, prog, mine, where, settings, deadline, op, done) -> None:
    """``native``'s run stopped (``done``: its status and where): wait on, or raise what stopped it."""
    while type(done) is not int:            # (status, pc, round, peer, err): it stopped
        status, pc, seg.round, peer, err = done
        seg.deadline, seg.op, seg.seq = deadline, op, mine[0]      # named in the errors below
        if status == _NAPPED:       # a wait slept: is the call still alive? (then wait without spinning)
            if time.monotonic() > deadline:
                raise seg.timed_out(peer)
            seg.check_alive(peer, mine[0])
            settings = (0, 0, _layout.longer(settings[2]), *settings[3:])
        elif status == _MISMATCH:
            theirs = seg.call_of(peer, seg.round & 1)
            raise ctx.mismatch(peer, mine[0], theirs[1:], their_seq=theirs[0])
        elif status in (_BOUNDS, _CMA_FAILED):
            writing = int(np.frombuffer(prog, np.int64, 1, pc * _WIDTH * 8)[0]) == _PUT
            raise seg.read_error(peer, seg.round & 1, err, OSError(err, os.strerror(err))
                                 if status == _CMA_FAILED else None, writing=writing)
        elif status == _BUFFER:     # found before anything ran (peer: the buffer, err: the bytes it needs)
            raise buffer_error(ctx.rank, op, mine[0], peer, err, where, seg.area)
        else:
            raise RuntimeError(f"rank {ctx.rank}: {op}: the native executor cannot run this call (status "
                               f"{status}); set PYXCCL_NATIVE=0 and report it")
        done = _native.run(prog, pc, seg.layout, seg.round, mine, where, settings)
    seg.round = done


def buffer_error(rank: int, op: str, seq: int, b: int, need: int, where: tuple, area: int) -> ProtocolError:
    """The error of a native run refused because buffer ``b`` (an id of ``_BUFS``) of ``where`` = (in,
    out, tmp) is missing, read-only or shorter than the ``need`` bytes its program reaches."""
    name = next(k for k, v in _BUFS.items() if v == b)
    if name == "win":
        what = f"the segment's window has {area}"
    elif where[b] is None:
        what = "none was given"
    else:
        m = memoryview(where[b])
        what = f"it has {m.nbytes}" + (" and is read-only" if m.readonly and m.nbytes >= need else "")
    return ProtocolError(f"rank {rank}: {op} (#{seq} on this communicator): the compiled program reaches byte "
                         f"{need} of the {name!r} buffer and {what}; nothing was run: pass buffers of the sizes "
                         f"the program was compiled for (a prepared call's arrays have its first call's sizes)",
                         rank=rank, op=op, seq=seq)


def attach_segment(ctx, broadcast_object, allgather_object) -> None:
    """Collective: give a one-host communicator its shared segment (rank 0 makes it, the others open
    it through /proc/<pid>/fd; every rank must manage, or none uses it). The object collectives are
    the communicator's own."""
    if ctx.mesh.transport == "tcp" or len(set(ctx.hosts)) > 1 \
            or any(ctx.link_class(0, p) != "shm" for p in range(1, ctx.size)):
        return
    from ..transport.cma import works
    from ..transport.segment import HostSegment, ordering_problem
    area = _env.get("PYXCCL_SHM_AREA_BYTES") if ctx.rank == 0 else 0
    seg = HostSegment(0, ctx.size, area) if ctx.rank == 0 else None
    where = broadcast_object((os.getpid(), seg.fd, seg.area) if seg else None)
    try:
        if seg is None:
            seg = HostSegment.open(ctx.rank, ctx.size, where[2], where[0], where[1])
        ok = True
    except OSError:     # /proc/<pid>/fd not openable here (ptrace rules): no fast path
        ok = False
    why = ordering_problem()        # the Python executor cannot run safely on this CPU: no fast path
    if why is not None:
        warnings.warn(f"pyxccl: rank {ctx.rank}: the one-host fast path is off: {why}", RuntimeWarning,
                      stacklevel=2)
        ok = False
    cma = ok and (ctx.rank == 0 or works(*(int(x) for x in seg.pids[0])))
    # (what each rank sees of its cores too: the schedules must agree on the pieces they cut)
    oks = allgather_object((ok, cma, ok and not seg.oversubscribed))
    if not all(o for o, _, _ in oks):
        if seg is not None:
            seg.close()
        return
    seg.cma = all(c for _, c, _ in oks) and _env.get("PYXCCL_CMA")
    seg.pipelined = all(f for _, _, f in oks)
    seg.check_alive = ctx.check_alive
    ctx.use_segment(seg)
