"""Shared-memory transport for ranks on one host.

Each direction of a peer pair has a ring of ``slots`` fixed-size slots in an
anonymous shared memory file (``memfd_create``) made by the sender and handed
to the receiver over their Unix socket (SCM_RIGHTS). Nothing ever has a name
in /dev/shm, so nothing can be left behind, even by a killed process.

The rings are handed over during the connection's handshake (the dialer's
with its proof, the acceptor's with its answer, see ``pyxccl.transport.auth``);
a peer made by hand over a socket pair exchanges them first thing.

The sender copies a chunk into a free slot and writes a small header on the
socket; the mesh's progress loop (which serves this socket with every other)
copies (or reduces) the slot straight into the posted buffer and returns the
slot with a CREDIT frame. Large messages use
several slots at once, so the sender fills one slot while the receiver drains
another. Waiting is on the socket and on a condition variable: no spinning.
"""
from __future__ import annotations

import mmap
import os
import socket
import threading
import time
from collections import deque

import numpy as np

from .. import _env
from .._errors import ProtocolError
from .base import CHUNK_ALIGN, CREDIT, SHM_DATA, StreamPeer
from .copies import copy

SLOT_BYTES = _env.get("PYXCCL_SHM_SLOT_BYTES")
SLOTS = _env.get("PYXCCL_SHM_SLOTS")


def ring(rank: int, peer: int) -> int:
    """A new ring for sending to ``peer``: the descriptor of its memfd (the caller closes it)."""
    fd = os.memfd_create(f"pyxccl-{rank}-to-{peer}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, slot_bytes() * SLOTS)
    except OSError:
        os.close(fd)
        raise
    return fd


def slot_bytes() -> int:
    return SLOT_BYTES - SLOT_BYTES % CHUNK_ALIGN   # every chunk stays itemsize-aligned


class ShmPeer(StreamPeer):
    def __init__(self, rank, peer, mailbox, on_lost, sock: socket.socket, rings: tuple[int, int] | None = None):
        """``rings``: (ours, theirs) descriptors already exchanged (the handshake's); without, they are
        exchanged over ``sock`` now. Either way the descriptors are closed here."""
        super().__init__(rank, peer, mailbox, on_lost, sock)
        self.slot_bytes = slot_bytes()
        size = self.slot_bytes * SLOTS
        if rings is None:
            fd = ring(rank, peer)
            try:
                socket.send_fds(sock, [size.to_bytes(8, "little")], [fd])
            except OSError:
                os.close(fd)
                raise
            msg, fds, _, _ = socket.recv_fds(sock, 8, 1)
            if len(msg) != 8 or len(fds) != 1:
                for f in fds:
                    os.close(f)
                os.close(fd)
                raise ConnectionError(f"rank {rank}: shared-memory handshake with rank {peer} failed")
            rings = (fd, fds[0])
        try:
            self._out_map = mmap.mmap(rings[0], size)
            theirs = os.fstat(rings[1]).st_size
            if theirs < size or theirs % self.slot_bytes:
                raise ConnectionError(f"rank {rank}: rank {peer}'s shared-memory ring is {theirs} bytes where "
                                      f"{size} were due; every rank must have the same PYXCCL_SHM_SLOT_BYTES "
                                      f"and PYXCCL_SHM_SLOTS")
            self._in_map = mmap.mmap(rings[1], size)
        finally:
            os.close(rings[0])
            os.close(rings[1])
        self._out = np.frombuffer(self._out_map, np.uint8)
        self._in = np.frombuffer(self._in_map, np.uint8)
        self._free = deque(range(SLOTS))
        self._free_cv = threading.Condition()

    def send(self, key, dtype_code, payload, deadline, call=None) -> None:
        total, sb = payload.nbytes, self.slot_bytes
        if total == 0:
            self._send_frames([self.header(SHM_DATA, key, dtype_code, 0, 0, 0, 0, call)], deadline)
            return
        for off in range(0, total, sb):
            n = min(sb, total - off)
            slot = self._take_slot(deadline)
            copy(self._out[slot * sb: slot * sb + n], payload[off:off + n])
            self._send_frames([self.header(SHM_DATA, key, dtype_code, total, off, n, slot, call)], deadline)

    def _take_slot(self, deadline: float) -> int:
        with self._free_cv:
            while not self._free:
                self._free_cv.wait(timeout=max(0.01, min(0.25, deadline - time.monotonic())))
                if not self._free:
                    self._check_deadline(deadline)
            return self._free.popleft()

    def _on_frame(self, kind, dcode, key, total, off, n, aux, call) -> None:
        if kind == SHM_DATA:
            sb = self.slot_bytes
            if n > sb or aux >= SLOTS:
                return super()._on_frame(-1, dcode, key, total, off, n, aux, call)
            self.mailbox.deliver(self.peer, key, dcode, total, off, self._in[aux * sb: aux * sb + n], call)
            if n:
                try:
                    with self._send_lock:
                        self.sock.sendall(self.header(CREDIT, aux=aux))
                except OSError:
                    # The sender closed right after its last send (its GOODBYE is behind this frame):
                    # it needs no slot back. A real loss shows as the stream's end, read next.
                    pass
        elif kind == CREDIT:
            with self._free_cv:
                if aux >= SLOTS or aux in self._free:   # a slot given back that it does not hold
                    raise ProtocolError(
                        f"rank {self.rank}: rank {self.peer} gave back shared-memory slot {aux}, which it does "
                        f"not hold (slots 0..{SLOTS - 1}); closing the connection: a bug or memory corruption "
                        f"in that rank", rank=self.rank, peer=self.peer)
                self._free.append(aux)
                self._free_cv.notify()
        else:
            super()._on_frame(kind, dcode, key, total, off, n, aux, call)

    def _check_deadline(self, deadline: float) -> None:
        if self._closing:
            raise self._lost("the communicator is closing")
        super()._check_deadline(deadline)

    def close(self) -> None:
        super().close()
        with self._free_cv:
            self._free_cv.notify_all()
        # Nothing reads the rings any more (the loop dropped this peer): unmap them now, not at GC.
        self._in = self._out = self._in_map = self._out_map = None
