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
waiter spins briefly, then sleeps on the futex.

Memory order: a reader must see a window's data and header once it sees the
counter that publishes them, and a rank must not overwrite its window before
its readers' counters say they are done. The native executor (``_native.c``)
uses release stores and acquire loads for that, on any CPU. The Python
executor (``core/onehost.py`` through the methods here) relies on x86's order
(stores are not reordered with stores, nor loads with loads) and a locked
instruction as the one full barrier it needs (``fence``); on other CPUs
(aarch64, ...) it puts real barriers where that order is assumed (``_acquire``,
``_release``, ``fence``: ``pyxccl._native.fence``), and where that helper is
not built it refuses to run: ``ordering_problem()`` says why, and the
communicator then does without the fast path (``onehost.attach_segment``).

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

from .. import _env
from .._errors import CommTimeoutError, ProtocolError
from .mailbox import lost_error
from .topology import job_cpus

_LINE = 64                  # bytes of a round header, and the alignment of everything in the segment
# Where things are in a control line (uint32 words): the round counter, rank w's sleep flag at
# _FLAGS + w, the CPU the rank last ran on at _CPU + n (only the native waits use it), when it entered its
# last two calls at _ENTRY + n (by the call's parity), and (rank 0's line) the way its current call writes
# windows at _WAY + n (_native.c, nt_windows: rank 0 picks for all, timing its calls from the last entry)
_COUNTER, _FLAGS, _CPU, _ENTRY, _WAY = 0, 1, 1, 2, 4
_PID_WORDS = 2              # uint64 per rank in the pid table: the pid, an address of its memory
#: the layout the native executor assumes (onehost.py compares it with ``_native.tables()``)
LAYOUT = {"counter_word": _COUNTER, "flags_word": _FLAGS, "cpu_word_plus_n": _CPU, "entry_words_plus_n": _ENTRY,
          "way_word_plus_n": _WAY,
          "header_bytes": _LINE, "pid_words": _PID_WORDS}
#: the order of ``HostSegment.layout``, the segment as ``_native.run`` takes it
LAYOUT_FIELDS = ("base", "line", "hdr_at", "head", "area", "pids_at", "me", "n")
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)
SEQ, W0, W1, ADDR, NBYTES = range(5)     # fields of a round header
_NOWHERE = 1 << 63          # a posted address taken back (revoke): above every process's address space
_CALL = struct.Struct("<QQQ")            # seq, w0, w1 at the start of a round header
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_FENCE = threading.Lock()                # taking a lock is an atomic instruction: a full memory barrier (x86)
# x86 keeps stores in order and loads in order (only a load may pass an earlier store: fence() is
# for that); other CPUs need barriers wherever that order is assumed: the C helper's
_ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i486", "i586", "i686", "x86")
_BARRIER = None
if not _ORDERED:
    try:
        from .._native import fence as _BARRIER
    except ImportError:     # not built (or built before it had a fence): ordering_problem() says so
        _BARRIER = None


def ordering_problem() -> str | None:
    """Why the Python executor cannot run safely on this CPU, or None: it needs x86's memory order, or
    the barriers of the C helper ``pyxccl._native`` elsewhere."""
    if _ORDERED or _BARRIER is not None:
        return None
    return (f"the one-host fast path's Python executor needs memory barriers on this CPU "
            f"({platform.machine()}: loads and stores may be reordered), and it takes them from the C helper "
            f"pyxccl._native, which is not built here (or is too old to have them); reinstall pyxccl where a C "
            f"compiler is available (pip builds the helper from source) to use the fast path")


def _acquire() -> None:
    """After seeing a peer's counter: what it published is read only after (a no-op on x86)."""
    if _BARRIER is not None:
        _BARRIER()


_release = _acquire     # before publishing my counter: what it publishes is written before (the same barrier)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


# A futex wait sleeps at most NAP_NS, then the waiter looks at the deadline and the peers (they cannot wake
# it when they fail) and sleeps again, each nap twice the last up to NAP_MAX_NS: a rank that waits long
# wakes 40 times in 2 s, not 1,000 (4 ranks on 2 cores: 7% of a core with 2 ms naps, 0.7% with these)
NAP_NS, NAP_MAX_NS = 2_000_000, 50_000_000


def longer(nap_ns: int) -> int:
    """The nap after one of ``nap_ns``."""
    return min(2 * nap_ns, NAP_MAX_NS)


def _ge(a: int, b: int) -> bool:
    """a >= b for 32-bit counters that wrap."""
    return ((a - b) & 0xFFFFFFFF) < 0x80000000


