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

from ..schedule import Copy, Recv, Schedule, Send, offsets, split_counts
from .registry import SHIFT, register
from .ring import allgather_phase, reduce_scatter_phase, shared_offsets, shared_split

SEGMENT = 1 << 16      # elements per chain segment


@register("broadcast", "chain", relay=True)
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


def scatter_phase(rank: int, nranks: int, count: int, root: int) -> Schedule:
    """scatter_allgather's first phase: the root's n pieces down a binomial tree, top down (piece v ends
    on virtual rank v = rank - root)."""
    n = nranks
    pieces = shared_split(count, n)
    off = shared_offsets(pieces, n)                     # piece v belongs to virtual rank v (shared, read only)
    vr = (rank - root) % n
    real = lambda v: (v + root) % n                     # noqa: E731
    s = Schedule(rank, n)
    d = 1 << max(0, (n - 1).bit_length() - 1) if n > 1 else 0
    while d >= 1:
        if vr % (2 * d) == 0 and vr + d < n:
            hi = min(vr + 2 * d, n)
            s.step(Send(real(vr + d), "out", off[vr + d], off[hi] - off[vr + d]))
        elif vr % (2 * d) == d:
            hi = min(vr + d, n)
            s.step(Recv(real(vr - d), "out", off[vr], off[hi] - off[vr]))
        d >>= 1
    return s


def ring_phase(rank: int, nranks: int, count: int, root: int) -> Schedule:
    """scatter_allgather's second phase: the ring allgather among virtual ranks v -> real(v): real(vr) +- 1
    is rank +- 1, so it is the ring of real ranks over the virtual pieces (what embedding it said, without
    copying every operation)."""
    s = Schedule(rank, nranks)
    allgather_phase(s, shared_split(count, nranks), "out", have=(rank - root) % nranks)
    return s


# Priced by phases (tuning/select.py): the scatter, then the ring folded from when the last rank ended the
# scatter: the ring's last step on every rank waits, through n - 1 hand-offs, for every rank's first (every
# rank's walk of the whole: the same within 2.4e-4, tests/test_tuner_fold.py)
@register("broadcast", "scatter_allgather", phases=((scatter_phase, ()), (ring_phase, SHIFT)))
def broadcast_scatter_allgather(rank: int, nranks: int, count: int, root: int) -> Schedule:
    s = scatter_phase(rank, nranks, count, root)
    s.steps += ring_phase(rank, nranks, count, root).steps
    return s


def reduce_scatter_phase_of(rank: int, nranks: int, count: int, root: int) -> Schedule:
    """reduce_scatter_gather's first phase: the ring reduce-scatter (reduce_scatter "ring") built in place:
    its "tmp" is this one's "tmp" at 0 and its "out" this rank's piece."""
    pieces = shared_split(count, nranks)           # (the first the largest: split_counts)
    total = shared_offsets(pieces, nranks)[-1]
    s = Schedule(rank, nranks, scratch=total + (pieces[0] if pieces else 0))
    s.step(Copy("in", 0, "tmp", 0, total))
    reduce_scatter_phase(s, pieces, "tmp", last=rank)
    return s


def gather_phase(rank: int, nranks: int, count: int, root: int) -> Schedule:
    """reduce_scatter_gather's second phase: every reduced piece to the root (the root's "out", another's
    scratch after the reduce-scatter's)."""
    pieces = shared_split(count, nranks)
    off = shared_offsets(pieces, nranks)        # shared by every rank of the call (read only)
    total = off[-1]
    s = Schedule(rank, nranks, scratch=total + (pieces[0] if pieces else 0))
    if rank == root:
        s.step(Copy("tmp", off[rank], "out", off[rank], pieces[rank]))
        s.step(*(Recv(p, "out", off[p], pieces[p]) for p in range(nranks) if p != root))
    else:
        s.step(Copy("tmp", off[rank], "tmp", total, pieces[rank]))
        s.step(Send(root, "tmp", total, pieces[rank]))
    return s


# Priced by phases (tuning/select.py): the ring folded, then every rank's gather walked from where its ring
# ended; against every rank's walk of the whole, the link bookings of the ring that the gather meets are
# left out (tests/test_tuner_fold.py)
@register("reduce", "reduce_scatter_gather", phases=((reduce_scatter_phase_of, SHIFT), (gather_phase, ())))
def reduce_rs_gather(rank: int, nranks: int, count: int, root: int) -> Schedule:
    s = reduce_scatter_phase_of(rank, nranks, count, root)
    s.steps += gather_phase(rank, nranks, count, root).steps
    return s
