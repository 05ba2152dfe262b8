"""Every rank's schedule of a rooted tree algorithm as the C core's arrays (``compact.py``), made at once
in numpy rather than rank by rank.

Rooted collectives do not fold by host symmetry, so the tuner walks every rank's schedule of them; at
thousands of ranks building those schedules as Python objects, converting them and the garbage
collections they set off were most of pricing a size (issue 26: 4,096 hierarchical broadcasts, 0.2 s).

This is a second implementation of the builders it covers: binomial broadcast, reduce, gather and
scatter (``algorithms/tree.py``), direct gather and scatter (``algorithms/direct.py``), hierarchical
broadcast, gather and scatter with their default phases (``algorithms/hierarchical.py``; gather and scatter
on hosts of consecutive ranks), the chain broadcast, van de Geijn's broadcast and Rabenseifner's
reduce (``algorithms/pipeline.py``; the last two: ring phases, O(ranks) steps a rank, up to
``RING_OPS`` operations). :func:`arrays` gives, bit for bit, what
``compact.convert([every rank's schedule], written=True)`` gives (``tests/test_tuner_rooted.py``
compares them over many layouts, roots and sizes), or None where it does not cover the call. The
arrays hold no buffers or offsets, only what the walk reads: kind, peer, count, reduce flag, the
bytes a copy touches and whether an in-place call leaves a copy out.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np

from ..algorithms import hierarchical, pipeline
from ..schedule import split_counts
from .compact import COPY, RECV, SEND, Compact, prefix_sums, taken

#: step keys of the phases of one rank: a phase's steps are numbered from its base (fewer than 2^20
#: steps a phase, at most 4 phases: keys below ``_STEPS``)
_PHASE, _STEPS = 1 << 20, 1 << 22
#: a "lowest set bit" above any rank's: the root's (virtual rank 0) in a binomial tree
_NO_BIT = 1 << 62
#: bytes of the call's buffers a copy touches per byte (``compact``'s ``touch``): every copy here is
#: between "in", "out" and "tmp", none reduces
_TOUCH = 2


#: the columns of ``Ops.add`` after the rank (step, kind, peer, count, red, touch, skip, rep, stride, times), their
#: types
_COLUMNS = (np.int64, np.int8, np.int64, np.int64, np.int8, np.int8, bool, np.int64, np.int64, np.int64)


def _column(x, dtype, m: int):
    """``x`` as a column of ``m`` values of ``dtype``, or a scalar (a Python or numpy number: the same for
    every row, made a column by ``_joined``)."""
    if type(x) is np.ndarray:
        if x.ndim == 0:
            return x.item()
        if x.shape == (m,):
            return x if x.dtype == dtype else x.astype(dtype)
        return np.broadcast_to(np.asarray(x, dtype), (m,))
    if type(x) in (int, bool) or np.ndim(x) == 0:
        return x
    return np.broadcast_to(np.asarray(x, dtype), (m,))


def _joined(values, lens, dtype) -> np.ndarray:
    """The parts' values of one column (each a column or a scalar) as one column."""
    if not any(type(v) is np.ndarray for v in values):
        return np.repeat(np.asarray(values, dtype), lens)
    out, at = np.empty(sum(lens), dtype), 0
    for v, m in zip(values, lens):          # (a slice set, not a column made for each scalar)
        out[at:at + m] = v
        at += m
    return out


