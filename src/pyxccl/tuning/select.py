"""The tuner: for a call, model every algorithm that can run on this communicator's
topology and take the cheapest (NCCL's argmin over a cost table, but the table
comes from the schedules, walked by the cost model). Choices are cached per size
bucket (powers of two)."""
from __future__ import annotations

import logging

from .. import algorithms
from ..algorithms import registry
from ..algorithms.segment import Window
from ..primitives import PRIMITIVES
from .cost import Estimate, Machine, estimate

log = logging.getLogger("pyxccl")


class Tuner:
    def __init__(self, nranks: int, hosts: list[int], klass, machine: Machine, cores: list[int],
                 segment: tuple[int, bool] | None = None):
        """``segment``: (bytes of a rank's window, single-copy reads work) of the one-host fast path,
        or None where there is none."""
        self.n, self.hosts, self.klass, self.machine = nranks, hosts, klass, machine
        self.segment = segment
        per_host = {h: hosts.count(h) for h in set(hosts)}
        self.stretch = [max(1.0, per_host[hosts[r]] / max(1, cores[r])) for r in range(nranks)]
        self._cache: dict[tuple, str] = {}

    def usable(self, algo: registry.Algorithm) -> bool:
        return self.segment is not None or not algo.segment

    def model(self, primitive: str, name: str, nbytes: int, itemsize: int = 4) -> Estimate | None:
        """The model's estimate for ``name`` (None if the algorithm can't run this call here)."""
        algo = registry.lookup(primitive, name)
        if not self.usable(algo):
            return None
        args = PRIMITIVES[primitive].sized(self.n, nbytes, itemsize)
        window = Window.of(self.segment[0], itemsize, self.segment[1]) if algo.segment else None
        try:
            scheds = [algo.schedule(r, self.n, hosts=self.hosts, window=window, **args) for r in range(self.n)]
        except ValueError:
            return None
        # No working set: the tuner leaves out the memory term (cost.py). With it, the message path
        # over shared memory looks cheaper than the segment for large calls, and on a host with more
        # ranks than cores it is not: measured here, 4 ranks on 2 cores, a 64 MiB allgather takes
        # 71 ms by recursive doubling and 22-30 ms on the segment (docs/sim.md, "Fidelity").
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
