"""Megatron tensor parallelism (TP) and its sequence-parallel variant (SP), communication via :mod:`.ops`.

A block's linear layers are split over the TP group: the first of each pair by output features
(:class:`ColumnParallelLinear`), the second by input features (:class:`RowParallelLinear`), so the
pair needs one collective forward and one backward. Per block (attention + MLP), G = b*s*h*itemsize:

- TP: 2 all_reduce of G forward (after each row layer) and 2 backward (before each column layer).
- SP: each all_reduce becomes an all_gather (before the column layer, output G) and a
  reduce_scatter (after the row layer, input G); LayerNorms, dropout and residuals run on
  [b, s/tp, h]. The replicated parameters that see only the sequence shard (LayerNorms, the row
  layers' biases, marked ``p.sequence_parallel = True``) need their grads summed over TP:
  :func:`sync_sequence_parallel_grads` does that with one all_reduce after backward.

A TP group of size 1 communicates nothing.

>>> g = ParallelGroups(tp=2)                                                # doctest: +SKIP
>>> torch.manual_seed(0); dense = TransformerBlock(64, 8)
>>> block = ParallelTransformerBlock.from_dense(dense, g.tp, sequence_parallel=True)
>>> y = block(split_sequence(x, g.tp))          # x: [b, s, h], the same on every rank
>>> y.backward(dy); sync_sequence_parallel_grads(block, g.tp)
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .._errors import InvalidArgumentError
from . import ops

__all__ = ["copy_to_tp", "reduce_from_tp", "gather_from_sp", "reduce_scatter_to_sp", "split_sequence",
           "sync_sequence_parallel_grads", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelSelfAttention", "ParallelTransformerBlock", "MLP", "SelfAttention", "TransformerBlock"]


def _check(cond: bool, group, op: str, what: str) -> None:
    if not cond:
        me = group.ranks[group.rank]
        raise InvalidArgumentError(f"rank {me}: {op}: {what} (tp={group.size})", rank=me, op=op)


def _seq_first_gather(x, group):
    """[b, s/tp, h] -> [b, s, h]: all_gather with the sequence moved to dim 0 (ops gather on dim 0)."""
    x = x.transpose(0, 1).contiguous()
    out = x.new_empty((x.shape[0] * group.size,) + x.shape[1:])
    ops.all_gather(out, x, group)
    return out.transpose(0, 1)


def _seq_first_reduce_scatter(x, group, op="reduce_scatter_to_sp"):
    """[b, s, h] -> this rank's [b, s/tp, h] of the sum over the group."""
    _check(x.shape[1] % group.size == 0, group, op, f"sequence length {x.shape[1]} must be divisible by tp")
    x = x.transpose(0, 1).contiguous()
    out = x.new_empty((x.shape[0] // group.size,) + x.shape[1:])
    ops.reduce_scatter(out, x, group)
    return out.transpose(0, 1)


def _all_reduce(x, group):
    x = x.clone(memory_format=torch.contiguous_format)      # ops reduce in place; autograd's tensors stay
    ops.all_reduce(x, group)
    return x


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_first_gather(x, group)

    @staticmethod
    def backward(ctx, g):
        return _seq_first_reduce_scatter(g, ctx.group, "gather_from_sp backward"), None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_first_reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, g):
        return _seq_first_gather(g, ctx.group), None


class _GatherLastDim(torch.autograd.Function):
    """[..., f/tp] -> [..., f] (ColumnParallelLinear's gather_output); backward keeps this rank's slice."""
    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.k = group, x.shape[-1]
        x = x.movedim(-1, 0).contiguous()
        out = x.new_empty((x.shape[0] * group.size,) + x.shape[1:])
        ops.all_gather(out, x, group)
        return out.movedim(0, -1)

    @staticmethod
    def backward(ctx, g):
        return g.narrow(-1, ctx.group.rank * ctx.k, ctx.k).contiguous(), None


def _apply(fn, x, group):
    return x if group.size == 1 else fn.apply(x, group)


def copy_to_tp(x, group):
    """Megatron's f: identity forward, all_reduce of the gradient over ``group`` backward."""
    return _apply(_CopyToTP, x, group)


def reduce_from_tp(x, group):
    """Megatron's g: all_reduce over ``group`` forward, identity backward."""
    return _apply(_ReduceFromTP, x, group)


def gather_from_sp(x, group):
    """[b, s/tp, h] -> [b, s, h] (all_gather along the sequence); backward reduce_scatter."""
    return _apply(_GatherFromSP, x, group)


def reduce_scatter_to_sp(x, group):
    """[b, s, h] partial sums -> this rank's [b, s/tp, h] of their sum; backward all_gather."""
    return _apply(_ReduceScatterToSP, x, group)


def split_sequence(x, group):
    """This rank's sequence shard of a replicated [b, s, h] (no communication): an SP model's input."""
    _check(x.shape[1] % group.size == 0, group, "split_sequence", f"sequence length {x.shape[1]} must be "
           "divisible by tp")
    n = x.shape[1] // group.size
    return x.narrow(1, group.rank * n, n)


def sync_sequence_parallel_grads(module: nn.Module, group) -> None:
    """Sum over ``group`` the grads of ``module``'s parameters marked ``sequence_parallel`` (SP's
    LayerNorms and row-layer biases, which saw only this rank's sequence shard): one all_reduce
    of all of them, flattened. Call after backward, before the optimizer step."""
    params = [p for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if group.size == 1 or not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    ops.all_reduce(flat, group)
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p.grad))


