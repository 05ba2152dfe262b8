"""The communication of the parallel modules: torch.distributed calls on a :class:`Group`, counted.

Each function records (group, primitive, bytes: the call's whole buffer, nccl-tests' convention, which
``Communicator.traffic()`` and the planner (``pyxccl/plan/traffic.py``) use too: an allgather's gathered
output, a reduce-scatter's and an all-to-all's input) in :data:`pyxccl.parallel.traffic.TRAFFIC`
and makes the torch.distributed call on the group's process group, so the modules run on any
backend (pyxccl, Gloo) and what they move is counted the same way on each.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .traffic import TRAFFIC


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM, async_op: bool = False):
    """Sum ``t`` over ``group`` in place (torch's ``all_reduce``)."""
    TRAFFIC.record(group, "all_reduce", _nbytes(t))
    return dist.all_reduce(t, op=op, group=group.pg, async_op=async_op)


def all_gather(out: torch.Tensor, t: torch.Tensor, group, async_op: bool = False):
    """``out`` (``group.size`` times ``t``'s elements) = every rank's ``t`` in rank order."""
    TRAFFIC.record(group, "all_gather", _nbytes(out))
    return dist.all_gather_into_tensor(out, t.contiguous(), group=group.pg, async_op=async_op)


def reduce_scatter(out: torch.Tensor, t: torch.Tensor, group, op=dist.ReduceOp.SUM, async_op: bool = False):
    """``out`` = this rank's block of the sum of every rank's ``t`` (``group.size`` blocks)."""
    TRAFFIC.record(group, "reduce_scatter", _nbytes(t))
    return dist.reduce_scatter_tensor(out, t.contiguous(), op=op, group=group.pg, async_op=async_op)


def all_to_all(out: torch.Tensor, t: torch.Tensor, group, out_splits=None, in_splits=None, async_op: bool = False):
    """Block i of ``t`` (``in_splits[i]`` rows) to rank i; ``out`` gets block j from rank j."""
    TRAFFIC.record(group, "all_to_all", _nbytes(t))
    return dist.all_to_all_single(out, t.contiguous(), out_splits, in_splits, group=group.pg, async_op=async_op)


def broadcast(t: torch.Tensor, src: int, group, async_op: bool = False):
    """``t`` of group rank ``src`` to every rank of ``group``."""
    TRAFFIC.record(group, "broadcast", _nbytes(t))
    return dist.broadcast(t, src=group.ranks[src], group=group.pg, async_op=async_op)


def isend(t: torch.Tensor, dst: int, group):
    """Send ``t`` to group rank ``dst``; returns the Work."""
    TRAFFIC.record(group, "send", _nbytes(t))
    return dist.isend(t.contiguous(), dst=group.ranks[dst], group=group.pg)


def irecv(t: torch.Tensor, src: int, group):
    """Receive into ``t`` from group rank ``src``; returns the Work."""
    TRAFFIC.record(group, "recv", _nbytes(t))
    return dist.irecv(t, src=group.ranks[src], group=group.pg)
