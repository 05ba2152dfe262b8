"""Rank functions for the tensor/sequence-parallel tests (tests/test_parallel_tp.py).

Every rank builds the dense reference itself from the same seed (no communication) and the
parallel copy of it with ``from_dense``; results go back as lists and floats."""
from __future__ import annotations

import parallelfns as pf

B, S, H, HEADS, FFN = 2, 8, 16, 4, 32


def _models(n_blocks, g, sp, seed=0):
    import torch
    from pyxccl.parallel.tensor import ParallelTransformerBlock, TransformerBlock
    torch.manual_seed(seed)
    dense = torch.nn.Sequential(*[TransformerBlock(H, HEADS, FFN) for _ in range(n_blocks)])
    par = torch.nn.Sequential(*[ParallelTransformerBlock.from_dense(b, g.tp, sequence_parallel=sp)
                                for b in dense])
    x = torch.randn(B, S, H)
    dy = torch.randn(B, S, H)
    return dense, par, x, dy


def _shard(t, g, sp):
    from pyxccl.parallel.tensor import split_sequence
    return split_sequence(t, g.tp) if sp else t


def block_grads(comm, tp, sp):
    """One block forward and backward, dense and parallel: outputs, input grads, every parameter's
    grad (this rank's shard, its partition dim) and the dense grads, for the test to gather."""
    import torch
    from pyxccl.parallel.tensor import sync_sequence_parallel_grads
    g = pf.groups(comm, tp=tp)
    dense, par, x, dy = _models(1, g, sp)
    xd = x.clone().requires_grad_()
    yd = dense(xd)
    yd.backward(dy)
    xp = _shard(x, g, sp).clone().requires_grad_()
    yp = par(xp)
    yp.backward(_shard(dy, g, sp))
    sync_sequence_parallel_grads(par, g.tp)
    dgrads = dict(dense.named_parameters())
    grads = {}
    for name, p in par.named_parameters():
        grads[name] = (p.grad.tolist(), getattr(p, "partition_dim", None), dgrads[name].grad.tolist())
    return dict(y=yp.tolist(), yd=_shard(yd.detach(), g, sp).tolist(),
                dx=xp.grad.tolist(), dxd=_shard(xd.grad, g, sp).tolist(), grads=grads,
                same_names=sorted(grads) == sorted(dgrads))


def train_losses(comm, tp, sp, steps=3):
    """A 2-block stack, SGD: the dense loss and the parallel loss of each step."""
    import torch
    import torch.distributed as dist
    from pyxccl.parallel.tensor import sync_sequence_parallel_grads
    g = pf.groups(comm, tp=tp)
    dense, par, x, _ = _models(2, g, sp, seed=1)
    target = torch.randn(B, S, H)
    opt_d = torch.optim.SGD(dense.parameters(), lr=0.1, momentum=0.9)
    opt_p = torch.optim.SGD(par.parameters(), lr=0.1, momentum=0.9)
    out = []
    for _ in range(steps):
        opt_d.zero_grad()
        loss_d = ((dense(x) - target) ** 2).mean()
        loss_d.backward()
        opt_d.step()
        opt_p.zero_grad()
        # SP: each rank's loss is its shard's part of the mean; their sum is the dense loss
        loss_p = ((par(_shard(x, g, sp)) - _shard(target, g, sp)) ** 2).sum() / target.numel()
        loss_p.backward()
        sync_sequence_parallel_grads(par, g.tp)
        opt_p.step()
        total = loss_p.detach().clone()
        if sp:      # the reported loss only: not the model's communication, so not through ops
            dist.all_reduce(total, group=g.tp.pg)
        out.append((loss_d.item(), total.item()))
    return out


def block_traffic(comm, tp, sp, n_blocks=2):
    """The traffic rows of one forward, one backward and (SP) the LN-grad sync of a block stack."""
    from pyxccl.parallel import traffic
    from pyxccl.parallel.tensor import sync_sequence_parallel_grads
    g = pf.groups(comm, tp=tp)
    _, par, x, dy = _models(n_blocks, g, sp)

    def rows():
        return [(r.group, r.op, r.calls, r.bytes, r.sent, r.received) for r in traffic.step()]

    xp = _shard(x, g, sp).clone().requires_grad_()
    traffic.reset()
    y = par(xp)
    fwd = rows()
    y.backward(_shard(dy, g, sp))
    bwd = rows()
    sync_sequence_parallel_grads(par, g.tp)
    sync = rows()
    n_sp = sum(p.numel() for p in par.parameters() if getattr(p, "sequence_parallel", False))
    return fwd, bwd, sync, n_sp


def bad_sizes(comm, tp, what):
    """The InvalidArgumentError a wrong size raises: (type name, message)."""
    import torch
    from pyxccl.parallel import tensor as T
    g = pf.groups(comm, tp=tp)
    try:
        if what == "heads":
            T.ParallelSelfAttention(4 * (tp + 1), tp + 1, g.tp)
        elif what == "ffn":
            T.ParallelMLP(H, FFN + 1, g.tp)
        elif what == "seq":
            T.split_sequence(torch.randn(B, S + 1, H), g.tp)
        elif what == "seq_rs":
            T.reduce_scatter_to_sp(torch.randn(B, S + 1, H), g.tp)
        return None
    except Exception as e:      # noqa: BLE001 - the test checks the type
        return type(e).__name__, str(e)


def column_gather_output(comm, tp, sp):
    """ColumnParallelLinear(gather_output=True) alone: its output and grads against nn.Linear's."""
    import torch
    from pyxccl.parallel.tensor import ColumnParallelLinear
    g = pf.groups(comm, tp=tp)
    torch.manual_seed(2)
    dense = torch.nn.Linear(H, FFN)
    col = ColumnParallelLinear.from_dense(dense, g.tp, gather_output=True, sequence_parallel=sp)
    x, dy = torch.randn(B, S, H), torch.randn(B, S, FFN)
    xd, xp = x.clone().requires_grad_(), _shard(x, g, sp).clone().requires_grad_()
    yd, yp = dense(xd), col(xp)
    yd.backward(dy)
    yp.backward(dy)          # gathered: every rank holds the whole output (and its whole grad)
    return dict(y=yp.tolist(), yd=yd.tolist(), dx=xp.grad.tolist(), dxd=_shard(xd.grad, g, sp).tolist(),
                dw=col.weight.grad.tolist(), dwd=dense.weight.grad.chunk(tp)[g.tp.rank].tolist())
