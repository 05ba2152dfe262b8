"""Prepared calls: a blocking collective made again, exactly as before, skips the full path.

The first call of a shape (primitive, dtypes, sizes, root, op, algorithm,
timeout, from one thread) takes the full path: argument checks, plan,
schedule, fingerprint. The call is then kept as a ``Prepared`` under its key;
the next call with the same key only checks what the key cannot say (the
arrays are contiguous, the output writable, input and output apart, the
timeout's type, the communicator usable and idle), takes its numbers and
runs the schedule: the compiled program, when it runs natively on the
one-host segment, else through its plan. Anything
else (a torch tensor, async_op, an engine with work queued, a failed
communicator) takes the full path, which gives the same result or raises
the proper error. (A thread is known by its identity here: one renamed after
its first call keeps its first name in the fingerprints of prepared calls.)
"""
from __future__ import annotations

import time
from threading import get_ident

import numpy as np

from .._errors import CommError
from ..primitives import PRIMITIVES
from . import onehost
from .onehost import _native
from .recorder import ended
from .traffic import schedule_io

native_run = _native.run if _native is not None else None
_KEPT = 256              # prepared call shapes per communicator


class Prepared:
    __slots__ = ("plan", "name", "s", "prog", "words", "settings", "record", "timeout", "writes", "avg", "what",
                 "inner", "block", "io")

    def __init__(self, plan, name, s, size, thread, words, timeout, writes, what):
        seg = plan.ctx.segment
        self.plan, self.name, self.s, self.words, self.timeout, self.writes = plan, name, s, words, timeout, writes
        self.prog = onehost.program(s, plan.dtype.itemsize) if plan.codes else None     # else: plan.run
        self.settings = plan.codes and (*seg.waits, *plan.codes)
        self.record = (plan, name, size, thread, words)
        self.what = what            # for the flight recorder
        self.io = (what[3], *schedule_io(s, plan.dtype.itemsize))      # for the traffic counters
        self.avg = plan.avg
        # The in-place form the full path lets input and output overlap in (_checks.Check.apart); prepared
        # calls have equal blocks: the smaller buffer ("inner") is block number ``block`` of the larger.
        prim = PRIMITIVES[plan.primitive]
        self.inner = {"count": "out", "blocks": "in" if prim.gathers else "out"}.get(prim.shape)
        self.block = plan.ctx.rank if prim.shape == "blocks" else 0

    def in_place(self, inp: np.ndarray, out: np.ndarray) -> bool:
        """Are overlapping ``inp`` and ``out`` the call's in-place form?"""
        if self.inner is None:
            return False
        inner, outer = (inp, out) if self.inner == "in" else (out, inp)
        return (inner.__array_interface__["data"][0]
                == outer.__array_interface__["data"][0] + self.block * inner.nbytes)


class Quick:
    """The prepared calls of one communicator (its ``Context``)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._prepared: dict = {}

    def clear(self) -> None:
        """Forget every prepared call (their fingerprints or plans changed)."""
        self._prepared.clear()

    def keep(self, key, plan, name: str, s, size, thread: str, words, timeout, writes: bool, what) -> None:
        """After the full path decided a call: keep it under ``key`` if it can run prepared."""
        if key is None:
            return
        if len(self._prepared) >= _KEPT:
            del self._prepared[next(iter(self._prepared))]        # the oldest
        try:
            self._prepared[(key, get_ident())] = Prepared(plan, name, s, size, thread, words, timeout, writes, what)
        except TypeError:       # an unhashable argument (some op object): never prepared
            pass

    def __call__(self, key, inp, out) -> bool:
        """Run the call kept under ``key`` on arrays ``inp`` and ``out`` (either may be None); False if
        there is none or anything about this call needs the full path (nothing ran then)."""
        try:
            p = self._prepared.get((key, get_ident()))
        except TypeError:
            return False
        if p is None or type(key[-1]) is not type(p.timeout):    # a key ends with the timeout: True == 1
            return False
        if out is not None:
            f = out.flags
            if not f.c_contiguous or (p.writes and not f.writeable):
                return False
        if inp is not None and inp is not out and not inp.flags.c_contiguous:
            return False
        if inp is not None and out is not None and inp is not out and onehost.overlaps(inp, out) \
                and not p.in_place(inp, out):
            return False        # overlapping, not in place: the full path refuses it
        ctx = self.ctx
        eng = ctx.engine
        lock = eng.lock         # as Context.submit: numbers and place in line under one lock
        lock.acquire()
        if ctx.error is not None or ctx.closed or not eng.claim():
            lock.release()
            return False
        ctx.seq += 1
        seq = ctx.seq
        ctx.coll_seq = cseq = (ctx.coll_seq + 1) & 0xFFFFFFFF
        lock.release()
        entry = ctx.recorder.begin(seq, cseq, p.what)
        try:
            ctx.remember(cseq, p.record)
            ctx.traffic.add(p.name, *p.io)
            deadline = time.monotonic() + (ctx.timeout if p.timeout is None else p.timeout)
            if p.prog is None:
                p.plan.run(p.s, _bufs(inp, out), cseq, p.words, p.name, deadline)
                ended(entry)
                return True
            seg, mine, where = ctx.segment, (cseq, *p.words), (inp, out, None)
            done = native_run(p.prog, 0, seg.layout, seg.round, mine, where, p.settings)
            if type(done) is int:
                seg.round = done
            else:
                onehost.native(ctx, p.prog, mine, where, p.settings, deadline, p.name, done)
            if p.avg:
                out /= ctx.size
            ended(entry)
            return True
        except CommError as e:
            e = ctx.failure(e, p.name, seq, cseq, entry)
            ctx.abort(e)        # a half-done collective leaves the ranks out of step
            raise e from None
        finally:
            eng.release()


def _bufs(inp, out) -> dict:
    """The named buffers of a schedule, flat, as the full path makes them."""
    bufs = {} if inp is not None or out is not None else {"in": np.empty(0, np.uint8)}
    if inp is not None:
        bufs["in"] = inp.reshape(-1)
    if out is not None:
        bufs["out"] = bufs["in"] if out is inp else out.reshape(-1)
    return bufs