class Ops:
    """The operations of many ranks, added in any rank order: each with its rank and a step key; a
    rank's operations of one key form one of its steps (keys in increasing order), in the order added.
    ``ranks``: the ranks whose schedules are made, in increasing order (by default all ``nranks``).
    An operation added with ``rep`` > 1 stands for itself at keys step, step + 1, ..., step + rep - 1
    (``compact.Compact.rep``): where others share some of those keys it is cut there, so that every step
    made is one set of operations run ``rep`` times. ``stride``: in its k-th run, the operation's peer is
    peer + k * stride (mod ``nranks``; ``compact.Compact.stride``). ``times``: a copy made that many times in a
    row (``compact.Compact.times``)."""

    def __init__(self, nranks: int, ranks=None):
        self.n = nranks
        self.ranks = np.arange(nranks, dtype=np.int64) if ranks is None else np.asarray(ranks, np.int64)
        self.parts: list[tuple] = []
        self.repeats = self.strides = self.times = False

    def add(self, rank, step, kind, peer, count, red=0, touch=0, skip=False, rep=1, stride=0, times=1) -> None:
        rank = np.asarray(rank, np.int64)
        m = len(rank)
        if m:
            row = (rank, *(_column(x, t, m) for x, t in zip(
                (step, kind, peer, count, red, touch, skip, rep, stride, times), _COLUMNS)))
            self.parts.append(row)
            self.repeats = self.repeats or type(row[-3]) is np.ndarray or row[-3] != 1
            self.strides = self.strides or type(row[-2]) is np.ndarray or row[-2] != 0
            self.times = self.times or type(row[-1]) is np.ndarray or row[-1] != 1

    def compact(self) -> Compact:
        n = self.n
        # (the columns of repeats, strides and times only where some operation has them)
        wanted = (True,) * 7 + (self.repeats, self.repeats, self.times)
        if self.parts:
            cols = list(zip(*self.parts))
            lens = [len(r) for r in cols[0]]
            rank = np.concatenate(cols[0])
            step, kind, peer, count, red, touch, skip, rep, stride, times = (
                _joined(v, lens, t) if want else None for v, t, want in zip(cols[1:], _COLUMNS, wanted))
        else:
            rank, step, peer, count, rep, stride, times = (np.zeros(0, np.int64) for _ in range(7))
            kind, red, touch, skip = np.zeros(0, np.int8), np.zeros(0, np.int8), np.zeros(0, np.int8), np.zeros(0, bool)
        keep = count > 0                # what Schedule.step and embed leave out (and steps left empty)
        if self.repeats:
            if not keep.all():
                rank, step, kind, peer, count, red, touch, skip, rep, stride, times = (
                    taken(x, keep) for x in (rank, step, kind, peer, count, red, touch, skip, rep, stride, times))
                keep = np.ones(len(rank), bool)
            rank, step, rep, peer, stride, kind, count, red, touch, skip, times = _cut(
                rank, step, rep, peer, stride, n, kind, count, red, touch, skip, times)
        order = None if keep.all() else np.flatnonzero(keep)           # (None: every op, in the order added)
        key = rank * _STEPS + step if order is None else rank[order] * _STEPS + step[order]
        if len(key) > 1 and not (key[1:] >= key[:-1]).all():       # (added in order: nothing to sort)
            by = np.argsort(key, kind="stable")          # stable: a step's ops in the order added
            order, key = (by if order is None else order[by]), key[by]
        if order is not None:
            rank, kind, red, peer, count, skip, touch, rep, stride, times = (
                taken(x, order) for x in (rank, kind, red, peer, count, skip, touch, rep, stride, times))
        m = len(key)
        new = np.ones(m, bool)
        np.not_equal(key[1:], key[:-1], out=new[1:])
        starts = np.flatnonzero(new)
        step_start = np.append(starts, m).astype(np.int64)
        ranks = self.ranks
        at = rank[starts] if len(ranks) == n else np.searchsorted(ranks, rank[starts])
        rank_start = prefix_sums(np.bincount(at, minlength=len(ranks)))
        # (a column of defaults is none: an embedded phase's zero strides leave the arrays without any, which
        # then need not be written out where strides matter: ``bound.local``)
        return Compact(kind, red, peer, count, step_start, rank_start, ranks, skip if skip.any() else None, touch,
                       rep[starts] if self.repeats else None,
                       stride if self.repeats and self.strides and stride.any() else None, n,
                       times if self.times and (times != 1).any() else None)


