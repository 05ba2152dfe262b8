"""Rank functions for the pyxccl.parallel tests: the groups and the traffic counters."""
from __future__ import annotations

import os
from contextlib import contextmanager

_GROUPS = {}

RING = "allreduce=ring,allgather=ring,reduce_scatter=ring"


@contextmanager
def algorithms(spec: str):
    """Communicators made inside use PYXCCL_ALGO=spec (so a test knows which schedule runs)."""
    old = os.environ.get("PYXCCL_ALGO")
    os.environ["PYXCCL_ALGO"] = spec
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYXCCL_ALGO"]
        else:
            os.environ["PYXCCL_ALGO"] = old


def groups(comm, tp: int = 1, pp: int = 1, ep: int = 1, backend=None, ring: bool = True):
    """This pool's ParallelGroups of these sizes, made once (ring algorithms: the formulas' schedule)."""
    from pyxccl.parallel import ParallelGroups
    key = (tp, pp, ep, backend, ring)
    g = _GROUPS.get(key)
    if g is None:
        with algorithms(RING if ring else ""):
            g = _GROUPS[key] = ParallelGroups(tp=tp, pp=pp, ep=ep, backend=backend)
    return g


def layout(comm, tp, pp, ep=1):
    g = groups(comm, tp, pp, ep)
    return (g.tp.ranks, g.dp.ranks, g.pp.ranks, g.ep.ranks, g.tp_index, g.dp_index, g.pp_index, g.layout())


def ring_allreduce_traffic(comm, tp, numel):
    """One counted allreduce of ``numel`` float32 on the DP group: this step's rows."""
    import torch
    from pyxccl.parallel import ops, traffic
    g = groups(comm, tp)
    traffic.reset()
    ops.all_reduce(torch.ones(numel), g.dp)
    ops.all_gather(torch.empty(numel * g.dp.size), torch.ones(numel), g.dp)
    ops.reduce_scatter(torch.empty(numel), torch.ones(numel * g.dp.size), g.dp)
    return [(r.group, r.op, r.calls, r.bytes, r.sent, r.received) for r in traffic.step()]

