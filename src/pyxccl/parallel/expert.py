"""Expert parallelism: a mixture of experts whose experts are sharded over the EP group.

Each rank routes its own tokens (the gate is replicated), sends every kept (token, expert)
row to the rank holding that expert with one all-to-all, runs its local experts on what it
received, and sends the results back with the reverse all-to-all. Per forward, on the EP group:
one all-to-all of the int64 counts (8 * num_experts bytes) and two of token rows (rows * hidden *
itemsize each); the backward does the two row all-to-alls again, in reverse.

>>> g = ParallelGroups(tp=1, pp=1, ep=4)                   # doctest: +SKIP
>>> moe = MoE(512, 2048, num_experts=8, group=g.ep)        # 2 experts per rank
>>> y = moe(x)                                             # x: [T, 512] or [b, s, 512]
>>> moe.stats["dropped"], moe.global_stats()["load"]
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._errors import InvalidArgumentError
from . import ops


class AllToAll(torch.autograd.Function):
    """Rows of ``x`` (dim 0): ``in_splits[j]`` rows to group rank j, ``out_splits[j]`` rows from it.
    The backward is the reverse exchange of the gradients (splits swapped)."""

    @staticmethod
    def forward(ctx, x, group, out_splits, in_splits):
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        ops.all_to_all(out, x.contiguous(), group, list(out_splits), list(in_splits))
        return out

    @staticmethod
    def backward(ctx, grad):
        g = grad.new_empty((sum(ctx.in_splits),) + tuple(grad.shape[1:]))
        ops.all_to_all(g, grad.contiguous(), ctx.group, list(ctx.in_splits), list(ctx.out_splits))
        return g, None, None, None


def all_to_all(x: torch.Tensor, group, out_splits, in_splits) -> torch.Tensor:
    """Differentiable all-to-all of the rows of ``x`` over ``group`` (see :class:`AllToAll`).

    >>> y = all_to_all(x, g.ep, out_splits=[3, 1], in_splits=[2, 2])   # doctest: +SKIP
    """
    return AllToAll.apply(x, group, [int(s) for s in out_splits], [int(s) for s in in_splits])


def expert(hidden: int, ffn: int) -> nn.Module:
    """One expert: Linear(hidden, ffn) - GELU - Linear(ffn, hidden)."""
    return nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))


def route(logits: torch.Tensor, top_k: int, capacity_factor: float):
    """Top-k routing with a per-expert capacity, the same in :class:`MoE` and :class:`DenseMoE`.

    ``probs = softmax(logits)``; each token's top-k experts, their probabilities renormalized
    to sum to 1 over the k when k > 1 (top-1 keeps the raw probability, as Switch does: renormalized
    it would be 1 and the gate would get no gradient). Capacity ``C = ceil(capacity_factor * T * top_k / E)`` from this
    rank's T tokens (GShard's per-group capacity). Assignments are taken in token order
    (token t's k choices, best first, before token t+1's); those past C of their expert are
    dropped. Returns (token, expert, prob) of the kept assignments, sorted by expert (token
    order within one), and stats: ``load`` (assignments per expert before capacity), ``dropped``
    (assignments dropped), ``capacity``.
    """
    T, E = logits.shape
    probs = torch.softmax(logits, dim=-1)
    p, e = probs.topk(top_k, dim=-1)
    if top_k > 1:
        p = p / p.sum(dim=-1, keepdim=True)
    p, e = p.reshape(-1), e.reshape(-1)                       # assignment a = t * top_k + j
    tok = torch.arange(T, device=logits.device).repeat_interleave(top_k)
    cap = math.ceil(capacity_factor * T * top_k / E)
    onehot = F.one_hot(e, E)
    pos = (onehot.cumsum(0) * onehot).sum(-1) - 1             # index among earlier same-expert picks
    keep = pos < cap
    load = onehot.sum(0)
    order = torch.sort(e[keep], stable=True).indices          # by expert; token order kept within
    stats = {"load": load, "dropped": int((~keep).sum()), "capacity": cap}
    return tok[keep][order], e[keep][order], p[keep][order], stats


class DenseMoE(nn.Module):
    """Every expert in one process: the reference of :class:`MoE` (same routing and capacity rule).

    >>> dense = DenseMoE(64, 128, num_experts=4, top_k=2)      # doctest: +SKIP
    >>> y = dense(x); dense.stats["load"]
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int = 2, capacity_factor: float = 1.25):
        super().__init__()
        _check(hidden, ffn, num_experts, top_k, capacity_factor, 1, 0, "DenseMoE")
        self.hidden, self.ffn, self.num_experts = hidden, ffn, num_experts
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(expert(hidden, ffn) for _ in range(num_experts))
        self.stats: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, x = x.shape, x.reshape(-1, self.hidden)
        tok, e, p, self.stats = route(self.gate(x), self.top_k, self.capacity_factor)
        out = torch.zeros_like(x)
        for i, f in enumerate(self.experts):
            m = e == i
            if m.any():
                out = out.index_add(0, tok[m], p[m, None] * f(x[tok[m]]))
        return out.reshape(shape)


