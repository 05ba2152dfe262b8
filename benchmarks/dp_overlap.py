"""Data parallel across emulated hosts: bucketed allreduce during backward vs one blocking allreduce after.

    .venv/bin/python benchmarks/dp_overlap.py [--hosts 2 --per-host 1 --rate 1gbit --layers 12 --batch 768]

One training step (forward, backward, gradient averaging, SGD step) of an MLP of ``layers`` Linear(1024,
1024) layers, through pyxccl.parallel.data.GradientReducer on the pyxccl torch backend, over hosts made
by tests/netns.py with their links shaped to ``rate``:

- overlapped: buckets of ``--bucket-mb`` (25 MiB, DDP's default) in reverse layer order, each
  allreduce started by the autograd hook of its last gradient (asynchronous), waited for before the
  optimizer step;
- blocking: the same gradients in one allreduce after backward (``overlap=False``);
- and the two parts alone: the step without communication, and the allreduce of every gradient.

Method as in ../shared/peers: barrier, time one step, step time = max over ranks, median over
iterations, the variants interleaved in each iteration. The issue's target: overlapped at least 25%
faster than blocking.
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path


def _worker(a) -> None:
    import torch
    import torch.distributed as dist

    import pyxccl.torch  # noqa: F401  (registers the backend)
    from pyxccl.parallel import ParallelGroups, ops, traffic
    from pyxccl.parallel.data import GradientReducer
    torch.set_num_threads(1)
    dist.init_process_group("pyxccl")
    g = ParallelGroups()
    n = g.dp.size

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(a.hidden, a.hidden) for _ in range(a.layers)])

    x, y = torch.randn(a.batch, a.hidden), torch.randn(a.batch, a.hidden)
    variants = {}
    kinds = [(f"overlapped, {mb:g} MiB", True, mb) for mb in a.bucket_mb]
    for name, overlap, mb in kinds + [("blocking", False, None), ("no communication", None, None)]:
        m = model()
        red = GradientReducer(m, g.dp, bucket_cap_mb=mb or 25, overlap=overlap) if overlap is not None else None
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)

        def step(m=m, red=red, opt=opt):
            torch.nn.functional.mse_loss(m(x), y).backward()
            if red is not None:
                red.finish()
            opt.step()
            opt.zero_grad()
        variants[name] = (step, red)
    grads = torch.zeros(sum(p.numel() for p in model().parameters()))
    variants["allreduce alone"] = (lambda: ops.all_reduce(grads, g.dp), None)

    def timed(fn) -> float:
        dist.barrier()
        t = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return dt.item()

    times = {k: [] for k in variants}
    for i in range(a.warmup + a.iters):
        for k, (fn, _) in variants.items():       # interleaved: each round runs every variant once
            dt = timed(fn)
            if i >= a.warmup:
                times[k].append(dt)
    traffic.reset()
    first = kinds[0][0]
    variants[first][0]()
    rows = traffic.step()
    if dist.get_rank() == 0:
        for k, ts in times.items():
            buckets = len(variants[k][1].buckets) if variants[k][1] else 0
            print(f"RESULT {k.replace(' ', '_')} {statistics.median(ts)} {buckets}")
        print(f"GRADS {grads.numel() * 4} RANKS {n}")
        print(traffic.table(rows, f"# traffic of one step, {first} buckets (rank 0)"))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=1)
    ap.add_argument("--rate", default="1gbit", help="tc rate per host link; 0 = unshaped")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=768, help="per rank: backward about as long as the allreduce")
    ap.add_argument("--bucket-mb", type=lambda v: [float(x) for x in v.split(",")], default=[25.0, 5.0],
                    help="bucket caps to compare, MiB (25: DDP's default)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return _worker(a)
    from multihost import _run_job, emulated_hosts
    worker = [str(Path(__file__).resolve()), "--worker", f"--bucket-mb={','.join(map(str, a.bucket_mb))}"]
    worker += [f"--{k}={getattr(a, k)}" for k in ("layers", "hidden", "batch", "iters", "warmup")]
    with emulated_hosts("dp_overlap.py", a.hosts, a.rate, prefix="pxd", subnet="10.77.0") as hosts:
        out = _run_job(hosts, a.per_host, worker, {"PYXCCL_SECRET": "dp-overlap"}, 1800)
    res = {k.replace("_", " "): (float(t), int(b)) for k, t, b in re.findall(r"RESULT (\S+) ([\d.e-]+) (\d+)", out)}
    m = re.search(r"GRADS (\d+) RANKS (\d+)", out)
    print(f"# DP step, {a.layers} x Linear({a.hidden}, {a.hidden}), batch {a.batch} per rank, "
          f"{int(m.group(1)) / 2**20:.0f} MiB of gradients, {a.hosts} hosts x {a.per_host} ranks, link {a.rate}, "
          f"median of {a.iters} (max over ranks)")
    base = res["blocking"][0]
    print(f"{'what':<26}{'buckets':>8}{'ms':>10}{'faster than blocking':>22}")
    for k, (t, b) in res.items():
        print(f"{k:<26}{b or '':>8}{t * 1e3:>10.1f}{(1 - t / base) * 100:>21.0f}%")
    print(f"# target: overlapped >= 25% faster than blocking; the floor (compute and communication fully "
          f"overlapped): {max(res['no communication'][0], res['allreduce alone'][0]) * 1e3:.1f} ms")
    print(out[out.find("# traffic of one step"):].strip())


if __name__ == "__main__":
    main()
