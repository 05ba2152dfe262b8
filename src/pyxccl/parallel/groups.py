"""The process groups of DP x TP x PP (x EP), placed as the brief says.

TP moves the most, most often (two allreduces per block, forward and backward): its ranks are
consecutive, so they share a host. DP and PP move less, less often: they go across hosts.
A global rank is ``(pp_index * dp + dp_index) * tp + tp_index`` (Megatron's order, tp-dp-pp);
an EP group is ``ep`` consecutive members of a DP group (experts sharded over part of the
data-parallel ranks, each EP group one replica of all experts).

>>> g = ParallelGroups(tp=2, pp=2)          # doctest: +SKIP
>>> print(g.layout())                        # who is where, and whether TP stays on one host
>>> ops.all_reduce(x, g.tp)                  # a Group: its torch process group, ranks, name
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

import torch.distributed as dist

from .._errors import InvalidArgumentError
from .traffic import TRAFFIC, communicator


@dataclass
class Group:
    """One sub-group this rank is in: ``name`` ("tp", "dp", "pp", "ep"), ``ranks`` (global, in
    group-rank order), this rank's ``rank`` in it and its ``size``; ``pg`` is the torch group."""
    name: str
    ranks: list[int]
    rank: int
    pg: object = field(repr=False, default=None)

    @property
    def size(self) -> int:
        return len(self.ranks)


class ParallelGroups:
    """The DP x TP x PP (x EP) groups of the default torch.distributed group (collective: every
    rank makes it, in the same order). ``dp`` defaults to what is left of the world size.

    Attributes: ``tp``, ``dp``, ``pp``, ``ep`` (:class:`Group`) and this rank's indices
    ``tp_index``, ``dp_index``, ``pp_index`` (its pipeline stage).
    """

    def __init__(self, tp: int = 1, pp: int = 1, dp: int | None = None, ep: int = 1, *, backend=None):
        world, me = dist.get_world_size(), dist.get_rank()
        if dp is None:
            dp = world // (tp * pp) if tp * pp and world % (tp * pp) == 0 else 0
        if min(tp, pp, dp, ep) < 1 or tp * pp * dp != world or dp % ep:
            raise InvalidArgumentError(f"rank {me}: ParallelGroups: tp={tp} x dp={dp} x pp={pp} must equal the "
                                       f"world size {world}, and ep={ep} must divide dp; choose sizes that do",
                                       rank=me, op="ParallelGroups")
        self.sizes = dict(tp=tp, dp=dp, pp=pp, ep=ep)
        self.world = world
        self.tp_index, self.dp_index, self.pp_index = me % tp, me // tp % dp, me // (tp * dp)

        def rank(t, d, p):
            return (p * dp + d) * tp + t

        every = {
            "tp": [[rank(t, d, p) for t in range(tp)] for p in range(pp) for d in range(dp)],
            "dp": [[rank(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[rank(t, d, p) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "ep": [[rank(t, e0 + e, p) for e in range(ep)] for p in range(pp) for t in range(tp)
                   for e0 in range(0, dp, ep)],
        }
        self.every = every
        self.hosts = [None] * world
        dist.all_gather_object(self.hosts, socket.gethostname())
        for name, lists in every.items():
            mine = None
            for ranks in lists:      # every rank makes every group, in one order (torch's rule)
                pg = dist.new_group(ranks, backend=backend)
                if me in ranks:
                    mine = Group(name, ranks, ranks.index(me), pg)
                    comm = communicator(pg)
                    if comm is not None:
                        comm.label = name           # the timeline's lane says which group it is
            setattr(self, name, mine)
            TRAFFIC.watch(mine.pg)

    @property
    def first_stage(self) -> bool:
        return self.pp_index == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_index == self.sizes["pp"] - 1

    def spanning(self, name: str) -> list[list[int]]:
        """The groups ``name`` whose ranks are on more than one host."""
        return [r for r in self.every[name] if len({self.hosts[x] for x in r}) > 1]

    def layout(self) -> str:
        """Who is where: each group's ranks and hosts, and a warning if TP leaves a host."""
        s = self.sizes
        lines = [f"world {self.world} = tp {s['tp']} x dp {s['dp']} x pp {s['pp']}"
                 + (f" (ep {s['ep']} within dp)" if s["ep"] > 1 else "")]
        hosts = sorted(set(self.hosts), key=self.hosts.index)
        for h in hosts:
            lines.append(f"  host {h}: ranks {[r for r in range(self.world) if self.hosts[r] == h]}")
        for name in ("tp", "dp", "pp", "ep"):
            if s[name] > 1:
                lines.append(f"  {name} groups: {self.every[name]}")
        bad = self.spanning("tp")
        if bad:
            lines.append(f"  warning: tp groups {bad} span hosts; tp moves the most: keep it within a host "
                         f"(tp <= ranks per host)")
        return "\n".join(lines)
