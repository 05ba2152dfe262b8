"""Matching incoming messages to posted receives, for all peers of one process mesh.

A message is keyed by (communicator id, tag, seq): collectives use the tag
``COLL`` and their sequence number on the communicator; point-to-point calls
use the user's tag and seq 0. Messages with one key are matched in the order
they were sent (MPI's non-overtaking rule). A receive posted with
``peer=None`` takes the first message with its key from any peer
(MPI_ANY_SOURCE); receives naming the peer are matched before it.

A collective message also carries its call's fingerprint (two words, see
``pyxccl.primitives``): a receive whose call differs fails with a
``CollectiveMismatchError`` before a byte lands, and so does a message for a
collective this rank already finished (a rank that only sends in a call, a
broadcast root, hears of a disagreement that way). Such errors, and the
``ABORT`` messages a failing rank sends its communicator's other ranks, go to
``on_comm_error(comm_id, error, remote)``.

A message that arrives before its receive is posted is kept ("unexpected"),
so that a sender never waits for the receiver to call recv: this is what keeps
send-send-recv-recv patterns from deadlocking. Transports deliver a message in
one or more chunks, in order, from the mesh's progress thread. Empty queues are
dropped, so a long run of calls leaves nothing behind.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from .._errors import CollectiveMismatchError, CommAbortedError, CommTimeoutError, PeerLostError, ProtocolError
from ..dtypes import CODE_DTYPE, DTYPE_CODE, dtype_name
from .copies import copy

COLL = -1               # the tag of collective messages
ABORT = -2              # the tag of a rank's "I gave up on this communicator" message
# Its dtype field says why (0: anything else); its seq field, for a timeout, the world rank the
# sender blames, plus one (0 otherwise).
ABORT_MISMATCH, ABORT_CALLED, ABORT_TIMEOUT = 1, 2, 3      # a mismatch, the sender's comm.abort(), a timeout
PROGRESS = -3           # "how far are you?" of a rank whose collective #seq timed out (no payload)
PROGRESS_REPLY = -4     # the answer: int64 (last collective issued, last completed); dropped if nobody waits
LOST = -5               # mesh news, no payload: the sender lost its connection to world rank seq - 1
_MAX_ABORT = 64 << 10
_COUNTING = threading.Lock()     # bytes landed and completion, when several threads fill one message


def newer(a: int, b: int) -> bool:
    """Sequence number a comes after b (32-bit, wrapping)."""
    return 0 < (a - b) & 0xFFFFFFFF < 0x80000000


class RecvRequest:
    """One posted receive: ``nbytes`` into ``dst`` (a flat typed array), copying or reducing.
    ``call``: the fingerprint a collective's message must carry (None: point to point)."""
    __slots__ = ("peer", "key", "dst", "raw", "nbytes", "reduce", "got", "event", "error", "op", "on_done", "call")

    def __init__(self, peer: int | None, key, dst: np.ndarray, reduce=None, op: str = "recv", call=None):
        self.peer, self.key, self.dst, self.reduce, self.op, self.call = peer, key, dst, reduce, op, call
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
            copy(self.raw[off:off + n], src)
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
    __slots__ = ("chunks", "got", "dtype_code", "nbytes", "order", "call")

    def __init__(self, nbytes: int, dtype_code: int, order: int, call=None):
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.got, self.dtype_code, self.nbytes, self.order, self.call = 0, dtype_code, nbytes, order, call

    def add(self, off: int, data: np.ndarray) -> None:
        with _COUNTING:
            if self.order >= 0:
                self.chunks.append((off, data))
            self.got += data.nbytes

    def text(self) -> str:
        return b"".join(bytes(c) for _, c in sorted(self.chunks, key=lambda x: x[0])).decode(errors="replace")


def _push(d: dict, k, v) -> None:
    q = d.get(k)
    if q is None:
        d[k] = deque((v,))
    else:
        q.append(v)


def _pop(d: dict, k):
    q = d[k]
    v = q.popleft()
    if not q:
        del d[k]
    return v


