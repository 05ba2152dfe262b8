"""Rank functions for the torch backend's persistent requests (tests/test_torch_persistent.py):
torch.distributed is already up (torchfns.init_torch); each function makes its own groups, so
their request caches count from zero."""
from __future__ import annotations

import re

import ppfns


def _group(slots=None, **kw):
    """A new pyxccl group and its backend; ``slots=0``: no persistent requests (plain calls only)."""
    import torch
    import torch.distributed as dist
    g = dist.new_group(backend="pyxccl", **kw)
    b = g._get_backend(torch.device("cpu"))
    if slots is not None:
        b.persistent.slots = slots
    return g, b


def _counts(b):
    return b.persistent.created, b.persistent.reused


def repeated_calls(comm):
    """all_reduce (inline and on the worker, SUM and AVG), broadcast and send/recv repeated on one
    tensor with new data: the same bits as on a group without persistent requests, one request per
    tensor made at the second call and started from then on. Returns the failures."""
    import torch
    import torch.distributed as dist
    g, b = _group()
    g0, _ = _group(slots=0)
    r, n = dist.get_rank(), dist.get_world_size()
    fails = []

    def expect(ok, what):
        if not ok:
            fails.append(f"rank {r}: {what}")

    for numel, async_op, op in ((12, False, dist.ReduceOp.SUM), (100_000, True, dist.ReduceOp.SUM),
                                (1000, False, dist.ReduceOp.AVG)):
        t, t0 = torch.empty(numel), torch.empty(numel)
        before = _counts(b)
        for k in range(5):
            gen = torch.Generator().manual_seed(1000 * k + r)
            t.copy_(torch.randn(numel, generator=gen))
            t0.copy_(t)
            for grp, x in ((g, t), (g0, t0)):
                w = dist.all_reduce(x, op=op, group=grp, async_op=async_op)
                if async_op:
                    w.wait()
            expect(torch.equal(t, t0), f"all_reduce {numel} {op} step {k}: differs from the plain call's")
        got = tuple(a - c for a, c in zip(_counts(b), before))
        expect(got == (1, 3), f"all_reduce {numel}: (made, reused) {got}, expected (1, 3)")

    t = torch.empty(7, dtype=torch.int64)
    before = _counts(b)
    for k in range(4):
        t.fill_(100 * k + r)
        dist.broadcast(t, src=n - 1, group=g)
        expect(torch.equal(t, torch.full((7,), 100 * k + n - 1)), f"broadcast step {k}: {t.tolist()}")
    got = tuple(a - c for a, c in zip(_counts(b), before))
    expect(got == (1, 2), f"broadcast: (made, reused) {got}, expected (1, 2)")

    # rank 0 starts its request while the others make plain calls on new tensors: they still meet
    t = torch.empty(3000)
    before = _counts(b)
    for k in range(4):
        x = t if r == 0 else torch.empty(3000)
        x.copy_(torch.arange(3000.0) * (r + 1) + k)
        dist.all_reduce(x, group=g, async_op=True).wait()
        expect(torch.equal(x, torch.arange(3000.0) * (n * (n + 1) // 2) + k * n), f"mixed step {k}: {x[:3].tolist()}")
    got = tuple(a - c for a, c in zip(_counts(b), before))
    expect(got == ((1, 2) if r == 0 else (0, 0)), f"mixed: (made, reused) {got}")

    if r < 2:                       # send and receive between ranks 0 and 1, a fixed buffer each
        buf = torch.empty(5000)
        before = _counts(b)
        for k in range(4):
            if r == 0:
                buf.copy_(torch.arange(5000.0) + k)
                dist.send(buf, 1, group=g, tag=3)
            else:
                dist.recv(buf, 0, group=g, tag=3)
                expect(torch.equal(buf, torch.arange(5000.0) + k), f"recv step {k}: {buf[:3].tolist()}")
        got = tuple(a - c for a, c in zip(_counts(b), before))
        expect(got == (1, 2), f"{'send' if r == 0 else 'recv'}: (made, reused) {got}, expected (1, 2)")
    dist.barrier(group=g)
    dist.destroy_process_group(g)
    dist.destroy_process_group(g0)
    return fails


def stale_buffers(comm):
    """A tensor's request is never started for another tensor: a new tensor at the same address
    (after the first died) or another view of the same memory starts over with a plain call, and
    a dead tensor's entry (with its request and storage) goes with it. Returns the failures."""
    import gc

    import torch
    import torch.distributed as dist
    g, b = _group()
    c = b.persistent
    r, n = dist.get_rank(), dist.get_world_size()
    s = n * (n + 1) // 2
    fails = []

    def expect(ok, what):
        if not ok:
            fails.append(f"rank {r}: {what}")

    t = torch.full((64,), float(r + 1))
    dist.all_reduce(t, group=g)
    dist.all_reduce(t, group=g)
    expect(c.created == 1 and len(c) == 1, f"after two calls: made {c.created}, {len(c)} entries")
    expect(torch.equal(t, torch.full((64,), float(s * n))), f"t {t[:3].tolist()}")
    del t
    gc.collect()
    expect(len(c) == 0, f"a dead tensor's entry stays ({len(c)} entries): its request keeps it alive")
    for k in range(3):              # new tensors of the same shape, often at the old one's address
        u = torch.full((64,), float(r + 1 + k))
        dist.all_reduce(u, group=g)
        want = float(s + n * k)
        expect(torch.equal(u, torch.full((64,), want)), f"new tensor {k}: {u[:3].tolist()}, expected {want}")
        del u
    expect(c.created == 1 and c.reused == 0, f"new tensors reused a request: made {c.created}, reused {c.reused}")
    u = torch.full((64,), float(r + 1))
    dist.all_reduce(u, group=g)
    dist.all_reduce(u, group=g)     # second sighting: a request of its own
    v = u.view(8, 8)                # the same memory, another tensor object: a plain call first
    dist.all_reduce(v, group=g)
    expect(torch.equal(u, torch.full((64,), float(s * n * n))), f"u {u[:3].tolist()}")
    expect((c.created, c.reused) == (2, 0), f"made/reused {(c.created, c.reused)}, expected (2, 0)")
    dist.destroy_process_group(g)
    expect(len(c) == 0, "entries left after the group's destruction")
    return fails


def timeout_after_repeats(comm, slots):
    """Two all_reduces of one tensor on a new group (timeout 1 s), then rank 0 makes a third the
    others don't: what rank 0's call raises (type, RuntimeError?, message with numbers blanked)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    g, b = _group(slots=slots, timeout=timedelta(seconds=1))
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    dist.all_reduce(t, group=g)
    out = None
    if dist.get_rank() == 0:
        try:
            dist.all_reduce(t, group=g)
            out = ("returned",)
        except Exception as e:  # noqa: BLE001
            out = (type(e).__name__, isinstance(e, RuntimeError), re.sub(r"[0-9a-f]{4,}|\d+(\.\d+)?", "#", str(e)))
        out += (b.persistent.created,)
    dist.barrier()
    dist.destroy_process_group(g)
    return out


def _ddp_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def ddp_steps(comm, variant: str, steps: int, free_after: int | None = None):
    """``steps`` DDP steps of a small MLP in several buckets on a new group. ``variant``: "plain"
    (pyxccl, no persistent requests), "cache" (the backend's requests, no hook), "hook"
    (:func:`pyxccl.torch.hooks.allreduce_hook`, taking its requests from the backend's cache),
    "torch_hook" (torch's default allreduce_hook, cache off); "hook_gloo" and "torch_hook_gloo"
    the two hooks on a Gloo group. With ``free_after``, the hook's ``state.free()`` runs after that
    step. Returns the final parameters, the bucket count of the last step, the (made, started
    again) counts of the variant's requests (the hook's state's for the hooks) and the backend
    cache's counts."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as torch_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from pyxccl.torch.hooks import PersistentState, allreduce_hook
    if variant.endswith("_gloo"):
        g, b = dist.new_group(backend="gloo"), None
    else:
        g, b = _group(slots=None if variant in ("cache", "hook") else 0)
    model = _ddp_model()
    ddp = DDP(model, process_group=g, bucket_cap_mb=0.004)
    seen: dict[int, set] = {}
    state = PersistentState(g)

    def counted(hook, st):
        def h(s, bucket):
            seen.setdefault(step, set()).add(bucket.index())
            return hook(s, bucket)
        ddp.register_comm_hook(st, h)
    if variant.startswith("hook"):
        counted(allreduce_hook, state)
    elif variant.startswith("torch_hook"):
        counted(torch_hook, g)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    n, r = dist.get_world_size(), dist.get_rank()
    for step in range(steps):
        x, y = torch.randn(8 * n, 16, generator=gen), torch.randn(8 * n, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[r * 8:(r + 1) * 8]), y[r * 8:(r + 1) * 8]).backward()
        opt.step()
        if step == free_after:
            state.free()
    cache = _counts(b) if b else (0, 0)
    counts = (state.created, state.reused) if variant.startswith("hook") else cache
    params = [p.detach().numpy().copy() for p in model.parameters()]
    buckets = len(seen.get(steps - 1, ()))
    del ddp
    state.free()
    dist.destroy_process_group(g)
    return params, buckets, counts, cache


def pipeline_steps(comm, kind: str, microbatches: int, steps: int, fixed: bool):
    """``steps`` pipeline steps (ppfns' model, SGD) with or without fixed buffers: each step's loss and
    this stage's final parameters, the sends and receives this rank made per step, and the PP group's
    (made, started again) request counts over the steps."""
    import torch

    import parallelfns as pf
    from pyxccl.parallel.pipeline import Pipeline
    g = pf.groups(comm, pp=comm.size)
    p, s = g.pp.size, g.pp.rank
    b = g.pp.pg._get_backend(torch.device("cpu"))
    mine = ppfns._stage(ppfns._model(), s, p)
    pipe = Pipeline(mine, g.pp, microbatches=microbatches, schedule=kind, fixed_buffers=fixed,
                    act_shape=(ppfns.BATCH // microbatches, ppfns.H), loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(mine.parameters(), lr=0.1)
    before = _counts(b)
    losses = []
    for k in range(steps):
        x, y = ppfns._data(k)
        loss = pipe.step(x if s == 0 else None, y if s == p - 1 else None)
        losses.append(None if loss is None else loss.item())
        opt.step()
        opt.zero_grad()
    p2p = microbatches * ((s > 0) + (s < p - 1)) * 2      # each neighbour: m sends and m receives
    counts = tuple(a - c for a, c in zip(_counts(b), before))
    return losses, [q.detach().numpy().copy() for q in mine.parameters()], p2p, counts


def reducer_steps(comm, overlap: bool, steps: int, slots):
    """``steps`` steps of GradientReducer (dpfns' MLP, one bucket per layer) on a new pyxccl group
    with ``slots`` (0: no persistent requests): this rank's final parameters, the bucket count and
    the group's (made, started again) request counts."""
    import torch

    import dpfns
    from pyxccl.parallel import Group
    from pyxccl.parallel.data import GradientReducer
    g, b = _group(slots=slots)
    n, r = g.size(), g.rank()
    model = dpfns.mlp(0)
    red = GradientReducer(model, Group("dp", list(range(n)), r, g), bucket_cap_mb=16 / 1024, overlap=overlap)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = dpfns.batch(step, r, 0)
        torch.nn.functional.mse_loss(model(x), y).backward()
        red.finish()
        opt.step()
        opt.zero_grad()
    red.remove()
    out = [p.detach().numpy().copy() for p in model.parameters()], len(red.buckets), _counts(b)
    import torch.distributed as dist
    dist.destroy_process_group(g)
    return out
