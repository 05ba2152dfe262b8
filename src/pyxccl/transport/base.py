"""The transport interface, and the framing shared by the socket-based transports.

A transport connects this process to one peer process. Its whole interface:

- ``send(key, dtype_code, payload, deadline, call=None)``: send one message (a
  flat uint8 numpy array; ``call``: the two fingerprint words of a collective's
  message), blocking until it no longer needs ``payload``; a message is
  delivered even when the receiver has not posted its receive yet;
- incoming messages go to ``mailbox.deliver(...)`` from the mesh's progress
  thread (``progress.py``: one ``selectors`` loop serves every socket of the
  process; ``start(progress)`` hands a peer's sockets to it, and the loop has
  the peer read one frame whenever a socket is readable); a lost connection
  goes to ``on_lost(peer, exc)`` (a clean end, a GOODBYE: graceful; ETIMEDOUT:
  the link died; a malformed frame: ProtocolError);
- ``close()``: say goodbye and release everything (no thread is left: the loop
  drops the peer's sockets before they are closed).

A peer has no thread of its own. The loop may block reading the rest of a
frame (senders write frames whole, from their own threads), but never waits
for anything a thread of this process must do.

A new transport is one file implementing :class:`Peer`.
"""
from __future__ import annotations

import errno
import socket
import struct
import threading
import time
from abc import ABC, abstractmethod

import numpy as np

from .._errors import CommTimeoutError, ProtocolError
from .mailbox import Mailbox, lost_error

MAGIC = 0x7863          # "xc"
# magic, kind, dtype code, comm id, tag, seq, total bytes, chunk offset, chunk bytes, aux, call (2 words)
HEADER = struct.Struct("<HBBIiIQQQQQQ")
DATA, SHM_DATA, CREDIT, GOODBYE, STRIPE = 1, 2, 3, 4, 5
_KINDS = (DATA, SHM_DATA, CREDIT, GOODBYE, STRIPE)
MAX_MESSAGE = 1 << 40
# Every chunk but a message's last starts and ends on this (a multiple of every itemsize): the
# transports cut messages there (stripes, slots), and a receive that reduces views each chunk as
# its dtype.
CHUNK_ALIGN = 64


class Peer(ABC):
    """A connection to one peer rank (see the module docstring)."""

    def __init__(self, rank: int, peer: int, mailbox: Mailbox, on_lost):
        self.rank, self.peer, self.mailbox, self.on_lost = rank, peer, mailbox, on_lost
        self.closed_by_peer = False
        self.host: str | None = None     # the peer's host, named in errors (set by the mesh)

    @abstractmethod
    def send(self, key: tuple[int, int, int], dtype_code: int, payload: np.ndarray,
             deadline: float, call: tuple[int, int] | None = None) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @property
    def kind(self) -> str:
        return type(self).__name__.removesuffix("Peer").lower()


def recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False on a clean EOF before the first byte."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0:
                return False
            raise ConnectionResetError("connection closed in the middle of a frame")
        got += k
    return True


def recv_into_all(sock: socket.socket, view) -> None:
    """Fill ``view`` (any writable buffer) from ``sock``; ConnectionResetError if it closes first."""
    if len(view) and not recv_exact(sock, memoryview(view).cast("B")):
        raise ConnectionResetError("connection closed in the middle of a frame")


