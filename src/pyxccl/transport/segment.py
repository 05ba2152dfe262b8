"""A shared memory segment for the ranks of one communicator on one host.

The one-host fast path runs segment schedules on it (``algorithms/segment.py``,
executed by ``core/onehost.py``): every rank owns a control line (its round
counter, a futex word, flags saying who sleeps waiting on it, and the CPU it
last ran on, which the native waits read), and
per round parity a 64-byte header (the fingerprint of its call: seq and two
words; the address and size of a buffer it posted for single-copy reads) and
a data area, its window. A round: wait until everyone finished the round
before last (its parity's window and header are about to be reused), write
my window, publish (header, then counter), wait for the counters I need,
check the call, read. No locks, no syscalls while the peers keep up: a
waiter spins briefly, then sleeps on the futex. Readers see a window's data
and header once they see its counter (stores are not reordered with stores,
nor loads with loads, on x86-64).

The segment is a ``memfd``: peers open it through /proc/<pid>/fd of the rank
that made it, so nothing ever has a name in /dev/shm.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct
import threading
import time

import numpy as np

from .._errors import CommTimeoutError, ProtocolError
from .mailbox import lost_error
from .topology import job_cpus

_LINE = 64
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)
SEQ, W0, W1, ADDR, NBYTES = range(5)     # fields of a round header
_CALL = struct.Struct("<QQQ")            # seq, w0, w1 at the start of a round header
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_FENCE = threading.Lock()                # taking a lock is an atomic instruction: a full memory barrier


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_NAP = _Timespec(0, 2_000_000)      # sleep at most 2 ms per futex wait, then look again


def _ge(a: int, b: int) -> bool:
    """a >= b for 32-bit counters that wrap."""
    return ((a - b) & 0xFFFFFFFF) < 0x80000000


class HostSegment:
    def __init__(self, rank: int, nranks: int, area_bytes: int, fd: int | None = None):
        self.rank, self.n = rank, nranks
        self.area = area_bytes - area_bytes % _LINE
        # counter, a sleep flag per rank, the CPU the rank last ran on (the native waits read it)
        self.line = _LINE * ((4 * (nranks + 2) + _LINE - 1) // _LINE)
        ctl_bytes = self.line * nranks
        pids = _LINE * ((16 * nranks + _LINE - 1) // _LINE)
        head = ctl_bytes + pids + 2 * nranks * _LINE
        size = head + 2 * nranks * self.area
        if fd is None:      # we make it
            fd = os.memfd_create("pyxccl-segment", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            self.fd = fd
        else:
            self.fd = None
        self._map = mmap.mmap(fd, size)
        if self.fd is None:
            os.close(fd)
        buf = np.frombuffer(self._map, np.uint8)
        self.ctl = buf[:ctl_bytes].view(np.uint32).reshape(nranks, self.line // 4)  # [r,0] counter, [r,1+w] sleeps
        self.pids = buf[ctl_bytes:ctl_bytes + 16 * nranks].view(np.uint64).reshape(nranks, 2)  # pid, an address
        self.hdr = buf[ctl_bytes + pids:head].view(np.uint64).reshape(2, nranks, _LINE // 8)
        self._hdr_at = ctl_bytes + pids      # byte offset of the round headers (struct access on the hot path)
        self.data = buf[head:].reshape(2, nranks, self.area)
        # Held for the object's life: the map is never unmapped under a native run of another thread
        # (it holds this object); it goes when the last reference to the segment does.
        self._anchor = ctypes.c_char.from_buffer(self._map)
        self._base = ctypes.addressof(self._anchor)
        self.layout = (self._base, self.line, self._hdr_at, head, self.area, ctl_bytes, rank, nranks)  # for _native
        self.pids[rank] = (os.getpid(), self._base)    # something the others may try to read (cma.works)
        self.cma = False          # single-copy reads between the ranks work (set by the communicator)
        self.round = 0
        self._typed: dict = {}
        oversubscribed = nranks > job_cpus()
        self.spin = 0.0 if oversubscribed else float(os.environ.get("PYXCCL_SPIN_US", 1000)) * 1e-6
        self.yields = int(os.environ.get("PYXCCL_YIELDS", 20)) if oversubscribed else 0
        self.waits = (int(self.spin * 1e9), self.yields)       # the native executor's wait settings
        self.deadline = 0.0
        self.op, self.seq = "fast path", 0     # the call running on the segment, named in errors

    @classmethod
    def open(cls, rank, nranks, area_bytes, owner_pid: int, owner_fd: int) -> "HostSegment":
        fd = os.open(f"/proc/{owner_pid}/fd/{owner_fd}", os.O_RDWR)
        return cls(rank, nranks, area_bytes, fd=fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.ctl = self.data = self.hdr = self.pids = None
        self._typed.clear()         # the map itself goes with the last reference to this object

    # --- one round -------------------------------------------------------------------
    def begin(self) -> int:
        """Start the next round: wait until my window of this parity may be reused; return the parity."""
        prev = self.round
        self.round = (prev + 1) & 0xFFFFFFFF
        m, line = self._map, self.line
        for p in range(self.n):
            if p != self.rank and not _ge(_U32.unpack_from(m, p * line)[0], prev):
                self.wait(p, prev)
        parity = self.round & 1
        if self.hdr[parity, self.rank, NBYTES]:
            self.hdr[parity, self.rank, NBYTES] = 0     # nothing posted this round, unless post() says so
        return parity

    def window(self, parity: int, p: int, dtype: np.dtype) -> np.ndarray:
        """Rank ``p``'s window of ``parity`` as an array of ``dtype`` (views made once)."""
        key = (parity, p, dtype)
        v = self._typed.get(key)
        if v is None:
            v = self._typed[key] = self.data[parity, p, :self.area - self.area % dtype.itemsize].view(dtype)
        return v

    def publish(self, seq: int, w0: int, w1: int) -> None:
        """Make this round's window (and the call's fingerprint) visible: header, then counter."""
        m, at = self._map, self.rank * self.line
        _CALL.pack_into(m, self._hdr_at + ((self.round & 1) * self.n + self.rank) * _LINE, seq, w0, w1)
        _U32.pack_into(m, at, self.round)
        self.fence()        # my counter before their sleep flags: else a waiter may sleep through it
        if any(m[at + 4:at + 4 + 4 * self.n]):      # somebody sleeps on my counter
            _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._base + at), _FUTEX_WAKE, ctypes.c_int(self.n),
                          None, None, 0)

    def reached(self, p: int) -> bool:
        """Has rank ``p`` published this round yet? (Never waits.) After ``publish``, ``fence()`` first:
        then of two ranks that publish and look at each other, at least one sees the other (a load may
        not pass the store before it, as it could on x86 without a barrier)."""
        return _ge(_U32.unpack_from(self._map, p * self.line)[0], self.round)

    @staticmethod
    def fence() -> None:
        with _FENCE:
            pass

    def call_of(self, p: int, parity: int) -> tuple[int, int, int]:
        """The fingerprint (seq, w0, w1) rank ``p`` published for its round of ``parity``."""
        return _CALL.unpack_from(self._map, self._hdr_at + (parity * self.n + p) * _LINE)

    def post(self, parity: int, arr: np.ndarray) -> None:
        """Let the others read ``arr`` in this round straight from this process's memory."""
        h = self.hdr[parity, self.rank]
        h[ADDR], h[NBYTES] = arr.ctypes.data, arr.nbytes

    def posted(self, p: int, parity: int) -> int:
        """Bytes rank ``p`` posted in its round of ``parity`` (0: none; read its window)."""
        return _U64.unpack_from(self._map, self._hdr_at + (parity * self.n + p) * _LINE + 8 * NBYTES)[0]

    def read(self, p: int, parity: int, dst: np.ndarray, offset: int) -> None:
        """Fill ``dst`` from the buffer rank ``p`` posted, ``offset`` bytes in (single copy), never
        outside what ``p`` declared."""
        h = self.hdr[parity, p]
        if offset < 0 or offset + dst.nbytes > int(h[NBYTES]):
            raise self.read_error(p, parity, offset + dst.nbytes)
        from .cma import read
        try:
            read(int(self.pids[p, 0]), dst.ctypes.data, int(h[ADDR]) + offset, dst.nbytes)
        except OSError as e:
            raise self.read_error(p, parity, 0, e) from None

    def read_error(self, p: int, parity: int, end: int, err: OSError | None = None) -> ProtocolError:
        """The error of a single-copy read of rank ``p``'s posted buffer: past its end, or failed."""
        if err is None:
            why = (f"reading up to byte {end} of the {int(self.hdr[parity, p, NBYTES])}-byte buffer rank {p} "
                   f"posted: the ranks disagree on sizes")
        elif err.errno == errno.ESRCH:      # its process is gone: a lost rank, not a protocol error
            e = lost_error(self.rank, p, "its process exited or was killed during the call")
            e.op, e.seq = self.op, self.seq
            return e
        else:
            why = f"reading the buffer rank {p} posted failed ({err}); that rank freed or changed it during the call"
        e = ProtocolError(f"rank {self.rank}: {self._who()}: {why}", rank=self.rank, peer=p, op=self.op,
                          seq=self.seq)
        e.abandoned = err is not None      # the owner left the call: perhaps for a cause this rank learns next
        return e

    def timed_out(self, p: int) -> CommTimeoutError:
        return CommTimeoutError(f"rank {self.rank}: {self._who()} timed out waiting for rank {p}; that rank "
                                f"is slow, stuck or did not make the same call", rank=self.rank, peer=p, op=self.op,
                                seq=self.seq)

    def wait(self, p: int, target: int | None = None) -> None:
        """Until rank ``p`` has published round ``target`` (default: this round)."""
        target = self.round if target is None else target
        if _ge(_U32.unpack_from(self._map, p * self.line)[0], target):
            return
        ctl = self.ctl
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.spin:
            if _ge(int(ctl[p, 0]), target):
                return
        for _ in range(self.yields):          # more ranks than cores: let the one we wait for run
            os.sched_yield()
            if _ge(int(ctl[p, 0]), target):
                return
        addr = ctypes.c_void_p(self._base + p * self.line)
        flag = 1 + self.rank
        while True:
            ctl[p, flag] = 1
            self.fence()    # my flag before their counter (the publisher does the converse)
            cur = int(ctl[p, 0])
            if _ge(cur, target):
                ctl[p, flag] = 0
                return
            _libc.syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, ctypes.c_int(cur), ctypes.byref(_NAP), None, 0)
            ctl[p, flag] = 0
            if _ge(int(ctl[p, 0]), target):
                return
            if time.monotonic() > self.deadline:
                raise self.timed_out(p)
            self.check_alive(p, self.seq)

    def _who(self) -> str:
        return f"{self.op} (#{self.seq} on this communicator)"

    def check_alive(self, p: int, seq: int) -> None:
        """Overridden by the communicator: raise if it failed, if rank ``p`` is lost, or if call ``seq``
        cannot go on."""
