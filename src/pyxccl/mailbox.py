"""Matching incoming messages to posted receives, for all peers of one process mesh.

A message is keyed by (communicator id, tag, seq): collectives use a negative
tag (minus the primitive's code) and their sequence number on the
communicator; point-to-point calls use the user's tag and seq 0. Messages with
one key are matched in the order they were sent (MPI's non-overtaking rule).
A receive posted with ``peer=None`` takes the first message with its key from
any peer (MPI_ANY_SOURCE); receives naming the peer are matched before it.

A message that arrives before its receive is posted is copied to the heap
("unexpected"), so that a sender never waits for the receiver to call recv:
this is what keeps send-send-recv-recv patterns from deadlocking. Transports
deliver a message in one or more chunks, in order, from their receiver thread.
"""
from __future__ import annotations

import threading
from collections import defaultdict, deque

import numpy as np

from ._errors import PeerLostError, ProtocolError
from .dtypes import CODE_DTYPE, DTYPE_CODE, dtype_name


_COUNTING = threading.Lock()     # bytes landed and completion, when several threads fill one message


class RecvRequest:
    """One posted receive: ``nbytes`` into ``dst`` (a flat typed array), copying or reducing."""
    __slots__ = ("peer", "key", "dst", "raw", "nbytes", "reduce", "got", "event", "error", "op", "on_done")

    def __init__(self, peer: int, key, dst: np.ndarray, reduce=None, op: str = "recv"):
        self.peer, self.key, self.dst, self.reduce, self.op = peer, key, dst, reduce, op
        self.raw = dst.view(np.uint8)
        self.nbytes = dst.nbytes
        self.got = 0
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.on_done = None       # called once, from the completing thread

    def complete(self) -> None:
        with _COUNTING:
            if self.event.is_set():
                return
            self.event.set()
        if self.on_done is not None:
            self.on_done(self)

    def fail(self, exc: BaseException) -> None:
        if not self.event.is_set():
            self.error = exc
            self.complete()

    def put(self, off: int, src: np.ndarray) -> None:
        """Take ``src`` (uint8) as bytes [off, off+len) of the message."""
        n = src.nbytes
        if self.reduce is None:
            np.copyto(self.raw[off:off + n], src)
        else:
            dt = self.dst.dtype
            a, b = off // dt.itemsize, (off + n) // dt.itemsize
            self.reduce(self.dst[a:b], src.view(dt))
        self.landed(n)

    def landed(self, n: int) -> None:
        """``n`` more bytes are in place (several connections may fill one message at once)."""
        with _COUNTING:
            self.got += n
            done = self.got >= self.nbytes
        if done:
            self.complete()


class _Unexpected:
    """A message that came before its receive, kept as the chunks that arrived: memory is never
    allocated at the size a header claims, only as bytes come. ``order`` < 0: a message whose
    receive failed, read and dropped."""
    __slots__ = ("chunks", "got", "dtype_code", "nbytes", "order")

    def __init__(self, nbytes: int, dtype_code: int, order: int):
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.got, self.dtype_code, self.nbytes, self.order = 0, dtype_code, nbytes, order

    def add(self, off: int, data: np.ndarray) -> None:
        with _COUNTING:
            if self.order >= 0:
                self.chunks.append((off, data))
            self.got += data.nbytes


