"""Prepared calls: a collective call decided once, and the one function that runs it.

Every collective call becomes a ``Prepared``: the plan and the schedule it runs, its fingerprint
words, what the flight recorder and the traffic counters say of it, and the shapes of its buffers.
``Prepared.start`` runs it, whether the full path made it just now (comm.py: the argument checks,
then ``Context.prepare``) or a repeated call found it again under its key: sequence numbers, the
flight recorder, failure handling and AVG's division are in one place.

A call's key (``key``) is its name, the form of each buffer (numpy or torch, dtype, size, or None),
whether output and input are one object, its root, op, algorithm, timeout and the issuing thread as
the fingerprints name it: everything the full path decided. A repeated call with the key of a kept
``Prepared`` only checks what a key cannot say (``again``: the arrays are contiguous, the output is
writable, input and output are apart unless in the in-place form) and allocates what the key says
is allocated (``recvbuf=None``); anything else takes the full path, which gives the same result or
the proper error. A call whose key cannot say everything (the v-variants' counts, a compressed call,
a buffer of another type) has no key: it runs once, through the same ``start``.
"""
from __future__ import annotations

import sys
import threading
from time import monotonic

import numpy as np

from .._errors import CommAbortedError, CommError
from ..dtypes import as_array
from ..primitives import PRIMITIVES, apart
from . import onehost
from .engine import Work
from .onehost import _native
from .recorder import DONE, RUNNING, ended, started
from .counters import schedule_io

native_run = _native.run if _native is not None else None
_KEPT = 256              # prepared calls kept per communicator
RECENT_CALLS = 8         # collectives a context remembers for naming them in mismatch errors (a power of 2)
_EMPTY = np.empty(0, np.uint8)


FULL_PATH = object()     # what Prepared.again returns for a call that needs the full path


class _NoKey(Exception):
    """A call that cannot be kept: something about it is not in its key."""


_NONE = (2, None, None)


def _form(obj) -> tuple:
    """What a key says of a buffer argument other than None (``_NONE``): (kind, dtype, size), kind 0 for
    numpy, 1 for torch (the kind comes first: a numpy dtype is never compared with a torch one)."""
    if type(obj) is np.ndarray:
        return 0, obj.dtype, obj.size
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor:
        return 1, obj.dtype, obj.numel()
    raise _NoKey


def key(name: str, inp, out, root, op, algorithm, timeout, thread: int):
    """The key a call is kept under (None: it cannot be): ``inp`` and ``out`` are the objects this rank
    reads and writes (None: none, or ``out`` to be allocated), ``thread`` the issuing thread's digest
    in the fingerprints (0 when not checked). Made and hashed on every call: two numpy arrays make a
    flat tuple (the common case, cheapest), anything else one with a (kind, dtype, size) per buffer."""
    if root is not None and type(root) is not int:
        return None
    if type(inp) is np.ndarray and type(out) is np.ndarray:
        return (name, 0, inp.dtype, inp.size, 0, out.dtype, out.size, inp is out, root, op, algorithm, timeout,
                type(timeout), thread)
    try:
        return (name, _NONE if inp is None else _form(inp), _NONE if out is None else _form(out), inp is out, root,
                op, algorithm, timeout, type(timeout), thread)
    except _NoKey:
        return None


class _Refused(Exception):
    """What ``as_array`` raises for a buffer a repeat cannot use as it is (the full path says why)."""


def _array(obj, writable: bool):
    """``obj`` as a numpy array if a prepared call can use it as it is, else None."""
    if type(obj) is np.ndarray:
        f = obj.flags
        return obj if f.c_contiguous and (f.writeable or not writable) else None
    try:
        return as_array(obj, what="", writable=writable, ctx=_Refused)
    except _Refused:
        return None


