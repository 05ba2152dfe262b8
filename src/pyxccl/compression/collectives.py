"""Compressed collectives: allreduce, reduce_scatter and allgather with ``compression=``.

Two ways, by the kind of compressor (``pyxccl.compression``):

- A **quantizer** (FP16, BF16, INT8) is applied to every message of the algorithm that runs (ring,
  tree, hierarchical, ...: a message algorithm; the shared segment moves data by reads): each hop
  encodes what it sends, the receiver decodes into float32 and adds there (the reduction in float32,
  re-quantized at the next hop: the error grows with the hops a partial sum takes, up to about
  ``n - 1`` round trips' for a ring allreduce). Inside a host, a hierarchical algorithm sends
  uncompressed: compression is for the slow link. Every rank ends with the same result (a sender
  keeps what its peer saw).
- A **sparsifier** (TopK, Threshold, with error feedback kept per ``key``) compresses this rank's
  tensor once; the (index, value) pairs of every rank are all-gathered (6 bytes a pair: the value and
  the index's low 16 bits, with a pair count per 65,536 elements; one collective, of the tuner's
  choice) and summed in rank order on every rank. When the pairs would move more than a dense ring
  allreduce (k above 4/3 count/n: the union is dense), the contribution is densified and all-reduced
  instead.

Each is one call of the communicator, in issue order, ``async_op`` included (Threshold, whose pair
counts differ by rank, first all-gathers the counts, blocking).

>>> comm.allreduce(grad, compression=INT8())                          # doctest: +SKIP
>>> comm.allreduce(grad, compression=TopK(0.01), key="layer3.weight")
"""
from __future__ import annotations

import numpy as np

from .._checks import Check
from ..calls import Described
from ..ops import ReduceOp
from .codecs import Compressor, Quantizer, Sparsifier, nbytes, parse


def _parsed(comm, compression):
    """A spec string names one compressor per communicator ("topk:0.01" and "TopK:0.010" the same): its
    state (TopK's residuals per key, INT8's random stream) carries over from call to call, as it does
    for a compressor object passed each time. Kept on the communicator's context, whose close() drops
    them (their residuals can be large)."""
    if not isinstance(compression, str):
        return parse(compression)
    known = comm._compressors()
    codec = known.get(compression)
    if codec is None:
        codec = parse(compression)
        if isinstance(codec, Compressor):
            codec = known.setdefault(codec.spec, codec)
        codec = known.setdefault(compression, codec)     # setdefault: one winner if threads race
    return codec


def _codec(comm, c: Check, compression, buf: np.ndarray, op=None):
    codec = _parsed(comm, compression)
    if isinstance(codec, str):              # "auto": the cost model decides (None: not worth it here)
        codec = comm.compression_for(c.op, buf.nbytes)
    if codec is None:
        return None
    if buf.dtype != np.float32:
        raise c.error(f"compression={codec.spec!r} compresses float32 tensors, not {buf.dtype}; cast, or call "
                      f"without compression")
    if op is not None and c.op_for(op, buf.dtype) not in (ReduceOp.SUM, ReduceOp.AVG):
        raise c.error(f"compression={codec.spec!r} sums what it decodes: use op SUM or AVG, not {op}")
    return codec


def _sparsify(c: Check, codec: Sparsifier, x: np.ndarray, key):
    if codec.error_feedback and key is None:
        raise c.error(f"{codec.spec} with error feedback keeps what was not sent, per tensor: pass key= (a name for "
                      f"this tensor, the same at every step)")
    return codec.compress(x, key)


def _pair_counts(comm, codec: Sparsifier, pairs: int, count: int) -> list[int]:
    """Every rank's number of pairs: TopK's k is the same everywhere (the same count); Threshold's are
    all-gathered first (a blocking call: every rank must know them to size the gather)."""
    if codec.k(count) is not None:
        return [pairs] * comm.size
    return [int(x) for x in comm.allgather(np.array([pairs], np.int64))]


def dense_wins(counts: list[int], count: int) -> bool:
    """All-gathering the pairs moves about ``sum(nbytes) * (n-1)/n`` bytes a rank (6 a pair), a ring
    allreduce of the densified tensor ``8 * count * (n-1)/n``: dense when the pairs weigh as much."""
    return len(counts) > 1 and sum(nbytes(m, count) for m in counts) >= 8 * count


def _gather_pairs(run, c: Check, codec: Sparsifier, idx, val, count, counts, add, result):
    """All-gather every rank's (idx, val) pairs of a ``count``-element tensor, then ``add(wires)``: the
    packed pairs of each rank, in rank order."""
    nb = [nbytes(m, count) for m in counts]
    packed = codec.pack(idx, val, count)
    gathered = np.empty(sum(nb), np.uint8)
    ends = np.cumsum(nb).tolist()
    return run(c, Described("allgather", packed, gathered, dict(counts=nb), nb, gathered.nbytes, result=result,
                            after=lambda: add(np.split(gathered, ends[:-1]))))