class Mailbox:
    """Posted receives and unexpected messages of every peer of one mesh."""

    def __init__(self, rank: int):
        self.rank = rank
        self._lock = threading.Lock()
        self._posted: dict[tuple, deque] = defaultdict(deque)      # (peer, key) -> RecvRequests
        self._unexpected: dict[tuple, deque] = defaultdict(deque)  # (peer, key) -> _Unexpected
        self._current: dict[tuple, object] = {}   # (peer, key) -> message being filled
        self._any: dict[tuple, deque] = defaultdict(deque)         # key -> any-source RecvRequests
        self._arrivals = 0                        # orders unexpected messages for any-source receives
        self._dead: dict[int, BaseException] = {}

    # --- called by the engine -------------------------------------------------
    def post(self, req: RecvRequest) -> None:
        if req.peer is None:
            return self._post_any(req)
        pk = (req.peer, req.key)
        with self._lock:
            q = self._unexpected.get(pk)
            if q and q[0].got == q[0].nbytes:
                msg = q.popleft()
            elif req.peer in self._dead:
                req.fail(self._dead[req.peer])
                return
            else:  # if a message is still arriving, _match_late hands it over when complete
                self._posted[pk].append(req)
                return
        self._take(req, msg)

    def _post_any(self, req: RecvRequest) -> None:
        with self._lock:
            ready = [(q[0].order, pk) for pk, q in self._unexpected.items()
                     if pk[1] == req.key and q and q[0].got == q[0].nbytes]
            if not ready:
                self._any[req.key].append(req)
                return
            pk = min(ready)[1]
            req.peer, msg = pk[0], self._unexpected[pk].popleft()
        self._take(req, msg)

    def cancel(self, req: RecvRequest) -> None:
        with self._lock:
            for q in (self._posted.get((req.peer, req.key)), self._any.get(req.key)):
                if q and req in q:
                    q.remove(req)

    def _take(self, req: RecvRequest, msg: _Unexpected) -> None:
        err = self._check(req, msg.nbytes, msg.dtype_code)
        if err:
            req.fail(err)
        else:
            for off, data in msg.chunks:
                req.put(off, data)
            if req.nbytes == 0:
                req.complete()

    # --- called by transports' receiver threads ----------------------------------
    def target(self, peer: int, key, dtype_code: int, total: int, off: int, n: int):
        """Where chunk [off, off+n) of a ``total``-byte message from ``peer`` goes (chunks come in
        order; a transport that spreads a message over several connections claims it whole, n=total,
        and fills the parts with ``fill``)."""
        pk = (peer, key)
        with self._lock:
            cur = self._current.get(pk)
            if off == 0 and cur is None:
                # Earlier messages of this key still arriving (on other connections) go first.
                q = None if self._unexpected.get(pk) else self._posted.get(pk) or self._any.get(key)
                if q:
                    target = q.popleft()
                    target.peer = peer         # an any-source receive learns its sender here
                    err = self._check(target, total, dtype_code)
                    if err:
                        target.fail(err)
                        target = _Unexpected(total, dtype_code, -1)  # read it, nobody will use it
                else:
                    self._arrivals += 1
                    target = _Unexpected(total, dtype_code, self._arrivals)
                    self._unexpected[pk].append(target)
            elif cur is None or cur[1] != off:
                raise ProtocolError(
                    f"rank {self.rank}: rank {peer} sent bytes {off}..{off + n} of a {total}-byte message "
                    f"where bytes from {cur[1] if cur else 0} were due; the stream is corrupt, closing it",
                    rank=self.rank, peer=peer)
            else:
                target = cur[0]
            if off + n >= total:
                self._current.pop(pk, None)
            else:
                self._current[pk] = (target, off + n)
        return target

    def _landed(self, target, peer: int, key) -> None:
        if isinstance(target, _Unexpected):
            if target.got == target.nbytes and target.order >= 0:
                self._match_late((peer, key))
        elif target.nbytes == 0:
            target.complete()

    def deliver(self, peer: int, key, dtype_code: int, total: int, off: int, src: np.ndarray) -> None:
        """Chunk [off, off+len(src)) of a ``total``-byte message from ``peer`` (copied before returning)."""
        target = self.target(peer, key, dtype_code, total, off, len(src))
        if isinstance(target, RecvRequest):
            target.put(off, src)
        else:
            target.add(off, src.copy() if target.order >= 0 else src)
        self._landed(target, peer, key)

    def deliver_from(self, peer: int, key, dtype_code: int, total: int, off: int, n: int, read,
                     scratch: np.ndarray) -> None:
        """Like ``deliver``, but ``read(view)`` fills a uint8 view with the chunk's next bytes: straight
        into the receive buffer when it copies, else through ``scratch`` (whose size must be a multiple
        of every itemsize) in pieces."""
        self.fill(peer, key, self.target(peer, key, dtype_code, total, off, n), off, n, read, scratch)

    def fill(self, peer: int, key, target, off: int, n: int, read, scratch: np.ndarray) -> None:
        """Bytes [off, off+n) of ``target`` (from ``target()``), read with ``read`` (see ``deliver_from``)."""
        if isinstance(target, RecvRequest) and target.reduce is None:
            read(target.raw[off:off + n])
            target.landed(n)
        else:
            done = 0
            while done < n:
                k = min(len(scratch), n - done)
                if isinstance(target, RecvRequest):
                    read(scratch[:k])
                    target.put(off + done, scratch[:k])
                else:
                    piece = np.empty(k, np.uint8) if target.order >= 0 else scratch[:k]
                    read(piece)
                    target.add(off + done, piece)
                done += k
        self._landed(target, peer, key)

    def _match_late(self, pk) -> None:
        """An unexpected message completed: hand it, and complete ones queued behind it, to
        receives posted meanwhile."""
        while True:
            with self._lock:
                q, u = self._posted.get(pk) or self._any.get(pk[1]), self._unexpected.get(pk)
                if not (q and u and u[0].got == u[0].nbytes):
                    return
                req, msg = q.popleft(), u.popleft()
                req.peer = pk[0]
            self._take(req, msg)

    def _check(self, req: RecvRequest, total: int, dtype_code: int):
        dt = req.dst.dtype
        if dtype_code and dtype_code != DTYPE_CODE.get(dt):
            theirs = CODE_DTYPE.get(dtype_code)
            return ProtocolError(
                f"rank {self.rank}: {req.op} got {dtype_name(theirs) if theirs else dtype_code} "
                f"data from rank {req.peer} but its own buffer is {dtype_name(dt)}; "
                f"every rank must pass buffers of the same dtype",
                rank=self.rank, peer=req.peer, op=req.op)
        if total != req.nbytes:
            return ProtocolError(
                f"rank {self.rank}: {req.op} got a {total}-byte message from rank {req.peer} "
                f"where it expected {req.nbytes} bytes; the ranks passed different sizes or counts",
                rank=self.rank, peer=req.peer, op=req.op)
        return None

    def peer_lost(self, peer: int, exc: BaseException) -> None:
        """Fail every receive posted for ``peer``, now and later."""
        with self._lock:
            self._dead.setdefault(peer, exc)
            reqs = [r for (p, _), q in self._posted.items() if p == peer for r in q]
            for (p, k) in [pk for pk in self._posted if pk[0] == peer]:
                del self._posted[(p, k)]
        for r in reqs:
            r.fail(exc)

    def lost(self, peer: int) -> BaseException | None:
        return self._dead.get(peer)


def lost_error(rank: int, peer: int, why: str, host: str | None = None) -> PeerLostError:
    where = f" on host {host}" if host else ""
    return PeerLostError(
        f"rank {rank}: lost rank {peer}{where} ({why}); the job cannot go on without it: "
        f"check that rank's output for its error, then restart the job",
        rank=rank, peer=peer)
