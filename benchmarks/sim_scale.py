"""How far the simulator scales, and how well its symmetric mode agrees with the message level.

    .venv/bin/python benchmarks/sim_scale.py                 # the issue's figures (a few minutes)
    .venv/bin/python benchmarks/sim_scale.py --quick         # smaller clusters

Prints, for a 1 GiB allreduce on hosts of 8 ranks (NVLink-like ports inside a host, 8 NICs of
25 GB/s between hosts, a fat tree):

1. message level at 4,096 ranks (512 hosts), per algorithm: simulated time and wall time;
2. symmetric mode at 100,000 ranks (12,500 hosts): the same;
3. both modes where both run, side by side, with their difference.
"""
from __future__ import annotations

import argparse
import time

from pyxccl.sim import Cluster, Link, run


def cluster(hosts: int) -> Cluster:
    return Cluster(hosts, 8, intra=Link(1e-6, 1 / 300e9), inter=Link(5e-6, 1 / 25e9), nics=8)


def row(label: str, hosts: int, algo: str, mode: str, size: int) -> dict:
    t = time.perf_counter()
    r = run("allreduce", size, cluster(hosts), [algo], mode=mode)[0]
    wall = time.perf_counter() - t
    print(f"{label:>10} {hosts * 8:>8} {algo:>20} {r.mode:>10} {r.time * 1e3:>12.3f} {r.busbw / 1e9:>9.2f} "
          f"{r.messages:>14} {wall:>8.1f}", flush=True)
    return {"time": r.time, "wall": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="512 and 8,192 ranks instead of 4,096 and 100,000")
    p.add_argument("--size", type=int, default=1 << 30)
    a = p.parse_args()
    big_msg, big_sym = (64, 1024) if a.quick else (512, 12500)
    print(f"{'what':>10} {'ranks':>8} {'algorithm':>20} {'mode':>10} {'sim ms':>12} {'busbw':>9} "
          f"{'messages':>14} {'wall s':>8}")
    for algo in ("ring", "hierarchical", "double_binary_tree", "tree", "halving_doubling"):
        row("message", big_msg, algo, "message", a.size)
    for algo in ("ring", "hierarchical"):
        row("symmetric", big_sym, algo, "symmetric", a.size)
    print("\nagreement, where both run (simulated time, ms):")
    print(f"{'ranks':>8} {'algorithm':>20} {'message':>12} {'symmetric':>12} {'diff':>8}")
    worst = 0.0
    for hosts in (8, 64, big_msg):
        for algo in ("ring", "hierarchical", "halving_doubling"):
            m = run("allreduce", a.size, cluster(hosts), [algo], mode="message")[0].time
            s = run("allreduce", a.size, cluster(hosts), [algo], mode="symmetric")[0].time
            d = abs(s - m) / m
            worst = max(worst, d)
            print(f"{hosts * 8:>8} {algo:>20} {m * 1e3:>12.4f} {s * 1e3:>12.4f} {100 * d:>7.3f}%", flush=True)
    print(f"largest difference: {100 * worst:.3f}% (the issue's bound: 2%)")


if __name__ == "__main__":
    main()
