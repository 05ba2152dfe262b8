"""TCP transport: every message travels inline after its header on one socket
per peer pair; the receiver reads straight into the posted buffer (or into a
reusable scratch buffer when it must reduce)."""
from __future__ import annotations

import socket

import numpy as np

from .base import DATA, StreamPeer, recv_exact

_PIECE = 1 << 20     # reduce incoming data in pieces of this size (a multiple of every itemsize)


class TcpPeer(StreamPeer):
    def __init__(self, rank, peer, mailbox, on_lost, sock: socket.socket):
        super().__init__(rank, peer, mailbox, on_lost, sock)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._scratch = np.empty(_PIECE, np.uint8)

    def send(self, key, dtype_code, payload, deadline) -> None:
        n = payload.nbytes
        self._send_frames([self.header(DATA, key, dtype_code, n, 0, n), payload], deadline)

    def _on_frame(self, kind, dcode, key, total, off, n, aux) -> None:
        if kind != DATA:
            return super()._on_frame(kind, dcode, key, total, off, n, aux)
        if n == 0:
            self.mailbox.deliver(self.peer, key, dcode, total, 0, self._scratch[:0])
            return
        # Read in pieces: the mailbox copies or reduces each into its destination.
        done = 0
        while done < n:
            k = min(_PIECE, n - done)
            piece = self._scratch[:k]
            recv_exact(self.sock, memoryview(piece))
            self.mailbox.deliver(self.peer, key, dcode, total, off + done, piece)
            done += k