class Prepared:
    """One collective call, decided: run it with :meth:`start` (after :meth:`bind` for a repeat)."""
    __slots__ = ("ctx", "plan", "name", "s", "words", "record", "timeout", "what", "tally", "prog", "settings",
                 "avg", "writes", "alloc", "prim", "at", "tmp", "fast")

    def __init__(self, ctx, plan, name: str, s, size, thread: str, word: int, words, timeout, what: tuple, *,
                 args: dict, writes: bool, allocates: int | None):
        itemsize = plan.dtype.itemsize
        self.ctx, self.plan, self.name, self.s, self.words, self.timeout = ctx, plan, name, s, words, timeout
        self.record = (plan, name, size, thread, words)        # for naming the call in a mismatch error
        self.what = what                                        # for the flight recorder
        self.tally = ctx.traffic.tally(name, what[3], *schedule_io(s, itemsize, plan.codec, plan.compressed), s,
                                       itemsize)       # for comm.traffic()
        self.prog = onehost.program(s, itemsize) if plan.codes is not None else None   # else plan.run
        self.settings = self.prog and (*ctx.segment.waits, *plan.codes)
        self.avg, self.writes, self.alloc = plan.avg, writes, allocates     # alloc: elements of a new output
        self.prim = PRIMITIVES[plan.primitive]
        self.at = self.prim.in_place_at(ctx.rank, args, itemsize)
        self.tmp = s.scratch
        # the blocking call in one C call (run); AVG divides after its rounds, so finishes in Python
        self.fast = None if self.prog is None else _native.Call(
            self.prog, ctx.segment, words, self.settings, ctx, ctx.engine, ctx.recorder, what, self.record,
            self.tally, writes, not self.avg, RECENT_CALLS, (RUNNING, DONE), word)

    def again(self, inp, out, async_op):
        """Run a repeated call on the user's ``inp`` and ``out`` (``start``'s result), or return
        ``FULL_PATH`` if anything about them needs the full path (nothing ran then)."""
        if type(out) is np.ndarray:
            f = out.flags
            if not f.c_contiguous or (self.writes and not f.writeable):
                return FULL_PATH
            result = dst = out
        elif out is None:
            result = dst = None if self.alloc is None else np.empty(self.alloc, self.plan.dtype)
        else:
            result = out
            dst = _array(out, self.writes)
            if dst is None:
                return FULL_PATH
        if inp is None or inp is out:
            src = dst if inp is not None else None
        else:
            src = _array(inp, False)
            if src is None or (dst is not None and not apart(self.prim, src, dst, self.at)):
                return FULL_PATH
        if async_op is False:
            return self.run(src, dst, result)
        if async_op is not True:
            return FULL_PATH
        return self.start(src, dst, result, True)

    def start(self, inp, out, result, async_op: bool, codec=None, after=None):
        """Run the call on arrays ``inp`` and ``out`` (None: none), in issue order; return ``result``,
        or a Work with ``async_op``. ``codec``: the call's compressor, ``after()``: what runs once its
        schedule has (compression.py). (A blocking call comes through ``run``.)"""
        ctx = self.ctx
        eng = ctx.engine
        with eng.lock:      # numbers and place in line under one lock: threads run in number order
            if ctx.closed or ctx.error is not None:
                ctx.usable(self.name)
            ctx.seq += 1
            seq = ctx.seq
            ctx.coll_seq = cseq = (ctx.coll_seq + 1) & 0xFFFFFFFF
            deadline = monotonic() + (ctx.timeout if self.timeout is None else self.timeout)
            inline = not async_op and eng.claim()
            if inline:
                entry = ctx.recorder.begin(seq, cseq, self.what)
            else:
                entry = ctx.recorder.issue(seq, cseq, self.what)
                work = Work(self.name, cseq, ctx.rank, deadline, self.plan.algo.name)
                work._from_world, work._entry = ctx.to_comm, entry

                def queued(w):
                    started(entry)
                    self._execute(entry, seq, cseq, deadline, inp, out, codec, after)
                    return result
                eng.enqueue(queued, work)
        if not inline:
            return work if async_op else work.result()
        try:
            self._execute(entry, seq, cseq, deadline, inp, out, codec, after)
        finally:
            eng.release()
        return result

    def run(self, inp, out, result):
        """``start(inp, out, result, False)``: the blocking call. One the native executor runs, when the
        engine is idle, is one C call (``fast``: _native.Call, which numbers it, opens and ends its
        recorder entry, counts it and runs it as ``start`` and ``_execute`` would); anything else, or
        an engine busy with another call, goes through ``start``."""
        fast = self.fast
        if fast is None:
            return self.start(inp, out, result, False)
        done = fast(inp, out, self.ctx.scratch(self.tmp, self.plan.dtype) if self.tmp else None)
        if done is True:
            return result
        return self.settle(inp, out, result, done)

    def settle(self, inp, out, result, done):
        """The call after ``fast`` (or ``fast.again``) answered ``done`` other than done: nothing ran
        (False: the engine is busy; None: start() says what is wrong with the buffers, or, for a repeat
        without its key, ``FULL_PATH``), or it is this thread's to finish (``_finish``)."""
        if result is FULL_PATH:
            if done is None:
                return FULL_PATH
            result = out
        if done is False or done is None:
            return self.start(inp, out, result, False)
        return self._finish(inp, out, result, *done)

    def _finish(self, inp, out, result, done, entry, seq: int, cseq: int, t0: float):
        """The rest of a call ``fast`` numbered and left to finish here (with the engine claimed): a run
        that stopped (a wait slept, or an error), a communicator that failed meanwhile (``done`` None),
        or AVG's division."""
        ctx = self.ctx
        try:
            if done is None:
                ctx.usable(self.name)
            if type(done) is not int:
                tmp = ctx.scratch(self.tmp, self.plan.dtype) if self.tmp else None
                onehost.native(ctx, self.prog, (cseq,) + self.words, (inp, out, tmp), self.settings,
                               t0 + (ctx.timeout if self.timeout is None else self.timeout), self.name, done)
            if self.avg:
                np.divide(out, ctx.size, out=out)
            ended(entry)
        except CommError as e:
            raise self._comm_failed(e, entry, seq, cseq) from None
        except BaseException as e:
            self._broke(e, entry, cseq)
            raise
        finally:
            ctx.engine.release()
        return result

    def _comm_failed(self, e: CommError, entry, seq: int, cseq: int) -> CommError:
        """The error to raise for a call that failed with ``e``: the communicator is aborted (a half-done
        collective leaves the ranks out of step)."""
        ctx = self.ctx
        e = ctx.failure(e, self.name, seq, cseq, entry)
        ctx.abort(e)
        return e

    def _broke(self, e: BaseException, entry, cseq: int) -> None:
        """A call stopped by what is not the library's error (a bug, MemoryError, KeyboardInterrupt): the
        ranks are out of step all the same; the others are told at once, and the entry says how it ended
        (the caller re-raises ``e``)."""
        ctx = self.ctx
        ended(entry, e)
        ctx.abort(CommAbortedError(
            f"rank {ctx.rank}: {self.name} #{cseq} stopped half done on {type(e).__name__}: {e}; this "
            f"communicator is aborted: make a new one", cause=e, rank=ctx.rank, op=self.name, seq=cseq))

    def _execute(self, entry, seq: int, cseq: int, deadline: float, inp, out, codec, after) -> None:
        ctx = self.ctx
        try:
            if ctx.closed or ctx.error is not None:       # a call queued behind one that failed
                ctx.usable(self.name)
            i = cseq & (RECENT_CALLS - 1)       # names it in a mismatch error
            ctx.recent[i], ctx.recent_calls[i] = cseq, self.record
            self.tally.count()      # for comm.traffic()
            tmp = ctx.scratch(self.tmp, self.plan.dtype) if self.tmp else None
            if self.prog is not None:
                seg, mine, where = ctx.segment, (cseq,) + self.words, (inp, out, tmp)
                done = native_run(self.prog, 0, seg.layout, seg.round, mine, where, self.settings)
                if type(done) is int:
                    seg.round = done
                else:
                    onehost.native(ctx, self.prog, mine, where, self.settings, deadline, self.name, done)
            else:
                self.plan.run(self.s, _bufs(inp, out, tmp), cseq, self.words, self.name, deadline, codec)
            if after is not None:
                after()
            if self.avg:
                np.divide(out, ctx.size, out=out)
        except CommError as e:
            raise self._comm_failed(e, entry, seq, cseq) from None
        except BaseException as e:
            self._broke(e, entry, cseq)
            raise
        ended(entry)