class HostSegment:
    def __init__(self, rank: int, nranks: int, area_bytes: int, fd: int | None = None):
        self.rank, self.n = rank, nranks
        self.area = area_bytes - area_bytes % _LINE
        # counter, a sleep flag per rank, the CPU the rank last ran on (the native waits read it), entries, a way
        self.line = _LINE * ((4 * (_WAY + nranks + 1) + _LINE - 1) // _LINE)
        ctl_bytes = self.line * nranks
        pids = _LINE * ((8 * _PID_WORDS * nranks + _LINE - 1) // _LINE)
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
        # per rank: its pid, an address of its memory
        self.pids = buf[ctl_bytes:ctl_bytes + 8 * _PID_WORDS * nranks].view(np.uint64).reshape(nranks, _PID_WORDS)
        self.hdr = buf[ctl_bytes + pids:head].view(np.uint64).reshape(2, nranks, _LINE // 8)
        self._hdr_at = ctl_bytes + pids      # byte offset of the round headers (struct access on the hot path)
        self.data = buf[head:].reshape(2, nranks, self.area)
        # Held for the object's life: the map is never unmapped under a native run of another thread
        # (it holds this object); it goes when the last reference to the segment does.
        self._anchor = ctypes.c_char.from_buffer(self._map)
        self._base = ctypes.addressof(self._anchor)
        # the segment as _native.run takes it, in the order of LAYOUT_FIELDS
        self.layout = (self._base, self.line, self._hdr_at, head, self.area, ctl_bytes, rank, nranks)
        self.pids[rank] = (os.getpid(), self._base)    # something the others may try to read (cma.works)
        self.cma = False          # single-copy reads between the ranks work (set by the communicator)
        self.pipelined = False    # every rank has a core of its own (set by the communicator: all agree)
        self.round = 0
        self._typed: dict = {}
        self.oversubscribed = oversubscribed = nranks > job_cpus()
        self.spin = 0.0 if oversubscribed else _env.get("PYXCCL_SPIN_US") * 1e-6
        # yields before sleeping, oversubscribed. Up to 2 ranks a core, the rank a wait needs is likely its
        # core-mate, and a sleep costs a wake-up (30-100 us here): 4 ranks on 2 cores, 8 B allreduce, 25-160 us
        # with 20 yields (a median of 77 over 7 quiet runs), 21-35 with 200 (median 27). With many ranks a
        # core a yield hands the core to another waiter: 64 ranks on 2, issue 26's job 7.5 s with 20 and
        # 9.1 s with 200, its steady 8 B calls 12 and 24 ms
        few = nranks <= 2 * job_cpus()
        self.yields = _env.get("PYXCCL_YIELDS", 200 if few else 20) if oversubscribed else 0
        self.waits = (int(self.spin * 1e9), self.yields, NAP_NS)       # the native executor's wait settings
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
    def begin(self, free: bool = False) -> int:
        """Start the next round: wait until my window of this parity may be reused; return the parity.
        A free round (walk.py, rule 1: it writes nothing the others read) waits for nobody and leaves the
        header alone."""
        prev = self.round
        self.round = (prev + 1) & 0xFFFFFFFF
        parity = self.round & 1
        if free:
            return parity
        m, line = self._map, self.line
        for p in range(self.n):
            if p != self.rank and not _ge(_U32.unpack_from(m, p * line + 4 * _COUNTER)[0], prev):
                self.wait(p, prev)
        if _BARRIER is not None:
            _acquire()      # the peers' reads of this parity's windows before my writes to mine
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

    def publish(self, seq: int, w0: int, w1: int, header: bool = True) -> None:
        """Make this round's window (and the call's fingerprint, unless ``header`` is false: a free
        round's) visible: header, then counter."""
        m, at = self._map, self.rank * self.line
        if header:
            _CALL.pack_into(m, self._hdr_at + ((self.round & 1) * self.n + self.rank) * _LINE, seq, w0, w1)
        if _BARRIER is not None:
            _release()      # the window and header before the counter
        _U32.pack_into(m, at + 4 * _COUNTER, self.round)
        self.fence()        # my counter before their sleep flags: else a waiter may sleep through it
        flags = at + 4 * _FLAGS
        if any(m[flags:flags + 4 * self.n]):      # somebody sleeps on my counter
            _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._base + at), _FUTEX_WAKE, ctypes.c_int(self.n),
                          None, None, 0)

    def reached(self, p: int) -> bool:
        """Has rank ``p`` published this round yet? (Never waits.) After ``publish``, ``fence()`` first:
        then of two ranks that publish and look at each other, at least one sees the other (a load may
        not pass the store before it, as it could on x86 without a barrier)."""
        if _ge(_U32.unpack_from(self._map, p * self.line + 4 * _COUNTER)[0], self.round):
            if _BARRIER is not None:
                _acquire()
            return True
        return False

    @staticmethod
    def fence() -> None:
        """A full barrier: my stores before my later loads (a lock's atomic instruction on x86, the C
        helper's barrier elsewhere)."""
        if _BARRIER is not None:
            _BARRIER()
            return
        with _FENCE:
            pass

    def call_of(self, p: int, parity: int) -> tuple[int, int, int]:
        """The fingerprint (seq, w0, w1) rank ``p`` published for its round of ``parity``."""
        return _CALL.unpack_from(self._map, self._hdr_at + (parity * self.n + p) * _LINE)

    def post(self, parity: int, arr: np.ndarray) -> None:
        """Let the others read ``arr`` in this round straight from this process's memory."""
        h = self.hdr[parity, self.rank]
        h[ADDR], h[NBYTES] = arr.ctypes.data, arr.nbytes

    def revoke(self) -> None:
        """This rank leaves its call before its end (an error) in which it posted a buffer for the others to
        write into (the executors call this then; a buffer posted only to be read is left: a late read
        harms nobody): the addresses it posted are taken back, so that a peer still to write them fails
        (its single copy faults on an address no process has: a ProtocolError saying the owner abandoned
        it) instead of writing memory the caller has taken back. (A single copy already under way when
        this runs still lands.)"""
        if self.hdr is not None:
            self.hdr[:, self.rank, ADDR] = _NOWHERE

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

    def write(self, p: int, parity: int, src: np.ndarray, offset: int) -> None:
        """Copy ``src`` into the buffer rank ``p`` posted, ``offset`` bytes in (single copy), never
        outside what ``p`` declared."""
        h = self.hdr[parity, p]
        if offset < 0 or offset + src.nbytes > int(h[NBYTES]):
            raise self.read_error(p, parity, offset + src.nbytes, writing=True)
        from .cma import write
        try:
            write(int(self.pids[p, 0]), int(h[ADDR]) + offset, src.ctypes.data, src.nbytes)
        except OSError as e:
            raise self.read_error(p, parity, 0, e, writing=True) from None

    def read_error(self, p: int, parity: int, end: int, err: OSError | None = None,
                   writing: bool = False) -> ProtocolError:
        """The error of a single-copy read of (``writing``: write into) rank ``p``'s posted buffer: past
        its end, or failed."""
        posted = int(self.hdr[parity, p, NBYTES])
        verb = "writing" if writing else "reading"
        if err is None and not posted and writing:
            why = (f"writing up to byte {end} of a buffer rank {p} did not post: the ranks disagree on the "
                   f"algorithm or sizes")
        elif err is None and not posted:      # (the native executor's window reads are checked too)
            why = (f"reading up to byte {end} of the {self.area}-byte window of rank {p}: the ranks disagree on "
                   f"sizes or windows")
        elif err is None:
            why = f"{verb} up to byte {end} of the {posted}-byte buffer rank {p} posted: the ranks disagree on sizes"
        elif err.errno == errno.ESRCH:      # its process is gone: a lost rank, not a protocol error
            e = lost_error(self.rank, p, f"its process exited or was killed during {self._who()}")
            e.op, e.seq = self.op, self.seq
            return e
        else:
            why = f"{verb} the buffer rank {p} posted failed ({err}); that rank freed or changed it during the call"
        e = ProtocolError(f"rank {self.rank}: {self._who()}: {why}", rank=self.rank, peer=p, op=self.op,
                          seq=self.seq)
        e.abandoned = err is not None      # the owner left the call: perhaps for a cause this rank learns next
        return e

    def timed_out(self, p: int) -> CommTimeoutError:
        return CommTimeoutError(f"rank {self.rank}: {self._who()} timed out waiting for rank {p}; that rank "
                                f"is slow, stuck or did not make the same call", rank=self.rank, peer=p, op=self.op,
                                seq=self.seq)

    def wait(self, p: int, target: int | None = None) -> None:
        """Until rank ``p`` has published round ``target`` (default: this round); what it published
        then is visible to this rank."""
        target = self.round if target is None else target
        if not _ge(_U32.unpack_from(self._map, p * self.line + 4 * _COUNTER)[0], target):
            self._sleep(p, target)
        if _BARRIER is not None:
            _acquire()

    def _sleep(self, p: int, target: int) -> None:
        ctl = self.ctl
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.spin:
            if _ge(int(ctl[p, _COUNTER]), target):
                return
        for _ in range(self.yields):          # more ranks than cores: let the one we wait for run
            os.sched_yield()
            if _ge(int(ctl[p, _COUNTER]), target):
                return
        addr = ctypes.c_void_p(self._base + p * self.line + 4 * _COUNTER)
        flag = _FLAGS + self.rank
        nap = NAP_NS
        while True:
            ctl[p, flag] = 1
            self.fence()    # my flag before their counter (the publisher does the converse)
            cur = int(ctl[p, _COUNTER])
            if _ge(cur, target):
                ctl[p, flag] = 0
                return
            _libc.syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, ctypes.c_int(cur), ctypes.byref(_Timespec(0, nap)), None, 0)
            nap = longer(nap)
            ctl[p, flag] = 0
            if _ge(int(ctl[p, _COUNTER]), target):
                return
            if time.monotonic() > self.deadline:
                raise self.timed_out(p)
            self.check_alive(p, self.seq)

    def _who(self) -> str:
        return f"{self.op} (#{self.seq} on this communicator)"

    def check_alive(self, p: int, seq: int) -> None:
        """Overridden by the communicator: raise if it failed, if rank ``p`` is lost, or if call ``seq``
        cannot go on."""
