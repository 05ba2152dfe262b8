"""`pyxccl bench`: an nccl-tests style benchmark of pyxccl's collectives.

    pyxccl bench -n 4 allreduce -b 8 -e 256M -f 2 --dtype float32 --op sum [--algo ring] [--check]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import methodology as M


def add_arguments(p) -> None:
    p.add_argument("collective", nargs="?", default="allreduce",
                   help="one of " + ", ".join(M.PRIMITIVES) + ", or all")
    p.add_argument("-n", "--nproc", type=int, default=None, help="local ranks (default: the CPU count)")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (e.g. 8, 1K)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size (e.g. 256M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="multiply the size by this each row")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum")
    p.add_argument("--algo", default=None, help="force an algorithm (default: the tuner's choice)")
    p.add_argument("--iters", type=int, default=None, help="timed iterations (default: by size, as the peers)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--check", action="store_true", help="exit non-zero if any result is wrong")
    p.add_argument("--compression", default=None,
                   help="compare compressors side by side, e.g. none,fp16,int8,topk:0.01 (allreduce, reduce_scatter, "
                        "allgather; float32): time, bytes on the wire per rank and call, error")
    p.add_argument("--json", default=None, help="write the rows to this file")
    p.add_argument("--vs", default="", help="also run the sweep with these libraries: gloo,mpi,impi,deepspeed,"
                   "oneccl (see README.md, Benchmark, for installing them)")
    p.add_argument("--rounds", type=int, default=1, help="with --vs: repeat the sweeps, report the median")
    p.add_argument("--plot", default=None, help="with --vs: draw busbw against size into this PNG")
    p.add_argument("--sizes", default=None, help="exact sizes instead of -b/-e/-f, e.g. 8,1048576,64M")
    p.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)


def main(a) -> int:
    prims = M.PRIMITIVES if a.collective == "all" else tuple(a.collective.split(","))
    if any(p not in M.PRIMITIVES for p in prims):
        raise SystemExit(f"pyxccl bench: unknown collective {a.collective!r}; use one of {', '.join(M.PRIMITIVES)}")
    sizes = ([M.parse_size(s) for s in a.sizes.split(",")] if a.sizes else
             M.sweep(M.parse_size(a.minbytes), M.parse_size(a.maxbytes), a.stepfactor))
    n = a.nproc or os.cpu_count() or 1
    if "RANK" not in os.environ and a.vs:
        from .compare import compare
        return compare(a, n, prims, sizes)
    if "RANK" not in os.environ and n > 1:
        from ..launcher import run
        return run(n, [sys.executable, "-m", "pyxccl", "bench", *sys.argv[2:]])
    import pyxccl
    from .runner import run_pyxccl
    comm = pyxccl.init()
    progress = None
    if comm.rank == 0 and not a.quiet and len(prims) * len(sizes) > 4:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(prims) * len(sizes), desc="pyxccl bench", unit="size", leave=False,
                       file=sys.stderr)
            progress = bar.update
        except ImportError:
            pass
    if a.compression:
        from . import compression
        specs = [None if s in ("none", "") else s for s in a.compression.split(",")]
        rows = compression.run(comm, prims, sizes, specs, a.algo, a.iters, a.warmup)
        if comm.rank == 0:
            print(f"# pyxccl {pyxccl.__version__} bench --compression: {comm.size} ranks on "
                  f"{len({t['host'] for t in comm.topology()})} host(s)\n{compression.text(rows)}")
        comm.close()
        return 0
    rows = run_pyxccl(comm, prims, sizes, dtype=a.dtype, op=a.op, algo=a.algo, iters=a.iters, warmup=a.warmup,
                      progress=progress)
    wrong = 0
    if comm.rank == 0 and a.quiet:
        wrong = sum(p["wrong"] for r in rows for p in (r["out_of_place"], r["in_place"]) if p)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f)
    elif comm.rank == 0:
        print(f"# pyxccl {pyxccl.__version__} bench: {comm.size} ranks, transport "
              f"{'/'.join(sorted({comm.transport(p) for p in range(comm.size) if p != comm.rank}) or ['self'])}")
        current = None
        for r in rows:
            if r["op"] != current:
                current = r["op"]
                print(f"#\n# {current}\n{M.HEADER}")
            print(M.row_text(r))
            wrong += sum(p["wrong"] for p in (r["out_of_place"], r["in_place"]) if p)
        busbw = [p["busbw"] for r in rows for p in (r["out_of_place"], r["in_place"]) if p]
        print(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {sum(busbw) / max(1, len(busbw)):.4f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    wrong = comm.broadcast_object(wrong, root=0)
    comm.close()
    return 1 if a.check and wrong else 0
