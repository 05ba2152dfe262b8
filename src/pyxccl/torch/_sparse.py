"""Sparse COO tensors in all_reduce, as Gloo does it: allgather every rank's indices and values,
add them up locally in rank order and coalesce (so every rank gets the same bits as with Gloo).
Every other collective refuses non-strided tensors, as torch does for Gloo."""
from __future__ import annotations

import math

import torch

from pyxccl._errors import CollectiveMismatchError, NotSupportedError

_META = 9          # Gloo's metadata row: up to 4 sparse sizes, up to 4 dense sizes, nnz


def refuse_layouts(rank: int, op: str, args) -> None:
    """Raise NotSupportedError if a tensor among ``args`` (or in their lists) is not strided."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.layout is not torch.strided:
                raise NotSupportedError(
                    f"rank {rank}: {op} of a {a.layout} tensor: pyxccl's torch backend takes sparse COO tensors "
                    f"in all_reduce with SUM only, as Gloo does; call .to_dense() first", rank=rank, op=op)
        elif isinstance(a, (list, tuple)):
            refuse_layouts(rank, op, a)


def check_sparse_allreduce(rank: int, tensors, sum_op: bool) -> bool:
    """Whether this all_reduce is a sparse one; refuses what Gloo refuses at the call."""
    if all(t.layout is torch.strided for t in tensors):
        return False
    if not all(t.layout is torch.sparse_coo for t in tensors):
        bad = next((t.layout for t in tensors if t.layout not in (torch.strided, torch.sparse_coo)), None)
        what = f"a {bad} tensor" if bad is not None else "sparse and dense tensors together"
        raise NotSupportedError(f"rank {rank}: all_reduce of {what}: only sparse COO tensors (or only dense ones) "
                                f"are supported, as with Gloo; convert with .to_sparse() or .to_dense()",
                                rank=rank, op="allreduce")
    if not sum_op:
        raise NotSupportedError(f"rank {rank}: all_reduce of sparse tensors only works with ReduceOp.SUM (as with "
                                f"Gloo); reduce .to_dense() tensors for other ops", rank=rank, op="allreduce")
    return True


def _metadata(rank: int, t: torch.Tensor) -> torch.Tensor:
    row = torch.zeros(_META, dtype=torch.int64)
    sd, dd = t.sparse_dim(), t.dense_dim()
    if sd > 4 or dd > 4:
        raise NotSupportedError(f"rank {rank}: all_reduce of a sparse tensor with {sd} sparse and {dd} dense "
                                f"dimensions: at most 4 of each (as with Gloo)", rank=rank, op="allreduce")
    row[:sd] = torch.tensor(t.shape[:sd])
    row[4:4 + dd] = torch.tensor(t.shape[sd:])
    row[8] = t._nnz()
    return row


def sparse_allreduce(comm, tensors, timeout) -> torch.Tensor:
    """Sum sparse COO ``tensors`` over the ranks of ``comm`` in place (three allgathers)."""
    n, rank = comm.size, comm.rank
    inp = tensors[0]
    for t in tensors[1:]:          # several inputs on one rank: add them first, as Gloo does
        inp = inp + t
    inp = inp.coalesce()
    meta = torch.empty((n, _META), dtype=torch.int64)
    comm.allgather(_metadata(rank, inp), meta, timeout=timeout)
    for r in range(n):
        if not torch.equal(meta[r, :8], meta[rank, :8]):
            raise CollectiveMismatchError(
                f"rank {rank}: all_reduce of sparse tensors: sizes {list(inp.shape)} here, but rank {r} has another "
                f"shape (metadata {meta[r, :8].tolist()}); every rank must pass tensors of one shape. Nothing was "
                f"reduced; the group stays usable", rank=rank, peer=r, op="allreduce")
    nnz = meta[:, 8].tolist()
    sd = inp.sparse_dim()
    indices = torch.empty(sd * sum(nnz), dtype=torch.int64)
    comm.allgatherv(inp._indices().contiguous().reshape(-1), indices, [sd * k for k in nnz], timeout=timeout)
    # values travel as bytes: any dtype (complex, bool) moves, the reduction is torch's
    vals = inp._values().contiguous()
    row_bytes = math.prod(vals.shape[1:]) * vals.element_size()
    values = torch.empty(sum(nnz) * row_bytes, dtype=torch.uint8)
    comm.allgatherv(vals.reshape(-1).view(torch.uint8), values, [k * row_bytes for k in nnz], timeout=timeout)
    values = values.view(vals.dtype).reshape((sum(nnz),) + tuple(vals.shape[1:]))
    out, off = None, 0
    for k in nnz:                  # Gloo's additions, in its order: the same bits as Gloo's
        part = torch.sparse_coo_tensor(indices[sd * off:sd * (off + k)].view(sd, k), values[off:off + k],
                                       inp.shape, dtype=inp.dtype)
        if out is None:
            out = part
        else:
            out += part
        off += k
    return out.coalesce()
