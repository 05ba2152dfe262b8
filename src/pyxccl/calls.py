"""What each call of the Communicator is: its arguments checked and described, once per call form.

``DESCRIBE[name](c, rank, size, ...)`` takes a call's arguments as the user passed them (``c``: the
call's ``_checks.Check``) and returns a :class:`Described`: its primitive, the arrays it reads and
writes, the builder arguments (``pyxccl.primitives``), what its fingerprint says of the counts, the
bytes the algorithm is chosen for, op, root, what the call returns, whether it writes its output
and what a repeat allocates. The Communicator (comm.py) runs what is described; a repeated call of
the same key runs the same ``Prepared`` (core/prepared.py) without coming here.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._checks import Check

_BARRIER_IN = np.empty(0, np.uint8)


class Described(NamedTuple):
    primitive: str
    inp: np.ndarray | None      # what this rank reads (None: nothing)
    out: np.ndarray | None      # what it writes (None: nothing); may be ``inp`` (in place)
    args: dict                  # the schedule builder's arguments (pyxccl.primitives)
    size: object                # what the fingerprint says of the counts (primitives.size_word)
    nbytes: int                 # the size the algorithm is chosen for
    op: object = None           # the checked ReduceOp
    root: int | None = None
    result: object = None       # what the call returns
    writes: bool = True         # it writes ``out`` (a broadcast's root and a reduce's other ranks do not)
    allocates: int | None = None    # a repeat allocates an output of this many elements (recvbuf=None)
    codec: object = None        # compression (compression/): the call's compressor
    after: object = None        # compression: what runs once the schedule has


def allreduce(c: Check, rank: int, size: int, tensor, op, out) -> Described:
    buf = c.array(tensor, "tensor", writable=out is None)
    dst = buf if out is None else c.same_dtype(buf, c.array(out, "out", writable=True), "out")
    return Described("allreduce", buf, dst, dict(count=buf.size), buf.size, buf.nbytes, c.op_for(op, buf.dtype),
                     result=tensor if out is None else out)


def broadcast(c: Check, rank: int, size: int, tensor, root) -> Described:
    root = c.rank(root, "root")
    buf = c.array(tensor, "tensor", writable=rank != root)
    return Described("broadcast", None, buf, dict(count=buf.size, root=root), buf.size, buf.nbytes, root=root,
                     result=tensor, writes=rank != root)


def reduce(c: Check, rank: int, size: int, tensor, root, op, out) -> Described:
    """The other ranks' buffers are read, never written."""
    root = c.rank(root, "root")
    is_root = rank == root
    buf = c.array(tensor, "tensor", writable=is_root and out is None)
    dst = c.same_dtype(buf, c.array(out, "out", writable=True), "out") if is_root and out is not None else buf
    return Described("reduce", buf, dst, dict(count=buf.size, root=root), buf.size, buf.nbytes,
                     c.op_for(op, buf.dtype), root, out if out is not None and is_root else tensor, writes=is_root)


def allgather(c: Check, rank: int, size: int, sendbuf, recvbuf) -> Described:
    send = c.array(sendbuf, "sendbuf", writable=False)
    return _allgatherv(c, send, recvbuf, [send.size] * size)


def allgatherv(c: Check, rank: int, size: int, sendbuf, recvbuf, counts) -> Described:
    return _allgatherv(c, c.array(sendbuf, "sendbuf", writable=False), recvbuf, counts)


def _allgatherv(c: Check, send, recvbuf, counts) -> Described:
    counts = c.counts(counts, "counts", own=(send.size, "sendbuf"))
    allocates = sum(counts) if recvbuf is None else None
    recvbuf = c.allocate(recvbuf, sum(counts), send.dtype)
    recv = c.same_dtype(send, c.array(recvbuf, "recvbuf", writable=True), "recvbuf")
    return Described("allgather", send, recv, dict(counts=counts), counts, recv.nbytes, result=recvbuf,
                     allocates=allocates)


def gather(c: Check, rank: int, size: int, sendbuf, recvbuf, root) -> Described:
    send = c.array(sendbuf, "sendbuf", writable=False)
    return _gatherv(c, rank, size, send, recvbuf, root, [send.size] * size)


def gatherv(c: Check, rank: int, size: int, sendbuf, recvbuf, counts, root) -> Described:
    send = c.array(sendbuf, "sendbuf", writable=False)
    return _gatherv(c, rank, size, send, recvbuf, root, c.root_counts(counts, c.rank(root, "root"), send.size))


