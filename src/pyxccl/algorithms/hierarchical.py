"""Hierarchical algorithms: inside each host, across hosts, inside again.

Links inside a host (shared memory) are much faster than links between
hosts, so the inter-host phase should carry as little as possible, and
carry it over every rank's link rather than one. Notation below: H hosts;
when they are *even* (the same number L of ranks on each), local rank j of
every host forms *column* j, the group the inter-host phase runs in; c is
the elements per rank (per block for alltoall), N = n c the total. One host
(or ``hosts=None``) degenerates to the flat inner algorithm; hosts of one
rank each (L = 1) to the flat outer one. Hosts are numbered in the order of
their first rank; a host's ranks need not be contiguous. The inner phases
use an ``inner`` algorithm, the inter-host ones an ``outer`` one (keywords).

allreduce
    1. intra-host reduce-scatter: local rank j ends with the host's sum of
       shard j (shards: the vector cut into L);
    2. inter-host allreduce of shard j within column j;
    3. intra-host allgather of the shards.
    Across hosts (ring outer): 2(H-1)/H of the vector out of and into each
    host, split over its L ranks. Uneven hosts: intra-host binomial reduce to
    the host's first rank (its *leader*), allreduce among leaders, intra-host
    binomial broadcast: the same bytes, through one link per host.

allgather
    1. inter-host allgather within column j of the ranks' blocks: local rank
       j holds the blocks of local rank j of every host;
    2. intra-host allgather of these columns;
    3. a local copy putting the blocks in rank order (none when column order
       already is rank order, e.g. ``hosts = [r % H]``).
    Across hosts: each host receives every other host's data exactly once,
    N (H-1)/H, the least possible, split over its L links: (H-1) c per
    rank with ring or direct outer. (A flat ring over hosts-contiguous
    ranks puts (n-1) c on one link per host.) Uneven hosts: intra-host
    direct gather to the leader, allgather of the host blocks among
    leaders, intra-host binomial broadcast of the whole result.

reduce_scatter
    The mirror image of allgather: a local copy putting the input in column
    order; intra-host reduce-scatter of the columns (local rank j ends with
    the host's sum of column j); inter-host reduce-scatter within column j.
    Across hosts: (H-1) c out of each rank, N (H-1)/H out of each host.
    Uneven hosts: intra-host binomial reduce of the whole input to the
    leader, reduce-scatter of the host blocks among leaders, intra-host
    direct scatter.

broadcast
    Small messages, or uneven hosts: the root and the first rank of every
    other host (the leaders) run the outer broadcast (binomial), then each
    leader broadcasts inside its host (inner, binomial). From ``SHARD_MIN``
    elements on even hosts: intra-host direct scatter of L shards on the
    root's host, broadcast of shard j within column j (outer), intra-host
    ring allgather of the shards: every host's L links carry 1/L each.
    Across hosts, both ways: the message (N elements here) reaches each
    other host exactly once, (H-1) N in all with binomial outer.

alltoall (equal blocks only)
    1. intra-host alltoall: local rank j collects, from every rank of its
       host, the blocks meant for local rank j of any host;
    2. inter-host alltoall within column j: one message per host pair and
       column, of L blocks, straight to its destination.
    Local copies regroup the blocks around both phases. Across hosts: each
    block meant for another host crosses once, (H-1) L c per rank as H-1
    messages instead of L (H-1). Uneven hosts: intra-host direct gather of
    every rank's whole input to the leader, alltoall among leaders (one
    message per host pair), intra-host direct scatter. Forwarding a block
    needs its size, and a builder only knows its own rank's counts, so
    unequal counts raise ValueError (the tuner then skips this algorithm;
    ``alltoallv`` does not use it unless forced, and forcing it with counts
    that differ between ranks cannot work: some ranks would go ahead).

gather / scatter (counts known to every rank)
    gather: intra-host gather to the leader (the root on the root's host),
    gather of the host blocks among leaders to the root, which puts them in
    rank order. scatter runs it backwards. Across hosts: each other host's
    data once, in H-1 messages (direct outer) instead of n-L.
"""
from __future__ import annotations