def _cut(rank, step, rep, peer, stride, n: int, *cols):
    """The operations (rank, step key, repeats, peer, stride, other columns) with each one cut where another
    of its rank's begins or ends within its keys: then the operations of one rank and key all end at one key
    (one step, one number of repeats); a part from the k-th key on has its peer moved k strides."""
    long = np.flatnonzero(rep > 1)          # (only these can be cut: the others hold one key)
    if not len(long):
        return (rank, step, rep, peer, stride, *cols)
    start = rank * _STEPS + step
    end = start + rep
    bounds = np.sort(np.concatenate((start, end)))
    bounds = bounds[np.append(True, bounds[1:] != bounds[:-1])]         # (np.unique's first call imports numpy.ma)
    lo = np.searchsorted(bounds, start[long])
    cuts = np.searchsorted(bounds, end[long]) - lo
    if (cuts == 1).all():
        return (rank, step, rep, peer, stride, *cols)
    pieces = np.ones(len(start), np.int64)
    pieces[long] = cuts
    first_of = np.zeros(len(start), np.int64)           # each op's first boundary
    first_of[long] = lo
    which = np.repeat(np.arange(len(start), dtype=np.int64), pieces)
    k = np.arange(len(which), dtype=np.int64) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    first = np.where(k == 0, start[which], bounds[np.minimum(first_of[which] + k, len(bounds) - 1)])
    last = np.where(k == pieces[which] - 1, end[which], bounds[np.minimum(first_of[which] + k + 1, len(bounds) - 1)])
    stride = stride[which]
    peer = np.where(stride != 0, (peer[which] + (first - start[which]) * stride) % max(n, 1), peer[which])
    rank = rank[which]
    return (rank, first - rank * _STEPS, last - first, peer, stride, *(taken(c, which) for c in cols))


class _Groups:
    """Members of groups of ranks (a phase embedded in each group): ``flat``, the groups' ranks one group
    after another; per member, where its group starts in ``flat``, its size, the member's index there
    and the index of the group's root."""

    def __init__(self, flat, start, size, idx, root):
        self.flat, self.start, self.size, self.idx = flat, start, size, idx
        self.root = np.broadcast_to(root, idx.shape)
        self.rank = flat[start + idx]

    @classmethod
    def one(cls, n: int, root: int) -> "_Groups":
        """All ranks, one group."""
        ar = np.arange(n, dtype=np.int64)
        return cls(ar, np.zeros(n, np.int64), np.full(n, n, np.int64), ar, root)

    def peer(self, j):
        """The ranks at indices ``j`` (one per member) of the members' groups."""
        return self.flat[self.start + j % self.size]


def _rounds(g: _Groups) -> int:
    return int(max(0, int(g.size.max()) - 1)).bit_length() if len(g.size) else 0


def _pick(x, on):
    return x[on] if np.ndim(x) else x


def _bcast(ops: Ops, g: _Groups, count, base: int) -> None:
    """tree.broadcast in every group: in step k, virtual ranks below 2^k send to virtual rank + 2^k."""
    vr = (g.idx - g.root) % g.size
    for k in range(_rounds(g)):
        bit = 1 << k
        send = (vr < bit) & (vr + bit < g.size)
        on = send | ((bit <= vr) & (vr < 2 * bit))
        if on.any():
            peer = g.peer(np.where(send, g.idx + bit, g.idx - bit))
            ops.add(g.rank[on], base + k, np.where(send[on], SEND, RECV), peer[on], _pick(count, on))


def _binomial_broadcast(nranks: int, hosts, count: int, root: int) -> Compact:
    ops = Ops(nranks)
    _bcast(ops, _Groups.one(nranks, root), count, 0)
    return ops.compact()


def _binomial_reduce(nranks: int, hosts, count: int, root: int) -> Compact:
    """tree.reduce: a copy into the accumulator ("out" at the root: left out in place), the children's sums
    received and reduced, the sum sent to the parent."""
    n, g, ops = nranks, _Groups.one(nranks, root), Ops(nranks)
    vr = (g.idx - root) % n
    low = np.where(vr == 0, _NO_BIT, vr & -vr)
    ops.add(g.rank, 0, COPY, 0, count, touch=_TOUCH, skip=g.rank == root)
    for k in range(_rounds(g)):
        bit = 1 << k
        recv = (bit < low) & (vr + bit < n)
        ops.add(g.rank[recv], 1 + k, RECV, (g.rank[recv] + bit) % n, count, red=1)
        send = low == bit
        ops.add(g.rank[send], 1 + k, SEND, (g.rank[send] - bit) % n, count)
    return ops.compact()


