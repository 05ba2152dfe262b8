"""PyTorch on pyxccl vs Gloo, in one run (issue: the torch backend's speed table).

    .venv/bin/pyxccl run -n 2 benchmarks/torch_vs_gloo.py [--steps 10] [--ddp-only]

DDP training step time of an MLP of about 25 M float32 parameters, and the
median time of all_reduce / all_gather_into_tensor / reduce_scatter_tensor /
all_to_all_single at 8 B, 1 MiB and 64 MiB (nccl-tests sizes: the full
buffer), each with the default group on pyxccl and a Gloo group, interleaved. The DDP rows end
with the time each backend adds over the no-communication step, and the ratio of the two (the
target: pyxccl's at most a third of Gloo's), and the same for the CPU time the step used.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import pyxccl.torch  # noqa: F401  (registers the backend)


def timed(fn, iters, warmup=3):
    out = []
    for i in range(warmup + iters):
        dist.barrier()
        t = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i >= warmup:
            out.append(dt.item())
    return statistics.median(out)


def timed_step(fn):
    """One call of ``fn``: (its time, max over ranks; the CPU time its processes used, summed over
    ranks: every thread, so a backend's worker and helper threads count)."""
    dist.barrier()
    t, c = time.perf_counter(), time.process_time()
    fn()
    out = torch.tensor([time.perf_counter() - t, time.process_time() - c], dtype=torch.float64)
    wall, cpu = out.clone(), out.clone()
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu)
    return wall[0].item(), cpu[1].item()


def _no_communication(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--ddp-only", action="store_true", help="only the DDP rows (not the collectives)")
    ap.add_argument("--batch", type=int, default=4, help="DDP batch per rank (small: communication shows)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("pyxccl")
    groups = {"pyxccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    n, r = dist.get_world_size(), dist.get_rank()
    rows = []
    for g in groups.values():          # first calls set up connections and tuner caches: not timed
        for _ in range(20):
            dist.all_reduce(torch.ones(2), group=g)
    for size in () if a.ddp_only else (8, 1 << 20, 64 << 20):
        count = max(n, size // 4) // n * n
        x, out = torch.ones(count), torch.empty(count)
        part = torch.empty(count // n)
        iters = 100 if size <= 1 << 20 else 5     # small calls vary a lot on a shared machine
        for op, fn in (("all_reduce", lambda g: dist.all_reduce(x, group=g)),
                       ("all_gather_into_tensor", lambda g: dist.all_gather_into_tensor(out, part, group=g)),
                       ("reduce_scatter_tensor", lambda g: dist.reduce_scatter_tensor(part, x, group=g)),
                       ("all_to_all_single", lambda g: dist.all_to_all_single(out, x, group=g))):
            for name, g in groups.items():
                rows.append((f"{op} {size} B", name, timed(lambda: fn(g), iters)))
    # DDP step: forward, backward (bucketed gradient allreduce overlapping it), optimizer step; on
    # pyxccl, on Gloo, and the floor: the same step with a comm hook that communicates nothing
    # (compute alone). The three run interleaved, one step each per round, so that the machine's
    # load (other users of a shared box) weighs on all three alike; the added time of a backend is
    # its step minus the floor's of the same round.
    setups = []
    for name, g, hook in (("pyxccl", groups["pyxccl"], None), ("gloo", groups["gloo"], None),
                          ("floor", groups["gloo"], _no_communication)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                    torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
        params = sum(p.numel() for p in model.parameters())
        ddp = DDP(model, process_group=g)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        setups.append((name, ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)))
    x, y = torch.randn(a.batch, 1024), torch.randn(a.batch, 1024)
    steps = {name: [] for name, _, _ in setups}
    cpus = {name: [] for name, _, _ in setups}
    for i in range(3 + a.steps):
        for name, ddp, opt in setups:
            def step():
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            t, c = timed_step(step)
            if i >= 3:
                steps[name].append(t)
                cpus[name].append(c)
    med = {k: statistics.median(v) for k, v in steps.items()}
    added = {k: statistics.median(s - f for s, f in zip(steps[k], steps["floor"])) for k in ("pyxccl", "gloo")}
    # on a shared machine the wall times follow the other users' load; CPU time much less
    added_cpu = {k: statistics.median(s - f for s, f in zip(cpus[k], cpus["floor"])) for k in ("pyxccl", "gloo")}
    what = f"DDP step ({params / 1e6:.1f} M params, batch {a.batch})"
    rows += [(what, "pyxccl", med["pyxccl"]), (what, "gloo", med["gloo"]),
             ("DDP step, no communication (floor)", "pyxccl", med["floor"]),
             ("DDP step, no communication (floor)", "gloo", med["floor"]),
             ("DDP step minus the floor (added)", "pyxccl", added["pyxccl"]),
             ("DDP step minus the floor (added)", "gloo", added["gloo"]),
             ("DDP step CPU, all ranks, minus the floor's", "pyxccl", added_cpu["pyxccl"]),
             ("DDP step CPU, all ranks, minus the floor's", "gloo", added_cpu["gloo"])]
    if r == 0:
        print(f"# torch {torch.__version__}, {n} ranks, median ms (max over ranks per iteration)")
        print(f"{'what':<42}{'pyxccl':>12}{'gloo':>12}{'gloo/pyxccl':>13}")
        for i in range(0, len(rows), 2):        # rows come in (pyxccl, gloo) pairs
            (what, _, t1), (_, _, t2) = rows[i], rows[i + 1]
            print(f"{what:<42}{t1 * 1e3:>12.3f}{t2 * 1e3:>12.3f}{t2 / t1:>13.2f}")
        print(f"pyxccl's added time / gloo's: {added['pyxccl'] / added['gloo']:.2f} "
              f"(per round: {' '.join(f'{(p - f) / (g - f):.2f}' for p, g, f in zip(*steps.values()))}); "
              f"added CPU time: {added_cpu['pyxccl'] / added_cpu['gloo']:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
