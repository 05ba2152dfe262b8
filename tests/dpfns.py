"""Rank functions for the data-parallel tests: GradientReducer against one process, and its traffic."""
from __future__ import annotations

import parallelfns as pf

H, LAYERS = 64, 3           # a Linear(64, 64) holds 4160 floats: one bucket each at a 16 KiB cap


def mlp(seed: int):
    import torch
    torch.manual_seed(seed)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(H, H), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def batch(step: int, rank: int, micro: int, rows: int = 4):
    import torch
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(rows, H, generator=g), torch.randn(rows, H, generator=g)


def train_matches_one_process(comm, overlap: bool, accumulate: int, steps: int = 3, backend=None):
    """Each rank trains on its own micro-batches through the reducer; the reference trains one
    process on all of them at once (mean loss). Same losses and parameters, rtol 1e-5."""
    import torch
    from pyxccl.parallel.data import GradientReducer
    g = pf.groups(comm, backend=backend)
    n, r = g.dp.size, g.dp.rank
    model = mlp(0)
    if r:                                   # the reducer must start every rank from rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ref = mlp(0)
    ddp = GradientReducer(model, g.dp, bucket_cap_mb=16 / 1024, overlap=overlap, accumulate=accumulate)
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses, ref_losses = [], []
    for step in range(steps):
        local = 0.0
        for k in range(accumulate):
            assert not ddp.ready
            x, y = batch(0, r, k)           # the same data each step: the loss goes down
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss / accumulate).backward()
            local += loss.item() / accumulate
        assert ddp.ready
        ddp.finish()
        opt.step()
        opt.zero_grad()
        losses.append(local)
        xs, ys = zip(*(batch(0, q, k) for q in range(n) for k in range(accumulate)))
        ref_loss = torch.nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(ref_loss.item())
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    ddp.remove()
    return losses, ref_losses


def step_traffic(comm, overlap: bool, accumulate: int):
    """One step's rows, and whether every bucket's allreduce had started when backward returned."""
    import torch
    from pyxccl.parallel import traffic
    from pyxccl.parallel.data import GradientReducer
    g = pf.groups(comm)
    model = mlp(0)
    ddp = GradientReducer(model, g.dp, bucket_cap_mb=16 / 1024, overlap=overlap, accumulate=accumulate)
    traffic.reset()
    started = []
    for k in range(accumulate):
        x, y = batch(0, g.dp.rank, k)
        torch.nn.functional.mse_loss(model(x), y).backward()
        started.append([b.work is not None for b in ddp.buckets])
    ddp.finish()
    rows = [(r.group, r.op, r.calls, r.bytes, r.sent, r.received) for r in traffic.step()]
    ddp.remove()
    return rows, started, [b.numel for b in ddp.buckets]