def _shard(t, dim, group):
    n = t.shape[dim] // group.size
    return nn.Parameter(t.detach().narrow(dim, group.rank * n, n).clone())


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W [out_f, in_f] split by output rows: this rank holds [out_f/tp, in_f] and
    gives y's features [rank*out_f/tp, (rank+1)*out_f/tp) (all of them if ``gather_output``).
    With ``sequence_parallel`` the input is [b, s/tp, h] and is all-gathered along the sequence.
    ``dense``: copy the shard from this nn.Linear (default: a new one, so a seeded model's values
    don't depend on tp).

    >>> fc1 = ColumnParallelLinear.from_dense(dense.fc1, groups.tp)          # doctest: +SKIP
    """

    def __init__(self, in_f, out_f, group, bias=True, gather_output=False, sequence_parallel=False, *, dense=None):
        super().__init__()
        _check(out_f % group.size == 0, group, "ColumnParallelLinear", f"out_features {out_f} must be divisible "
               "by tp")
        dense = dense if dense is not None else nn.Linear(in_f, out_f, bias)
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.weight = _shard(dense.weight, 0, group)
        self.bias = _shard(dense.bias, 0, group) if bias else None
        for p in self.parameters():
            p.partition_dim = 0

    @classmethod
    def from_dense(cls, linear: nn.Linear, group, **kw):
        return cls(linear.in_features, linear.out_features, group, linear.bias is not None, dense=linear, **kw)

    def forward(self, x):
        x = gather_from_sp(x, self.group) if self.sequence_parallel else copy_to_tp(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return _apply(_GatherLastDim, y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W [out_f, in_f] split by input columns: this rank holds [out_f, in_f/tp],
    takes x's features of its slice (a column layer's output) and sums the partial products over TP
    (all_reduce; reduce_scatter along the sequence with ``sequence_parallel``); the bias, replicated,
    is added after the reduction.

    >>> fc2 = RowParallelLinear.from_dense(dense.fc2, groups.tp)             # doctest: +SKIP
    """

    def __init__(self, in_f, out_f, group, bias=True, sequence_parallel=False, *, dense=None):
        super().__init__()
        _check(in_f % group.size == 0, group, "RowParallelLinear", f"in_features {in_f} must be divisible by tp")
        dense = dense if dense is not None else nn.Linear(in_f, out_f, bias)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _shard(dense.weight, 1, group)
        self.weight.partition_dim = 1
        self.bias = nn.Parameter(dense.bias.detach().clone()) if bias else None
        if bias:
            self.bias.partition_dim = None
            self.bias.sequence_parallel = sequence_parallel     # sees only the shard: grads summed over TP

    @classmethod
    def from_dense(cls, linear: nn.Linear, group, **kw):
        return cls(linear.in_features, linear.out_features, group, linear.bias is not None, dense=linear, **kw)

    def forward(self, x):
        y = F.linear(x, self.weight)
        y = reduce_scatter_to_sp(y, self.group) if self.sequence_parallel else reduce_from_tp(y, self.group)
        return y + self.bias if self.bias is not None else y


class MLP(nn.Module):
    """Dense reference: fc2(gelu(fc1(x)))."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttention(nn.Module):
    """Dense reference multi-head attention. ``qkv`` is nn.Linear(h, 3h) whose output rows are laid out
    head-major, [heads, 3 (q, k, v), head_dim]: a TP rank's heads are one contiguous slice of rows."""

    def __init__(self, hidden, heads, causal=True):
        super().__init__()
        if hidden % heads:
            raise InvalidArgumentError(f"SelfAttention: hidden {hidden} must be divisible by heads {heads}",
                                       op="SelfAttention")
        self.heads, self.head_dim, self.causal = heads, hidden // heads, causal
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)

    def attend(self, qkv, heads):
        b, s = qkv.shape[:2]
        q, k, v = qkv.view(b, s, heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)    # each [b, heads, s, hd]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=1 / math.sqrt(self.head_dim))
        return o.transpose(1, 2).reshape(b, s, heads * self.head_dim)

    def forward(self, x):
        return self.proj(self.attend(self.qkv(x), self.heads))