import numpy as np

from ..schedule import Copy, Schedule, copies, embed, offsets, split_counts
from .registry import SHIFT, lookup, register

#: Elements from which an even-host broadcast is cut into one shard per local rank (64 KiB of
#: float32: where the cost model, default link figures, 2 to 4 hosts, finds the two ways even).
SHARD_MIN = 1 << 14
# allreduce cuts a large buffer into up to PIPELINE_CHUNKS chunks of at least PIPELINE_MIN
# elements, so that the inside-host phases of one chunk overlap the inter-host phase of another
PIPELINE_CHUNKS, PIPELINE_MIN = 8, 1 << 20


def groups_of(hosts: list[int]) -> list[list[int]]:
    """Ranks of each host, hosts in order of their first rank."""
    order: dict[int, list[int]] = {}
    for r, h in enumerate(hosts):
        order.setdefault(h, []).append(r)
    return list(order.values())


class _Hosts:
    """What every rank's layout shares: the ranks of each host, and where each rank sits there."""

    def __init__(self, nranks: int, hosts):
        self.source = hosts
        self.groups = groups_of(hosts if hosts is not None else [0] * nranks)
        self.where = {r: (h, i) for h, g in enumerate(self.groups) for i, r in enumerate(g)}
        self.H = len(self.groups)
        L = len(self.groups[0])
        self.even = all(len(g) == L for g in self.groups)
        self.cols = [[g[j] for g in self.groups] for j in range(L)] if self.even else None
        self.host_order = [r for g in self.groups for r in g]
        self.grid = [r for col in self.cols for r in col] if self.even else None   # column by column
        self.leaders = [g[0] for g in self.groups]
        self.rooted = None      # gather/scatter: what _rooted computed for the last counts and root
        self._arrays = None

    def arrays(self):
        """(grid, host_order, 0..n-1) as numpy arrays (even hosts), made once."""
        if self._arrays is None:
            self._arrays = (np.asarray(self.grid, np.int64), np.asarray(self.host_order, np.int64),
                            np.arange(len(self.host_order), dtype=np.int64))
        return self._arrays


#: the last few communicators' shared layouts, by the identity of their hosts list (building every
#: rank's schedule of one call, as the tuner and the simulator do, computes it once, not per rank:
#: that was O(ranks) per rank). A hosts list is not changed once handed to a builder.
_SHARED: dict = {}


def _hosts(nranks: int, hosts) -> _Hosts:
    key = (id(hosts), nranks)
    got = _SHARED.get(key)
    if got is None or got.source is not hosts:
        got = _Hosts(nranks, hosts)
        if len(_SHARED) >= 8:
            _SHARED.pop(next(iter(_SHARED)))
        _SHARED[key] = got
    return got


def host_groups(nranks: int, hosts) -> tuple[list[list[int]], bool, dict[int, tuple[int, int]]]:
    """(the ranks of each host, hosts in order of their first rank; whether every host has as many;
    rank -> (its host's index there, its index on the host)): computed once for every rank of a call
    (shared, read only)."""
    sh = _hosts(nranks, hosts)
    return sh.groups, sh.even, sh.where


class Layout:
    """Where ``rank`` sits: ``groups`` (the ranks of each host), ``host`` (its host's index there),
    ``local`` and ``me`` (its host's ranks, its index among them), H and L (hosts, ranks on its
    host); on even hosts ``cols[j]``: local rank j of every host, in host order. The lists are
    shared by every rank's layout (read only)."""

    def __init__(self, rank: int, nranks: int, hosts):
        sh = _hosts(nranks, hosts)
        self.groups, self.H, self.even, self.cols = sh.groups, sh.H, sh.even, sh.cols
        self.host, self.me = sh.where[rank]
        self.local = self.groups[self.host]
        self.L = len(self.local)
        self.flat = self.H == 1 or self.H == nranks     # one host, or one rank per host
        self.host_order, self.grid, self.leaders = sh.host_order, sh.grid, sh.leaders
        self.shared, self.rooted, self.arrays = sh, sh.rooted, sh.arrays

    @staticmethod
    def sizes(counts: list[int], parts: list[list[int]]) -> list[int]:
        """Elements of each part (a host's ranks, a column)."""
        return [sum(counts[r] for r in part) for part in parts]

    def flat_name(self, inner: str, outer: str) -> str:
        """The algorithm a flat layout runs: ``inner`` on one host, ``outer`` across one-rank hosts."""
        return inner if self.H == 1 else outer


