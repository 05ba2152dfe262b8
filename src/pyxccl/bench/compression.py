"""`pyxccl bench --compression SPECS`: each size once per compressor ("none" among them), side by side.

Time as methodology.py says (barrier, one call, max over ranks, median), float32 SUM. Besides the
time: the bytes this rank handed to transports per call (``comm.traffic()``'s ``wire``, measured at
the sends, of one call), their ratio to the uncompressed call's, and the largest error of the result
relative to the largest value of the exact one (of a call with a new key: a sparsifier's first,
without residuals). On one host the uncompressed call may run on the shared segment, which moves
data by reads (no bytes on a wire): ``--algo ring`` compares like with like.
"""
from __future__ import annotations

import numpy as np

from . import methodology as M
from .runner import time_case

PRIMS = ("allreduce", "reduce_scatter", "allgather")
HEADER = f"#{'size':>11} {'compression':>20} {'algorithm':>20} {'time us':>11} {'algbw':>7} {'busbw':>7} " \
         f"{'wire B/rank':>12} {'x plain':>8} {'max rel err':>12}"


class _Case:
    """One call's buffers: every rank a different normal vector; the exact float64 result to compare."""

    def __init__(self, prim: str, nbytes: int, rank: int, n: int):
        self.prim, self.rank = prim, rank
        self.total, self.per = M.counts(prim, nbytes, 4, n)
        self.nbytes = self.total * 4
        own = self.per if prim == "allgather" else self.total
        xs = [np.random.default_rng(r).standard_normal(own).astype(np.float32) for r in range(n)]
        self.ref = xs[rank]
        exact = np.concatenate(xs) if prim == "allgather" else np.sum(xs, axis=0, dtype=np.float64)
        self.exact = exact[rank * self.per:(rank + 1) * self.per] if prim == "reduce_scatter" else exact
        self.send = np.empty_like(self.ref)
        self.recv = self.send if prim == "allreduce" else np.empty(self.per if prim == "reduce_scatter"
                                                                   else self.total, np.float32)

    def reset(self) -> None:
        np.copyto(self.send, self.ref)

    def wrong(self) -> int:         # exactness is not the measure here: error() is
        return 0

    def error(self) -> float:
        return float(np.max(np.abs(self.recv - self.exact)) / max(1e-30, np.max(np.abs(self.exact))))


def _call(comm, case: _Case, spec: str | None, algo: str | None, key: str = "bench"):
    kw = dict(compression=spec, key=f"{key}-{case.prim}-{case.total}", algorithm=algo) if spec else dict(algorithm=algo)
    if case.prim == "allreduce":
        comm.allreduce(case.send, **kw)
    elif case.prim == "reduce_scatter":
        comm.reduce_scatter(case.send, case.recv, **kw)
    else:
        comm.allgather(case.send, case.recv, **kw)


def _wire(comm, prim: str) -> int:
    return sum(comm.traffic().get(prim, {}).get("wire", {}).values())


def run(comm, prims, sizes, specs, algo=None, iters=None, warmup=None) -> list[dict]:
    rows = []
    for prim in prims:
        if prim not in PRIMS:
            raise SystemExit(f"pyxccl bench --compression: {prim} does not compress; use {', '.join(PRIMS)}")
        for nbytes in sizes:
            plain = None
            for spec in specs:
                case = _Case(prim, nbytes, comm.rank, comm.size)
                times, _ = time_case(comm, case, lambda c: _call(comm, c, spec, algo), iters, warmup)
                case.reset()
                w0 = _wire(comm, prim)
                _call(comm, case, spec, algo, "once")    # one more, alone: its bytes on the wire, its error
                wire = _wire(comm, prim) - w0           # (a new key: no residual from earlier calls)
                err = np.array([case.error()])
                comm.allreduce(err, "max")
                if spec is None:
                    plain = wire
                label, chosen = spec or "none", None
                if spec == "auto":          # say what it chose
                    chosen = comm.compression_for(prim, case.nbytes)
                    label = f"auto:{chosen.spec if chosen else 'none'}"
                if spec is None or (spec == "auto" and chosen is None):
                    ran = algo or comm.algorithm_for(prim, case.nbytes, case.ref.dtype)
                elif spec.startswith(("topk", "threshold")):
                    ran = "pairs allgather"
                else:
                    ran = algo or "ring/hierarchical"
                rows.append(dict(M.summarize(times, case.nbytes, prim, comm.size), op=prim, size=case.nbytes,
                                 compression=label, algorithm=ran, wire=wire,
                                 ratio=wire / plain if plain else None, error=float(err[0])))
    return rows


def text(rows: list[dict]) -> str:
    out, current = [], None
    for r in rows:
        if r["op"] != current:
            current = r["op"]
            out += [f"#\n# {current} (float32 sum)", HEADER]
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        out.append(f"{r['size']:>12} {r['compression']:>20} {r['algorithm']:>20} {r['time_us']:>11.1f} "
                   f"{r['algbw']:>7.2f} {r['busbw']:>7.2f} {r['wire']:>12} {ratio:>8} {r['error']:>12.2e}")
    return "\n".join(out)
