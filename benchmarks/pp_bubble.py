"""The pipeline bubble, measured against the theory (p-1)/(m+p-1).

    PYXCCL_SECRET=x .venv/bin/python benchmarks/pp_bubble.py [--steps 5]

Each stage's module does a fixed amount of "work" per micro-batch (time.sleep: 20 ms forward,
40 ms backward, the same on every stage), so the step's shape is the schedule's, not the CPU's.
For p = 2, 4 stages (a RankPool of p ranks, torch.distributed on pyxccl) and m = 4, 8
micro-batches, GPipe and 1F1B: a stage's bubble = 1 - busy / step time, busy = its forwards'
and backwards' time (pyxccl.parallel.pipeline.Pipeline.timeline, waiting for a receive
excluded), step time = the slowest stage's step (each step starts after a barrier);
the table shows the worst stage, median over the steps (one warm-up step first).
"""
from __future__ import annotations

import argparse
import statistics
import time

FWD, BWD = 0.020, 0.040


def bubble_rank(comm, port: int, configs, steps: int):
    """On each rank of the pool: {(kind, m): [the worst stage's bubble per step]}."""
    import os

    import torch
    import torch.distributed as dist

    import pyxccl.torch  # noqa: F401  (registers the backend)
    from pyxccl.parallel import ParallelGroups
    from pyxccl.parallel.pipeline import Pipeline

    if not dist.is_initialized():
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("pyxccl", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                                world_size=comm.size)
    g = ParallelGroups(pp=comm.size)

    class Sleep(torch.autograd.Function):
        """A stage's compute: FWD seconds forward, BWD backward."""
        @staticmethod
        def forward(ctx, x, w):
            time.sleep(FWD)
            return x * w

        @staticmethod
        def backward(ctx, grad):
            time.sleep(BWD)
            return grad, grad.sum().reshape(1)

    class Stage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            return Sleep.apply(x, self.w)

    out = {}
    for kind, m in configs:
        pipe = Pipeline(Stage(), g.pp, microbatches=m, schedule=kind, act_shape=(1, 4),
                        loss_fn=lambda y, t: (y - t).square().sum())
        x = y = torch.zeros(m, 4)
        vals = []
        for k in range(steps + 1):
            dist.barrier()
            pipe.step(x, y)
            wall = torch.tensor([pipe.wall[1] - pipe.wall[0]], dtype=torch.float64)
            dist.all_reduce(wall, op=dist.ReduceOp.MAX)
            b = torch.tensor([pipe.measured_bubble(wall.item())], dtype=torch.float64)
            dist.all_reduce(b, op=dist.ReduceOp.MAX)
            if k:
                vals.append(b.item())
        out[(kind, m)] = vals
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    from pyxccl.launcher import free_port
    from pyxccl.testing import RankPool

    configs = [(kind, m) for kind in ("gpipe", "1f1b") for m in (4, 8)]
    rows = []
    for p in (2, 4):
        pool = RankPool(p)
        try:
            res = pool.run(bubble_rank, free_port(), configs, a.steps, timeout=600)[0]
        finally:
            pool.close()
        for kind, m in configs:
            measured, theory = statistics.median(res[(kind, m)]), (p - 1) / (m + p - 1)
            rows.append((kind, p, m, measured, theory))
    print(f"forward {FWD * 1e3:.0f} ms, backward {BWD * 1e3:.0f} ms per micro-batch and stage; "
          f"median of {a.steps} steps, worst stage")
    print(f"{'schedule':<8} {'p':>2} {'m':>2} {'measured':>9} {'theory':>7} {'diff':>7}")
    for kind, p, m, measured, theory in sorted(rows, key=lambda r: (r[0] != "gpipe", r[1], r[2])):
        print(f"{kind:<8} {p:>2} {m:>2} {measured:>9.3f} {theory:>7.3f} {measured - theory:>+7.3f}")
    worst = max(abs(r[3] - r[4]) for r in rows)
    print(f"largest |measured - theory|: {worst:.3f} ({'within' if worst <= 0.05 else 'NOT within'} 0.05)")


if __name__ == "__main__":
    main()
