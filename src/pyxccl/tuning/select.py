"""The tuner: for a call, model every registered algorithm on this communicator's
topology and take the cheapest (NCCL's argmin over a cost table, but the table
comes from the schedules). Choices are cached per size bucket (powers of two)."""
from __future__ import annotations

import logging

from .. import algorithms
from ..algorithms import registry
from .cost import Estimate, Machine, estimate, fast_estimate

log = logging.getLogger("pyxccl")


def representative_args(primitive: str, n: int, count: int) -> dict:
    """Builder arguments for a ``count``-element call (nccl-tests sizes: the full buffer)."""
    per = max(1, count // n) if count else 0
    if primitive == "allreduce":
        return dict(count=count)
    if primitive in ("broadcast", "reduce"):
        return dict(count=count, root=0)
    if primitive in ("allgather", "reduce_scatter"):
        return dict(counts=[per] * n)
    if primitive in ("gather", "scatter"):
        return dict(counts=[per] * n, root=0)
    if primitive == "alltoall":
        return dict(send_counts=[per] * n, recv_counts=[per] * n)
    return {}


class Tuner:
    def __init__(self, nranks: int, hosts: list[int], klass, machine: Machine, cores: list[int],
                 fast_area: int = 0):
        """``fast_area``: bytes per rank area of the one-host fast path (0: no fast path here)."""
        self.n, self.hosts, self.klass, self.machine = nranks, hosts, klass, machine
        self.fast_area = fast_area
        per_host = {h: hosts.count(h) for h in set(hosts)}
        self.stretch = [max(1.0, per_host[hosts[r]] / max(1, cores[r])) for r in range(nranks)]
        self._cache: dict[tuple, str] = {}

    def model(self, primitive: str, name: str, nbytes: int, itemsize: int = 4) -> Estimate | None:
        """The model's estimate for ``name`` (None if the algorithm can't run this call)."""
        if name == "shm":
            if not self.fast_area:
                return None
            from ..fastpath import ONESHOT_BYTES
            return fast_estimate(primitive, self.n, nbytes, self.machine, max(self.stretch), self.fast_area,
                                 ONESHOT_BYTES)
        builder = registry.lookup(primitive, name)[1]
        args = representative_args(primitive, self.n, nbytes // itemsize)
        try:
            scheds = [registry.build(builder, r, self.n, hosts=self.hosts, **args) for r in range(self.n)]
        except ValueError:
            return None
        return estimate(scheds, itemsize, self.machine, self.klass, self.stretch, self.hosts)

    def table(self, primitive: str, nbytes: int, itemsize: int = 4) -> dict[str, Estimate]:
        out = {}
        for name in algorithms.algorithms(primitive):
            est = self.model(primitive, name, nbytes, itemsize)
            if est is not None:
                out[name] = est
        return out

    def choose(self, primitive: str, nbytes: int, itemsize: int = 4) -> str:
        bucket = 1 << max(3, (max(1, nbytes) - 1).bit_length())
        key = (primitive, bucket, itemsize)
        name = self._cache.get(key)
        if name is None:
            costs = self.table(primitive, bucket, itemsize)
            name = min(costs, key=lambda a: (costs[a].time, a))
            self._cache[key] = name
            if log.isEnabledFor(logging.INFO):
                alts = ", ".join(f"{a} {c.time * 1e6:.1f}us" for a, c in sorted(costs.items(), key=lambda x: x[1].time))
                log.info("%s %d B on %d ranks: %s (model: %s)", primitive, bucket, self.n, name, alts)
        return name
