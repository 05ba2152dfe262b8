"""Rank functions for tests/test_executors.py: ``fn(comm, ...)`` on every rank of a pool."""
from __future__ import annotations

import os
import warnings

import numpy as np


def fast_path_on_a_weakly_ordered_cpu(comm, barriers: bool) -> list[str]:
    """A new communicator made as on a CPU that reorders loads and stores (aarch64), with or without
    the C helper's barriers: with them it has the fast path, without it does not (a warning says
    why) and its calls run over the message transports; either way they give the right result."""
    from pyxccl.transport import segment
    saved = segment._ORDERED, segment._BARRIER, os.environ.get("PYXCCL_NATIVE")
    os.environ["PYXCCL_NATIVE"] = "0"       # the new communicator's plans: the Python executor, as on aarch64
    segment._ORDERED = False
    if not barriers:
        segment._BARRIER = None
    elif segment._BARRIER is None:
        from pyxccl._native import fence
        segment._BARRIER = fence
    fails = []
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            sub = comm.dup()
        said = [str(w.message) for w in seen if "fast path is off" in str(w.message)]
        fast = "segment" in sub.algorithms("allreduce")         # it has the one-host segment
        if barriers and (not fast or said):
            fails.append(f"rank {comm.rank}: with barriers the fast path is off: {said}")
        if not barriers and (fast or not said):
            fails.append(f"rank {comm.rank}: without barriers the fast path stays, or no warning says why")
        if said and "pyxccl._native" not in said[0]:
            fails.append(f"rank {comm.rank}: the warning does not say what to do: {said[0]}")
        x = np.arange(1000, dtype=np.float32) + comm.rank
        sub.allreduce(x, algorithm="segment" if fast else None)
        want = np.arange(1000, dtype=np.float32) * comm.size + sum(range(comm.size))
        if not np.array_equal(x, want):
            fails.append(f"rank {comm.rank}: allreduce gave a wrong sum")
        sub.close()
    finally:
        segment._ORDERED, segment._BARRIER, native = saved
        if native is None:
            os.environ.pop("PYXCCL_NATIVE", None)
        else:
            os.environ["PYXCCL_NATIVE"] = native
    return fails
