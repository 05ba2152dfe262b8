"""Rank functions for tests/test_parallel_zero.py: ZeRO stages 1, 2, 3 against one dense process."""
from __future__ import annotations

import parallelfns as pf

DIMS = (4, 5, 4, 6, 2)      # Linear parameter counts 25, 24, 30, 14 (93): padding for N = 2 and 4
BATCH, STEPS, LR = 3, 3, 0.05


def mlp(seed=0):
    import torch
    from torch import nn
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(DIMS, DIMS[1:])):
        layers.append(nn.Sequential(nn.Linear(a, b), nn.Tanh()) if i < len(DIMS) - 2 else nn.Linear(a, b))
    return nn.Sequential(*layers)


def batch(rank, step):
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(BATCH, DIMS[0], generator=g), torch.randn(BATCH, DIMS[-1], generator=g)


def _loss(out, y):
    return ((out - y) ** 2).mean()


def reference(n):
    """The dense model in one process: the concatenated batch, Adam; (losses, final params). No communication."""
    import torch
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses, grads = [], None
    for s in range(STEPS):
        xs, ys = zip(*(batch(r, s) for r in range(n)))
        loss = _loss(model(torch.cat(xs)), torch.cat(ys))
        opt.zero_grad()
        loss.backward()
        if s == 0:
            grads = [(k, v.grad.clone()) for k, v in model.named_parameters()]
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in model.named_parameters()}, grads


def ref_shards(grads, stage, n, rank):
    """This rank's shard of each bucket's padded flat gradient, laid out here independently of zero.py:
    stage 1 one bucket of every parameter, stages 2/3 one per top-level child (a Linear)."""
    import torch
    buckets = {}
    for k, g in grads:
        buckets.setdefault("" if stage == 1 else k.split(".")[0], []).append(g.reshape(-1))
    out = []
    for parts in buckets.values():
        flat = torch.cat(parts)
        size = -(-flat.numel() // n)
        flat = torch.cat([flat, flat.new_zeros(size * n - flat.numel())])
        out.append(flat[rank * size:(rank + 1) * size])
    return out


def _build(g, stage):
    import torch
    from pyxccl.parallel.zero import FullyShardedModule, ZeroOptimizer
    model = mlp()
    if stage == 3:
        model = FullyShardedModule(model, g.dp)
        return model, torch.optim.Adam(model.parameters(), lr=LR)
    return model, ZeroOptimizer(model, g.dp, stage=stage, optimizer=torch.optim.Adam, lr=LR)


def train(comm, stage):
    """STEPS steps of ZeRO ``stage``; per-step local losses and traffic rows, the final parameters'
    error against the reference, the optimizer state sizes and what the module holds."""
    import torch
    from pyxccl.parallel import traffic
    g = pf.groups(comm)
    n = g.dp.size
    model, opt = _build(g, stage)
    losses, rows, grads_between = [], [], []
    for s in range(STEPS):
        x, y = batch(g.dp.rank, s)
        traffic.reset()
        loss = _loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        # stage 2: the full gradients were freed by the hooks during backward
        grads_between.append([p.grad is not None for p in mlp_params(model)])
        opt.step()
        if s == 0:      # the shards' gradients: the mean over ranks, this rank's slice
            shards = list(model.parameters()) if stage == 3 else opt.shards
            grad0 = [p.grad.clone() for p in shards]
        rows.append([(r.group, r.op, r.calls, r.bytes, r.sent, r.received) for r in traffic.step()])
        losses.append(loss.item())
    final = model.full_parameters() if stage == 3 else {k: v.detach() for k, v in model.named_parameters()}
    ref_losses, ref, ref_grads = reference(n)
    want = ref_shards(ref_grads, stage, n, g.dp.rank)
    assert [t.numel() for t in want] == [t.numel() for t in grad0]
    grad_err = max(((a - b).abs() - 1e-7 - 1e-5 * b.abs()).max().item() for a, b in zip(grad0, want))
    assert set(final) == set(ref), (sorted(final), sorted(ref))
    err = max(((final[k] - ref[k]).abs() - 1e-6 - 1e-5 * ref[k].abs()).max().item() for k in ref)
    inner = opt if stage == 3 else opt.optimizer
    state = sum(st["exp_avg"].numel() for st in inner.state.values())
    if stage == 3:
        held = [(k, v.numel()) for k, v in model.state_dict().items()]
        kinds = sorted({type(p).__name__ for p in model.parameters()})
    else:
        held = kinds = None
    return dict(losses=losses, ref_losses=ref_losses, err=err, grad_err=grad_err, rows=rows, state=state, held=held,
                grads_between=grads_between, n=n, kinds=kinds)


def mlp_params(model):
    """The dense parameters (stages 1/2: the module's; stage 3: none remain outside the shards)."""
    return [p for k, p in model.named_parameters() if not k.startswith("shards.")]


def bad_args(comm):
    """The argument checks: (exception type name, message) per bad call."""
    from pyxccl.parallel.zero import FullyShardedModule, ZeroOptimizer
    g = pf.groups(comm)
    out = []
    for call in (lambda: ZeroOptimizer(mlp(), g.dp, stage=0), lambda: ZeroOptimizer(mlp(), g.dp, stage=3),
                 lambda: ZeroOptimizer(mlp(), "dp", stage=1), lambda: FullyShardedModule([], g.dp),
                 lambda: FullyShardedModule(mlp(), None)):
        try:
            call()
            out.append(None)
        except Exception as e:      # noqa: BLE001 - the test checks the type
            out.append((type(e).__name__, str(e)))
    return out
