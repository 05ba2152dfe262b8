"""Rank functions for the pipeline-parallel tests (tests/test_parallel_pp.py)."""
from __future__ import annotations

import parallelfns as pf

H, LAYERS, BATCH = 16, 8, 8


def _model(seed: int = 0):
    """The whole model: LAYERS x (Linear(H, H), tanh), the same on every rank for a seed."""
    import torch
    torch.manual_seed(seed)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(H, H), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _data(step: int):
    import torch
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, H, generator=g), torch.randn(BATCH, H, generator=g)


def _stage(model, stage: int, stages: int):
    """Stage ``stage``'s contiguous share of the layers (each Linear with its tanh)."""
    import torch
    per = 2 * LAYERS // stages
    return torch.nn.Sequential(*list(model)[stage * per:(stage + 1) * per])


def equivalence(comm, kind: str, microbatches: int, steps: int = 3):
    """``steps`` SGD steps of the pipeline and of the single-process model (no communication):
    per step, (pipeline loss or None, reference loss, [(pipeline grad, reference grad)] of this stage)."""
    import torch
    from pyxccl.parallel.pipeline import Pipeline
    g = pf.groups(comm, pp=comm.size)
    p, s = g.pp.size, g.pp.rank
    ref = _model()
    mine = _stage(_model(), s, p)                 # a copy: the pipeline's stage
    ref_stage = _stage(ref, s, p)                 # the same layers in the reference
    pipe = Pipeline(mine, g.pp, microbatches=microbatches, schedule=kind, act_shape=(BATCH // microbatches, H),
                    loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(mine.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    out = []
    for k in range(steps):
        x, y = _data(k)
        loss = pipe.step(x if s == 0 else None, y if s == p - 1 else None)
        rloss = torch.nn.functional.mse_loss(ref(x), y)
        rloss.backward()
        grads = [(a.grad.tolist(), b.grad.tolist()) for a, b in zip(mine.parameters(), ref_stage.parameters())]
        out.append((None if loss is None else loss.item(), rloss.item(), grads))
        opt.step(), ropt.step()
        opt.zero_grad(), ropt.zero_grad()
    return out


def traffic(comm, kind: str, microbatches: int):
    """One step's traffic rows of this stage, what pyxccl's communicator of the PP group counted
    ({op: (calls, sent, received)} of its isend/irecv), and the timeline's actions."""
    import torch
    from pyxccl.parallel import traffic as tr
    from pyxccl.parallel.pipeline import Pipeline
    g = pf.groups(comm, pp=comm.size)
    p, s = g.pp.size, g.pp.rank
    pipe = Pipeline(_stage(_model(), s, p), g.pp, microbatches=microbatches, schedule=kind,
                    act_shape=(BATCH // microbatches, H), loss_fn=torch.nn.functional.mse_loss)
    x, y = _data(0)
    comm_pp = tr.communicator(g.pp.pg)

    def raw():
        t = comm_pp.traffic()
        return {op: [t.get(op, {}).get(k, 0) for k in ("calls", "sent", "received")] for op in ("isend", "irecv")}
    tr.reset()
    before = raw()
    pipe.step(x if s == 0 else None, y if s == p - 1 else None)
    rows = [(r.group, r.op, r.calls, r.bytes, r.sent, r.received) for r in tr.step()]
    after = raw()
    counted = {op: tuple(a - b for a, b in zip(after[op], before[op])) for op in after}
    return rows, counted, [(k, i) for k, i, _, _ in pipe.timeline], pipe.actions
