"""TCP transport: every message travels inline after its header; the receiver
reads straight into the posted buffer (or through a reusable scratch buffer
when it must reduce, or into chunks as they come when no receive is posted
yet), so nothing is ever allocated at the size a header claims.

A peer pair has ``PYXCCL_NSOCKS`` connections (as NCCL_NSOCKS_PERTHREAD;
default 1). The first carries every message's header, in order, so messages
are matched to receives in the order they were sent; a message of at least
``PYXCCL_STRIPE_BYTES`` (default 1 MiB) is cut into one stripe per connection, the first stripe
following its header and the others sent at the same time on the other
connections ("lanes", each with a sender and a receiver thread), tagged with
the message's number. A lane's receiver waits until the first connection has
matched that message, then fills its part of it.
"""
from __future__ import annotations

import os
import queue
import socket
import threading

import numpy as np

from .._errors import ProtocolError
from .base import CHUNK_ALIGN, DATA, HEADER, STRIPE, StreamPeer, recv_exact, recv_into_all

_PIECE = 1 << 20     # reduce incoming data in pieces of this size (a multiple of every itemsize)
STRIPE_BYTES = 1 << 20


class TcpPeer(StreamPeer):
    def __init__(self, rank, peer, mailbox, on_lost, sock: socket.socket, lanes=()):
        super().__init__(rank, peer, mailbox, on_lost, sock)
        link_timeout = float(os.environ.get("PYXCCL_LINK_TIMEOUT", "5"))
        for s in (sock, *lanes):
            if s.family != socket.AF_UNIX:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _detect_link_loss(s, link_timeout)
        self._scratch = np.empty(_PIECE, np.uint8)
        self._stripe_bytes = int(os.environ.get("PYXCCL_STRIPE_BYTES", STRIPE_BYTES))
        self._lanes = [_Lane(self, s, i + 1) for i, s in enumerate(lanes)]
        self.connections = 1 + len(self._lanes)
        self._order = threading.Lock()      # stripes of one message go out in the same order on every lane
        self._sent = 0                      # numbers the striped messages we send
        self._striped: dict[int, list] = {}  # message number -> [target, stripes still to fill]
        self._striped_cv = threading.Condition()

    def start(self) -> None:
        super().start()
        for lane in self._lanes:
            lane.start()

    # --- sending ---------------------------------------------------------------------
    def send(self, key, dtype_code, payload, deadline, call=None) -> None:
        n = payload.nbytes
        if not self._lanes or n < self._stripe_bytes:
            self._send_frames([self.header(DATA, key, dtype_code, n, 0, n, 0, call), payload], deadline)
            return
        k = len(self._lanes) + 1
        cuts = [min(n, (n * i // k) // CHUNK_ALIGN * CHUNK_ALIGN) for i in range(k)] + [n]
        with self._order:
            self._sent += 1
            m = self._sent
            jobs = [lane.post([self.header(STRIPE, key, dtype_code, n, a, b - a, m), payload[a:b]], deadline)
                    for lane, a, b in zip(self._lanes, cuts[1:], cuts[2:])]
            self._send_frames([self.header(DATA, key, dtype_code, n, 0, cuts[1], m, call), payload[:cuts[1]]],
                              deadline)
        for job in jobs:
            job.wait()

    # --- receiving -------------------------------------------------------------------
    def _on_frame(self, kind, dcode, key, total, off, n, aux, call) -> None:
        if kind != DATA:
            return super()._on_frame(kind, dcode, key, total, off, n, aux, call)
        if not aux:
            self.mailbox.deliver_from(self.peer, key, dcode, total, off, n, self._read, self._scratch, call)
            return
        # The first stripe of message `aux`: match the whole message now, then let the lanes in.
        target = self.mailbox.target(self.peer, key, dcode, total, 0, total, call)
        with self._striped_cv:
            self._striped[aux] = [target, len(self._lanes)]
            self._striped_cv.notify_all()
        self.mailbox.fill(self.peer, key, target, 0, n, self._read, self._scratch)

    def _stripe_target(self, m: int):
        """The message a lane's stripe belongs to, once the first connection has matched it."""
        with self._striped_cv:
            while m not in self._striped:
                if self._closing or self.mailbox.lost(self.peer):
                    raise ConnectionAbortedError("closing")
                self._striped_cv.wait(0.5)
            entry = self._striped[m]
            entry[1] -= 1
            if entry[1] == 0:
                del self._striped[m]
            return entry[0]

    def _read(self, view: np.ndarray) -> None:
        recv_into_all(self.sock, view)

    def close(self) -> None:
        super().close()
        for lane in self._lanes:
            lane.close()


class _Lane:
    """One extra connection of a peer pair, with its own sender and receiver threads."""

    def __init__(self, owner: TcpPeer, sock: socket.socket, index: int):
        self.owner, self.sock = owner, sock
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._scratch = np.empty(_PIECE, np.uint8)
        self._hdr = bytearray(HEADER.size)
        name = f"{owner.rank}-{owner.peer}.{index}"
        self._threads = [threading.Thread(target=self._send_loop, daemon=True, name=f"pyxccl-lane-send-{name}"),
                         threading.Thread(target=self._recv_loop, daemon=True, name=f"pyxccl-lane-recv-{name}")]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def post(self, bufs: list, deadline: float) -> "_Job":
        job = _Job(bufs, deadline)
        self._jobs.put(job)
        return job

    def _send_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self.owner._send_frames(job.bufs, job.deadline, self.sock, self._lock)
            except BaseException as e:  # noqa: BLE001  (raised in the sender's thread by Job.wait)
                job.error = e
            job.done.set()

    def _recv_loop(self) -> None:
        np.seterr(all="ignore")         # this thread reduces incoming data (see StreamPeer._recv_loop)
        view, owner = memoryview(self._hdr), self.owner
        try:
            while recv_exact(self.sock, view):
                _, kind, dcode, comm, tag, seq, total, off, n, m, _, _ = owner.parse(view)
                if kind != STRIPE:
                    return owner._on_frame(kind, dcode, (comm, tag, seq), total, off, n, m, None)  # ProtocolError
                target = owner._stripe_target(m)
                owner.mailbox.fill(owner.peer, (comm, tag, seq), target, off, n,
                                   lambda v: recv_into_all(self.sock, v), self._scratch)
        except BaseException as e:  # noqa: BLE001
            # A lane closing is not news: the first connection reports the peer's fate. A frame
            # that does not fit the protocol is.
            if isinstance(e, ProtocolError) and not owner._closing:
                owner.on_lost(owner.peer, e)

    def close(self) -> None:
        self._jobs.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class _Job:
    __slots__ = ("bufs", "deadline", "done", "error")

    def __init__(self, bufs, deadline):
        self.bufs, self.deadline, self.done, self.error = bufs, deadline, threading.Event(), None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


def _detect_link_loss(sock: socket.socket, seconds: float) -> None:
    """Make the kernel notice a dead link within about ``seconds``: keepalive probes once idle
    for a while (a rank waiting to receive sends nothing), and a cap on how long sent data may
    stay unacknowledged. The receiver thread then sees ETIMEDOUT and reports the peer lost,
    instead of every rank waiting for its deadline. 0 turns it off."""
    if seconds <= 0 or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    idle = max(1, int(seconds / 2))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, int(seconds) - idle))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))
