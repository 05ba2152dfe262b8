"""A shared memory segment for the ranks of one communicator on one host.

The fast path of one-host collectives works on it (fastpath.py): every rank
owns a 64-byte control line (its round counter, a futex word, and flags
saying who sleeps waiting on it) and two data areas (the current round's and
the previous round's). A round: wait until everyone finished the round before
last (its area is about to be reused), write my area, publish my counter,
wait for the counters I need, read their areas. No locks, no syscalls while
the peers keep up: a waiter spins briefly, then sleeps on the futex.

The segment is a ``memfd``: peers open it through /proc/<pid>/fd of the rank
that made it, so nothing ever has a name in /dev/shm.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import time

import numpy as np

from .._errors import CommTimeoutError

_LINE = 64
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)


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
        self.line = _LINE * ((4 * (nranks + 1) + _LINE - 1) // _LINE)    # counter + a sleep flag per rank
        ctl_bytes = self.line * nranks
        head = ctl_bytes + 32 * nranks            # + per rank: pid, address, bytes of a posted buffer
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
        self.posts = buf[ctl_bytes:head].view(np.uint64).reshape(nranks, 4)   # [r] = pid, address, bytes, -
        self.posts[rank, 0] = os.getpid()
        self.cma = False          # single-copy reads between the ranks work (set by the communicator)
        self.data = buf[head:].reshape(2, nranks, self.area)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self.posts[rank, 1] = self._base          # something the others may try to read (cma.works)
        self.round = 0
        oversubscribed = nranks > len(os.sched_getaffinity(0))
        self.spin = 0.0 if oversubscribed else float(os.environ.get("PYXCCL_SPIN_US", 50)) * 1e-6
        self.yields = int(os.environ.get("PYXCCL_YIELDS", 20)) if oversubscribed else 0
        self.deadline = 0.0
        self.who = "fast path"

    @classmethod
    def open(cls, rank, nranks, area_bytes, owner_pid: int, owner_fd: int) -> "HostSegment":
        fd = os.open(f"/proc/{owner_pid}/fd/{owner_fd}", os.O_RDWR)
        return cls(rank, nranks, area_bytes, fd=fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.ctl = self.data = None
        try:
            self._map.close()
        except BufferError:
            pass      # a view is still alive; the map goes with it

    # --- one round -------------------------------------------------------------------
    def begin(self) -> np.ndarray:
        """Start the next round: wait until my area may be reused; return it (uint8)."""
        self.round = (self.round + 1) & 0xFFFFFFFF
        prev = (self.round - 1) & 0xFFFFFFFF
        for p in range(self.n):
            if p != self.rank:
                self.wait(p, prev)
        return self.data[self.round & 1, self.rank]

    def publish(self) -> None:
        line = self.ctl[self.rank]
        line[0] = self.round
        if line[1:1 + self.n].any():
            _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._base + self.rank * self.line), _FUTEX_WAKE,
                          ctypes.c_int(self.n), None, None, 0)

    def post(self, arr: np.ndarray) -> None:
        """Let the others read ``arr`` (this round) straight from this process's memory."""
        self.posts[self.rank, 1] = arr.ctypes.data
        self.posts[self.rank, 2] = arr.nbytes

    def read(self, p: int, dst: np.ndarray, offset: int = 0) -> None:
        """Fill ``dst`` from rank ``p``'s posted buffer, ``offset`` bytes in (single copy)."""
        from .cma import read
        if dst.nbytes:
            read(int(self.posts[p, 0]), dst.ctypes.data, int(self.posts[p, 1]) + offset, dst.nbytes)

    def area_of(self, p: int) -> np.ndarray:
        return self.data[self.round & 1, p]

    def wait(self, p: int, target: int | None = None) -> None:
        """Until rank ``p`` has published round ``target`` (default: this round)."""
        target = self.round if target is None else target
        ctl = self.ctl
        if _ge(int(ctl[p, 0]), target):
            return
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
            cur = int(ctl[p, 0])
            if _ge(cur, target):
                ctl[p, flag] = 0
                return
            _libc.syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, ctypes.c_int(cur), ctypes.byref(_NAP), None, 0)
            ctl[p, flag] = 0
            if _ge(int(ctl[p, 0]), target):
                return
            if time.monotonic() > self.deadline:
                raise CommTimeoutError(f"rank {self.rank}: {self.who} timed out waiting for rank {p}; that rank "
                                       f"is slow, stuck or did not make the same call", rank=self.rank, peer=p)
            self.check_alive(p)

    def check_alive(self, p: int) -> None:
        """Overridden by the communicator: raise if rank ``p`` is lost."""