class TransformerBlock(nn.Module):
    """Dense reference pre-LayerNorm block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, hidden, heads, ffn=None, causal=True):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn, self.mlp = SelfAttention(hidden, heads, causal), MLP(hidden, ffn or 4 * hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ParallelMLP(nn.Module):
    """fc1 column-parallel (ffn/tp per rank) -> gelu -> fc2 row-parallel: one all_reduce (or
    all_gather + reduce_scatter with ``sequence_parallel``) forward and one backward."""

    def __init__(self, hidden, ffn, group, sequence_parallel=False, *, dense: MLP | None = None):
        super().__init__()
        _check(ffn % group.size == 0, group, "ParallelMLP", f"ffn {ffn} must be divisible by tp")
        dense = dense if dense is not None else MLP(hidden, ffn)
        self.fc1 = ColumnParallelLinear.from_dense(dense.fc1, group, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear.from_dense(dense.fc2, group, sequence_parallel=sequence_parallel)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelSelfAttention(SelfAttention):
    """Attention with heads/tp heads per rank: qkv column-parallel over heads, proj row-parallel."""

    def __init__(self, hidden, heads, group, causal=True, sequence_parallel=False, *,
                 dense: SelfAttention | None = None):
        nn.Module.__init__(self)
        _check(heads % group.size == 0, group, "ParallelSelfAttention", f"heads {heads} must be divisible by tp")
        dense = dense if dense is not None else SelfAttention(hidden, heads, causal)
        self.heads, self.head_dim, self.causal = heads // group.size, hidden // heads, causal
        self.qkv = ColumnParallelLinear.from_dense(dense.qkv, group, sequence_parallel=sequence_parallel)
        self.proj = RowParallelLinear.from_dense(dense.proj, group, sequence_parallel=sequence_parallel)


class ParallelTransformerBlock(nn.Module):
    """:class:`TransformerBlock` over a TP group: 2 all_reduce forward and 2 backward of b*s*h*itemsize
    each; with ``sequence_parallel`` input and output are [b, s/tp, h] (see :func:`split_sequence`),
    2 all_gather and 2 reduce_scatter each way, and :func:`sync_sequence_parallel_grads` after backward.

    >>> block = ParallelTransformerBlock.from_dense(TransformerBlock(64, 8), groups.tp)   # doctest: +SKIP
    """

    def __init__(self, hidden, heads, group, ffn=None, sequence_parallel=False, causal=True, *,
                 dense: TransformerBlock | None = None):
        super().__init__()
        dense = dense if dense is not None else TransformerBlock(hidden, heads, ffn, causal)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.ln1, self.ln2 = copy.deepcopy(dense.ln1), copy.deepcopy(dense.ln2)
        for p in (*self.ln1.parameters(), *self.ln2.parameters()):
            p.sequence_parallel = sequence_parallel     # replicated but fed only the shard in SP
        self.attn = ParallelSelfAttention(hidden, dense.attn.heads, group, dense.attn.causal, sequence_parallel,
                                          dense=dense.attn)
        self.mlp = ParallelMLP(hidden, dense.mlp.fc1.out_features, group, sequence_parallel, dense=dense.mlp)

    @classmethod
    def from_dense(cls, block: TransformerBlock, group, sequence_parallel=False):
        return cls(block.ln1.normalized_shape[0], block.attn.heads, group, block.mlp.fc1.out_features,
                   sequence_parallel, block.attn.causal, dense=block)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
