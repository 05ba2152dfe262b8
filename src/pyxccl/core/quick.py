"""Prepared calls: a blocking collective made again, exactly as before, skips the full path.

The first call of a shape (primitive, dtypes, sizes, root, op, algorithm,
timeout, from one thread) takes the full path: argument checks, plan,
schedule, fingerprint. When that plan runs natively on the one-host segment,
the call is kept as a ``Prepared`` under its key; the next call with the same
key only checks what the key cannot say (the arrays are contiguous, the
output writable, the communicator usable and idle), takes its numbers and
runs the compiled program. Anything else (a torch tensor, async_op, an
engine with work queued, a failed communicator) takes the full path, which
gives the same result or raises the proper error.
"""
from __future__ import annotations

import time
from threading import get_ident

from .._errors import CommError
from . import onehost
from .engine import annotate

_RECENT_CALLS = 8        # calls remembered for naming them in mismatch errors


class Prepared:
    __slots__ = ("plan", "name", "prog", "words", "settings", "record", "timeout", "writes", "avg", "disjoint")

    def __init__(self, plan, name, s, size, thread, words, timeout, writes):
        seg = plan.ctx.segment
        self.plan, self.name, self.words, self.timeout, self.writes = plan, name, words, timeout, writes
        self.prog = onehost.program(s, plan.dtype.itemsize)
        self.settings = (int(seg.spin * 1e9), seg.yields, *plan.codes)
        self.record = (plan, name, size, thread, words)
        self.avg, self.disjoint = plan.avg, name == "alltoall"      # alltoall refuses overlapping buffers


class Quick:
    """The prepared calls of one communicator (its ``Context``)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._prepared: dict = {}

    def clear(self) -> None:
        """Forget every prepared call (their fingerprints or plans changed)."""
        self._prepared.clear()

    def keep(self, key, plan, name: str, s, size, thread: str, words, timeout, writes: bool) -> None:
        """After the full path decided a call: keep it under ``key`` if it can run prepared."""
        if key is not None and plan.codes is not None and not s.scratch and len(self._prepared) < 256:
            try:
                self._prepared[(key, get_ident())] = Prepared(plan, name, s, size, thread, words, timeout, writes)
            except TypeError:       # an unhashable argument (some op object): never prepared
                pass

    def __call__(self, key, inp, out) -> bool:
        """Run the call kept under ``key`` on arrays ``inp`` and ``out`` (either may be None); False if
        there is none or anything about this call needs the full path (nothing ran then)."""
        try:
            p = self._prepared.get((key, get_ident()))
        except TypeError:
            return False
        if p is None:
            return False
        if out is not None:
            f = out.flags
            if not f.c_contiguous or (p.writes and not f.writeable):
                return False
        if inp is not None and inp is not out and not inp.flags.c_contiguous:
            return False
        if p.disjoint and onehost.overlap(inp, out):
            return False
        ctx = self.ctx
        eng = ctx.engine
        with eng.lock:          # as Context.submit: numbers and place in line under one lock
            if ctx.error is not None or ctx.closed or not eng.claim():
                return False
            ctx.seq += 1
            seq = ctx.seq
            ctx.coll_seq = cseq = (ctx.coll_seq + 1) & 0xFFFFFFFF
        try:
            calls = ctx._calls
            calls[cseq] = p.record
            calls.pop((cseq - _RECENT_CALLS) & 0xFFFFFFFF, None)
            seg = ctx.segment
            deadline = time.monotonic() + (ctx.timeout if p.timeout is None else p.timeout)
            seg.deadline, seg.op, seg.seq = deadline, p.name, cseq
            onehost.native(ctx, p.prog, (cseq, *p.words), (inp, out, None), p.settings, deadline)
            if p.avg:
                out /= ctx.size
            return True
        except CommError as e:
            e = annotate(e, p.name, seq, ctx.rank)
            ctx.abort(e)        # a half-done collective leaves the ranks out of step
            raise e from None
        finally:
            eng.release()