def _build(primitive: str, name: str, rank: int, nranks: int, **args) -> Schedule:
    return lookup(primitive, name).build(rank, nranks, **args)


#: the inner and outer phases built lately, by their builder and arguments: every rank of a column,
#: or every rank with one local index, embeds the same phase (building every rank's schedule of one
#: call, as the tuner and the simulator do, built it again for each). Embedding only reads them.
#: Bounded in entries and in the operations they hold (oldest out first).
_SUBS: dict = {}
_SUBS_MAX, _SUBS_OPS = 1024, 1 << 18
_held = [0]             # operations held by _SUBS


def _sub(primitive: str, name: str, rank: int, nranks: int, **args) -> Schedule:
    """``_build``'s schedule of a phase to embed (maybe shared: never returned as a rank's own schedule)."""
    build = lookup(primitive, name).build
    key = (build, rank, nranks, *((k, tuple(v) if type(v) is list else v) for k, v in sorted(args.items())))
    got = _SUBS.get(key)
    if got is None:
        sched = build(rank, nranks, **args)
        ops = sum(map(len, sched.steps))
        if ops <= _SUBS_OPS // 16:
            try:
                while _SUBS and (len(_SUBS) >= _SUBS_MAX or _held[0] + ops > _SUBS_OPS):
                    _held[0] -= _SUBS.pop(next(iter(_SUBS)))[1]
            except (KeyError, RuntimeError, StopIteration):     # another thread trimmed it meanwhile
                pass
            if not _SUBS:
                _held[0] = 0            # (a count two threads raced on starts over)
            _SUBS[key] = (sched, ops)
            _held[0] += ops
        return sched
    return got[0]


def _move(s: Schedule, size, src: tuple[str, int], src_order: list, dst: tuple[str, int], dst_order: list):
    """One step of local copies: the blocks named in ``src_order``, laid out one after another from
    ``src`` (buffer, offset), go where ``dst_order`` lays them out from ``dst``; ``size(block)`` is a
    block's elements. Blocks adjacent on both sides move as one copy."""
    at = dict(zip(src_order, offsets([size(k) for k in src_order])))
    runs: list[list[int]] = []          # [source offset, destination offset, elements]
    for k, d in zip(dst_order, offsets([size(k) for k in dst_order])):
        a, c = at[k], size(k)
        if runs and runs[-1][0] + runs[-1][2] == a and runs[-1][1] + runs[-1][2] == d:
            runs[-1][2] += c
        else:
            runs.append([a, d, c])
    s.step(*(Copy(src[0], src[1] + a, dst[0], dst[1] + d, c) for a, d, c in runs))


#: the last steps ``_move_equal`` made, by their copies' pattern: on even hosts every rank regroups its
#: blocks the same way (the offsets do not depend on the rank), so every rank's schedule holds the same
#: step (a tuple, read only), made once and, for the tuner, converted to arrays once (``compact``)
_MOVES: dict = {}


