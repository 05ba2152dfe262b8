"""Hierarchical allreduce: inside each host, then across hosts, then inside again.

Links inside a host (shared memory) are much faster than links between
hosts, so the inter-host phase should carry as little as possible:

1. intra-host reduce-scatter: local rank j of each host ends with the host's
   sum of shard j (the inner algorithm, ring by default);
2. inter-host allreduce of shard j among the local ranks j of all hosts, all
   shards at once (the outer algorithm, ring by default): each host sends
   2(h-1)/h of the data in total, split over its L ranks' links;
3. intra-host allgather of the shards.

When hosts hold different numbers of ranks the shards do not line up, so the
algorithm falls back to a leader per host: intra-host binomial reduce to the
leader, allreduce among leaders, intra-host binomial broadcast. One host (or
``hosts=None``) degenerates to the inner algorithms alone.
"""
from __future__ import annotations

from ..schedule import Copy, Schedule, embed, split_counts
from .registry import lookup, register


def groups_of(hosts: list[int]) -> list[list[int]]:
    """Ranks of each host, hosts in order of their first rank."""
    order: dict[int, list[int]] = {}
    for r, h in enumerate(hosts):
        order.setdefault(h, []).append(r)
    return list(order.values())


@register("allreduce", "hierarchical")
def allreduce(rank: int, nranks: int, count: int, hosts=None, inner: str = "ring",
              outer: str = "ring") -> Schedule:
    hosts = hosts if hosts is not None else [0] * nranks
    local = next(g for g in groups_of(hosts) if rank in g)
    peers_by_host = groups_of(hosts)
    s = Schedule(rank, nranks)
    s.step(Copy("in", 0, "out", 0, count))
    L, me = len(local), local.index(rank)
    if all(len(g) == L for g in peers_by_host):
        shards = split_counts(count, L)
        cross = [g[me] for g in peers_by_host]          # local rank `me` of every host
        rs = lookup("reduce_scatter", inner)[1](me, L, counts=shards)
        ar = lookup("allreduce", outer)[1](cross.index(rank), len(cross), count=shards[me])
        ag = lookup("allgather", inner)[1](me, L, counts=shards)
        # tmp = [this rank's shard | scratch of whichever phase needs the most]
        s.scratch = shards[0] + max(rs.scratch, ar.scratch, ag.scratch)
        embed(s, rs, local, {"in": ("out", 0), "out": ("tmp", 0), "tmp": ("tmp", shards[0])})
        embed(s, ar, cross, {"in": ("tmp", 0), "out": ("tmp", 0), "tmp": ("tmp", shards[0])})
        embed(s, ag, local, {"in": ("tmp", 0), "out": ("out", 0), "tmp": ("tmp", shards[0])})
        return s
    leaders = [g[0] for g in peers_by_host]
    red = lookup("reduce", "binomial")[1](me, L, count=count, root=0)
    s.scratch = red.scratch
    embed(s, red, local, {"in": ("out", 0), "out": ("out", 0), "tmp": ("tmp", 0)})
    if rank in leaders:
        ar = lookup("allreduce", outer)[1](leaders.index(rank), len(leaders), count=count)
        s.scratch = max(s.scratch, ar.scratch)
        embed(s, ar, leaders, {"in": ("out", 0), "out": ("out", 0), "tmp": ("tmp", 0)})
    bc = lookup("broadcast", "binomial")[1](me, L, count=count, root=0)
    embed(s, bc, local, {"out": ("out", 0)})
    return s