def _tree(nranks: int, counts, root: int):
    """(ranks, virtual ranks, their lowest set bits, blocks in virtual-rank order, their offsets) of
    tree.py's gather/scatter tree."""
    n = nranks
    ranks = np.arange(n, dtype=np.int64)
    vr = (ranks - root) % n
    c = np.asarray(counts, np.int64)
    vcounts = np.concatenate((c[root:], c[:root]))
    return ranks, vr, np.where(vr == 0, _NO_BIT, vr & -vr), vcounts, prefix_sums(vcounts)


def _children(ops: Ops, n: int, root: int, ranks, vr, low, voff, kind: int, key) -> None:
    """Each rank's messages with its children (nearest first; ``key(k)``: the step of the k-th), each of
    the child's subtree's blocks."""
    for k in range(max(0, n - 1).bit_length()):
        bit = 1 << k
        on = (bit < low) & (vr + bit < n)
        child = vr[on] + bit
        ops.add(ranks[on], key(k), kind, (child + root) % n, voff[np.minimum(child + bit, n)] - voff[child])


def _binomial_gather(nranks: int, hosts, counts, root: int) -> Compact:
    """tree.gather: own block into "tmp", the children's subtrees received, the subtree sent to the parent;
    the root copies every block to its place in rank order."""
    n, ops = nranks, Ops(nranks)
    ranks, vr, low, vcounts, voff = _tree(n, counts, root)
    last = 1 + max(0, n - 1).bit_length()
    ops.add(ranks, 0, COPY, 0, np.asarray(counts, np.int64), touch=_TOUCH)
    _children(ops, n, root, ranks, vr, low, voff, RECV, lambda k: 1 + k)
    up = vr != 0
    ops.add(ranks[up], last, SEND, (vr[up] - low[up] + root) % n, voff[np.minimum(vr[up] + low[up], n)] - voff[vr[up]])
    ops.add(np.full(n, root), last, COPY, 0, vcounts, touch=_TOUCH)
    return ops.compact()


def _binomial_scatter(nranks: int, hosts, counts, root: int) -> Compact:
    """tree.scatter: the subtree's blocks received from the parent (the root copies them from "in" in
    virtual-rank order), the children's subtrees sent farthest first, the rank's own block copied out."""
    n, ops = nranks, Ops(nranks)
    ranks, vr, low, vcounts, voff = _tree(n, counts, root)
    last = 1 + max(0, n - 1).bit_length()
    up = vr != 0
    ops.add(ranks[up], 0, RECV, (vr[up] - low[up] + root) % n, voff[np.minimum(vr[up] + low[up], n)] - voff[vr[up]])
    ops.add(np.full(n, root), 0, COPY, 0, vcounts, touch=_TOUCH)
    _children(ops, n, root, ranks, vr, low, voff, SEND, lambda k: last - k)
    ops.add(ranks, last + 1, COPY, 0, np.asarray(counts, np.int64), touch=_TOUCH)
    return ops.compact()


def _direct(nranks: int, counts, root: int, gather: bool) -> Compact:
    """direct.gather (every other rank sends its block to the root, which copies its own and receives theirs
    in rank order) or direct.scatter (the root sends them)."""
    n, ops = nranks, Ops(nranks)
    c, ranks = np.asarray(counts, np.int64), np.arange(nranks, dtype=np.int64)
    other = ranks != root
    ops.add(ranks[other], 0, SEND if gather else RECV, root, c[other])
    ops.add([root], 0, COPY, 0, c[root], touch=_TOUCH, skip=int(c[:root].sum()) == 0)
    ops.add(np.full(n - 1, root), 0, RECV if gather else SEND, ranks[other], c[other])
    return ops.compact()


def _direct_gather(nranks: int, hosts, counts, root: int) -> Compact:
    return _direct(nranks, counts, root, True)


def _direct_scatter(nranks: int, hosts, counts, root: int) -> Compact:
    return _direct(nranks, counts, root, False)


