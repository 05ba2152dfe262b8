"""Persistent requests: a call checked and prepared once, started any number of times (MPI-4's
``MPI_Allreduce_init`` + ``MPI_Start``/``MPI_Wait``; mpi4py's ``Prequest``).

A request holds what the full path made of its call: the ``Prepared`` (core/prepared.py: plan,
schedule, compiled program, fingerprint words) and the arrays given at init, which every start
uses (the user writes new data into them between starts, as in MPI). A start is the prepared
call's ``start`` on those arrays: no key, no argument check, no plan lookup; the sequence
numbers, the flight recorder, failure handling and AVG's division are the ordinary call's.

The states are MPI's: *inactive* (made, or its last start completed and was waited or tested),
*active* (started, not yet waited), *freed*. ``start()`` of an active request and any start of a
freed one raise ``InvalidArgumentError`` (nothing runs, the communicator is unchanged);
``free()`` of an active request raises too (MPI: freeing an active persistent collective request
is erroneous), since the call still reads and writes the request's buffers. ``wait()`` and
``test()`` of an inactive request return True at once, as MPI's on an inactive request.
A request is used by one thread at a time, as a Work or an MPI request.
"""
from __future__ import annotations

from .._errors import InvalidArgumentError
from . import onehost


class _Request:
    """The part of a request that ``_native.Request`` is in C where the C executor is built: the fields its
    blocking start reads, and the start itself (here always ``_run``: without the C executor no request
    has a Call of its own, ``_mine`` is None)."""
    __slots__ = ("_work", "_freed", "_mine", "_inp", "_out", "result")

    def run(self):
        """Start and wait, on the calling thread (as the plain call without ``async_op``); returns what
        the plain call returns. Calling the request is the same."""
        return self._run()

    __call__ = run


