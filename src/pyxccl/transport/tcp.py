"""TCP transport: every message travels inline after its header; the receiver
reads straight into the posted buffer (or through a reusable scratch buffer
when it must reduce, or into chunks as they come when no receive is posted
yet), so nothing is ever allocated at the size a header claims.

A peer pair has ``PYXCCL_NSOCKS`` connections (as NCCL_NSOCKS_PERTHREAD;
default 1). The first carries every message's header, in order, so messages
are matched to receives in the order they were sent; a message of at least
``PYXCCL_STRIPE_BYTES`` (default 1 MiB) is cut into one stripe per connection,
the first stripe following its header and the others on the other connections
("lanes"), tagged with the message's number. No thread of its own: the sending
thread writes the main frame and the stripes itself, round robin without
blocking (``MSG_DONTWAIT``, and ``select`` for writability when no connection
takes more), so the lanes stream in parallel; the mesh's progress loop reads
every connection. A stripe whose message the first connection has not matched
yet makes the loop read the first connection's frames until it has (they are
in order, and a message's main frame goes out before or with its stripes).
"""
from __future__ import annotations

import functools
import select
import socket
import threading
import time

import numpy as np

from .. import _env
from .._errors import ProtocolError
from .base import CHUNK_ALIGN, DATA, HEADER, STRIPE, StreamPeer, recv_exact, recv_into_all

_PIECE = 1 << 20     # reduce incoming data in pieces of this size (a multiple of every itemsize)
STRIPE_BYTES = 1 << 20


