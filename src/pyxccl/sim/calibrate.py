"""Figures of this machine that the tuner's probe does not keep, for the simulator's measured cluster.

The probe (``pyxccl/probe.py``) runs at every init and must be short and robust to a busy moment, so
it keeps the fastest of a few batches. A prediction of what calls take needs what calls see:

- the shared segment's round as a call sees it: the median of barrier calls on the segment, every
  rank taking part (with more ranks than cores it is several times the fastest batch: 54 against
  13 us for 4 ranks on 2 cores here);
- a single-copy read of another process's buffer (process_vm_readv, the engine's ``Get`` of a
  posted buffer; its ``Put``, process_vm_writev, is priced at the same figures): alpha and beta
  fitted through reads of 64 KiB and 1 MiB, every rank reading its next rank's buffer at once (about 10 GB/s here, against 45 GB/s for a copy in cache);
- windows as rounds use them: the lines of a window live in the cache of the core that last used
  them, so writing one's window after the others read it (their cores hold its lines) runs at about
  9 GB/s here up to 256 KiB, against 40 GB/s for a window nobody else touched, and reading a window
  another rank just wrote at 10-40 GB/s (it varies from moment to moment on this VM). Kept as the
  time at each of a few sizes (the rate is not linear in the size), every rank at once;
- a copy between two of a rank's own buffers at 1-64 MiB, every rank at once: what a call's buffers
  cost as they outgrow each cache level and the memory is shared with the ranks on the other cores
  (here, two ranks: 20-22 GB/s at 4 MiB, 5.7-6.6 GB/s at 64 MiB), in CPU time: the time a rank waited
  for a core another rank held is the model's stretch, not the copy's. The model charges a call's bytes
  in user buffers at the rate of its size (``tuning.cost.memory_term``); and the same copy with
  non-temporal stores, for the buffers the native executor writes that way (those that pass the cache);
- a reduction of a round's piece, every rank at once, by the native executor's own loop.

>>> # on every rank of a one-host job:
>>> # figures = pyxccl.sim.calibrate.measure(comm)
>>> # Cluster.measured(1, comm.size, calibration=figures)
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from ..transport import cma
from ..transport.copies import page_aligned

try:                        # the C executor's own copy and reduction loops, where it is built (and current)
    from .. import _native
except ImportError:
    _native = None
if not hasattr(_native, "copy_into"):
    _native = None

_SIZES = (64 << 10, 1 << 20)


_WINDOW_SIZES = (16 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20)
_MEM_SIZES = (1 << 20, 4 << 20, 16 << 20, 64 << 20)


def _timed(comm, fn, reps: int, prep=None, clock=time.perf_counter, sync=None) -> float:
    """Median over ``reps`` calls of the slowest rank's time of ``fn`` (``prep``, then a barrier: ``sync``
    or ``comm.barrier``, before each), on ``clock`` (``time.thread_time``: the CPU time of the rank, not the
    time it waited for a core that another rank held)."""
    ts = []
    for _ in range(reps):
        if prep is not None:
            prep()
        (sync or comm.barrier)()
        t = clock()
        fn()
        ts.append(clock() - t)
    out = np.array([statistics.median(ts)])
    comm.allreduce(out, "max")
    return float(out[0])


def _single_copy(comm) -> list[float] | None:
    """[alpha, beta] of a process_vm_readv read from the next rank, or None where the kernel refuses."""
    bufs = {nb: page_aligned(nb // 4, 1) for nb in _SIZES}
    pid, addrs = comm.allgather_object((os.getpid(), {nb: b.ctypes.data for nb, b in bufs.items()}))[
        (comm.rank + 1) % comm.size]
    times, ok = [], True
    for nb in _SIZES:
        dst = page_aligned(nb // 4, 0)
        one = cma.reader(pid, dst.ctypes.data, addrs[nb], nb)

        def read():
            nonlocal ok
            ok &= one()
        times.append(_timed(comm, read, 30, clock=time.thread_time))
    good = np.array([int(ok)])
    comm.allreduce(good, "min")
    comm.barrier()          # nobody frees a buffer another still reads
    if not good[0]:
        return None
    beta = max(0.0, (times[1] - times[0]) / (_SIZES[1] - _SIZES[0]))
    return [max(0.0, times[0] - beta * _SIZES[0]), beta]


def _windows(comm) -> dict:
    """Reading and writing windows of the shared segment as rounds do, every rank at once, at the sizes
    of ``_WINDOW_SIZES`` the windows hold: {"peer": [[bytes, seconds], ...] reading the next rank's
    window right after it wrote it, "win": the same for writing one's own window right after the
    previous rank read it}, in CPU time (the model stretches them where ranks share cores; by the wall
    they came out the same at 4 ranks on 2 cores as at 2: an op shorter than a time slice runs whole
    once its rank has the core); with the native executor also "peer_nt" and "win_nt", the same with the
    window written by non-temporal stores (calls write their windows whichever way costs less: _native.c,
    nt_windows); {} without a segment. (The windows are free between calls: every round writes its
    window before publishing.)"""
    seg = comm.shared_segment()
    sizes = [nb for nb in _WINDOW_SIZES if nb <= seg.area] if seg is not None else []
    if not sizes:
        return {}
    u8 = np.dtype(np.uint8)
    mine, theirs = seg.window(0, comm.rank, u8), seg.window(0, (comm.rank + 1) % comm.size, u8)
    src, dst = page_aligned(max(sizes), 1, np.uint8), page_aligned(max(sizes), 0, np.uint8)
    ways = ("", "_nt") if _native is not None else ("",)
    out: dict = {k + way: [] for way in ways for k in ("peer", "win")}
    for way in ways:
        for nb in sizes:
            def write():
                if way:
                    _native.copy_into(mine[:nb], src[:nb], True)
                else:
                    np.copyto(mine[:nb], src[:nb])

            def read():
                np.copyto(dst[:nb], theirs[:nb])

            def then(f):        # after everyone's last timed op: nobody writes a window another still reads
                return lambda: (comm.barrier(), f())
            out["peer" + way].append([nb, _timed(comm, read, 40, prep=then(write), clock=time.thread_time)])
            out["win" + way].append([nb, _timed(comm, write, 40, prep=then(read), clock=time.thread_time)])
    return out


def _memory(comm) -> tuple[list, list]:
    """([[bytes, seconds], ...], the same): a copy of that many bytes between two buffers of this rank, at
    each size of ``_MEM_SIZES``, every rank at once (the slowest rank's median), in CPU time; with plain
    stores, and with the non-temporal ones the native executor uses into buffers that pass the cache
    (``_native.c``, ``nt_bytes``; ``[]`` without it)."""
    plain, streamed = [], []
    for nb in _MEM_SIZES:
        a, b = page_aligned(nb // 4, 1), page_aligned(nb // 4, 0)
        reps = max(3, min(20, (64 << 20) // nb))
        plain.append([nb, _timed(comm, lambda: np.copyto(b, a), reps, clock=time.thread_time)])
        if _native is not None:
            streamed.append([nb, _timed(comm, lambda: _native.copy_into(b, a, True), reps, clock=time.thread_time)])
    return plain, streamed


def _reductions(comm) -> list:
    """[[bytes, seconds], ...]: a float32 sum of that many bytes into a buffer of this rank from another,
    at each size of ``_WINDOW_SIZES`` (a round's piece), every rank at once (the slowest rank's median), in
    CPU time, by the native executor's own loop where it is built (numpy's add otherwise, the Python
    executor's). On this machine 38-57 ps a byte, against the probe's one figure of 36 (``gamma``: one
    process, the fastest of five numpy adds of 4 MiB)."""
    if _native is not None:
        tables = _native.tables()
        codes = tables["dtypes"]["float32"], tables["ops"]["sum"]
    out, small = [], 64
    for nb in (small,) + _WINDOW_SIZES:
        a, b = page_aligned(nb // 4, 1), page_aligned(nb // 4, 0)
        add = (lambda: _native.reduce_into(*codes, b, a)) if _native is not None else (lambda: np.add(b, a, out=b))
        out.append([nb, _timed(comm, add, 40, clock=time.thread_time)])
    # less the call from Python (the time of 64 bytes), which the executor's reductions do not pay
    return [[nb, max(0.0, t - out[0][1])] for nb, t in out[1:]]


def measure(comm) -> dict:
    """Collective, on a one-host communicator: {"seg": round seconds, "cma": [alpha, beta] or None,
    "peer" and "win", "peer_nt" and "win_nt": [[bytes, seconds], ...] or None (``_windows``),
    "mem": [[bytes, seconds], ...] and "mem_nt" (``_memory``), "red": the same (``_reductions``)}."""
    if len({t["host"] for t in comm.topology()}) != 1 or comm.size < 2:
        raise ValueError("calibrate on the ranks of one host (the segment and single-copy reads are a host's)")
    # (the barrier before each of the same form: a call of another form in between costs its lookup)
    round_ = lambda: comm.barrier(algorithm="segment")     # noqa: E731
    seg = _timed(comm, round_, 60, sync=round_)
    win = _windows(comm)
    mem, mem_nt = _memory(comm)
    return {"seg": seg, "cma": _single_copy(comm), "peer": win.get("peer"), "win": win.get("win"),
            "peer_nt": win.get("peer_nt"), "win_nt": win.get("win_nt"),
            "mem": mem, "mem_nt": mem_nt, "red": _reductions(comm)}
