"""The cross-core rate beside a 1 MiB call, batch by batch (issue 28, item 3: why 1 MiB moves).

    pyxccl run -n 2 benchmarks/cross_core.py [--batches 12] [--calls 50] [--prim broadcast]

Each batch times ``--calls`` reads by rank 1 of the 1 MiB that rank 0 just wrote into its window of the
shared segment (a plain numpy copy: the rate at which lines move from one core to the other), then
``--calls`` 1 MiB calls of ``--prim``; rank 1 prints each batch's two medians. On this project's VM both
flip together, every few seconds, between two modes (read 40-60 us and broadcast 53-92 us; read 95-100
us and broadcast 261-277 us), while one process's copy and the segment's 8 B round stay put.
"""
import argparse
import statistics
import time

import numpy as np

import pyxccl
from pyxccl.transport.copies import page_aligned


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--prim", default="broadcast", choices=("broadcast", "allreduce", "allgather"))
    a = ap.parse_args()
    comm = pyxccl.init()
    if comm.size != 2 or comm.shared_segment() is None:
        raise SystemExit("run it on 2 ranks of one host (pyxccl run -n 2)")
    seg, u8 = comm.shared_segment(), np.dtype(np.uint8)
    nb = min(1 << 20, seg.area)
    mine, theirs = seg.window(0, comm.rank, u8)[:nb], seg.window(0, 1 - comm.rank, u8)[:nb]
    src, dst = page_aligned(nb, 1, np.uint8), page_aligned(nb, 0, np.uint8)
    x = np.zeros(1 << 18, np.float32)
    call = {"broadcast": lambda: comm.broadcast(x, 0), "allreduce": lambda: comm.allreduce(x),
            "allgather": lambda: comm.allgather(x[:len(x) // 2], x)}[a.prim]
    for b in range(a.batches):
        reads, calls = [], []
        for _ in range(a.calls):
            if comm.rank == 0:
                np.copyto(mine, src)
            comm.barrier()
            t = time.perf_counter()
            if comm.rank == 1:
                np.copyto(dst, theirs)
            reads.append(time.perf_counter() - t)
            comm.barrier()
        for _ in range(a.calls):
            comm.barrier()
            t = time.perf_counter()
            call()
            calls.append(time.perf_counter() - t)
        if comm.rank == 1:
            print(f"batch {b:2}: read of {nb >> 10} KiB the other core wrote {statistics.median(reads) * 1e6:6.0f} us"
                  f"   {a.prim} 1 MiB {statistics.median(calls) * 1e6:6.0f} us", flush=True)
        time.sleep(0.03)
    comm.close()


if __name__ == "__main__":
    main()
