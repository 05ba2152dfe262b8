"""TCP transport: every message travels inline after its header on one socket
per peer pair; the receiver reads straight into the posted buffer (or into a
reusable scratch buffer when it must reduce, or into chunks as they come when
no receive is posted yet)."""
from __future__ import annotations

import os
import socket

import numpy as np

from .base import DATA, StreamPeer, recv_exact

_PIECE = 1 << 20     # reduce incoming data in pieces of this size (a multiple of every itemsize)


class TcpPeer(StreamPeer):
    def __init__(self, rank, peer, mailbox, on_lost, sock: socket.socket):
        super().__init__(rank, peer, mailbox, on_lost, sock)
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _detect_link_loss(sock, float(os.environ.get("PYXCCL_LINK_TIMEOUT", "5")))
        self._scratch = np.empty(_PIECE, np.uint8)

    def send(self, key, dtype_code, payload, deadline) -> None:
        n = payload.nbytes
        self._send_frames([self.header(DATA, key, dtype_code, n, 0, n), payload], deadline)

    def _on_frame(self, kind, dcode, key, total, off, n, aux) -> None:
        if kind != DATA:
            return super()._on_frame(kind, dcode, key, total, off, n, aux)
        self.mailbox.deliver_from(self.peer, key, dcode, total, off, n, self._read, self._scratch)

    def _read(self, view: np.ndarray) -> None:
        if len(view) and not recv_exact(self.sock, memoryview(view)):
            raise ConnectionResetError("connection closed in the middle of a frame")


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
