"""What this machine's figures are without a peer (the add and copy rates,
memory), and the rule that says a cached latency was measured on a busy machine. The probing
itself (ping-pongs and segment rounds between ranks) drives a communicator: ``pyxccl/probe.py``."""
from __future__ import annotations

import time

import numpy as np

from ..transport.copies import last_level_cache, page_aligned

# A cached latency above WIDE times the one seen now (plus SLACK) was measured on a busy machine.
WIDE, SLACK = 3.0, 0.5e-6


def local_figures(clock=time.perf_counter) -> tuple[float, float]:
    """(gamma, copy): seconds per byte of an in-place numpy add and of a copy, on 4 MiB; the fastest of 5."""
    a, b = page_aligned(1 << 20, 1), page_aligned(1 << 20, 1)
    best_add = best_copy = float("inf")
    for _ in range(5):
        t = clock()
        np.add(a, b, out=a)
        best_add = min(best_add, clock() - t)
        t = clock()
        np.copyto(a, b)
        best_copy = min(best_copy, clock() - t)
    return best_add / a.nbytes, best_copy / a.nbytes


def memory_figure(clock=time.perf_counter) -> float:
    """Seconds per byte read or written in memory, by one process: a copy between buffers twice
    the last-level cache (64 to 256 MiB each) reads and writes every byte once; the fastest of 3."""
    nbytes = min(256 << 20, max(64 << 20, 2 * last_level_cache()))
    a, b = page_aligned(nbytes // 4, 1), page_aligned(nbytes // 4, 1)
    best = float("inf")
    for _ in range(3):
        t = clock()
        np.copyto(a, b)
        best = min(best, clock() - t)
    return best / (2 * a.nbytes)


def disagreements(entry, seen: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Classes whose cached latency (``entry``: a ``linkcache.Entry``) is far above the one seen now
    (``seen``: class -> latency): class -> (cached, now)."""
    return {k: (entry.links[k].alpha, a) for k, a in seen.items()
            if k in entry.links and entry.links[k].alpha > WIDE * a + SLACK}