class StreamPeer(Peer):
    """A peer over one connected stream socket, served by a progress loop (``progress.py``).

    Subclasses say how a DATA frame's payload travels (inline, or in shared
    memory) by overriding ``send`` and ``_on_frame``.
    """

    def __init__(self, rank, peer, mailbox, on_lost, sock: socket.socket):
        super().__init__(rank, peer, mailbox, on_lost)
        self.sock = sock
        self._send_lock = threading.Lock()
        self._closing = False
        self._ended = False
        self._hdr = bytearray(HEADER.size)
        self._progress = None
        self._own_progress = False

    def sockets(self) -> list:
        """Every socket of this peer (the progress loop serves them all)."""
        return [self.sock]

    def start(self, progress=None) -> None:
        """Have ``progress`` (a mesh's loop) read this peer's frames; without one, a loop of its own
        (a peer made by hand, as tests do)."""
        if progress is None:
            from .progress import Progress
            progress = Progress(f"pyxccl-progress-{self.rank}<-{self.peer}")
            self._own_progress = True
        self._progress = progress
        progress.add(self.sock, self._readable)

    # --- sending ---------------------------------------------------------------
    def _send_frames(self, bufs: list, deadline: float, sock=None, lock=None) -> None:
        """Write ``bufs`` (bytes-like) as one unit on ``sock`` (default: the peer's socket); never
        interleaved with another thread's frame."""
        sock = sock or self.sock
        with lock or self._send_lock:
            bufs = [memoryview(b).cast("B") for b in bufs]
            while bufs:
                try:
                    k = sock.sendmsg(bufs)
                except (BlockingIOError, socket.timeout):
                    self._check_deadline(deadline)
                    continue
                except OSError as e:
                    raise self._lost(f"send failed: {e}") from None
                while bufs and k >= len(bufs[0]):
                    k -= len(bufs[0])
                    bufs.pop(0)
                if bufs and k:
                    bufs[0] = bufs[0][k:]

    def _check_deadline(self, deadline: float) -> None:
        lost = self.mailbox.lost(self.peer)
        if lost is not None:
            raise lost
        if time.monotonic() > deadline:
            raise CommTimeoutError(
                f"rank {self.rank}: sending to rank {self.peer} made no progress before the deadline; "
                f"that rank is stuck or not calling the same operation", rank=self.rank, peer=self.peer)

    def header(self, kind, key=(0, 0, 0), dtype_code=0, total=0, off=0, n=0, aux=0, call=None) -> bytes:
        w0, w1 = call or (0, 0)
        return HEADER.pack(MAGIC, kind, dtype_code, key[0], key[1], key[2], total, off, n, aux, w0, w1)

    # --- receiving -------------------------------------------------------------
    def _readable(self) -> bool:
        """The progress loop's handler: read one frame. False once the connection is over."""
        try:
            if self._read_frame():
                return True
            self._end(None)
        except BaseException as e:  # noqa: BLE001  (every failure is reported)
            self._end(e)
        return False

    def _recv_loop(self) -> None:
        """Read frames until the connection ends, on the calling thread (the fuzzer's harness)."""
        while self._readable():
            pass

    def _read_frame(self) -> bool:
        """Read and handle one frame; False on the end of the stream or a GOODBYE."""
        if not recv_exact(self.sock, memoryview(self._hdr)):
            return False
        magic, kind, dcode, comm, tag, seq, total, off, n, aux, w0, w1 = self.parse(self._hdr)
        if kind == GOODBYE:
            self.closed_by_peer = True
            return False
        self._on_frame(kind, dcode, (comm, tag, seq), total, off, n, aux, (w0, w1) if w0 else None)
        return True

    def _end(self, e: BaseException | None) -> None:
        """The connection is over (``e``: why, None for a clean end): stop serving it and, unless this
        side is closing, tell the mesh."""
        if self._ended:
            return
        self._ended = True
        self._detach()
        if self._closing:
            return
        if e is None:
            why = "it closed its communicator" if self.closed_by_peer else "its process exited or was killed"
            self.on_lost(self.peer, self._lost(why), graceful=self.closed_by_peer)
            return
        if isinstance(e, ProtocolError):
            err = e
        elif getattr(e, "errno", None) == errno.ETIMEDOUT:
            err = self._lost("its link stopped answering: host down or network cut")
        else:
            err = self._lost(f"connection error: {e}")
            err.__cause__ = e   # what broke, for whoever debugs it
        self.on_lost(self.peer, err)

    def _detach(self) -> None:
        """No handler of this peer runs once this returns (from the loop: at once; else waited for)."""
        pr = self._progress
        if pr is not None:
            for s in self.sockets():
                pr.remove(s)

    def parse(self, hdr) -> tuple:
        """A frame header's fields, checked: ProtocolError naming the peer if they cannot be right."""
        magic, kind, dcode, comm, tag, seq, total, off, n, aux, _, _ = fields = HEADER.unpack(hdr)
        if magic != MAGIC or kind not in _KINDS or total > MAX_MESSAGE or off + n > total \
                or off % CHUNK_ALIGN or (n % CHUNK_ALIGN and off + n != total):
            raise ProtocolError(
                f"rank {self.rank}: malformed frame from rank {self.peer} (magic {magic:#x}, kind {kind}, "
                f"{n} bytes at {off} of a {total}-byte message); closing the connection: a bug or "
                f"memory corruption in that rank", rank=self.rank, peer=self.peer)
        return fields

    def _lost(self, why: str):
        return lost_error(self.rank, self.peer, why, self.host)

    def _on_frame(self, kind, dcode, key, total, off, n, aux, call) -> None:
        raise ProtocolError(f"rank {self.rank}: unexpected frame kind {kind} from rank {self.peer}",
                            rank=self.rank, peer=self.peer)

    def shutdown(self) -> None:
        """Say goodbye and shut the sockets down (a handler blocked on them returns at once)."""
        if self._closing:
            return
        self._closing = True
        try:
            with self._send_lock:
                self.sock.sendall(self.header(GOODBYE))
        except OSError:
            pass
        for s in self.sockets():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.shutdown()
        if self._progress is not None and not self._ended:
            self._ended = True
            self._detach()
        if self._own_progress:
            self._progress.close()
        for s in self.sockets():
            s.close()