def block_runs(src_keys, dst_keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(where each block of ``dst_keys`` is in ``src_keys``, where each run of blocks adjacent on both sides
    starts in ``dst_keys``, the blocks of each run): ``_move_equal``'s copies, one a run."""
    order = np.argsort(src_keys, kind="stable")
    at = np.searchsorted(src_keys, dst_keys, sorter=order)
    pos = order[np.minimum(at, len(order) - 1)]
    if not np.array_equal(src_keys[pos], dst_keys):
        raise KeyError("a block to move is not in the source")
    start = np.concatenate(([0], np.flatnonzero(np.diff(pos) != 1) + 1))
    return pos, start, np.diff(np.append(start, len(dst_keys)))


def _move_equal(s: Schedule, c: int, src: tuple[str, int], src_keys, dst: tuple[str, int], dst_keys) -> None:
    """``_move`` of blocks of ``c`` elements each, named by integer keys (numpy arrays ``src_keys`` and
    ``dst_keys``, each key once): the same copies, found with numpy rather than block by block (the
    hierarchical alltoall moves n blocks a rank twice: at thousands of ranks, most of its build)."""
    if c <= 0 or not len(dst_keys):
        return
    pos, start, blocks = block_runs(src_keys, dst_keys)
    key = (c, src, dst, pos.tobytes())
    step = _MOVES.get(key)
    if step is None:
        step = tuple(copies(src[0], (pos[start] * c + src[1]).tolist(), dst[0], (start * c + dst[1]).tolist(),
                            (blocks * c).tolist()))
        if len(_MOVES) >= 16:
            _MOVES.clear()
        _MOVES[key] = step
    s.steps.append(step)


def _move_ranks(s: Schedule, counts: list[int], src: tuple[str, int], src_order: list[int], dst: tuple[str, int],
                dst_order: list[int]) -> None:
    """``_move`` of the ranks' blocks (``counts[rank]`` elements each): by ``_move_equal`` when every
    block is as large (the tuner's calls), else block by block."""
    if counts and counts.count(counts[0]) == len(counts):
        _move_equal(s, counts[0], src, np.asarray(src_order, np.int64), dst, np.asarray(dst_order, np.int64))
    else:
        _move(s, counts.__getitem__, src, src_order, dst, dst_order)


@register("allreduce", "hierarchical", settles=True, symmetry=SHIFT)
def allreduce(rank: int, nranks: int, count: int, hosts=None, inner: str = "ring",
              outer: str = "ring") -> Schedule:
    t = Layout(rank, nranks, hosts)
    local, L, me = t.local, t.L, t.me
    s = Schedule(rank, nranks)
    s.step(Copy("in", 0, "out", 0, count))
    if t.even:
        cross = t.cols[me]                              # local rank `me` of every host
        chunks = max(1, min(PIPELINE_CHUNKS, count // PIPELINE_MIN)) if len(cross) > 1 and L > 1 else 1
        parts, base = split_counts(count, chunks), 0
        made: dict = {}       # chunks of one size embed the same phases (embed only reads them)
        for c, (off, n) in enumerate(zip(offsets(parts), parts)):
            shards = split_counts(n, L)
            if n not in made:
                made[n] = (lookup("reduce_scatter", inner).build(me, L, counts=shards),
                           lookup("allreduce", outer).build(t.host, len(cross), count=shards[me]),
                           lookup("allgather", inner).build(me, L, counts=shards))
            rs, ar, ag = made[n]
            # this chunk's tmp = [this rank's shard | scratch of whichever phase needs the most]
            tmp = {"tmp": ("tmp", base + shards[0])}
            at = 1 + c * len(ar.steps)        # chunk c+1's phases run one inter-host phase behind c's
            embed(s, rs, local, {"in": ("out", off), "out": ("tmp", base), **tmp}, at=at)
            embed(s, ar, cross, {"in": ("tmp", base), "out": ("tmp", base), **tmp}, at=at + len(rs.steps))
            embed(s, ag, local, {"in": ("tmp", base), "out": ("out", off), **tmp},
                  at=at + len(rs.steps) + len(ar.steps))
            base += shards[0] + max(rs.scratch, ar.scratch, ag.scratch)
        s.scratch = base
        return s
    leaders = t.leaders
    red = _sub("reduce", "binomial", me, L, count=count, root=0)
    s.scratch = red.scratch
    embed(s, red, local, {"in": ("out", 0), "out": ("out", 0), "tmp": ("tmp", 0)})
    if t.me == 0:                                   # a leader
        ar = _sub("allreduce", outer, t.host, len(leaders), count=count)
        s.scratch = max(s.scratch, ar.scratch)
        embed(s, ar, leaders, {"in": ("out", 0), "out": ("out", 0), "tmp": ("tmp", 0)})
    bc = _sub("broadcast", "binomial", me, L, count=count, root=0)
    embed(s, bc, local, {"out": ("out", 0)})
    return s


@register("allgather", "hierarchical", settles=True, symmetry=SHIFT)
def allgather(rank: int, nranks: int, counts: list[int], hosts=None, inner: str = "ring",
              outer: str = "ring") -> Schedule:
    t = Layout(rank, nranks, hosts)
    if t.flat:
        return _build("allgather", t.flat_name(inner, outer), rank, nranks, counts=counts)
    ranks = list(range(nranks))
    s = Schedule(rank, nranks)
    if t.even:
        # "grid": every block, column by column (column j: local rank j of host 0, of host 1, ...)
        grid, col_size = t.grid, t.sizes(counts, t.cols)
        col_off = offsets(col_size)[t.me]
        cross = _sub("allgather", outer, t.host, t.H, counts=[counts[r] for r in t.cols[t.me]])
        intra = _sub("allgather", inner, t.me, t.L, counts=col_size)
        gbuf, gsize = (("out", 0), 0) if grid == ranks else (("tmp", 0), sum(counts))
        s.scratch = gsize + max(cross.scratch, intra.scratch)
        embed(s, cross, t.cols[t.me], {"in": ("in", 0), "out": (gbuf[0], col_off), "tmp": ("tmp", gsize)})
        embed(s, intra, t.local, {"in": (gbuf[0], col_off), "out": gbuf, "tmp": ("tmp", gsize)})
        if gbuf[0] != "out":
            _move_ranks(s, counts, gbuf, grid, ("out", 0), ranks)
        return s
    # uneven: the host's first rank (its leader) gathers the host's blocks, leaders allgather, broadcast
    leaders, host_order, host_size = t.leaders, t.host_order, t.sizes(counts, t.groups)
    hoff = offsets(host_size)[t.host]
    to_leader = _sub("gather", "direct", t.me, t.L, counts=[counts[r] for r in t.local], root=0)
    hbuf, hsize = (("out", 0), 0) if host_order == ranks else (("tmp", 0), sum(counts))
    embed(s, to_leader, t.local, {"in": ("in", 0), "out": (hbuf[0], hoff)})
    if rank in leaders:
        cross = _sub("allgather", outer, t.host, t.H, counts=host_size)
        s.scratch = hsize + cross.scratch
        embed(s, cross, leaders, {"in": (hbuf[0], hoff), "out": hbuf, "tmp": ("tmp", hsize)})
        if hbuf[0] != "out":
            _move_ranks(s, counts, hbuf, host_order, ("out", 0), ranks)
    from_leader = _sub("broadcast", "binomial", t.me, t.L, count=sum(counts), root=0)
    embed(s, from_leader, t.local, {"out": ("out", 0)})
    return s


@register("reduce_scatter", "hierarchical", settles=True, symmetry=SHIFT)
def reduce_scatter(rank: int, nranks: int, counts: list[int], hosts=None, inner: str = "ring",
                   outer: str = "ring") -> Schedule:
    t = Layout(rank, nranks, hosts)
    if t.flat:
        return _build("reduce_scatter", t.flat_name(inner, outer), rank, nranks, counts=counts)
    ranks, total = list(range(nranks)), sum(counts)
    s = Schedule(rank, nranks)
    if t.even:
        grid, col_size = t.grid, t.sizes(counts, t.cols)         # the input's blocks, column by column
        intra = _sub("reduce_scatter", inner, t.me, t.L, counts=col_size)
        cross = _sub("reduce_scatter", outer, t.host, t.H, counts=[counts[r] for r in t.cols[t.me]])
        # tmp = [input in column order, unless it already is | my column's host sum | scratch]
        gbuf, gsize = (("in", 0), 0) if grid == ranks else (("tmp", 0), total)
        mine = gsize + col_size[t.me]
        s.scratch = mine + max(intra.scratch, cross.scratch)
        if gbuf[0] != "in":
            _move_ranks(s, counts, ("in", 0), ranks, gbuf, grid)
        embed(s, intra, t.local, {"in": gbuf, "out": ("tmp", gsize), "tmp": ("tmp", mine)})
        embed(s, cross, t.cols[t.me], {"in": ("tmp", gsize), "out": ("out", 0), "tmp": ("tmp", mine)})
        return s
    # uneven: reduce the whole input to each host's leader, leaders reduce-scatter host blocks, scatter
    leaders, host_order, host_size = t.leaders, t.host_order, t.sizes(counts, t.groups)
    lead = rank in leaders
    # tmp = [input in host order, unless it already is | leader: host-reduced input | leader: host block]
    hbuf, hsize = (("in", 0), 0) if host_order == ranks else (("tmp", 0), total)
    red_at = hsize
    blk_at = red_at + (total if lead else 0)
    free = blk_at + (host_size[t.host] if lead else 0)
    if hbuf[0] != "in":
        _move_ranks(s, counts, ("in", 0), ranks, hbuf, host_order)
    to_leader = _sub("reduce", "binomial", t.me, t.L, count=total, root=0)
    embed(s, to_leader, t.local, {"in": hbuf, "out": ("tmp", red_at), "tmp": ("tmp", free)})
    s.scratch = free + to_leader.scratch
    if lead:
        cross = _sub("reduce_scatter", outer, t.host, t.H, counts=host_size)
        s.scratch = max(s.scratch, free + cross.scratch)
        embed(s, cross, leaders, {"in": ("tmp", red_at), "out": ("tmp", blk_at), "tmp": ("tmp", free)})
    from_leader = _sub("scatter", "direct", t.me, t.L, counts=[counts[r] for r in t.local], root=0)
    embed(s, from_leader, t.local, {"in": ("tmp", blk_at), "out": ("out", 0)})
    return s


@register("broadcast", "hierarchical")
def broadcast(rank: int, nranks: int, count: int, root: int, hosts=None, inner: str = "binomial",
              outer: str = "binomial") -> Schedule:
    t = Layout(rank, nranks, hosts)
    if t.flat:
        return _build("broadcast", t.flat_name(inner, outer), rank, nranks, count=count, root=root)
    root_host = next(h for h, g in enumerate(t.groups) if root in g)
    s = Schedule(rank, nranks)
    if t.even and count >= SHARD_MIN:
        # scatter L shards on the root's host, each column broadcasts its shard, allgather inside hosts
        shards = split_counts(count, t.L)
        off = offsets(shards)
        if t.host == root_host:
            deal = _sub("scatter", "direct", t.me, t.L, counts=shards, root=t.local.index(root))
            embed(s, deal, t.local, {"in": ("out", 0), "out": ("out", off[t.me])})
        cross = _sub("broadcast", outer, t.host, t.H, count=shards[t.me], root=root_host)
        embed(s, cross, t.cols[t.me], {"out": ("out", off[t.me])})
        share = _sub("allgather", "ring", t.me, t.L, counts=shards)
        embed(s, share, t.local, {"in": ("out", off[t.me]), "out": ("out", 0)})
        return s
    leaders = [root if h == root_host else g[0] for h, g in enumerate(t.groups)]
    if rank in leaders:
        cross = _sub("broadcast", outer, t.host, t.H, count=count, root=root_host)
        embed(s, cross, leaders, {"out": ("out", 0)})
    intra = _sub("broadcast", inner, t.me, t.L, count=count, root=t.local.index(leaders[t.host]))
    embed(s, intra, t.local, {"out": ("out", 0)})
    return s


@register("alltoall", "hierarchical", equal_blocks=True, symmetry=SHIFT)
def alltoall(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int], hosts=None,
             inner: str = "pairwise", outer: str = "pairwise") -> Schedule:
    """Equal blocks only: ValueError otherwise (see the module docstring)."""
    t = Layout(rank, nranks, hosts)
    if t.flat:
        return _build("alltoall", t.flat_name(inner, outer), rank, nranks, send_counts=send_counts,
                      recv_counts=recv_counts)
    if len(set(send_counts)) > 1 or send_counts != recv_counts:
        raise ValueError("hierarchical alltoall needs equal block sizes")
    c, n, H = send_counts[0], nranks, t.H
    size = lambda block: c                      # noqa: E731  (a block is a (source, destination) pair)
    s = Schedule(rank, nranks)
    if t.even:
        L, me = t.L, t.me
        # A: my blocks by destination local rank j, then host; B: what local rank i sent me (for
        # local rank `me` of each host); C: B by destination host; D: what column `me` sent me
        # blocks as integers (source rank * n + destination rank): the same moves as the pairs, in numpy
        grid, host_order, ar = t.arrays()
        local, col = np.asarray(t.local, np.int64), np.asarray(t.cols[me], np.int64)
        A = rank * n + grid
        B = (local[:, None] * n + col[None, :]).ravel()
        C = (local[None, :] * n + col[:, None]).ravel()
        D = host_order * n + rank
        intra = _sub("alltoall", inner, me, L, send_counts=[H * c] * L, recv_counts=[H * c] * L)
        cross = _sub("alltoall", outer, t.host, H, send_counts=[L * c] * H, recv_counts=[L * c] * H)
        X, Y = ("tmp", 0), ("tmp", n * c)       # two regions of n blocks, used in turn
        s.scratch = 2 * n * c + max(intra.scratch, cross.scratch)
        sub_tmp = ("tmp", 2 * n * c)
        a_buf = ("in", 0) if np.array_equal(grid, ar) else X
        d_buf = ("out", 0) if np.array_equal(host_order, ar) else Y
        if a_buf != ("in", 0):
            _move_equal(s, c, ("in", 0), rank * n + ar, X, A)
        embed(s, intra, t.local, {"in": a_buf, "out": Y, "tmp": sub_tmp})
        _move_equal(s, c, Y, B, X, C)
        embed(s, cross, t.cols[me], {"in": X, "out": d_buf, "tmp": sub_tmp})
        if d_buf != ("out", 0):
            _move_equal(s, c, Y, D, ("out", 0), ar * n + rank)
        return s
    # uneven: the leader gathers its host's inputs, leaders exchange one message per host pair, scatter
    leaders = [gr[0] for gr in t.groups]
    L, loc = t.L, t.local
    G = [(loc[i], d) for i in range(L) for d in range(n)]                             # gathered inputs
    X = [(loc[i], q) for gr in t.groups for q in gr for i in range(L)]                 # by destination host
    R = [(p, loc[j]) for gr in t.groups for j in range(L) for p in gr]                 # from each host
    S = [(p, loc[j]) for j in range(L) for p in range(n)]                              # by destination rank
    to_leader = _sub("gather", "direct", t.me, L, counts=[n * c] * L, root=0)
    from_leader = _sub("scatter", "direct", t.me, L, counts=[n * c] * L, root=0)
    sizes = [L * len(gr) * c for gr in t.groups]          # between my host's leader and each other
    cross = _sub("alltoall", outer, t.host, H, send_counts=sizes, recv_counts=sizes)
    P, Q = ("tmp", 0), ("tmp", L * n * c)      # the leader's two regions of L n blocks
    if rank in leaders:
        s.scratch = 2 * L * n * c + cross.scratch
        embed(s, to_leader, loc, {"in": ("in", 0), "out": P})
        _move(s, size, P, G, Q, X)
        embed(s, cross, leaders, {"in": Q, "out": P, "tmp": ("tmp", 2 * L * n * c)})
        _move(s, size, P, R, Q, S)
        embed(s, from_leader, loc, {"in": Q, "out": ("out", 0)})
    else:
        embed(s, to_leader, loc, {"in": ("in", 0)})
        embed(s, from_leader, loc, {"out": ("out", 0)})
    return s


def _rooted(t, counts: list[int], root: int, nranks: int):
    """gather/scatter through one rank per host: all ranks, the root's host, each host's leader (the
    root on its own host), the ranks in host order, and the elements of each host."""
    # the same for every rank of the call: computed once (O(ranks) each), kept while counts and root stay
    got = t.rooted
    if got is None or got[0] is not counts or got[2] != root or got[1] != counts:
        root_host = next(h for h, g in enumerate(t.groups) if root in g)
        leaders = [root if h == root_host else g[0] for h, g in enumerate(t.groups)]
        got = (counts, list(counts), root, (list(range(nranks)), root_host, leaders, t.host_order,
                                            t.sizes(counts, t.groups)))
        t.shared.rooted = got
    return got[3]


@register("gather", "hierarchical")
def gather(rank: int, nranks: int, counts: list[int], root: int, hosts=None, inner: str = "direct",
           outer: str = "direct") -> Schedule:
    t = Layout(rank, nranks, hosts)
    if t.flat:
        return _build("gather", t.flat_name(inner, outer), rank, nranks, counts=counts, root=root)
    ranks, root_host, leaders, host_order, host_size = _rooted(t, counts, root, nranks)
    # where the leaders collect: the root, every block in host order ("out" when that is rank
    # order); the other leaders, their host's block
    if rank == root:
        whole, free = (("out", 0), 0) if host_order == ranks else (("tmp", 0), sum(counts))
        block = (whole[0], offsets(host_size)[t.host])
    else:                                       # ("out" of a rank other than the root: never touched)
        whole, block, free = ("out", 0), ("tmp", 0), host_size[t.host] if rank in leaders else 0
    s = Schedule(rank, nranks)
    intra = _sub("gather", inner, t.me, t.L, counts=[counts[r] for r in t.local],
                   root=t.local.index(leaders[t.host]))
    s.scratch = free + intra.scratch
    embed(s, intra, t.local, {"in": ("in", 0), "out": block, "tmp": ("tmp", free)})
    if rank in leaders:
        cross = _sub("gather", outer, t.host, t.H, counts=host_size, root=root_host)
        s.scratch = max(s.scratch, free + cross.scratch)
        embed(s, cross, leaders, {"in": block, "out": whole, "tmp": ("tmp", free)})
    if rank == root and whole[0] != "out":
        _move_ranks(s, counts, whole, host_order, ("out", 0), ranks)
    return s


@register("scatter", "hierarchical")
def scatter(rank: int, nranks: int, counts: list[int], root: int, hosts=None, inner: str = "direct",
            outer: str = "direct") -> Schedule:
    t = Layout(rank, nranks, hosts)
    if t.flat:
        return _build("scatter", t.flat_name(inner, outer), rank, nranks, counts=counts, root=root)
    ranks, root_host, leaders, host_order, host_size = _rooted(t, counts, root, nranks)
    # tmp = [root: the input in host order, unless it already is | leaders: their host's block | scratch]
    whole, whole_size = ("in", 0), 0
    if rank == root and host_order != ranks:
        whole, whole_size = ("tmp", 0), sum(counts)
    block = ("tmp", whole_size)
    free = whole_size + (host_size[t.host] if rank in leaders else 0)
    s = Schedule(rank, nranks)
    if whole[0] == "tmp":
        _move_ranks(s, counts, ("in", 0), ranks, whole, host_order)
    if rank in leaders:
        cross = _sub("scatter", outer, t.host, t.H, counts=host_size, root=root_host)
        s.scratch = free + cross.scratch
        embed(s, cross, leaders, {"in": whole, "out": block, "tmp": ("tmp", free)})
    intra = _sub("scatter", inner, t.me, t.L, counts=[counts[r] for r in t.local],
                   root=t.local.index(leaders[t.host]))
    s.scratch = max(s.scratch, free + intra.scratch)
    embed(s, intra, t.local, {"in": block, "out": ("out", 0), "tmp": ("tmp", free)})
    return s
