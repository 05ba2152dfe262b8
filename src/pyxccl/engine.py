"""The engine: one ordered worker per communicator (its "communication stream"),
Work handles, and the executor that runs a Schedule on the transports.

Operations of a communicator run in the order they were issued. An async
operation is queued for the worker; a blocking one runs on the caller's thread
when nothing is queued ahead of it (saving two thread switches on the hot
path) and is queued otherwise. Either way an execution lock keeps them in order.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from ._errors import CommAbortedError, CommError, CommTimeoutError, PyxcclError
from .dtypes import DTYPE_CODE
from .mailbox import RecvRequest
from .ops import reducer
from .schedule import Copy, Recv, Schedule, Send


class Work:
    """Handle of an operation started with ``async_op=True``.

    >>> w = comm.allreduce(x, async_op=True)   # doctest: +SKIP
    >>> compute()                              # overlaps with the allreduce
    >>> w.wait()
    """

    def __init__(self, op: str, seq: int, rank: int, deadline: float):
        self.op, self.seq, self._rank, self._deadline = op, seq, rank, deadline
        self._ran = threading.Event()
        self._exc: BaseException | None = None
        self._result = None
        self._recvs: list[RecvRequest] = []   # receives still landing after the worker moved on
        self._callbacks: list = []
        self._cancel = None
        self._from_world = None  # world rank -> this communicator's rank, for naming peers

    def _finish(self, result=None, exc: BaseException | None = None) -> None:
        self._result, self._exc = result, exc
        self._ran.set()
        if exc is not None or not self._recvs:
            self._fire()
            return
        done, lock = set(), threading.Lock()

        def one_done(req):
            with lock:
                if id(req) in done:
                    return
                done.add(id(req))
                last = len(done) == len(self._recvs)
            if last:
                self._fire()
        for r in self._recvs:
            r.on_done = one_done
            if r.event.is_set():        # it may have landed before on_done was set
                one_done(r)

    def _fire(self) -> None:
        for cb in self._callbacks:
            cb(self)

    def add_done_callback(self, cb) -> None:
        """Call ``cb(work)`` from the completing thread once the operation is done."""
        self._callbacks.append(cb)
        if self.is_completed():
            cb(self)

    def is_completed(self) -> bool:
        """True once the operation finished, successfully or not; never blocks."""
        return self._ran.is_set() and (self._exc is not None or all(r.event.is_set() for r in self._recvs))

    def exception(self) -> BaseException | None:
        """The error the operation failed with (None if it succeeded or is still running)."""
        if self._exc is None and self._ran.is_set():
            for r in self._recvs:
                if r.error is not None:
                    return r.error
        return self._exc

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; raise its error. ``timeout`` (s) caps this wait only."""
        # With no timeout of its own, give the operation a moment past its deadline to report its
        # own, more precise error (which peer it waited for).
        end = self._deadline + 1.0 if timeout is None else min(self._deadline, time.monotonic() + timeout)
        if not self._ran.wait(max(0.0, end - time.monotonic())):
            raise self._timeout(None)
        if self._exc is not None:
            raise self._exc
        for r in self._recvs:
            if not r.event.wait(max(0.0, end - time.monotonic())):
                if self._cancel is not None and end >= self._deadline:
                    self._cancel(r)
                raise self._timeout(None if r.peer is None or self._from_world is None
                                    else self._from_world(r.peer))
            if r.error is not None:
                raise r.error
        return True

    def source_rank(self) -> int:
        """For an ``irecv``: wait, then return the rank the message came from (useful with ``src=None``)."""
        if self.op != "irecv":
            raise TypeError(f"rank {self._rank}: source_rank() is for irecv Works, not {self.op}")
        self.wait()
        return self._from_world(self._recvs[0].peer)

    def result(self):
        """Wait, then return what the blocking call would have returned."""
        self.wait()
        return self._result

    def _timeout(self, peer) -> CommTimeoutError:
        who = f"rank {peer}" if peer is not None else "a peer"
        return CommTimeoutError(
            f"rank {self._rank}: {self.op} (#{self.seq} on this communicator) timed out waiting for "
            f"{who}; that rank is slow, stuck or did not call {self.op}: check its output, or raise "
            f"the deadline with timeout= or PYXCCL_TIMEOUT", rank=self._rank, peer=peer, op=self.op, seq=self.seq)


