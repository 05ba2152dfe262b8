"""Single-copy reads from and writes to another process's memory (Linux cross-memory
attach, process_vm_readv and process_vm_writev), as MPICH and Open MPI use on one host. Allowed between
processes of one user unless ptrace rules forbid it; ``works()`` tells."""
from __future__ import annotations

import ctypes
import errno

from .copies import MIN_BYTES, PIECE, bounce_at, short_ahead

_libc = ctypes.CDLL(None, use_errno=True)


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_readv = getattr(_libc, "process_vm_readv", None)
if _readv is not None:
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                       ctypes.c_ulong, ctypes.c_ulong]
    _readv.restype = ctypes.c_ssize_t

_writev = getattr(_libc, "process_vm_writev", None)
if _writev is not None:
    _writev.argtypes = _readv.argtypes
    _writev.restype = ctypes.c_ssize_t

_CHUNK = 1 << 30


def _move(call, name: str, pid: int, local_addr: int, remote_addr: int, nbytes: int) -> None:
    done = 0
    while done < nbytes:
        want = min(_CHUNK, nbytes - done)
        local = _Iovec(local_addr + done, want)
        remote = _Iovec(remote_addr + done, want)
        got = call(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            raise OSError(ctypes.get_errno() or errno.EFAULT, f"{name} with pid {pid} failed")
        done += got


def _bounced(call, name: str, pid: int, local_addr: int, remote_addr: int, nbytes: int, reading: bool) -> None:
    """``_move`` where the kernel's copy would be slow (``copies.py``): in pieces through the bounce buffer,
    half a page from the source."""
    for at in range(0, nbytes, PIECE):
        m = min(PIECE, nbytes - at)
        _, b = bounce_at((remote_addr if reading else local_addr) + at, m)
        if not reading:
            ctypes.memmove(b, local_addr + at, m)
        _move(call, name, pid, b, remote_addr + at, m)
        if reading:
            ctypes.memmove(local_addr + at, b, m)


def read(pid: int, dst_addr: int, src_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``src_addr`` in process ``pid`` to ``dst_addr`` here."""
    if nbytes >= MIN_BYTES and short_ahead(dst_addr, src_addr):
        _bounced(_readv, "process_vm_readv", pid, dst_addr, src_addr, nbytes, reading=True)
    else:
        _move(_readv, "process_vm_readv", pid, dst_addr, src_addr, nbytes)


def write(pid: int, dst_addr: int, src_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``src_addr`` here to ``dst_addr`` in process ``pid``."""
    if _writev is None:
        raise OSError(errno.ENOSYS, "process_vm_writev is not available")
    if nbytes >= MIN_BYTES and short_ahead(dst_addr, src_addr):
        _bounced(_writev, "process_vm_writev", pid, src_addr, dst_addr, nbytes, reading=False)
    else:
        _move(_writev, "process_vm_writev", pid, src_addr, dst_addr, nbytes)


def reader(pid: int, dst_addr: int, src_addr: int, nbytes: int):
    """A read of ``nbytes`` at ``src_addr`` in process ``pid`` to ``dst_addr`` here, prepared once:
    a callable that makes one ``process_vm_readv`` (no bounce, no loop) and returns whether it read
    every byte. For timing the kernel's copy as the C executor makes it (``sim.calibrate``)."""
    local, remote = _Iovec(dst_addr, nbytes), _Iovec(src_addr, nbytes)
    args = (pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return lambda: _readv(*args) == nbytes


def works(pid: int, addr: int) -> bool:
    """Can this process read 8 bytes at ``addr`` of process ``pid``?"""
    if _readv is None:
        return False
    buf = ctypes.create_string_buffer(8)
    try:
        read(pid, ctypes.addressof(buf), addr, 8)
        return True
    except OSError:
        return False
