"""How a benchmark measures, the same for pyxccl and for its peers (MPI, Gloo),
(docs/peers.md): nccl-tests sizes, per-iteration max over ranks,
median of the iterations, busbw by nccl-tests' factors (the primitives' sizes
and factors are those of ``pyxccl.primitives``)."""
from __future__ import annotations

import re
import statistics

import numpy as np

from ..primitives import PRIMITIVES as _DESCRIBED

#: The primitives a benchmark sweeps, in nccl-tests' order.
PRIMITIVES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather", "scatter")


def parse_size(text: str) -> int:
    """"8", "1K", "64M", "1G" -> bytes."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text.strip(), re.I)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 64K, 256M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def sweep(begin: int, end: int, factor: int) -> list[int]:
    out, s = [], begin
    while s <= end:
        out.append(s)
        s = s * factor if factor > 1 else s + 1
    return out


def iters_for(nbytes: int) -> tuple[int, int]:
    """(warm-up, timed) iterations, as the peers were measured."""
    if nbytes <= 1 << 20:
        return 5, 20
    if nbytes <= 16 << 20:
        return 2, 10
    return 1, 5


def counts(prim: str, nbytes: int, itemsize: int, n: int) -> tuple[int, int]:
    """(total elements, elements per rank); split primitives give every rank at least one."""
    p = _DESCRIBED[prim]
    args = p.sized(n, max(nbytes, itemsize), itemsize)
    per = args["count"] if "count" in args else (args.get("counts") or args["send_counts"])[0]
    return (per * n if p.split else per), per


def busbw_factor(prim: str, n: int) -> float:
    return _DESCRIBED[prim].busbw_factor(n)


def pattern(count: int, dtype) -> np.ndarray:
    return (np.arange(count, dtype=np.int64) % 7).astype(dtype)


def summarize(times: list[float], nbytes: int, prim: str, n: int) -> dict:
    med = statistics.median(times)
    algbw = nbytes / med / 1e9
    return dict(time_us=med * 1e6, min_us=min(times) * 1e6, algbw=algbw, busbw=algbw * busbw_factor(prim, n))


HEADER = ("#%11s %12s %9s %7s %5s %10s %7s %7s %6s %10s %7s %7s %6s" % (
    "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
    "#wrong") + "\n" + "#%11s %12s %9s %7s %5s %10s %7s %7s %6s %10s %7s %7s %6s" % (
    "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))


def row_text(r: dict) -> str:
    def part(p):
        if p is None:
            return "%10s %7s %7s %6s" % ("-", "-", "-", "-")
        return "%10.1f %7.2f %7.2f %6d" % (p["time_us"], p["algbw"], p["busbw"], p["wrong"])
    return "%12d %12d %9s %7s %5d %s %s" % (r["size"], r["count"], r["type"], r["redop"], r["root"],
                                           part(r["out_of_place"]), part(r["in_place"]))