class PersistentRequest(onehost._native.Request if onehost._native is not None else _Request):
    """A call made once and started many times: ``comm.allreduce_init(x)`` and the other ``*_init``
    calls of a :class:`~pyxccl.Communicator` return one.

    >>> req = comm.allreduce_init(x)          # checked and planned here; nothing moves   # doctest: +SKIP
    >>> for step in range(100):
    ...     x[:] = grads(step)                # new data into the same buffer
    ...     req.start(); compute(); req.wait()
    >>> work = req.start()                    # the started call's Work (add_done_callback, ...)
    >>> req()                                 # the blocking form: start and wait
    >>> req.free()                            # or: with comm.allreduce_init(x) as req: ...

    ``start()`` returns at once with the call's Work (the call runs on the communicator's worker, in issue order with
    every other call); ``wait(timeout=None)`` waits for it and raises its error; ``test()`` says
    whether it is done (raising its error once done); ``run()`` or calling the request runs it
    on the calling thread and returns what the plain call returns. Every rank must start its
    requests in the order it would make the plain calls: making a request moves nothing, and each
    start is checked against the other ranks' calls like any call.
    """
    __slots__ = ("op", "rank", "algorithm", "_context")

    def __init__(self, ctx, op: str, algorithm: str | None, result):
        self.op, self.rank, self.algorithm, self.result = op, ctx.rank, algorithm, result
        self._context, self._work, self._freed, self._mine = ctx, None, False, None

    def _go(self, async_op: bool):
        """Run the call once: a Work with ``async_op``, else the call's result."""
        raise NotImplementedError

    def start(self):
        """Start the call on the request's buffers and return at once; ``wait()`` or ``test()`` completes it.

        Returns the started call's pyxccl Work (the plain call's ``async_op=True`` result) for code that
        waits on the Work itself or chains on it (``add_done_callback``; the torch backend wraps it in a
        torch Work): that Work's ``wait()`` does not make the request inactive; its ``wait()``/``test()`` do."""
        if self._work is not None or self._freed:
            raise self._refused("start()")
        self._work = w = self._go(True)
        return w

    def _run(self):
        """``run()`` in Python (where the C call does not take it: see ``_native.Request``)."""
        if self._work is not None or self._freed:
            raise self._refused("run()")
        return self._go(False)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the last start to complete and raise its error (True when there is none to wait
        for). ``timeout`` (s) caps this wait only: past it, ``CommTimeoutError`` and the request stays
        active (wait again); the call's own deadline is its ``timeout=`` at init."""
        w = self._work
        if w is None:
            return True
        try:
            w.wait(timeout)
        except BaseException:
            if w.is_completed():
                self._work = None
            raise
        self._work = None
        return True

    def test(self) -> bool:
        """True once the last start completed (then the request is inactive again; its error, if any,
        is raised now), False while it runs; never blocks."""
        w = self._work
        if w is None:
            return True
        if not w.is_completed():
            return False
        self._work = None
        w.wait(0)          # raises the call's error
        return True

    @property
    def active(self) -> bool:
        """Started and not yet completed by ``wait()`` or ``test()``."""
        return self._work is not None

    @property
    def freed(self) -> bool:
        """``free()`` was called: the request refuses to start."""
        return self._freed

    def free(self) -> None:
        """Release the request (its buffers and prepared call); a freed request refuses to start.
        Refused while a start is active: ``wait()`` first."""
        if self._work is not None:
            raise self._refused("free()")
        self._freed = True
        self._drop()

    def _drop(self) -> None:
        self.result = None

    def __enter__(self) -> "PersistentRequest":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Free the request; when the block raised, a start still active is waited for first (its own
        error, if any, is dropped: the block's propagates)."""
        if exc_type is not None and self._work is not None:
            try:
                self.wait()
            except BaseException:  # noqa: BLE001  (the block's exception is the one to see)
                self._work = None
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._freed else "active" if self._work is not None else "inactive"
        return f"<pyxccl.PersistentRequest {self.op} on rank {self.rank}, {state}>"

    def _refused(self, what: str) -> InvalidArgumentError:
        r, op = self.rank, self.op
        if self._freed:
            why = f"the request was freed; make a new one with comm.{op}_init(...)"
        elif what == "free()":
            why = ("a start() is still active (freeing an active persistent request is erroneous, as in MPI: "
                   "the call still uses its buffers); call wait() first")
        else:
            why = (f"its last start() is still active (#{self._work.seq} on this communicator); call wait(), "
                   f"or test() until it returns True, before starting it again")
        return InvalidArgumentError(f"rank {r}: persistent {op} request: {what} refused: {why}", rank=r, op=op)


class CollectiveRequest(PersistentRequest):
    """A persistent collective: its ``Prepared`` per issuing thread (fingerprints name the thread that
    starts a call, as they name the one that makes a plain call) and the arrays of its init."""
    __slots__ = ("_prepared", "_remake", "_first")

    def __init__(self, ctx, op: str, prepared, remake, inp, out, result):
        super().__init__(ctx, op, prepared.plan.algo.name, result)
        self._inp, self._out, self._remake = inp, out, remake
        self._prepared = {ctx.thread_word(): prepared}      # thread digest -> its Prepared
        # the blocking start in one C call from the thread of init (_native.Request checks the thread)
        self._first = prepared
        self._mine = None if prepared.tmp else prepared.fast    # run in C (_native.Request), from the init thread

    def _go(self, async_op: bool):
        p = self._prepared.get(self._context.thread_word())
        if p is None:       # started from another thread than before: its fingerprint names this one
            p = self._remake()
            if len(self._prepared) >= 8:
                self._prepared.clear()
            self._prepared[self._context.thread_word()] = p
        if async_op:
            return p.start(self._inp, self._out, self.result, True)
        return p.run(self._inp, self._out, self.result)

    def _settle(self, done):
        """The C call's answer other than done (``_native.Request``): nothing ran (the engine was busy),
        or this thread finishes it."""
        return self._first.settle(self._inp, self._out, self.result, done)

    def _drop(self) -> None:
        super()._drop()
        self._inp = self._out = self._remake = self._first = self._mine = None
        self._prepared = {}


class PointToPointRequest(PersistentRequest):
    """A persistent send or receive (MPI_Send_init, MPI_Recv_init): its arguments checked once; each
    start is an ``isend``/``irecv`` of the same buffer, peer and tag."""
    __slots__ = ("_buf", "_peer", "_tag", "_timeout")

    def __init__(self, ctx, op: str, buf, peer, tag: int, timeout, result):
        super().__init__(ctx, op, None, result)
        self._buf, self._peer, self._tag, self._timeout = buf, peer, tag, timeout

    def _go(self, async_op: bool):
        ctx, op = self._context, self.op
        if op == "send":
            return ctx.send("isend" if async_op else "send", self._buf, self._peer, self._tag, async_op=async_op,
                            timeout=self._timeout)
        return ctx.recv("irecv" if async_op else "recv", self._buf, self._peer, self._tag, self.result,
                        async_op=async_op, timeout=self._timeout)

    def _drop(self) -> None:
        super()._drop()
        self._buf = None