class Mailbox:
    """Posted receives and unexpected messages of every peer of one mesh."""

    def __init__(self, rank: int):
        self.rank = rank
        self._lock = threading.Lock()
        self._posted: dict[tuple, deque] = {}      # (peer, key) -> RecvRequests
        self._unexpected: dict[tuple, deque] = {}  # (peer, key) -> _Unexpected
        self._current: dict[tuple, object] = {}   # (peer, key) -> message being filled
        self._any: dict[tuple, deque] = {}         # key -> any-source RecvRequests
        self._arrivals = 0                        # orders unexpected messages for any-source receives
        self._dead: dict[int, BaseException] = {}
        self._done: dict[int, int] = {}           # comm id -> its last finished collective
        self._running: dict[int, tuple] = {}      # comm id -> (seq, fingerprint) of its latest collective here
        self._early: dict[int, set] = {}          # comm id -> (peer, key) of unexpected collective messages
        self._describe: dict[int, object] = {}    # comm id -> describe(peer, seq, words) of its ongoing calls
        self.on_comm_error = lambda comm_id, err, remote: None   # set by the mesh
        self.on_progress = lambda comm_id, peer, seq: None      # a PROGRESS query came (set by the mesh)
        self.on_lost_news = lambda peer, lost: None             # a LOST notice came (set by the mesh)

    # --- called by the engine -------------------------------------------------
    def post(self, req: RecvRequest) -> None:
        if req.peer is None:
            return self._post_any(req)
        pk = (req.peer, req.key)
        with self._lock:
            q = self._unexpected.get(pk)
            if q and q[0].got == q[0].nbytes:
                msg = _pop(self._unexpected, pk)
                self._forget_early(pk)
            elif req.peer in self._dead:
                req.fail(self._dead[req.peer])
                return
            else:  # if a message is still arriving, _match_late hands it over when complete
                _push(self._posted, pk, req)
                return
        self._take(req, msg)

    def _post_any(self, req: RecvRequest) -> None:
        with self._lock:
            ready = [(q[0].order, pk) for pk, q in self._unexpected.items()
                     if pk[1] == req.key and q and q[0].got == q[0].nbytes]
            if not ready:
                _push(self._any, req.key, req)
                return
            pk = min(ready)[1]
            req.peer, msg = pk[0], _pop(self._unexpected, pk)
        self._take(req, msg)

    def cancel(self, req: RecvRequest) -> None:
        with self._lock:
            for d, k in ((self._posted, (req.peer, req.key)), (self._any, req.key)):
                q = d.get(k)
                if q and req in q:
                    q.remove(req)
                    if not q:
                        del d[k]

    def begin(self, comm_id: int, seq: int, call) -> None:
        """Collective ``seq`` of a communicator starts here with fingerprint ``call``: a message for it
        that carries another, already here or still to come, is a disagreement (raised through
        ``on_comm_error``) even before a receive is posted for it (a rank waiting for another peer in
        a call whose root differs hears of it at once, not at its deadline)."""
        self._running[comm_id] = (seq, call)    # one store (target() reads it under the lock), then:
        if not self._early.get(comm_id):         # a message that came before: checked here
            return
        with self._lock:
            early = self._early.get(comm_id, ())
            bad = [(pk, self._unexpected[pk][0].call) for pk in early if pk[1][2] == seq and pk in self._unexpected
                   and self._unexpected[pk][0].call != call]
        for (peer, key), theirs in bad[:1]:
            self.on_comm_error(comm_id, self._stray(peer, key, theirs), False)

    def finish(self, comm_id: int, seq: int) -> None:
        """Collective ``seq`` of a communicator is done here: a message for it, now or later, means
        the ranks disagreed about it (raised through ``on_comm_error``)."""
        with self._lock:
            self._done[comm_id] = seq
            early = self._early.get(comm_id)
            late = [pk for pk in early if not newer(pk[1][2], seq)] if early else ()
            msgs = [(pk, self._unexpected.pop(pk)[0]) for pk in late if pk in self._unexpected]
            for pk in late:
                self._forget_early(pk)
        for (peer, key), msg in msgs:
            self.on_comm_error(comm_id, self._stray(peer, key, msg.call), False)

    def stray(self, comm_id: int, seq: int):
        """(peer, fingerprint) of a collective message that arrived for call ``seq`` or before it (while
        this rank runs ``seq`` on the one-host segment: the peer runs it over messages), or None."""
        with self._lock:
            for peer, key in self._early.get(comm_id, ()):
                if not newer(key[2], seq) and (peer, key) in self._unexpected:
                    return peer, self._unexpected[(peer, key)][0].call
        return None

    def calls(self, comm_id: int, describe) -> None:
        """``describe(peer, seq, words)`` makes the mismatch error of a communicator's call ``seq``
        against a peer's (None: the communicator is gone; forget everything of it)."""
        with self._lock:
            if describe is not None:
                self._describe[comm_id] = describe
                return
            for d in (self._describe, self._done, self._early, self._running):
                d.pop(comm_id, None)
            for d in (self._posted, self._unexpected):
                for pk in [pk for pk in d if pk[1][0] == comm_id]:
                    del d[pk]

    def _disagrees(self, key, call) -> bool:
        """(Under the lock.) A collective message with no receive for it is for a call this rank
        finished, or for the one it runs but with another fingerprint."""
        done = self._done.get(key[0])
        if done is not None and not newer(key[2], done):
            return True
        running = self._running.get(key[0])
        return running is not None and running[0] == key[2] and running[1] != call

    def _stray(self, peer, key, call) -> ProtocolError:
        describe = self._describe.get(key[0])
        if describe is not None:
            return describe(peer, key[2], call)
        return CollectiveMismatchError(f"rank {self.rank}: rank {peer} sent a message for collective #{key[2]}, "
                                       f"which this rank finished without it: the ranks made different calls",
                                       rank=self.rank, peer=peer)

    def _forget_early(self, pk) -> None:
        early = self._early.get(pk[1][0]) if pk[1][1] == COLL and pk not in self._unexpected else None
        if early is not None:
            early.discard(pk)
            if not early:
                del self._early[pk[1][0]]

    def _take(self, req: RecvRequest, msg: _Unexpected) -> None:
        err = self._check(req, msg.nbytes, msg.dtype_code, msg.call)
        if err:
            req.fail(err)
        else:
            for off, data in msg.chunks:
                req.put(off, data)
            if req.nbytes == 0:
                req.complete()

    # --- called by the transports (from the progress thread) ----------------------------------
    def target(self, peer: int, key, dtype_code: int, total: int, off: int, n: int, call=None):
        """Where chunk [off, off+n) of a ``total``-byte message from ``peer`` goes (chunks come in
        order; a transport that spreads a message over several connections claims it whole, n=total,
        and fills the parts with ``fill``). ``call``: the fingerprint words of a collective's message."""
        pk = (peer, key)
        stray = None
        if key[1] == PROGRESS and off == 0:
            self.on_progress(key[0], peer, key[2])
            return _Unexpected(total, dtype_code, -1)
        if key[1] == LOST and off == 0:
            self.on_lost_news(peer, key[2] - 1)
            return _Unexpected(total, dtype_code, -1)
        with self._lock:
            cur = self._current.get(pk)
            if off == 0 and cur is None:
                # Earlier messages of this key still arriving (on other connections) go first.
                ahead = pk in self._unexpected
                if not ahead and (pk in self._posted or key in self._any):
                    target = _pop(self._posted, pk) if pk in self._posted else _pop(self._any, key)
                    target.peer = peer         # an any-source receive learns its sender here
                    err = self._check(target, total, dtype_code, call)
                    if err:
                        target.fail(err)
                        target = _Unexpected(total, dtype_code, -1)  # read it, nobody will use it
                elif key[1] == PROGRESS_REPLY:      # an answer nobody waits for any more: read and dropped
                    target = _Unexpected(total, dtype_code, -1)
                elif (key[1] == COLL and self._disagrees(key, call)) or (key[1] == ABORT and total > _MAX_ABORT):
                    stray = self._stray(peer, key, call) if key[1] == COLL else ProtocolError(
                        f"rank {self.rank}: rank {peer} sent an abort message of {total} bytes", rank=self.rank,
                        peer=peer)
                    target = _Unexpected(total, dtype_code, -1)
                else:
                    self._arrivals += 1
                    target = _Unexpected(total, dtype_code, self._arrivals, call)
                    _push(self._unexpected, pk, target)
                    if key[1] == COLL:
                        self._early.setdefault(key[0], set()).add(pk)
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
        if stray is not None:
            self.on_comm_error(key[0], stray, False)
        return target

    def _landed(self, target, peer: int, key) -> None:
        if isinstance(target, _Unexpected):
            if target.got == target.nbytes and target.order >= 0:
                if key[1] == ABORT:
                    self._aborted(peer, key, target)
                else:
                    self._match_late((peer, key))
        elif target.nbytes == 0:
            target.complete()

    def _aborted(self, peer: int, key, msg: _Unexpected) -> None:
        with self._lock:
            q = self._unexpected.get((peer, key))
            if q and msg in q:
                q.remove(msg)
                if not q:
                    del self._unexpected[(peer, key)]
        text = msg.text()
        if msg.dtype_code == ABORT_CALLED:     # to its peers, an aborted rank is a lost one
            err = lost_error(self.rank, peer, f"it aborted the communicator: {text}")
        elif msg.dtype_code == ABORT_TIMEOUT:  # a timeout: blame whom its sender blamed
            err = CommTimeoutError(f"rank {self.rank}: rank {peer} gave up on this communicator: {text}",
                                   rank=self.rank, peer=key[2] - 1 if key[2] else peer)
        else:
            cls = CollectiveMismatchError if msg.dtype_code == ABORT_MISMATCH else CommAbortedError
            err = cls(f"rank {self.rank}: rank {peer} gave up on this communicator: {text}", rank=self.rank, peer=peer)
        self.on_comm_error(key[0], err, True)

    def deliver(self, peer: int, key, dtype_code: int, total: int, off: int, src: np.ndarray, call=None) -> None:
        """Chunk [off, off+len(src)) of a ``total``-byte message from ``peer`` (copied before returning)."""
        target = self.target(peer, key, dtype_code, total, off, len(src), call)
        if isinstance(target, RecvRequest):
            target.put(off, src)
        else:
            target.add(off, src.copy() if target.order >= 0 else src)
        self._landed(target, peer, key)

    def deliver_from(self, peer: int, key, dtype_code: int, total: int, off: int, n: int, read,
                     scratch: np.ndarray, call=None) -> None:
        """Like ``deliver``, but ``read(view)`` fills a uint8 view with the chunk's next bytes: straight
        into the receive buffer when it copies, else through ``scratch`` (whose size must be a multiple
        of every itemsize) in pieces."""
        self.fill(peer, key, self.target(peer, key, dtype_code, total, off, n, call), off, n, read, scratch)

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
                u = self._unexpected.get(pk)
                if not (u and u[0].got == u[0].nbytes):
                    return
                if pk in self._posted:
                    req = _pop(self._posted, pk)
                elif pk[1] in self._any:
                    req = _pop(self._any, pk[1])
                else:
                    return
                msg = _pop(self._unexpected, pk)
                self._forget_early(pk)
                req.peer = pk[0]
            self._take(req, msg)

    def _check(self, req: RecvRequest, total: int, dtype_code: int, call):
        if req.call is not None and call != req.call:
            return self._stray(req.peer, req.key, call)
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

    def fail_posted(self, comm_id: int, exc: BaseException) -> None:
        """Fail every receive posted for a communicator (it was aborted), but the answers to a timed-out
        rank's progress queries (it asks precisely when the others give up)."""
        with self._lock:
            reqs = []
            for d in (self._posted, self._any):
                for k in [k for k in d if (key := k[1] if d is self._posted else k)[0] == comm_id
                          and key[1] != PROGRESS_REPLY]:
                    reqs.extend(d.pop(k))
        for r in reqs:
            r.fail(exc)

    def peer_lost(self, peer: int, exc: BaseException) -> None:
        """Fail every receive posted for ``peer``, now and later."""
        with self._lock:
            self._dead.setdefault(peer, exc)
            reqs = [r for (p, _), q in self._posted.items() if p == peer for r in q]
            for pk in [pk for pk in self._posted if pk[0] == peer]:
                del self._posted[pk]
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
