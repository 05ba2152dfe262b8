"""Shared-memory transport for ranks on one host.

Each direction of a peer pair has a ring of ``slots`` fixed-size slots in an
anonymous shared memory file (``memfd_create``) made by the sender and handed
to the receiver over their Unix socket (SCM_RIGHTS). Nothing ever has a name
in /dev/shm, so nothing can be left behind, even by a killed process.

The sender copies a chunk into a free slot and writes a small header on the
socket; the receiver's thread copies (or reduces) the slot straight into the
posted buffer and returns the slot with a CREDIT frame. Large messages use
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

from .._errors import ProtocolError
from .base import CHUNK_ALIGN, CREDIT, SHM_DATA, StreamPeer

SLOT_BYTES = int(os.environ.get("PYXCCL_SHM_SLOT_BYTES", 1 << 20))
SLOTS = int(os.environ.get("PYXCCL_SHM_SLOTS", 4))


class ShmPeer(StreamPeer):
    def __init__(self, rank, peer, mailbox, on_lost, sock: socket.socket):
        super().__init__(rank, peer, mailbox, on_lost, sock)
        self.slot_bytes = SLOT_BYTES - SLOT_BYTES % CHUNK_ALIGN   # every chunk stays itemsize-aligned
        size = self.slot_bytes * SLOTS
        fd = os.memfd_create(f"pyxccl-{rank}-to-{peer}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self._out_map = mmap.mmap(fd, size)
            socket.send_fds(sock, [size.to_bytes(8, "little")], [fd])
        finally:
            os.close(fd)
        msg, fds, _, _ = socket.recv_fds(sock, 8, 1)
        if len(msg) != 8 or len(fds) != 1:
            raise ConnectionError(f"rank {rank}: shared-memory handshake with rank {peer} failed")
        try:
            self._in_map = mmap.mmap(fds[0], int.from_bytes(msg, "little"))
        finally:
            os.close(fds[0])
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
            np.copyto(self._out[slot * sb: slot * sb + n], payload[off:off + n])
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
        if not self._thread.is_alive():     # nothing reads the rings any more: unmap them now, not at GC
            self._in = self._out = self._in_map = self._out_map = None
