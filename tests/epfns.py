"""Rank functions for the expert-parallel tests (pyxccl.parallel.expert)."""
from __future__ import annotations

import parallelfns as pf

H, F, T = 8, 16, 24        # hidden, ffn, tokens per rank


def _dense(E, top_k, cf):
    import torch
    from pyxccl.parallel.expert import DenseMoE
    torch.manual_seed(1234)        # every rank builds the same model
    return DenseMoE(H, F, E, top_k, cf)


def _tokens(r, shape=(T, H)):
    import torch
    g = torch.Generator().manual_seed(100 + r)      # each rank's own tokens
    return torch.randn(*shape, generator=g)


def _grads(params):
    import torch
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]


def _close(a, b, rtol=1e-5, atol=1e-6):
    import torch
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def equivalence(comm, E, top_k, cf, shape3=False):
    """MoE on this rank's tokens vs DenseMoE computed here over every rank's tokens (no communication):
    output, input grad, expert grads (sum over ranks of the dense ones), gate grad (all-reduced),
    then a few Adam steps' losses. Returns (checks, dropped per rank in the dense reference)."""
    import torch
    from pyxccl.parallel import ops
    from pyxccl.parallel.expert import MoE
    g = pf.groups(comm, ep=comm.size)
    n, me = g.ep.size, g.ep.rank
    shape = (2, T // 2, H) if shape3 else (T, H)
    xs = [_tokens(r, shape) for r in range(n)]
    dense = _dense(E, top_k, cf)
    moe = MoE.from_dense(dense, g.ep)
    # the reference: one DenseMoE per rank's tokens (each with its own capacity), losses summed
    refs, xgrads, dropped = [], [], []
    for x in xs:
        x = x.clone().requires_grad_()
        y = dense(x)
        y.square().sum().backward()
        refs.append(y.detach())
        xgrads.append(x.grad)
        dropped.append(dense.stats["dropped"])
    x = xs[me].clone().requires_grad_()
    y = moe(x)
    y.square().sum().backward()
    ops.all_reduce(moe.gate.weight.grad, g.dp)      # the replicated gate: DP gradient sum
    mine = list(dense.experts[moe.first:moe.first + moe.local].parameters())
    ok = {
        "out": _close(y.detach(), refs[me]), "shape": tuple(y.shape) == shape,
        "xgrad": _close(x.grad, xgrads[me]),
        "experts": all(_close(a, b) for a, b in zip(_grads(moe.experts.parameters()), _grads(mine))),
        "gate": _close(moe.gate.weight.grad, dense.gate.weight.grad),
    }
    # Adam: the dense model steps on the summed grads of every rank's tokens, each rank on its own
    dense.zero_grad()
    moe.zero_grad()
    od, om = torch.optim.Adam(dense.parameters(), lr=1e-2), torch.optim.Adam(moe.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        ld = [dense(x).square().sum() for x in xs]
        sum(ld).backward()
        od.step()
        od.zero_grad()
        lm = moe(xs[me]).square().sum()
        lm.backward()
        ops.all_reduce(moe.gate.weight.grad, g.dp)
        om.step()
        om.zero_grad()
        losses.append((lm.item(), ld[me].item()))
    ok["adam"] = all(abs(a - b) <= 1e-5 * abs(b) + 1e-6 for a, b in losses)
    ok["params"] = all(_close(a, b, atol=1e-5) for a, b in zip(
        moe.experts.parameters(), dense.experts[moe.first:moe.first + moe.local].parameters()))
    return ok, dropped


def stats(comm, E, top_k, cf):
    """MoE.stats and global_stats() vs the dense reference's, per rank and summed over ranks."""
    import torch
    from pyxccl.parallel.expert import MoE
    g = pf.groups(comm, ep=comm.size)
    dense = _dense(E, top_k, cf)
    moe = MoE.from_dense(dense, g.ep)
    ref = []
    for r in range(g.ep.size):
        with torch.no_grad():
            dense(_tokens(r))
        ref.append(dense.stats)
    with torch.no_grad():
        moe(_tokens(g.ep.rank))
    s, gs = moe.stats, moe.global_stats()
    mine = ref[g.ep.rank]
    return (s["load"].tolist(), s["dropped"], s["capacity"], mine["load"].tolist(), mine["dropped"],
            mine["capacity"], gs["load"].tolist(), gs["dropped"],
            sum(d["load"] for d in ref).tolist(), sum(d["dropped"] for d in ref))


_PAIRWISE = {}


def _pairwise_groups(n):
    """EP groups whose equal-block all-to-all (the counts) runs pairwise send/recv too: on one host the
    tuner may pick the shared-segment schedule, whose ranks read (receive) without sending."""
    from pyxccl.parallel import ParallelGroups
    if n not in _PAIRWISE:
        with pf.algorithms(pf.RING + ",alltoall=pairwise"):
            _PAIRWISE[n] = ParallelGroups(tp=1, pp=1, ep=n)
    return _PAIRWISE[n]


def traffic(comm, E, top_k, cf):
    """One forward and one backward: the all_to_all rows of each, and the rows every rank sends
    every expert (kept, from the dense routing of each rank's tokens, computed here)."""
    import torch
    from pyxccl.parallel import traffic as tr
    from pyxccl.parallel.expert import MoE, route
    g = _pairwise_groups(comm.size)
    dense = _dense(E, top_k, cf)
    moe = MoE.from_dense(dense, g.ep)
    kept = []              # kept[r][e]: rows rank r sends expert e
    for r in range(g.ep.size):
        with torch.no_grad():
            _, e, _, _ = route(dense.gate(_tokens(r)), top_k, cf)
        kept.append(torch.bincount(e, minlength=E).tolist())
    x = _tokens(g.ep.rank).requires_grad_()
    tr.reset()
    y = moe(x)
    fwd = [(r.group, r.op, r.calls, r.bytes, r.sent, r.received) for r in tr.step()]
    y.square().sum().backward()
    bwd = [(r.group, r.op, r.calls, r.bytes, r.sent, r.received) for r in tr.step()]
    return fwd, bwd, kept
