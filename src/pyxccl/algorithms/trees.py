"""Allreduce through trees: a binomial tree (reduce to rank 0, then broadcast),
a flat "master" tree (everyone to rank 0 and back: the parameter-server shape
of the seeds), and NCCL's double binary tree."""
from __future__ import annotations

import functools

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


@functools.lru_cache(maxsize=4)       # every rank's schedule reads the same trees (read only)
def _dtree(n: int):
    """Tree 0 has the odd ranks as leaves; tree 1 is its mirror (even n) or its shift by one
    (odd n), whose leaves are the even ranks: every rank is a leaf in at least one tree."""
    t0 = {r: _btree(n, r) for r in range(n)}
    f = (lambda r: n - 1 - r) if n % 2 == 0 else (lambda r: (r + 1) % n)
    t1 = {f(r): (f(p) if p >= 0 else -1, [f(c) for c in ch]) for r, (p, ch) in t0.items()}
    return t0, t1


def _tree_phase(s: Schedule, rank: int, tree: dict, off: int, count: int, slot: int) -> None:
    """Reduce [off, off+count) of "out" up ``tree`` to its root, then broadcast it back down."""
    parent, children = tree[rank]
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
    t0, t1 = _dtree(nranks)
    halves = split_counts(count, 2)
    s = Schedule(rank, nranks, scratch=2 * max(halves))
    s.step(Copy("in", 0, "out", 0, count))
    _tree_phase(s, rank, t0, 0, halves[0], 0)
    _tree_phase(s, rank, t1, halves[0], halves[1], 0)
    return s