def _leaders(nranks: int, hosts, counts, root: int):
    """hierarchical.gather/scatter's layout where its hosts are consecutive blocks of ranks (else None: the
    root regroups the blocks, built rank by rank): (ranks, each rank's host, the hosts' leaders, the root's
    host, the other hosts, the elements of each host, the blocks, whether each rank leads)."""
    groups, _, where = hierarchical.host_groups(nranks, hosts)
    size = np.fromiter(map(len, groups), np.int64, len(groups))
    start = prefix_sums(size)[:-1]
    ranks = np.arange(nranks, dtype=np.int64)
    if not all(g[0] == b and g[-1] == b + len(g) - 1 for g, b in zip(groups, start.tolist())):
        return None
    host = np.repeat(np.arange(len(groups), dtype=np.int64), size)
    root_host = where[root][0]
    leaders = start.copy()
    leaders[root_host] = root
    c = np.asarray(counts, np.int64)
    host_size = np.add.reduceat(c, start) if nranks else c
    leads = np.zeros(nranks, bool)
    leads[leaders] = True
    return ranks, host, leaders, root_host, np.arange(len(groups)) != root_host, host_size, c, leads


def _through_leaders(flat):
    """hierarchical.gather/scatter with direct phases (their defaults): ``flat``'s arrays on one host or one
    rank a host; on hosts of consecutive ranks, the decorated maker's, given ``_leaders``' layout; else None."""
    def deco(make):
        def fast(nranks: int, hosts, counts, root: int, inner: str = "direct", outer: str = "direct"):
            if inner != "direct" or outer != "direct":
                return None
            if len(hierarchical.host_groups(nranks, hosts)[0]) in (1, nranks):
                return flat(nranks, None, counts, root)
            got = _leaders(nranks, hosts, counts, root)
            return None if got is None else make(nranks, root, *got)
        fast.__doc__ = make.__doc__         # (not functools.wraps: arrays() reads fast's own parameters)
        return fast
    return deco


@_through_leaders(_direct_gather)
def _hierarchical_gather(n, root, ranks, host, leaders, root_host, others, host_size, c, leads) -> Compact:
    """Each host's members send their blocks to its leader (the root on its host, else its first rank),
    which copies its own and receives theirs; the leaders send their hosts' blocks to the root, which
    copies its host's onto itself and receives the others in host order."""
    ops, mem = Ops(n), ~leads
    ops.add(ranks[mem], 0, SEND, leaders[host[mem]], c[mem])
    ops.add(leaders, 0, COPY, 0, c[leaders], touch=_TOUCH, skip=(leaders == root) & (int(c[:root].sum()) == 0))
    ops.add(leaders[host[mem]], 0, RECV, ranks[mem], c[mem])
    ops.add(leaders[others], 1, SEND, root, host_size[others])
    ops.add([root], 1, COPY, 0, host_size[root_host], touch=_TOUCH)
    ops.add(np.full(int(others.sum()), root), 1, RECV, leaders[others], host_size[others])
    return ops.compact()


@_through_leaders(_direct_scatter)
def _hierarchical_scatter(n, root, ranks, host, leaders, root_host, others, host_size, c, leads) -> Compact:
    """The root copies its host's blocks and sends every other host's to its leader; each leader copies
    its own block out and sends its members theirs."""
    ops, mem = Ops(n), ~leads
    ops.add([root], 0, COPY, 0, host_size[root_host], touch=_TOUCH)
    ops.add(np.full(int(others.sum()), root), 0, SEND, leaders[others], host_size[others])
    ops.add(leaders[others], 0, RECV, root, host_size[others])
    ops.add(leaders, 1, COPY, 0, c[leaders], touch=_TOUCH)
    ops.add(leaders[host[mem]], 1, SEND, ranks[mem], c[mem])
    ops.add(ranks[mem], 1, RECV, leaders[host[mem]], c[mem])
    return ops.compact()