def _bufs(inp, out, tmp) -> dict:
    """The named, flat buffers of a schedule."""
    bufs = {"in": _EMPTY} if inp is None and out is None else {}
    if inp is not None:
        bufs["in"] = inp.reshape(-1)
    if out is not None:
        bufs["out"] = bufs["in"] if out is inp else out.reshape(-1)
    if tmp is not None:
        bufs["tmp"] = tmp
    return bufs


class PreparedCalls(dict):
    """The prepared calls of one communicator, by key: ``get(key)`` (a dict's: no lock, a dict read is
    atomic; it raises TypeError for a key with an unhashable part, which is never kept); changes are
    made under a lock. At most _KEPT: a new one evicts the oldest not used (``used``, noted by the caller
    of ``get``) since it was last passed over, so that a call repeated all along stays however long ago it
    was kept (evicting by age alone, a repeat kept early that goes by its key, an allocating or async form,
    was evicted by a call first seen after it in the same loop, and took the full path once more).

    ``last``: per (call name, id of its output array, or of None where the rank has no output), the
    Prepared of the last blocking repeat on numpy arrays that ran in C: a repeat with the very root, op,
    algorithm and timeout objects (``is``) of its Prepared's latest remembered repeat, from a thread of
    the same word, needs no key: ``fast.again`` checks those objects, the thread and the arrays against
    the key's in C (``remember``: ``fast.expect``; an id is only where to look: another array there is
    checked the same way), and returns True when it ran, else ``Prepared.settle`` takes it
    (``FULL_PATH`` for its result: the output, or the full path when anything is not the key's).
    ``forms``: the same per (name, id of the output, and the ids of the root, op, algorithm and timeout
    objects), where a call whose ``last`` is of another form looks next: calls of two forms taking turns
    on one output (``barrier()`` and ``barrier(algorithm=...)``, a sum and a max into one array) each
    repeat in C instead of going through their keys every time."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self.used: set = set()          # keys got since the eviction passed them (a set's add: no lock)
        self.last: dict = {}
        self.forms: dict = {}

    def remember(self, name: str, inp, out, root, op, algorithm, timeout, p: Prepared) -> None:
        """Prepared call ``p`` just ran blocking on ``inp`` and ``out`` under its key: its repeats on
        arrays like these take ``last``."""
        if p.fast is None or (inp is not None and type(inp) is not np.ndarray):
            return
        if out is None:         # a rank without output (a gather's non-root): unless it allocates one
            if p.alloc is not None:
                return
        elif type(out) is not np.ndarray:
            return
        p.fast.expect(np.ndarray, None if inp is None else inp.dtype, 0 if inp is None else inp.nbytes,
                      None if out is None else out.dtype, 0 if out is None else out.nbytes, inp is out,
                      -1 if p.at is None else p.at, p.prim.gathers, root, op, algorithm, timeout)
        last, forms = self.last, self.forms
        if len(forms) >= _KEPT:         # (last's keys are forms' cut short: it holds no more)
            self.last, self.forms = last, forms = {}, {}
        last[name, id(out)] = forms[name, id(out), id(root), id(op), id(algorithm), id(timeout)] = p

    def keep(self, k, p: Prepared) -> None:
        try:
            hash(k)
        except TypeError:
            return
        with self._lock:
            while k not in self and len(self) >= _KEPT:
                old = next(iter(self))
                if old in self.used:        # used since: a second chance, as the newest
                    self.used.discard(old)
                    self[old] = self.pop(old)
                else:
                    del self[old]
            self[k] = p

    def clear(self) -> None:
        """Forget every prepared call (the plans they ran changed)."""
        with self._lock:
            super().clear()
            self.used, self.last, self.forms = set(), {}, {}
