"""Large-message broadcast and reduce.

chain: the ranks form a line from the root; the message is cut into k
segments and in step t the rank at position i forwards segment t-i, so all
links are busy at once: n+k-2 steps, each link carries the message once.

scatter_allgather (van de Geijn): the root scatters n pieces down a binomial
tree, then a ring allgather completes every rank: 2(n-1)/n of the message
per rank instead of log2(n) whole copies.

reduce_scatter_gather (Rabenseifner's reduce): ring reduce-scatter, then
every rank sends its reduced piece to the root.
"""
from __future__ import annotations

from ..schedule import Recv, Schedule, Send, embed, offsets, split_counts
from .registry import lookup, register
from .ring import allgather_phase

SEGMENT = 1 << 16      # elements per chain segment


@register("broadcast", "chain")
def broadcast_chain(rank: int, nranks: int, count: int, root: int) -> Schedule:
    s = Schedule(rank, nranks)
    k = max(1, min(64, -(-count // SEGMENT)))
    off = offsets(split_counts(count, k))
    i = (rank - root) % nranks                          # position in the chain
    nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
    for t in range(max(0, i - 1), min(nranks + k - 2, i + k)):     # the steps this rank has a part in
        ops = []
        j = t - (i - 1)                                 # segment arriving from the previous rank
        if i >= 1 and 0 <= j < k:
            ops.append(Recv(prv, "out", off[j], off[j + 1] - off[j]))
        j = t - i                                       # segment going to the next rank
        if i < nranks - 1 and 0 <= j < k:
            ops.append(Send(nxt, "out", off[j], off[j + 1] - off[j]))
        s.step(*ops)
    return s


@register("broadcast", "scatter_allgather")
def broadcast_scatter_allgather(rank: int, nranks: int, count: int, root: int) -> Schedule:
    n = nranks
    pieces = split_counts(count, n)
    off = offsets(pieces)                               # piece v belongs to virtual rank v
    vr = (rank - root) % n
    real = lambda v: (v + root) % n                     # noqa: E731
    s = Schedule(rank, n)
    d = 1 << max(0, (n - 1).bit_length() - 1) if n > 1 else 0
    while d >= 1:                                       # binomial scatter, top down
        if vr % (2 * d) == 0 and vr + d < n:
            hi = min(vr + 2 * d, n)
            s.step(Send(real(vr + d), "out", off[vr + d], off[hi] - off[vr + d]))
        elif vr % (2 * d) == d:
            hi = min(vr + d, n)
            s.step(Recv(real(vr - d), "out", off[vr], off[hi] - off[vr]))
        d >>= 1
    ag = Schedule(vr, n)                                # ring allgather among virtual ranks
    allgather_phase(ag, pieces, "out", have=vr)
    embed(s, ag, [*range(root, n), *range(root)], {"out": ("out", 0)})     # virtual rank v is real(v)
    return s


@register("reduce", "reduce_scatter_gather")
def reduce_rs_gather(rank: int, nranks: int, count: int, root: int) -> Schedule:
    pieces = split_counts(count, nranks)
    off = offsets(pieces)
    rs = lookup("reduce_scatter", "ring").build(rank, nranks, counts=pieces)
    s = Schedule(rank, nranks, scratch=rs.scratch + max(pieces, default=0))
    mine = ("out", off[rank]) if rank == root else ("tmp", rs.scratch)
    embed(s, rs, list(range(nranks)), {"in": ("in", 0), "out": mine, "tmp": ("tmp", 0)})
    if rank == root:
        s.step(*(Recv(p, "out", off[p], pieces[p]) for p in range(nranks) if p != root))
    else:
        s.step(Send(root, "tmp", rs.scratch, pieces[rank]))
    return s