class TcpPeer(StreamPeer):
    def __init__(self, rank, peer, mailbox, on_lost, sock: socket.socket, lanes=()):
        super().__init__(rank, peer, mailbox, on_lost, sock)
        link_timeout = _env.get("PYXCCL_LINK_TIMEOUT")
        for s in (sock, *lanes):
            if s.family != socket.AF_UNIX:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _detect_link_loss(s, link_timeout)
        self._scratch = np.empty(_PIECE, np.uint8)
        self._stripe_bytes = _env.get("PYXCCL_STRIPE_BYTES", STRIPE_BYTES)
        self._lanes = list(lanes)
        self.connections = 1 + len(self._lanes)
        self._order = threading.Lock()      # one striped message at a time: stripes keep one order on every lane
        self._sent = 0                      # numbers the striped messages we send
        # Read by the progress loop only: message number -> [target, stripes still to fill]
        self._striped: dict[int, list] = {}
        self._matched = 0                   # the last striped message the first connection matched
        self._lane_hdr = bytearray(HEADER.size)

    def sockets(self) -> list:
        return [self.sock, *self._lanes]

    def start(self, progress=None) -> None:
        super().start(progress)
        for i in range(len(self._lanes)):
            self._progress.add(self._lanes[i], functools.partial(self._lane_readable, i))

    # --- sending ---------------------------------------------------------------------
    def send(self, key, dtype_code, payload, deadline, call=None) -> None:
        n = payload.nbytes
        if not self._lanes or n < self._stripe_bytes:
            self._send_frames([self.header(DATA, key, dtype_code, n, 0, n, 0, call), payload], deadline)
            return
        k = len(self._lanes) + 1
        cuts = [min(n, (n * i // k) // CHUNK_ALIGN * CHUNK_ALIGN) for i in range(k)] + [n]
        with self._order, self._send_lock:
            self._sent += 1
            m = self._sent
            units = [(self.sock, [self.header(DATA, key, dtype_code, n, 0, cuts[1], m, call), payload[:cuts[1]]])]
            units += [(lane, [self.header(STRIPE, key, dtype_code, n, a, b - a, m), payload[a:b]])
                      for lane, a, b in zip(self._lanes, cuts[1:], cuts[2:])]
            self._stream(units, deadline)

    def _stream(self, units: list, deadline: float) -> None:
        """Write every (socket, buffers) of ``units`` whole, round robin without blocking on any one."""
        todo = [(s, [memoryview(b).cast("B") for b in bufs if len(b)]) for s, bufs in units]
        todo = [u for u in todo if u[1]]
        while todo:
            moved = False
            for unit in list(todo):
                sock, bufs = unit
                try:
                    k = sock.sendmsg(bufs, (), socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    raise self._lost(f"send failed: {e}") from None
                moved = True
                while bufs and k >= len(bufs[0]):
                    k -= len(bufs[0])
                    bufs.pop(0)
                if bufs and k:
                    bufs[0] = bufs[0][k:]
                if not bufs:
                    todo.remove(unit)
            if todo and not moved:
                self._check_deadline(deadline)
                select.select([], [s for s, _ in todo], [], max(0.0, min(0.25, deadline - time.monotonic())))

    # --- receiving -------------------------------------------------------------------
    def _on_frame(self, kind, dcode, key, total, off, n, aux, call) -> None:
        if kind != DATA:
            return super()._on_frame(kind, dcode, key, total, off, n, aux, call)
        if not aux:
            self.mailbox.deliver_from(self.peer, key, dcode, total, off, n, self._read, self._scratch, call)
            return
        if not self._lanes or aux != self._matched + 1:
            raise ProtocolError(f"rank {self.rank}: rank {self.peer} sent striped message #{aux} where "
                                f"#{self._matched + 1} was due (over {len(self._lanes)} extra connections); "
                                f"closing the connection", rank=self.rank, peer=self.peer)
        # The first stripe of message `aux`: match the whole message now; the lanes fill the rest.
        target = self.mailbox.target(self.peer, key, dcode, total, 0, total, call)
        self._matched = aux
        self._striped[aux] = [target, len(self._lanes)]
        self.mailbox.fill(self.peer, key, target, 0, n, self._read, self._scratch)

    def _readable(self) -> bool:
        # A lane's handler may have read the first connection's frames after the loop saw it readable
        # in the same round (``_stripe_target``): then there is nothing to read, and a blocking read
        # would wait for a frame that comes only once the lanes are read.
        if self._lanes and not _pending(self.sock):
            return True
        return super()._readable()

    def _stripe_target(self, m: int):
        """The message a lane's stripe belongs to: the first connection's frames are read until it has
        matched message ``m`` (the loop never waits for a thread of this process)."""
        while m not in self._striped:
            if m <= self._matched:
                raise ProtocolError(f"rank {self.rank}: rank {self.peer} sent a stripe of message #{m}, "
                                    f"whose stripes are all in; closing the connection",
                                    rank=self.rank, peer=self.peer)
            try:
                more = self._read_frame()
            except BaseException as e:  # noqa: BLE001  (the first connection's fate is the peer's)
                self._end(e)
                raise _Ended() from None
            if not more:
                self._end(None)
                raise _Ended()
        entry = self._striped[m]
        entry[1] -= 1
        if entry[1] == 0:
            del self._striped[m]
        return entry[0]

    def _lane_readable(self, i: int) -> bool:
        """The progress loop's handler of lane ``i``: read one stripe."""
        sock = self._lanes[i]
        view = memoryview(self._lane_hdr)
        try:
            if not recv_exact(sock, view):
                return False        # a lane closing is not news: the first connection reports the peer's fate
            _, kind, dcode, comm, tag, seq, total, off, n, m, _, _ = self.parse(view)
            if kind != STRIPE:
                self._on_frame(-1, dcode, (comm, tag, seq), total, off, n, m, None)    # ProtocolError
            target = self._stripe_target(m)
            self.mailbox.fill(self.peer, (comm, tag, seq), target, off, n,
                              lambda v: recv_into_all(sock, v), self._scratch)
            return True
        except _Ended:
            return False
        except ProtocolError as e:
            self._end(e)
            return False
        except BaseException:  # noqa: BLE001  (a lane breaking: the first connection reports the peer's fate)
            return False

    def _read(self, view: np.ndarray) -> None:
        recv_into_all(self.sock, view)


def _pending(sock: socket.socket) -> bool:
    """Bytes (or the stream's end, or an error) wait on ``sock``: a read would not block."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        pass
    return True


class _Ended(Exception):
    """The first connection ended while a lane looked for its message (already reported)."""


def _detect_link_loss(sock: socket.socket, seconds: float) -> None:
    """Make the kernel notice a dead link within about ``seconds``: keepalive probes once idle
    for a while (a rank waiting to receive sends nothing), and a cap on how long sent data may
    stay unacknowledged. The progress thread then sees ETIMEDOUT and reports the peer lost,
    instead of every rank waiting for its deadline. 0 turns it off."""
    if seconds <= 0 or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    idle = max(1, int(seconds / 2))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, int(seconds) - idle))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))
