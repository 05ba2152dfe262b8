"""Allreduce through trees: a binomial tree (reduce to rank 0, then broadcast),
a flat "master" tree (everyone to rank 0 and back: the parameter-server shape
of the seeds), and NCCL's double binary tree."""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send, embed, many, offsets, split_counts
from .direct import but, others
from .registry import lookup, register


@register("allreduce", "tree")
def allreduce_tree(rank: int, nranks: int, count: int) -> Schedule:
    """Binomial reduce to rank 0, then binomial broadcast: 2 ceil(log2 n) steps, the whole
    vector on every link: good for small messages."""
    red = lookup("reduce", "binomial").build(rank, nranks, count=count, root=0)
    bc = lookup("broadcast", "binomial").build(rank, nranks, count=count, root=0)
    s = Schedule(rank, nranks, scratch=red.scratch)
    ident = list(range(nranks))
    embed(s, red, ident, {"in": ("in", 0), "out": ("out", 0), "tmp": ("tmp", 0)})
    embed(s, bc, ident, {"out": ("out", 0)})
    return s


@register("allreduce", "reduce_broadcast")
def allreduce_master(rank: int, nranks: int, count: int) -> Schedule:
    """Every rank sends its vector to rank 0, which reduces them in rank order and sends the
    result back: 2 steps, but rank 0's link carries 2(n-1) vectors."""
    s = Schedule(rank, nranks, scratch=count * nranks if rank == 0 else 0)
    if rank != 0:
        s.step(Send(0, "in", 0, count))
        s.step(Recv(0, "out", 0, count))
        return s
    peers, at = range(1, nranks), [p * count for p in range(1, nranks)]
    s.step(Copy("in", 0, "tmp", 0, count), *many(Recv, peers, "tmp", at, count, False))
    s.step(Copy("tmp", 0, "out", 0, count), *many(Copy, "tmp", at, "out", 0, count, True))
    s.step(*many(Send, peers, "out", 0, count))
    return s


@register("allreduce", "direct", rotates=True)
def allreduce_direct(rank: int, nranks: int, count: int) -> Schedule:
    """All pairs: rank j receives chunk j from everyone and reduces it (in rank order), then sends
    the reduced chunk to everyone: 2 steps, 2(n-1)/n of the data per rank, n-1 messages a step. (Peers
    in rank order, not from r + 1 on as direct.py's exchanges: rotated it folds, and its fold was 17-30%
    below every rank's walk at 1-16 MiB on 4 x 4 to 16 x 8 hosts.)"""
    counts = split_counts(count, nranks)
    off = offsets(counts)
    mine = counts[rank]
    s = Schedule(rank, nranks, scratch=mine * nranks)
    s.step(Copy("in", 0, "out", 0, count))
    peers = others(rank, nranks)
    their_off, their_counts = but(off, rank, nranks), but(counts, rank, nranks)
    s.step(Copy("out", off[rank], "tmp", rank * mine, mine), *many(Send, peers, "out", their_off, their_counts),
           *many(Recv, peers, "tmp", [p * mine for p in peers], mine, False))
    s.step(Copy("tmp", 0, "out", off[rank], mine),
           *many(Copy, "tmp", [p * mine for p in range(1, nranks)], "out", off[rank], mine, True))
    s.step(*many(Send, peers, "out", off[rank], mine), *many(Recv, peers, "out", their_off, their_counts, False))
    return s


def _btree(n: int, r: int):
    """NCCL's binary tree (ncclGetBtree): (parent, [children]) of rank r. A rank's level is its
    lowest set bit, so every odd rank is a leaf; rank 0 is the root, with one child."""
    bit = 1
    while bit < n and not bit & r:
        bit <<= 1
    if r == 0:
        return -1, [bit >> 1] if n > 1 else []
    up = (r ^ bit) | (bit << 1)
    if up >= n:
        up = r ^ bit
    low = bit >> 1
    kids = [r - low] if low else []
    while low and r + low >= n:       # the right child may lie past the end: try a lower level
        low >>= 1
    if low:
        kids.append(r + low)
    return up, kids


def _dtree(n: int, r: int):
    """Rank r's (parent, [children]) in tree 0 and in tree 1. Tree 0 has the odd ranks as leaves; tree 1 is
    its mirror (even n) or its shift by one (odd n), whose leaves are the even ranks: (even n) every rank is
    a leaf in at least one tree. (Rank r's place only, in O(log n): making every rank's was O(n) a schedule's build.)"""
    f, back = ((lambda q: n - 1 - q), (lambda q: n - 1 - q)) if n % 2 == 0 else ((lambda q: (q + 1) % n),
                                                                                (lambda q: (q - 1) % n))
    parent, children = _btree(n, back(r))          # tree 1 is tree 0 with every rank moved by f
    return _btree(n, r), (f(parent) if parent >= 0 else -1, [f(c) for c in children])


def _tree_phase(s: Schedule, place: tuple, off: int, count: int, slot: int) -> None:
    """Reduce [off, off+count) of "out" up the tree to its root, then broadcast it back down (``place``: the
    rank's (parent, [children]) there)."""
    parent, children = place
    if children:
        s.step(*(Recv(c, "tmp", slot + i * count, count) for i, c in enumerate(children)))
        s.step(*(Copy("tmp", slot + i * count, "out", off, count, reduce=True) for i in range(len(children))))
    if parent >= 0:
        s.step(Send(parent, "out", off, count))
        s.step(Recv(parent, "out", off, count))
    if children:
        s.step(*(Send(c, "out", off, count) for c in children))


@register("allreduce", "double_binary_tree")
def allreduce_double_tree(rank: int, nranks: int, count: int) -> Schedule:
    """NCCL's double binary tree: two binary trees, the second the mirror (or, for odd n, the
    shift) of the first, so that a leaf of one is an inner node of the other; each carries half of the data up (reduce)
    and back down (broadcast). log-depth latency with both link directions of every rank in use.

    The halves run one after the other here: interleaving the two trees' steps can deadlock
    (a rank waiting for its child in one tree while that child waits for it in the other)."""
    t0, t1 = _dtree(nranks, rank)
    halves = split_counts(count, 2)
    s = Schedule(rank, nranks, scratch=2 * max(halves))
    s.step(Copy("in", 0, "out", 0, count))
    _tree_phase(s, t0, 0, halves[0], 0)
    _tree_phase(s, t1, halves[0], halves[1], 0)
    return s
