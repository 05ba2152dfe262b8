"""Rank functions for the DDP compression hook tests (torch.distributed already initialized by torchfns)."""
from __future__ import annotations

import os
import sys

import numpy as np

import torchfns

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def _model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def hook_steps(comm, spec: str, backend: str, steps: int, bucket_cap_mb: float = 0.004):
    """``steps`` DDP steps of a small MLP with ``compression_hook(CompressionState(spec))`` on the
    pyxccl (default) or the Gloo group. Returns what every hook call saw and gave: a list of
    (step, bucket index, parameter ids of the bucket, the bucket before the hook, after it), each
    step's gradients as DDP left them (flattened, in parameter order) and the final parameters."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from pyxccl.torch.hooks import CompressionState, compression_hook
    group = torchfns._INIT["gloo"] if backend == "gloo" else None
    model = _model()
    ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_cap_mb)
    names = {id(p): i for i, p in enumerate(model.parameters())}
    state = CompressionState(spec, group)
    records, step = [], [0]

    def hook(st, bucket):
        raw = bucket.buffer().detach().numpy().copy()
        s, idx = step[0], bucket.index()
        params = tuple(names[id(p)] for p in bucket.parameters())

        def rec(f):
            out = f.value()
            records.append((s, idx, params, raw, out.detach().numpy().copy()))
            return out
        return compression_hook(st, bucket).then(rec)

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    n, r = dist.get_world_size(), dist.get_rank()
    grads = []
    for s in range(steps):
        step[0] = s
        x, y = torch.randn(8 * n, 16, generator=g), torch.randn(8 * n, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[r * 8:(r + 1) * 8]), y[r * 8:(r + 1) * 8]).backward()
        grads.append(np.concatenate([p.grad.detach().numpy().ravel() for p in model.parameters()]))
        opt.step()
    records.sort(key=lambda t: (t[0], t[1]))
    return records, grads, [p.detach().numpy().copy() for p in model.parameters()]


def convergence(comm, variants, **kw):
    """benchmarks/convergence.py's training on this pool's ranks (torch.distributed already up)."""
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    import convergence as cv
    return cv.train_all(comm, variants, **kw)