class MoE(nn.Module):
    """A mixture of experts sharded over ``group`` (the EP :class:`~pyxccl.parallel.groups.Group`).

    Group rank r holds experts ``r * E/ep .. (r+1) * E/ep - 1`` (``self.experts``, E/ep of them,
    each Linear-GELU-Linear); the gate ``Linear(hidden, E, bias=False)`` is replicated: all-reduce
    its gradient over the data-parallel group like any replicated weight. The expert gradients are
    complete after backward (every rank's tokens for them came here). After each forward
    ``self.stats`` holds this rank's routing: ``load`` (int64 [E], assignments per expert before
    capacity), ``dropped``, ``capacity``; :meth:`global_stats` sums load and dropped over the group.

    >>> moe = MoE.from_dense(DenseMoE(64, 128, 4), g.ep)     # doctest: +SKIP
    >>> loss = moe(x).square().mean(); loss.backward()
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, group, top_k: int = 2,
                 capacity_factor: float = 1.25):
        super().__init__()
        _check(hidden, ffn, num_experts, top_k, capacity_factor, group.size, group.rank, "MoE")
        self.hidden, self.ffn, self.num_experts = hidden, ffn, num_experts
        self.top_k, self.capacity_factor, self.group = top_k, capacity_factor, group
        self.local = num_experts // group.size
        self.first = group.rank * self.local               # global index of this rank's first expert
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(expert(hidden, ffn) for _ in range(self.local))
        self.stats: dict = {}

    @classmethod
    def from_dense(cls, dense: DenseMoE, group) -> "MoE":
        """This rank's share of ``dense``: its gate and experts ``rank*E/ep ..`` (copied)."""
        m = cls(dense.hidden, dense.ffn, dense.num_experts, group, dense.top_k, dense.capacity_factor)
        m.gate.load_state_dict(dense.gate.state_dict())
        for i, f in enumerate(m.experts):
            f.load_state_dict(dense.experts[m.first + i].state_dict())
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden:
            raise InvalidArgumentError(f"rank {self.group.rank}: MoE.forward: x has last dim {x.shape[-1]}, "
                                       f"expected hidden={self.hidden}; pass [T, {self.hidden}] or [b, s, "
                                       f"{self.hidden}]", rank=self.group.rank, op="MoE.forward")
        shape, x = x.shape, x.reshape(-1, self.hidden)
        ep, L = self.group.size, self.local
        tok, e, p, self.stats = route(self.gate(x), self.top_k, self.capacity_factor)
        # rows per (destination rank, expert); kept rows are already sorted that way
        counts = torch.bincount(e, minlength=self.num_experts).to(torch.int64)
        got = torch.empty_like(counts)
        ops.all_to_all(got, counts, self.group)              # got[j*L + l]: rows rank j sends my expert l
        send, recv = counts.view(ep, L).sum(1).tolist(), got.view(ep, L).sum(1).tolist()
        rows = all_to_all(x[tok], self.group, recv, send)
        # received: by source rank, then local expert
        which = torch.arange(L).repeat(ep).repeat_interleave(got)
        y = torch.zeros_like(rows)
        for l, f in enumerate(self.experts):
            idx = (which == l).nonzero().squeeze(1)
            y = y.index_copy(0, idx, f(rows[idx]))
        back = all_to_all(y, self.group, send, recv)        # the reverse exchange: my rows, in send order
        out = torch.zeros_like(x).index_add(0, tok, p[:, None] * back)
        return out.reshape(shape)

    def global_stats(self) -> dict:
        """``self.stats`` with ``load`` and ``dropped`` summed over the EP group (one counted all_reduce
        of E+1 int64)."""
        t = torch.cat([self.stats["load"], torch.tensor([self.stats["dropped"]])]).to(torch.int64)
        ops.all_reduce(t, self.group)
        return {"load": t[:-1], "dropped": int(t[-1]), "capacity": self.stats["capacity"]}


def _check(hidden, ffn, num_experts, top_k, capacity_factor, ep, rank, op):
    if min(hidden, ffn, num_experts, top_k) < 1 or top_k > num_experts or num_experts % ep \
            or not capacity_factor > 0:
        raise InvalidArgumentError(f"rank {rank}: {op}: hidden={hidden}, ffn={ffn}, num_experts={num_experts}, "
                                   f"top_k={top_k}, capacity_factor={capacity_factor}, ep={ep}: sizes must be "
                                   f">= 1, top_k <= num_experts, num_experts divisible by the EP group size and "
                                   f"capacity_factor > 0; choose values that are", rank=rank, op=op)
