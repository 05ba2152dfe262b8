"""Single-copy reads from another process's memory (Linux cross-memory attach,
process_vm_readv), as MPICH and Open MPI use on one host. Allowed between
processes of one user unless ptrace rules forbid it; ``works()`` tells."""
from __future__ import annotations

import ctypes

_libc = ctypes.CDLL(None, use_errno=True)


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_readv = getattr(_libc, "process_vm_readv", None)
if _readv is not None:
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                       ctypes.c_ulong, ctypes.c_ulong]
    _readv.restype = ctypes.c_ssize_t

_CHUNK = 1 << 30


def read(pid: int, dst_addr: int, src_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``src_addr`` in process ``pid`` to ``dst_addr`` here."""
    done = 0
    while done < nbytes:
        want = min(_CHUNK, nbytes - done)
        local = _Iovec(dst_addr + done, want)
        remote = _Iovec(src_addr + done, want)
        got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            raise OSError(ctypes.get_errno(), f"process_vm_readv from pid {pid} failed")
        done += got


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