_QUEUED = object()


class _Call:
    """What an inline call's function sees of its Work: the sequence number."""
    __slots__ = ("seq", "_recvs", "_cancel")

    def __init__(self, seq: int):
        self.seq, self._recvs, self._cancel = seq, [], None


class Engine:
    """The ordered worker of one communicator."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._exec = threading.Lock()
        self._pending = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def try_inline(self, fn, arg):
        """Run ``fn(arg)`` now on this thread if nothing is queued or running; else return
        ``_QUEUED`` without running it. The blocking hot path: no Work, no thread switch."""
        with self._lock:
            if self._pending:
                return _QUEUED
            self._pending = 1
        try:
            with self._exec:
                return fn(arg)
        finally:
            with self._lock:
                self._pending -= 1

    def submit(self, fn, work: Work, *, async_op: bool) -> Work:
        with self._lock:
            inline = not async_op and self._pending == 0
            self._pending += 1
        if inline:
            with self._exec:
                self._run(fn, work)
        else:
            self._q.put((fn, work))
        return work

    def _run(self, fn, work: Work) -> None:
        try:
            work._finish(fn(work))
        except BaseException as e:  # noqa: BLE001  (handed to the caller through Work)
            work._finish(exc=e)
        finally:
            with self._lock:
                self._pending -= 1

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            with self._exec:
                self._run(*item)

    def stop(self) -> None:
        self._q.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def annotate(err: BaseException, op: str, seq: int, rank: int) -> BaseException:
    """The same error, its message prefixed with the operation that met it."""
    if not isinstance(err, PyxcclError) or err.op is not None:
        return err
    kw = dict(rank=rank, peer=err.peer, op=op, seq=seq)
    msg = f"{op} (#{seq} on this communicator): {err}"
    if isinstance(err, CommAbortedError):
        return CommAbortedError(msg, cause=err.cause, **kw)
    return type(err)(msg, **kw)


def run_schedule(comm, s: Schedule, bufs: dict, *, op, key, opname: str, seq: int, deadline: float) -> None:
    """Run rank ``s.rank``'s steps; ``bufs`` maps buffer names to flat typed arrays."""
    reduce = reducer(op) if op is not None else None
    mailbox, to_world = comm._mesh.mailbox, comm._world_ranks
    dcode = DTYPE_CODE[next(iter(bufs.values())).dtype]
    for step in s.steps:
        reqs = []
        for o in step:
            if type(o) is Copy:
                src = bufs[o.src][o.src_off:o.src_off + o.count]
                dst = bufs[o.dst][o.dst_off:o.dst_off + o.count]
                if o.reduce:
                    reduce(dst, src)
                elif src.ctypes.data != dst.ctypes.data:   # an in-place call copies nothing
                    np.copyto(dst, src)
        for o in step:
            if type(o) is Recv:
                req = RecvRequest(to_world[o.peer], key, bufs[o.buf][o.off:o.off + o.count],
                                  reduce if o.reduce else None, opname)
                comm._track(req)
                mailbox.post(req)
                reqs.append(req)
        try:
            for o in step:
                if type(o) is Send:
                    comm._peer(o.peer).send(key, dcode, bufs[o.buf][o.off:o.off + o.count].view(np.uint8),
                                            deadline)
            for req in reqs:
                if not req.event.wait(max(0.0, deadline - time.monotonic())):
                    raise CommTimeoutError(
                        f"rank {comm.rank}: {opname} (#{seq} on this communicator) timed out waiting for "
                        f"rank {comm._from_world(req.peer)}; that rank is slow, stuck or did not call "
                        f"{opname}: check its output, or raise the deadline with timeout= or PYXCCL_TIMEOUT",
                        rank=comm.rank, peer=comm._from_world(req.peer), op=opname, seq=seq)
                if req.error is not None:
                    raise req.error
        except CommError:
            for req in reqs:
                mailbox.cancel(req)
            raise
        finally:
            for req in reqs:
                comm._untrack(req)
