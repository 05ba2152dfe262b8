"""What the tuner's first call of a size costs as communicators grow (issue 26, "Scale", item 4).

    .venv/bin/python benchmarks/tuner_scale.py                       # 8 to 4,096 ranks, hosts of 8
    .venv/bin/python benchmarks/tuner_scale.py --shapes 1x64,128x8 --primitives allreduce

For each shape (hosts x ranks per host, this machine's default link figures) and primitive, the CPU
time (not wall time: the machine may be shared) of ``Tuner.choose`` for one size bucket with a fresh
tuner (every algorithm priced), the best of up to three runs, and the choice. Each run is a process of
its own, warmed up (modules loaded) on another layout: the builders' and the converter's caches hold
nothing of the measured one, as at a job's first call of the size.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

from pyxccl.tuning import Machine, Tuner
from pyxccl.tuning.cost import HostLinks


def tuner(hosts: int, per_host: int) -> Tuner:
    n = hosts * per_host
    hl = [r // per_host for r in range(n)]
    # the link classes as a communicator gives them (core/context.py): by its hosts' rule
    return Tuner(n, hl, HostLinks(hl, "shm"), Machine(cores=per_host), [per_host] * n,
                 segment=(2 << 20, True) if hosts == 1 else None)


def one(hosts: int, per: int, prim: str, size: int) -> tuple[float, str]:
    """(CPU seconds, choice) of a fresh tuner's first call, in this process (warmed up on 2 x 4)."""
    tuner(2, 4).choose(prim, size)
    t = tuner(hosts, per)
    t0 = time.process_time()
    name = t.choose(prim, size)
    return time.process_time() - t0, name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x8,2x4,4x8,16x8,32x8,64x8,128x8,512x8")
    ap.add_argument("--primitives", default="allreduce,allgather,reduce_scatter,alltoall,broadcast")
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--one", help=argparse.SUPPRESS)        # HxL/primitive: one run, in this process
    a = ap.parse_args()
    if a.one:
        shape, prim = a.one.split("/")
        took, name = one(*map(int, shape.split("x")), prim, a.size)
        print(took, name)
        return
    print(f"{'ranks':>6} {'shape':>7} {'primitive':>15} {'cpu ms':>10}  choice")
    for shape in a.shapes.split(","):
        hosts, per = map(int, shape.split("x"))
        for prim in a.primitives.split(","):
            best, name = float("inf"), ""
            for _ in range(3):
                got = subprocess.run([sys.executable, __file__, "--one", f"{shape}/{prim}", "--size", str(a.size)],
                                     capture_output=True, text=True, check=True).stdout.split()
                best, name = min(best, float(got[0])), got[1]
                if best > 2:
                    break
            print(f"{hosts * per:>6} {shape:>7} {prim:>15} {best * 1e3:>10.1f}  {name}", flush=True)


if __name__ == "__main__":
    main()