# Each runs through ``run(check, Described)``: the Communicator's, which runs a described call.
def allreduce(comm, run, tensor, op, out, async_op, algorithm, timeout, compression, key):
    c = Check(comm, "allreduce", (algorithm, async_op, timeout))
    buf = c.array(tensor, "tensor", writable=out is None)
    dst = buf if out is None else c.same_dtype(buf, c.array(out, "out", writable=True), "out")
    codec = _codec(comm, c, compression, buf, op)
    if codec is None:
        return comm.allreduce(tensor, op, out=out, async_op=async_op, algorithm=algorithm, timeout=timeout)
    op = c.op_for(op, buf.dtype)
    result = tensor if out is None else out
    if isinstance(codec, Quantizer):
        if dst is not buf:                  # in place: each rank keeps what it sent as its peers saw it
            np.copyto(dst, buf)
        return run(c, Described("allreduce", dst, dst, dict(count=dst.size), dst.size, dst.nbytes, op,
                                result=result, codec=codec))
    idx, val = _sparsify(c, codec, buf, key)
    counts = _pair_counts(comm, codec, len(idx), dst.size)
    if dense_wins(counts, dst.size):
        dst[:] = 0
        codec.accumulate(dst, idx, val)
        return run(c, Described("allreduce", dst, dst, dict(count=dst.size), dst.size, dst.nbytes, op,
                                result=result))

    def add(wires):                         # every rank sums in rank order: the same bits everywhere
        codec.sum_packed(dst, wires)
        if op is ReduceOp.AVG:
            np.divide(dst, comm.size, out=dst)
    return _gather_pairs(run, c, codec, idx, val, dst.size, counts, add, result)


def reduce_scatter(comm, run, sendbuf, recvbuf, op, async_op, algorithm, timeout, compression, key):
    c = Check(comm, "reduce_scatter", (algorithm, async_op, timeout))
    recv = c.array(recvbuf, "recvbuf", writable=True)
    send = c.same_dtype(recv, c.array(sendbuf, "sendbuf", writable=False), "sendbuf")
    codec = _codec(comm, c, compression, send, op)
    if codec is None:
        return comm.reduce_scatter(sendbuf, recvbuf, op, async_op=async_op, algorithm=algorithm, timeout=timeout)
    op = c.op_for(op, send.dtype)
    counts = c.counts([recv.size] * comm.size, "counts", total=(send.size, "sendbuf"), own=(recv.size, "recvbuf"))
    if isinstance(codec, Quantizer):
        return run(c, Described("reduce_scatter", send, recv, dict(counts=counts), counts, send.nbytes, op,
                                result=recvbuf, codec=codec))
    idx, val = _sparsify(c, codec, send, key)
    lo, hi = comm.rank * recv.size, (comm.rank + 1) * recv.size

    def add(wires):                         # only the pairs of this rank's part
        recv[:] = 0
        for w in wires:
            i, v = codec.unpack(w, send.size)
            a, b = np.searchsorted(i, (lo, hi))      # indices come sorted
            codec.accumulate(recv, i[a:b] - lo, v[a:b])
        if op is ReduceOp.AVG:
            np.divide(recv, comm.size, out=recv)
    return _gather_pairs(run, c, codec, idx, val, send.size, _pair_counts(comm, codec, len(idx), send.size), add,
                         recvbuf)


def allgather(comm, run, sendbuf, recvbuf, async_op, algorithm, timeout, compression, key):
    c = Check(comm, "allgather", (algorithm, async_op, timeout))
    send = c.array(sendbuf, "sendbuf", writable=False)
    codec = _codec(comm, c, compression, send)
    if codec is None:
        return comm.allgather(sendbuf, recvbuf, async_op=async_op, algorithm=algorithm, timeout=timeout)
    recvbuf = c.allocate(recvbuf, send.size * comm.size, send.dtype)
    recv = c.same_dtype(send, c.array(recvbuf, "recvbuf", writable=True), "recvbuf")
    counts = [send.size] * comm.size
    c.size(recv, sum(counts), "the output")
    if isinstance(codec, Quantizer):        # every rank's block as the others see it, its own included
        return run(c, Described("allgather", codec.round_trip(send), recv, dict(counts=counts), counts, recv.nbytes,
                                result=recvbuf, codec=codec))
    idx, val = _sparsify(c, codec, send, key)

    def add(wires):
        for r, w in enumerate(wires):
            codec.sum_packed(recv[r * send.size:(r + 1) * send.size], [w])
    return _gather_pairs(run, c, codec, idx, val, send.size, _pair_counts(comm, codec, len(idx), send.size), add,
                         recvbuf)

