"""The engine: one ordered worker per communicator (its "communication stream")
and Work handles.

Operations of a communicator run in the order they were issued. An async
operation is queued for the worker; a blocking one runs on the caller's thread
when nothing is queued ahead of it (saving two thread switches on the hot
path) and is queued otherwise. A call takes its sequence number and its place
in line under one lock (``Engine.lock``), so two threads issuing on one
communicator run in the order of their numbers; an execution lock keeps them
from overlapping.
"""
from __future__ import annotations

import logging
import numbers
import queue
import threading
import time

from .._errors import CommAbortedError, CommTimeoutError, InvalidArgumentError, PyxcclError
from ..transport.mailbox import RecvRequest
from . import onehost
from .recorder import ended


def _lock():
    """_native.Lock (threading.Lock's interface, which a Call takes and checks in C) where the C executor is
    built, else threading.Lock. Not by PYXCCL_NATIVE: that is read as each plan is made, so a communicator
    made with it off makes Calls once it is unset, and they need these locks."""
    return threading.Lock() if onehost._native is None else onehost._native.Lock()


class Work:
    """Handle of an operation started with ``async_op=True``.

    >>> w = comm.allreduce(x, async_op=True)   # doctest: +SKIP
    >>> compute()                              # overlaps with the allreduce
    >>> w.wait()
    """

    def __init__(self, op: str, seq: int, rank: int, deadline: float, algorithm: str | None = None):
        self.op, self.seq, self._rank, self._deadline = op, seq, rank, deadline
        self.algorithm = algorithm            # the algorithm a collective runs
        self._ran = threading.Event()
        self._exc: BaseException | None = None
        self._result = None
        self._recvs: list[RecvRequest] = []   # receives still landing after the worker moved on
        self._callbacks: list = []
        self._fired = False                   # the callbacks ran (under _cb_lock: each runs once)
        self._cb_lock = threading.Lock()
        self._cancel = None
        self._from_world = None  # world rank -> this communicator's rank, for naming peers
        self._entry = None       # its flight-recorder entry

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
        if self._recvs and self._entry is not None:     # a receive ends when its message has landed
            ended(self._entry, self.exception())
        with self._cb_lock:
            self._fired = True
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # noqa: BLE001  (as concurrent.futures: a callback's error must not stop the worker)
                logging.getLogger("pyxccl").exception("rank %s: a done-callback of %s #%s raised", self._rank,
                                                      self.op, self.seq)

    def add_done_callback(self, cb) -> None:
        """Call ``cb(work)`` once, when the operation is done: from the completing thread, or from this
        one if it is done already."""
        with self._cb_lock:
            if not self._fired:
                self._callbacks.append(cb)
                return
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
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
                                    or not 0 <= timeout <= 1e9):      # nan fails the comparison too
            raise InvalidArgumentError(f"rank {self._rank}: {self.op} #{self.seq}: Work.wait(timeout={timeout!r}): "
                                       f"give seconds from 0 to 1e9, or None", rank=self._rank, op=self.op)
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


class InlineCall:
    """What an inline call's function sees of its Work: the sequence number and its receives."""
    __slots__ = ("seq", "_recvs", "_cancel")

    def __init__(self, seq: int):
        self.seq, self._recvs, self._cancel = seq, [], None


class Engine:
    """The ordered worker of one communicator.

    Under ``lock`` a caller takes its numbers, then either ``claim()``s the engine to run its
    call inline (when nothing is queued or running; then ``release()`` after) or ``enqueue``s it.
    """

    def __init__(self, name: str):
        self.lock = _lock()
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._exec = _lock()
        self._pending = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def claim(self) -> bool:
        """(Holding ``lock``.) True, and the engine is this caller's until ``release()``, if idle: nothing
        queued (``_pending``: queued or running on the worker) and no inline call running (one holds the
        execution lock; callers queue behind it). Prepared.run writes this out."""
        return not self._pending and self._exec.acquire(False)

    def release(self) -> None:
        """The inline call is done (no lock needed: an inline call is not in ``_pending``)."""
        self._exec.release()

    def enqueue(self, fn, work: Work) -> None:
        """(Holding ``lock``.) Run ``fn(work)`` on the worker after everything issued before."""
        self._pending += 1
        self._q.put((fn, work))

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, work = item
            with self._exec:
                try:
                    work._finish(fn(work))
                except BaseException as e:  # noqa: BLE001  (handed to the caller through Work)
                    work._finish(exc=e)
            with self.lock:
                self._pending -= 1

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
