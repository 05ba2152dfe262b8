"""`pyxccl info`: what this job looks like to pyxccl, and what the tuner would pick."""
from __future__ import annotations

import os

import pyxccl


from .algorithms import registry

PRIMITIVES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather", "scatter")
_ABBREV = {"self": "  - ", "shm": " shm", "tcp_local": "tcpL", "tcp": " tcp"}
SIZES = [8 << (2 * i) for i in range(13)] + [256 << 20]     # 8 B, 32 B, ... 128 MiB, 256 MiB


def _size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def report() -> None:
    comm = pyxccl.init()
    # connections are made on first use: what a rank holds after init (its set-up's calls)
    rows = comm.allgather_object((os.uname().nodename, os.getpid(), sum(comm.connections().values())))
    if comm.rank == 0:
        topo = comm.topology()
        print(f"pyxccl {pyxccl.__version__}: {comm.size} ranks on {len({t['host'] for t in topo})} host(s)")
        print(f"{'rank':>4}  {'host':<20}{'pid':>8}{'cores':>6}{'numa':>5}{'conns':>6}  transport to each rank")
        for r, (node, pid, conns) in enumerate(rows):
            kinds = " ".join(_ABBREV[comm.link_class(r, p)] for p in range(comm.size))
            print(f"{r:>4}  {node:<20}{pid:>8}{topo[r]['cores']:>6}{topo[r]['numa']:>5}{conns:>6}  {kinds}")
        print("(conns: peers a rank is connected to; connections are made on first use)")
        m = comm.link_figures()
        if m is not None:
            from .tuning.linkcache import cache_path
            print("\nmeasured link figures (alpha = latency per message, beta as bandwidth):")
            print(f"  ({m.source}; kept in {cache_path()})")
            for k, link in sorted(m.links.items()):
                bw = f"{1 / link.beta / 1e9:6.2f} GB/s" if link.beta else "(copies, below)"
                print(f"  {k:<10} alpha {link.alpha * 1e6:8.1f} us   {bw}")
            print(f"  reduce {1 / m.gamma / 1e9:.2f} GB/s, copy {1 / m.copy / 1e9:.2f} GB/s, {m.cores} cores")
        if comm.size > 1:
            print("\nalgorithm chosen (size = nccl-tests convention, float32):")
            print(f"{'size':>6}  " + "".join(f"{p:<22}" for p in PRIMITIVES))
            for size in SIZES:
                names = [comm.algorithm_for(p, size) for p in PRIMITIVES]
                print(f"{_size(size):>6}  " + "".join(f"{nm:<22}" for nm in names))
        else:
            print("\none rank: no algorithm choice to make; defaults: "
                  + ", ".join(f"{p}={registry.default(p)}" for p in PRIMITIVES))
        print("\nalgorithms usable here: " + "; ".join(f"{p}: {', '.join(comm.algorithms(p))}"
                                                     for p in PRIMITIVES + ("barrier",)))
    comm.close()