def _hierarchical_broadcast(nranks: int, hosts, count: int, root: int, inner: str = "binomial",
                            outer: str = "binomial") -> Compact | None:
    """hierarchical.broadcast with binomial phases (the tuner's: its defaults)."""
    if inner != "binomial" or outer != "binomial":
        return None
    n = nranks
    groups, even, where = hierarchical.host_groups(n, hosts)
    H = len(groups)
    if H == 1 or H == n:                    # flat: one host, or one rank a host
        return _binomial_broadcast(n, None, count, root)
    root_host, root_me = where[root]
    size = np.fromiter(map(len, groups), np.int64, H)
    start = prefix_sums(size)[:-1]
    host_order = np.fromiter((r for g in groups for r in g), np.int64, n)
    host = np.repeat(np.arange(H, dtype=np.int64), size)           # per member in host order
    me = np.arange(n, dtype=np.int64) - start[host]
    ops = Ops(n)
    if even and count >= hierarchical.SHARD_MIN:
        # the root's host deals L shards (direct scatter), column j broadcasts shard j, ring allgather inside
        L = int(size[0])
        if L >= _PHASE:             # (the ring's steps would not fit in a phase's keys)
            return None
        shards = np.asarray(split_counts(count, L), np.int64)
        mine = shards[me]
        deal = host == root_host
        at_root = deal & (me == root_me)
        to = deal & ~at_root
        ops.add(host_order[at_root], 0, COPY, 0, shards[root_me], touch=_TOUCH)
        others = np.arange(L) != root_me
        local = host_order[start[root_host]:start[root_host] + L]
        ops.add(np.full(L - 1, root), 0, SEND, local[others], shards[others])
        ops.add(host_order[to], 0, RECV, root, mine[to])
        grid = host_order.reshape(H, L).T.ravel()                      # column by column
        _bcast(ops, _Groups(grid, me * H, np.full(n, H, np.int64), host, root_host), mine, _PHASE)
        ops.add(host_order, 2 * _PHASE, COPY, 0, mine, touch=_TOUCH)
        k = np.arange(L - 1, dtype=np.int64)
        rank, j, k = np.repeat(host_order, L - 1), np.repeat(me, L - 1), np.tile(k, n)
        base = np.repeat(start[host], L - 1)
        ops.add(rank, 2 * _PHASE + 1 + k, SEND, host_order[base + (j + 1) % L], shards[(j - k) % L])
        ops.add(rank, 2 * _PHASE + 1 + k, RECV, host_order[base + (j - 1) % L], shards[(j - k - 1) % L])
        return ops.compact()
    # the leaders (the root on its host, every other host's first rank) broadcast, then each host inside
    leaders = host_order[start]
    leaders[root_host] = root
    ar = np.arange(H, dtype=np.int64)
    _bcast(ops, _Groups(leaders, np.zeros(H, np.int64), np.full(H, H, np.int64), ar, root_host), count, 0)
    _bcast(ops, _Groups(host_order, start[host], size[host], me, np.where(host == root_host, root_me, 0)), count,
           _PHASE)
    return ops.compact()