def _gatherv(c: Check, rank, size, send, recvbuf, root, counts) -> Described:
    """Only the root has an output: None there allocates one; the others' ``recvbuf`` is not used."""
    root = c.rank(root, "root")
    counts = c.counts(counts, "counts", own=(send.size, "sendbuf"))
    recv = allocates = None
    if rank == root:
        allocates = sum(counts) if recvbuf is None else None
        recvbuf = c.allocate(recvbuf, sum(counts), send.dtype)
        recv = c.same_dtype(send, c.array(recvbuf, "recvbuf", writable=True), "recvbuf")
    else:
        recvbuf = None
    return Described("gather", send, recv, dict(counts=counts, root=root), c.agreed(counts), send.nbytes * size,
                     root=root, result=recvbuf, allocates=allocates)


def scatter(c: Check, rank: int, size: int, sendbuf, recvbuf, root) -> Described:
    recv = c.array(recvbuf, "recvbuf", writable=True)
    return _scatterv(c, rank, size, sendbuf, recv, recvbuf, root, [recv.size] * size)


def scatterv(c: Check, rank: int, size: int, sendbuf, recvbuf, counts, root) -> Described:
    recv = c.array(recvbuf, "recvbuf", writable=True)
    return _scatterv(c, rank, size, sendbuf, recv, recvbuf, root,
                     c.root_counts(counts, c.rank(root, "root"), recv.size))


def _scatterv(c: Check, rank, size, sendbuf, recv, recvbuf, root, counts) -> Described:
    """Only the root's ``sendbuf`` is read (the others may pass None)."""
    root = c.rank(root, "root")
    counts = c.counts(counts, "counts", own=(recv.size, "recvbuf"))
    send = None
    if rank == root:
        if sendbuf is None:
            raise c.error("the root must pass sendbuf")
        send = c.same_dtype(recv, c.array(sendbuf, "sendbuf", writable=False), "sendbuf")
    return Described("scatter", send, recv, dict(counts=counts, root=root), c.agreed(counts), recv.nbytes * size,
                     root=root, result=recvbuf)


def reduce_scatter(c: Check, rank: int, size: int, sendbuf, recvbuf, op) -> Described:
    recv = c.array(recvbuf, "recvbuf", writable=True)
    return _reduce_scatterv(c, sendbuf, recv, recvbuf, [recv.size] * size, op)


def reduce_scatterv(c: Check, rank: int, size: int, sendbuf, recvbuf, counts, op) -> Described:
    return _reduce_scatterv(c, sendbuf, c.array(recvbuf, "recvbuf", writable=True), recvbuf, counts, op)


def _reduce_scatterv(c: Check, sendbuf, recv, recvbuf, counts, op) -> Described:
    send = c.same_dtype(recv, c.array(sendbuf, "sendbuf", writable=False), "sendbuf")
    counts = c.counts(counts, "counts", total=(send.size, "sendbuf"), own=(recv.size, "recvbuf"))
    return Described("reduce_scatter", send, recv, dict(counts=counts), counts, send.nbytes,
                     c.op_for(op, send.dtype), result=recvbuf)


def alltoall(c: Check, rank: int, size: int, sendbuf, recvbuf) -> Described:
    send = c.array(sendbuf, "sendbuf", writable=False)
    if send.size % size:
        raise c.error(f"sendbuf has {send.size} elements, not a multiple of the {size} ranks")
    counts = [send.size // size] * size
    return _alltoallv(c, rank, send, recvbuf, counts, counts)


def alltoallv(c: Check, rank: int, size: int, sendbuf, recvbuf, send_counts, recv_counts) -> Described:
    return _alltoallv(c, rank, c.array(sendbuf, "sendbuf", writable=False), recvbuf, send_counts, recv_counts)


def _alltoallv(c: Check, rank, send, recvbuf, send_counts, recv_counts) -> Described:
    recv = c.same_dtype(send, c.array(recvbuf, "recvbuf", writable=True), "recvbuf")
    sc = c.counts(send_counts, "send_counts", total=(send.size, "sendbuf"))
    rc = c.counts(recv_counts, "recv_counts", total=(recv.size, "recvbuf"))
    if sc[rank] != rc[rank]:
        raise c.error(f"this rank sends itself {sc[rank]} elements but expects {rc[rank]}")
    # alltoallv: each rank knows only its own counts, which the fingerprint cannot compare
    return Described("alltoall", send, recv, dict(send_counts=sc, recv_counts=rc),
                     sc if c.op == "alltoall" else None, send.nbytes, result=recvbuf)


def barrier(c: Check, rank: int, size: int) -> Described:
    return Described("barrier", _BARRIER_IN, None, {}, 0, 0)


DESCRIBE = {f.__name__: f for f in (allreduce, broadcast, reduce, allgather, allgatherv, gather, gatherv, scatter,
                                    scatterv, reduce_scatter, reduce_scatterv, alltoall, alltoallv, barrier)}