def _chain(nranks: int, hosts, count: int, root: int) -> Compact | None:
    """pipeline.broadcast_chain: the rank at position i of the line from the root receives segment j from
    the one before in step i - 1 + j and sends it on to the one after in step i + j."""
    n = nranks
    k = max(1, min(64, -(-count // pipeline.SEGMENT)))
    if n + k >= _STEPS:         # (its steps would not fit in a rank's keys)
        return None
    seg = np.asarray(split_counts(count, k), np.int64)
    ranks = np.arange(n, dtype=np.int64)
    i = (ranks - root) % n
    ops = Ops(n)
    recv, send = i >= 1, i < n - 1
    for j in range(k):          # a step's receive first, then its send: all receives are added first
        ops.add(ranks[recv], i[recv] - 1 + j, RECV, (ranks[recv] - 1) % n, seg[j])
    for j in range(k):
        ops.add(ranks[send], i[send] + j, SEND, (ranks[send] + 1) % n, seg[j])
    return ops.compact()


def around(ops: Ops, r: np.ndarray, first: int, chunk, send_at: int, recv_at: int, red: int = 0) -> None:
    """A ring phase (``ring.reduce_scatter_phase``, ``ring.allgather_phase``) from step key ``first``: in its
    k-th step rank r sends chunk (r + send_at - k) % n to r + 1 and receives chunk (r + recv_at - k) % n from
    r - 1 (``red``: and reduces it). Steps alike in a row (chunks of one size) are added once, repeated
    (``Ops.add``'s ``rep``): n - 1 steps a rank are n - 1 operations to make only where the sizes differ.
    (shifted.py's rings use it too.)"""
    n = ops.n
    if n < 2 or not len(r):
        return
    r = np.asarray(r, np.int64)
    if (chunk == chunk[0]).all():           # every step alike: one, n - 1 times
        rank, k, rep = r, np.zeros(len(r), np.int64), n - 1
    else:                                   # runs of steps whose two chunks are of the sizes of the last
        # step k sends chunk (r + send_at - k) % n: it differs from step k - 1's where that chunk's size differs
        # from the next one's, so a run begins at k = (r + send_at + 1 - d) % n for each d whose chunk differs
        # from chunk d - 1 (or the same for the receives): O(such chunks) a rank, not O(n) (a split's chunks
        # are of two sizes: where a few elements are cut for thousands of ranks, most are empty)
        d = np.flatnonzero(chunk != np.roll(chunk, 1))
        ks = np.concatenate((np.zeros((len(r), 1), np.int64), (r[:, None] + send_at + 1 - d) % n,
                             (r[:, None] + recv_at + 1 - d) % n), axis=1)
        ks[ks > n - 2] = 0                  # (step 0 begins a run anyway; there is no step n - 1)
        ks.sort(axis=1)
        new = np.ones(ks.shape, bool)
        new[:, 1:] = ks[:, 1:] != ks[:, :-1]
        row, col = np.nonzero(new)
        rank, k = r[row], ks[row, col]
        ends = np.append(k[1:], n - 1)
        ends[np.append(row[1:] != row[:-1], True)] = n - 1
        rep = ends - k
    ops.add(rank, first + k, SEND, (rank + 1) % n, chunk[(rank + send_at - k) % n], rep=rep)
    ops.add(rank, first + k, RECV, (rank - 1) % n, chunk[(rank + recv_at - k) % n], red=red, rep=rep)


def _ring_steps(nranks: int) -> bool:
    """Whether the arrays of a ring phase on every rank are small enough to make (else the builders run)."""
    return 2 * nranks * (nranks - 1) <= RING_OPS


def _scatter_allgather(nranks: int, hosts, count: int, root: int) -> Compact | None:
    """pipeline.broadcast_scatter_allgather: a binomial scatter of the n pieces (top down), then the ring
    allgather of the real ranks over the virtual pieces."""
    n = nranks
    if not _ring_steps(n):
        return None
    ops, pieces, ranks, _ = _binomial_pieces(n, count, root)
    around(ops, ranks, _PHASE, pieces, -root, -root - 1)
    return ops.compact()


def _binomial_pieces(n: int, count: int, root: int):
    """pipeline.scatter_phase's operations: (the ops, the pieces, the ranks, their virtual ranks)."""
    pieces = np.asarray(split_counts(count, n), np.int64)
    off = prefix_sums(pieces)
    ranks = np.arange(n, dtype=np.int64)
    vr = (ranks - root) % n
    ops = Ops(n)
    d, t = (1 << max(0, (n - 1).bit_length() - 1) if n > 1 else 0), 0
    while d >= 1:
        send = (vr % (2 * d) == 0) & (vr + d < n)
        v = vr[send]
        ops.add(ranks[send], t, SEND, (v + d + root) % n, off[np.minimum(v + 2 * d, n)] - off[v + d])
        recv = vr % (2 * d) == d
        v = vr[recv]
        ops.add(ranks[recv], t, RECV, (v - d + root) % n, off[np.minimum(v + d, n)] - off[v])
        d, t = d >> 1, t + 1
    return ops, pieces, ranks, vr


def _scatter_phase(nranks: int, hosts, count: int, root: int) -> Compact:
    """pipeline.scatter_phase (scatter_allgather's first phase, priced apart: select.py)."""
    return _binomial_pieces(nranks, count, root)[0].compact()


def _reduce_scatter_gather(nranks: int, hosts, count: int, root: int) -> Compact | None:
    """pipeline.reduce_rs_gather: the input copied to "tmp", the ring reduce-scatter (rank r ends with piece
    r), every piece sent to the root."""
    n = nranks
    if not _ring_steps(n):
        return None
    pieces = np.asarray(split_counts(count, n), np.int64)
    ranks = np.arange(n, dtype=np.int64)
    ops = Ops(n)
    ops.add(ranks, 0, COPY, 0, count, touch=_TOUCH)
    around(ops, ranks, 1, pieces, -1, -2, red=1)
    to_root(ops, ranks, pieces, root, _PHASE)
    return ops.compact()


def to_root(ops: Ops, ranks: np.ndarray, pieces: np.ndarray, root: int, base: int) -> None:
    """pipeline.gather_phase's steps from key ``base`` for ``ranks`` (increasing; ``pieces``: every rank's):
    each rank's piece copied aside (onto "out" on the root), then sent to the root, which receives them in
    rank order."""
    ops.add(ranks, base, COPY, 0, pieces[ranks], touch=_TOUCH)
    other = ranks[ranks != root]
    ops.add(other, base + 1, SEND, root, pieces[other])
    if len(other) < len(ranks):
        senders = np.delete(np.arange(ops.n, dtype=np.int64), root)
        ops.add(np.full(len(senders), root), base + 1, RECV, senders, pieces[senders])


def _gather_phase(nranks: int, hosts, count: int, root: int) -> Compact:
    """pipeline.gather_phase (reduce_scatter_gather's second phase, priced apart: select.py): walked for every
    rank, whose schedules, built one by one, cost O(ranks^2) (each its pieces' offsets: 4,096 ranks, 60 ms)."""
    ops = Ops(nranks)
    to_root(ops, ops.ranks, np.asarray(split_counts(count, nranks), np.int64), root, 0)
    return ops.compact()


#: the most operations of the ring phases :func:`arrays` makes for every rank (about 60 bytes each while
#: made): 1,024 ranks; above, the builders run as before
RING_OPS = 1 << 22

# (primitive, name) -> (the arrays' maker, whether they are cheap: O(ranks log ranks) operations in all,
# as cheap to walk as a fold; the ring-based ones hold O(ranks^2))
_FAST = {("broadcast", "binomial"): (_binomial_broadcast, True), ("reduce", "binomial"): (_binomial_reduce, True),
         ("gather", "binomial"): (_binomial_gather, True), ("scatter", "binomial"): (_binomial_scatter, True),
         ("broadcast", "hierarchical"): (_hierarchical_broadcast, True),
         ("gather", "direct"): (_direct_gather, True), ("scatter", "direct"): (_direct_scatter, True),
         ("gather", "hierarchical"): (_hierarchical_gather, True),
         ("scatter", "hierarchical"): (_hierarchical_scatter, True),
         ("broadcast", "chain"): (_chain, False), ("broadcast", "scatter_allgather"): (_scatter_allgather, False),
         ("broadcast", "scatter_allgather/scatter_phase"): (_scatter_phase, True),
         ("reduce", "reduce_scatter_gather"): (_reduce_scatter_gather, False),
         ("reduce", "reduce_scatter_gather/gather_phase"): (_gather_phase, True)}


def covers(primitive: str, name: str) -> bool:
    """Whether :func:`arrays` may give ``name``'s arrays (it may still decline a call)."""
    return (primitive, name) in _FAST


def cheap(primitive: str, name: str) -> bool:
    """Whether :func:`arrays` covers ``name`` with O(ranks log ranks) operations in all (a tree's): made and
    walked about as fast as a folded walk, where the others (ring phases: O(ranks^2)) cost what walking
    every rank does."""
    return _FAST.get((primitive, name), (None, False))[1]


def arrays(primitive: str, name: str, nranks: int, hosts, args: dict) -> Compact | None:
    """The arrays of every rank's schedule of ``name`` (``args``: its builder's arguments, ``hosts``: the
    hosts of a host-aware algorithm), in the order written, as ``compact.convert`` makes them from the
    schedules; None where this module does not cover the call."""
    fast = _FAST.get((primitive, name), (None,))[0]
    if fast is None or nranks < 1 or not set(args) <= _params(fast):
        return None
    return fast(nranks, hosts, **args)


@functools.lru_cache(maxsize=None)
def _params(fast) -> frozenset:
    return frozenset(inspect.signature(fast).parameters)
