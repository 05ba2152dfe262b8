"""Some ranks' schedules of the algorithms that fold (rings, direct and pairwise exchanges, the hierarchical
layouts, the 2D torus) as the C core's arrays (``compact.py``), made in numpy rather than built as Python
objects.

The tuner walks host 0's ranks of an algorithm that folds (``symmetric.py``) and checks its declared move
on a few other ranks; these algorithms hold O(ranks) operations a rank, so at thousands of ranks
building those schedules and converting them was most of pricing a size (issue 26: host 0's 8 ranks of
the ring allreduce on 4,096 ranks, 65k steps, 60 ms built and 25 ms converted, against 26 ms walked).

This is a second implementation of the builders it covers: the ring allreduce, allgather and reduce-scatter
(``algorithms/ring.py``), the direct allreduce and the reduce-then-broadcast one (``algorithms/trees.py``:
their bounds read rank 0's schedule, O(ranks) operations, and a spot's), the direct allgather, reduce-scatter
and alltoall and the pairwise alltoall (``algorithms/direct.py``), the ring phases of van de Geijn's broadcast
and Rabenseifner's reduce (``algorithms/pipeline.py``, priced apart: ``select._phase_estimate``) and that
reduce whole (for its bound), the hierarchical allreduce, alltoall, allgather and reduce-scatter on even hosts
of equal blocks (``algorithms/hierarchical.py``: each embedded phase is its flat algorithm's arrays, peers
mapped through the group and steps moved, as ``schedule.embed`` does) and the 2D-torus allreduce
(``algorithms/torus.py``); where a call is not covered (uneven hosts, blocks of different sizes) it declines
and the builders run. :func:`arrays` gives, bit for bit, what ``compact.convert([the ranks' schedules],
written=True)`` gives (``tests/test_tuner_shifted.py`` compares them over many layouts and sizes, empty blocks
included). Like ``rooted.py``'s, the arrays hold only what the walk reads.
"""
from __future__ import annotations

import numpy as np

from ..algorithms import bcube, hierarchical, torus
from ..algorithms.registry import lookup
from ..schedule import split_counts
from .compact import COPY, RECV, SEND, Compact, convert, prefix_sums
from .rooted import Ops, around, to_root

#: bytes of the call's buffers ("in", "out", "tmp": ``cost.CALL_BUFFERS``) a copy touches per byte: a plain
#: copy's source and destination; a reducing copy's destination twice (read and written)
_PLAIN, _REDUCING = 2, 3


def _offsets(counts) -> tuple[np.ndarray, np.ndarray]:
    """(``counts`` as int64, their prefix sums)."""
    c = np.asarray(counts, np.int64)
    return c, prefix_sums(c)


def _ring_allreduce(ops: Ops, r, count: int) -> None:
    """ring.allreduce: the copy in place (left out in place), the reduce-scatter that leaves chunk r + 1 on
    rank r, the allgather from it."""
    n = ops.n
    pieces = np.asarray(split_counts(count, n), np.int64)
    ops.add(r, 0, COPY, 0, count, touch=_PLAIN, skip=True)
    around(ops, r, 1, pieces, 0, -1, red=1)
    around(ops, r, n, pieces, 1, 0)


def _ring_allgather(ops: Ops, r, counts) -> None:
    c, off = _offsets(counts)
    ops.add(r, 0, COPY, 0, c[r], touch=_PLAIN, skip=off[r] == 0)
    around(ops, r, 1, c, 0, -1)


def _ring_reduce_scatter(ops: Ops, r, counts) -> None:
    """ring.reduce_scatter: the input copied to "tmp", the reduce-scatter that leaves chunk r on rank r,
    copied out."""
    n = ops.n
    c, off = _offsets(counts)
    ops.add(r, 0, COPY, 0, off[-1], touch=_PLAIN)
    around(ops, r, 1, c, -1, -2, red=1)
    ops.add(r, n, COPY, 0, c[r], touch=_PLAIN)


def _reduce_broadcast(ops: Ops, r, count: int) -> None:
    """trees.allreduce_master: every vector to rank 0, which receives them into "tmp" beside its own, reduces
    them into "out" in rank order and sends the result back (priced by its local bound, from rank 0's)."""
    n = ops.n
    others = r[r != 0]
    ops.add(others, 0, SEND, 0, count)
    ops.add(others, 1, RECV, 0, count)
    if len(r) and r[0] == 0:
        peers, root = np.arange(1, n, dtype=np.int64), np.zeros(n - 1, np.int64)
        ops.add([0], 0, COPY, 0, count, touch=_PLAIN)
        ops.add(root, 0, RECV, peers, count)
        ops.add([0], 1, COPY, 0, count, touch=_PLAIN)
        ops.add(root, 1, COPY, 0, count, red=1, touch=_REDUCING)
        ops.add(root, 2, SEND, peers, count)


def _direct_allreduce(ops: Ops, r, count: int) -> None:
    """trees.allreduce_direct: the copy in place, then chunk q of the vector to rank q and every rank's chunk r
    received into "tmp" (peers in rank order), reduced into "out" in rank order, sent to everyone."""
    n = ops.n
    pieces = np.asarray(split_counts(count, n), np.int64)
    mine = pieces[r]
    rank = np.repeat(r, n - 1)
    k = np.tile(np.arange(n - 1, dtype=np.int64), len(r))
    peer = k + (k >= rank)                  # the others, in rank order
    ops.add(r, 0, COPY, 0, count, touch=_PLAIN, skip=True)
    ops.add(r, 1, COPY, 0, mine, touch=_PLAIN)
    ops.add(rank, 1, SEND, peer, pieces[peer])
    ops.add(rank, 1, RECV, peer, pieces[rank])
    ops.add(r, 2, COPY, 0, mine, touch=_PLAIN)
    ops.add(rank, 2, COPY, 0, pieces[rank], red=1, touch=_REDUCING)
    ops.add(rank, 3, SEND, peer, pieces[rank])
    ops.add(rank, 3, RECV, peer, pieces[peer])


def _bcube_allreduce(ops: Ops, r, count: int) -> None:
    """bcube.allreduce: the copy in place; for each dimension, the direct reduce-scatter of the region among
    the b ranks that differ only in that digit (sends of every other part, receives of one's own into "tmp",
    then one's own part copied beside them and reduced in group order); then the dimensions back, allgathers.
    (Each kind of operation of every dimension added at once: a step's operations stay in the order added.)"""
    b, k = bcube.base_of(ops.n)
    ops.add(r, 0, COPY, 0, count, touch=_PLAIN, skip=True)
    if k == 0:
        return
    m = len(r)
    strides = b ** np.arange(k, dtype=np.int64)
    digit = r[None, :] // strides[:, None] % b                # (dimension, rank)
    size = np.empty((k + 1, m), np.int64)                       # each rank's region before each dimension
    size[0] = count
    for dim in range(k):                                        # (split_counts: the first parts one larger)
        size[dim + 1] = size[dim] // b + (digit[dim] < size[dim] % b)
    j = np.arange(b, dtype=np.int64)
    parts = size[:-1, :, None] // b + (j < size[:-1, :, None] % b)         # (dimension, rank, part)
    others = j != digit[:, :, None]                 # the group in order, rank by rank: the mask's order
    peer = (r[None, :, None] + (j - digit[:, :, None]) * strides[:, None, None])[others]
    their, own = parts[others], size[1:].ravel()
    rank, rank_b = np.tile(r, k), np.tile(np.repeat(r, b - 1), k)
    step = np.repeat(1 + 3 * np.arange(k, dtype=np.int64), m)
    step_b = np.repeat(step, b - 1)
    own_b = np.repeat(own, b - 1)
    ops.add(rank_b, step_b, SEND, peer, their)
    ops.add(rank_b, step_b, RECV, peer, own_b)
    ops.add(rank, step + 1, COPY, 0, own, touch=_PLAIN)
    ops.add(rank, step + 2, COPY, 0, own, touch=_PLAIN)
    ops.add(rank_b, step_b + 2, COPY, 0, own_b, red=1, touch=_REDUCING)
    back = 1 + 3 * k + (k - 1) - (step_b - 1) // 3      # dimension d's allgather: step 1 + 3k + (k - 1 - d)
    ops.add(rank_b, back, SEND, peer, own_b)
    ops.add(rank_b, back, RECV, peer, their)


def _exchange(ops: Ops, r, step, sends, recvs) -> None:
    """One step's messages of a direct exchange: to r + 1, r + 2, ..., then from r - 1, r - 2, ...
    (``sends(rank, peer)``, ``recvs(rank, peer)``: their counts)."""
    n = ops.n
    rank = np.repeat(r, n - 1)
    k = np.tile(np.arange(1, n, dtype=np.int64), len(r))
    to, frm = (rank + k) % n, (rank - k) % n
    ops.add(rank, step, SEND, to, sends(rank, to))
    ops.add(rank, step, RECV, frm, recvs(rank, frm))


def _direct_allgather(ops: Ops, r, counts) -> None:
    c, off = _offsets(counts)
    ops.add(r, 0, COPY, 0, c[r], touch=_PLAIN, skip=off[r] == 0)
    _exchange(ops, r, 0, lambda rank, to: c[rank], lambda rank, frm: c[frm])


def _direct_reduce_scatter(ops: Ops, r, counts) -> None:
    """direct.reduce_scatter: block q of the input to rank q, the n - 1 received into "tmp", then reduced into
    "out" in rank order."""
    n = ops.n
    c, _ = _offsets(counts)
    mine = c[r]
    ops.add(r, 0, COPY, 0, mine, touch=_PLAIN)
    _exchange(ops, r, 0, lambda rank, to: c[to], lambda rank, frm: c[rank])
    ops.add(r, 1, COPY, 0, mine, touch=_PLAIN)
    ops.add(np.repeat(r, n - 1), 1, COPY, 0, np.repeat(mine, n - 1), red=1, touch=_REDUCING)


def _alltoall_copy(ops: Ops, r, send_counts, recv_counts):
    sc, soff = _offsets(send_counts)
    rc, roff = _offsets(recv_counts)
    ops.add(r, 0, COPY, 0, sc[r], touch=_PLAIN, skip=soff[r] == roff[r])
    return sc, rc


def _direct_alltoall(ops: Ops, r, send_counts, recv_counts) -> None:
    sc, rc = _alltoall_copy(ops, r, send_counts, recv_counts)
    _exchange(ops, r, 0, lambda rank, to: sc[to], lambda rank, frm: rc[frm])


def _pairwise_alltoall(ops: Ops, r, send_counts, recv_counts) -> None:
    """direct.alltoall: in step k, to r + k and from r - k (blocks of one size: one step, run n - 1 times, its
    peers moving by one each run)."""
    n = ops.n
    sc, rc = _alltoall_copy(ops, r, send_counts, recv_counts)
    if n > 1 and (sc == sc[0]).all() and (rc == rc[0]).all():
        ops.add(r, 1, SEND, (r + 1) % n, sc[0], rep=n - 1, stride=1)
        ops.add(r, 1, RECV, (r - 1) % n, rc[0], rep=n - 1, stride=-1)
        return
    rank = np.repeat(r, n - 1)
    k = np.tile(np.arange(1, n, dtype=np.int64), len(r))
    to, frm = (rank + k) % n, (rank - k) % n
    ops.add(rank, k, SEND, to, sc[to])
    ops.add(rank, k, RECV, frm, rc[frm])


def _sag_ring_phase(ops: Ops, r, count: int, root: int) -> None:
    """pipeline.ring_phase: the ring allgather of the pieces, rank r holding piece r - root."""
    pieces = np.asarray(split_counts(count, ops.n), np.int64)
    around(ops, r, 0, pieces, -root, -root - 1)


def _rsg_ring_phase(ops: Ops, r, count: int, root: int) -> np.ndarray:
    """pipeline.reduce_scatter_phase_of: the input copied to "tmp", the reduce-scatter that leaves piece r on
    rank r (the pieces returned)."""
    pieces = np.asarray(split_counts(count, ops.n), np.int64)
    ops.add(r, 0, COPY, 0, int(pieces.sum()), touch=_PLAIN)
    around(ops, r, 1, pieces, -1, -2, red=1)
    return pieces


def _reduce_scatter_gather(ops: Ops, r, count: int, root: int) -> None:
    """pipeline.reduce_rs_gather: its ring phase, then every piece to the root (priced by phases: this is
    for its local bound, which reads rank 0's schedule)."""
    to_root(ops, r, _rsg_ring_phase(ops, r, count, root), root, ops.n)


#: the phases made lately (``_phase``): every rank of a host, and every call of one pricing, embeds the same
_PHASES: dict = {}


def _kept(key, make) -> Compact:
    """``_PHASES[key]``, made by ``make()`` the first time (read only)."""
    got = _PHASES.get(key)
    if got is None:
        if len(_PHASES) >= 256:
            _PHASES.clear()
        got = _PHASES[key] = make()
    return got


#: flat algorithms whose steps alike are held once (``Ops.add``'s ``rep``, ``stride``): every rank's arrays of a
#: phase across the hosts are O(hosts), made at once for the spots on other hosts too (a direct exchange's are
#: O(hosts^2): made for the hosts asked only)
_RUNS_HELD = ("ring", "pairwise")


def _phase(prim: str, name: str, rank: int, nranks: int, every: bool = False, **args) -> Compact:
    """A phase's arrays (one rank's schedule of a flat algorithm): made here where covered, else built and
    converted; kept (read only) for the next rank or call that embeds it. ``every``: every rank's made at
    once the first time (a phase inside a host: each of its ranks embeds it)."""
    key = (prim, name, nranks, *((k, tuple(v) if type(v) is list else v) for k, v in sorted(args.items())))
    if every and covers(prim, name):
        return _one_of(key, rank, lambda: arrays(prim, name, range(nranks), nranks, args))
    return _kept((*key, rank), lambda: arrays(prim, name, (rank,), nranks, args) if covers(prim, name) else
                 convert([lookup(prim, name).build(rank, nranks, **args)], written=True))


def _one_of(key, rank: int, make) -> Compact:
    """Rank ``rank``'s arrays of the phase ``key`` whose every rank ``make()`` makes (once, kept)."""
    whole = _kept(key, make)
    return _kept((*key, rank), lambda: whole.take(rank, rank + 1))


def _span(sub: Compact) -> int:
    """The steps of a phase (one rank's arrays), a repeated step counted as often as it runs."""
    return len(sub.step_start) - 1 if sub.rep is None else int(sub.rep.sum())


def _mapped(sub: Compact, group: np.ndarray, n: int) -> tuple:
    """``schedule.embed(into, sub, group, bufs)``'s operations, as columns (step in ``sub``, kind, peer, count,
    reduce flag, touch, repeats, strides), for a phase whose buffers are mapped onto "out" and "tmp" (none onto
    "in": no copy of it is one an in-place call leaves out), in a call of ``n`` ranks. A peer that moves by a
    stride each run moves by that many group steps where the group is every d-th rank of all n (a column
    of hosts alike), and is written out elsewhere (a host's own ranks: a few steps)."""
    m = len(group)
    d = int(group[1] - group[0]) % n if m > 1 else 0
    moves = sub.stride is not None and d * m == n and np.array_equal(group, (group[0] + d * np.arange(m)) % n)
    steps, copy, reps, strides, sub = _unmapped(sub, sub.times is not None or (sub.stride is not None and not moves))
    return (steps, sub.kind, np.where(copy, 0, group[sub.peer]), sub.count, sub.red, sub.touch, reps,
            strides * d if moves else strides)


#: ``_unmapped``'s columns of the phases lately embedded, by the identity of their arrays (kept with them)
_UNMAPPED: dict = {}


def _unmapped(sub: Compact, expand: bool) -> tuple:
    """(each op's step in ``sub``, whether it is a copy, its repeats, its strides, the arrays they are of) of
    ``sub``, or of ``sub.expanded()`` where ``expand``: what ``_mapped`` gives whatever the group, made once a
    phase (every rank of a host, and every call of one pricing, embeds the same phases)."""
    key = (id(sub), expand)
    got = _UNMAPPED.get(key)
    if got is None or got[-1] is not sub:
        if len(_UNMAPPED) >= 256:
            _UNMAPPED.clear()
        whole = sub.expanded() if expand else sub
        steps = np.repeat(_offsets(whole.reps())[1][:-1], np.diff(whole.step_start))
        got = _UNMAPPED[key] = (steps, whole.kind == COPY, whole.op_reps(), whole.strides(), whole, sub)
    return got[:-1]


class _Embedded:
    """The phases embedded in some ranks' schedules (``_mapped``'s columns), added to ``ops`` at once
    (``added``): an ``Ops.add`` a phase of a rank was most of making a few ranks' arrays. A rank's steps of
    a phase hold nothing else (``_in_turn``), so the order added within a step is kept."""

    def __init__(self, ops: Ops):
        self.ops, self.cols = ops, []

    def add(self, rank: int, step: int, cols: tuple) -> None:
        self.cols.append((np.full(len(cols[0]), rank), step + cols[0], *cols[1:]))

    def added(self) -> None:
        if self.cols:
            c = [np.concatenate(x) for x in zip(*self.cols)]
            self.ops.add(c[0], c[1], *c[2:7], rep=c[7], stride=c[8])


def _chunk(ar: Compact, phases, n: int) -> tuple:
    """(the outer allreduce's span, the columns of a hierarchical allreduce's chunk: its ``phases``, each an
    (arrays, group) embedded with ``_mapped``, one after another from step 0)."""
    placed, at = [], 0
    for sub, group in phases:
        cols = _mapped(sub, group, n)
        placed.append((cols[0] + at, *cols[1:]))
        at += _span(sub)
    return _span(ar), [np.concatenate(x) for x in zip(*placed)]


def _hierarchical_allreduce(ops: Ops, r, count: int, hosts=None, inner: str = "ring", outer: str = "ring"):
    """hierarchical.allreduce on even hosts (else False: declined): the copy in place, then its pipeline of
    chunks, each an inner reduce-scatter, an outer allreduce across its column and an inner allgather, chunk
    c + 1's phases one outer allreduce behind c's (``embed``'s ``at``: a phase's step k joins step at + k)."""
    n = ops.n
    ops.add(r, 0, COPY, 0, count, touch=_PLAIN, skip=True)
    into = _Embedded(ops)
    for rank in r.tolist():
        t = hierarchical.Layout(rank, n, hosts)
        if not t.even:
            return False
        local, cross, me, L = np.asarray(t.local, np.int64), np.asarray(t.cols[t.me], np.int64), t.me, t.L
        chunks = (max(1, min(hierarchical.PIPELINE_CHUNKS, count // hierarchical.PIPELINE_MIN))
                  if len(cross) > 1 and L > 1 else 1)
        parts = split_counts(count, chunks)
        placed, phases = [], {}
        for c0 in range(chunks):
            if c0 and parts[c0] == parts[c0 - 1]:
                continue
            c1 = next((c for c in range(c0, chunks) if parts[c] != parts[c0]), chunks)    # a run of one size
            got = phases.get(parts[c0])          # (the chunks are of at most two sizes)
            if got is None:
                shards = split_counts(parts[c0], L)
                ar = _phase("allreduce", outer, t.host, len(cross), outer in _RUNS_HELD, count=shards[me])
                got = phases[parts[c0]] = _chunk(ar, ((_phase("reduce_scatter", inner, me, L, True, counts=shards), local),
                                                      (ar, cross), (_phase("allgather", inner, me, L, True, counts=shards), local)), n)
            span, cols = got
            # chunk c's phases from step 1 + c * span: the chunk's columns, once a chunk of the run
            at = 1 + np.arange(c0, c1, dtype=np.int64) * span
            idx = np.tile(np.arange(len(cols[0])), c1 - c0)
            placed.append(((cols[0][None, :] + at[:, None]).ravel(), *(x[idx] for x in cols[1:])))
        cols = [np.concatenate(x) for x in zip(*placed)] if len(placed) > 1 else placed[0]
        into.add(rank, 0, cols)
    into.added()
    return None


def _in_turn(into: _Embedded, rank: int, parts, step: int = 0) -> None:
    """``rank``'s steps from ``step`` on, one part after another: a step of copies (their counts;
    ``_move_equal``'s, none of "in" onto "out"), a phase embedded (its arrays, its group: ``_mapped``), or
    None (nothing)."""
    ops = into.ops
    for part in parts:
        if type(part) is np.ndarray:
            if len(part) > 1 and (part == part[0]).all():     # alike copies: one, made that many times
                ops.add([rank], step, COPY, 0, part[0], touch=_PLAIN, times=len(part))
            else:
                ops.add(np.full(len(part), rank), step, COPY, 0, part, touch=_PLAIN)
            step += 1
        elif part is not None:
            into.add(rank, step, _mapped(*part, ops.n))
            step += _span(part[0])


def _even_layouts(n: int, ranks, hosts, *blocks):
    """The ranks' ``hierarchical.Layout``s where the hierarchical builders run their even hosts' phases on
    blocks of one size (``blocks``: the call's lists of blocks), else None."""
    if any(len(set(b)) > 1 for b in blocks) or any(b != blocks[0] for b in blocks):
        return None
    out = [hierarchical.Layout(rank, n, hosts) for rank in ranks]
    return None if any(t.flat or not t.even for t in out) else out


#: the regroupings' copies of the hierarchical layouts lately priced (``_runs``), by their shared lists' identity
_RUNS: dict = {}


def _runs(t: hierarchical.Layout, what: str, moves, c: int) -> list:
    """A hierarchical ``what``'s regroupings' copies of blocks of ``c`` elements on layout ``t``: for each of the
    moves (``moves()``: (source keys, destination keys) of each, or None where it does not move) the counts
    of its copies, one a run of blocks (``hierarchical.block_runs``), or None. The same on every rank (the
    keys are moved by the rank): found once a layout."""
    key = (id(t.shared), what)
    got = _RUNS.get(key)
    if got is None or got[0] is not t.shared:
        if len(_RUNS) >= 64:
            _RUNS.clear()
        got = _RUNS[key] = (t.shared, [None if m is None else hierarchical.block_runs(*m)[2] for m in moves()])
    return [None if b is None or c <= 0 else b * c for b in got[1]]


def _alltoall_moves(t: hierarchical.Layout, rank: int, n: int) -> tuple:
    """The hierarchical alltoall's regroupings on ``rank``: by destination local rank (unless the input is so
    already), by destination host, into rank order (unless already so)."""
    grid, host_order, ar = t.arrays()
    local, col = np.asarray(t.local, np.int64), np.asarray(t.cols[t.me], np.int64)
    return (None if np.array_equal(grid, ar) else (ar, grid),
            ((local[:, None] * n + col[None, :]).ravel(), (local[None, :] * n + col[:, None]).ravel()),
            None if np.array_equal(host_order, ar) else (host_order * n + rank, ar * n + rank))


def _hierarchical_alltoall(ops: Ops, r, send_counts, recv_counts, hosts=None, inner: str = "pairwise",
                           outer: str = "pairwise"):
    """hierarchical.alltoall on even hosts of equal blocks (else False: declined), its steps one after another:
    the input regrouped by destination local rank (unless already so), the inner alltoall, a regrouping by
    destination host, the outer alltoall across its column, the blocks put in rank order (unless already)."""
    n = ops.n
    c = send_counts[0] if n else 0
    layouts = _even_layouts(n, r.tolist(), hosts, send_counts, recv_counts)
    if layouts is None:
        return False
    into = _Embedded(ops)
    for rank, t in zip(r.tolist(), layouts):
        H, L, me = t.H, t.L, t.me
        local, col = np.asarray(t.local, np.int64), np.asarray(t.cols[me], np.int64)
        runs = _runs(t, "alltoall", lambda: _alltoall_moves(t, rank, n), c)
        intra = _phase("alltoall", inner, me, L, True, send_counts=[H * c] * L, recv_counts=[H * c] * L)
        cross = _phase("alltoall", outer, t.host, H, outer in _RUNS_HELD, send_counts=[L * c] * H, recv_counts=[L * c] * H)
        _in_turn(into, rank, (runs[0], (intra, local), runs[1], (cross, col), runs[2]))
    into.added()
    return None


def _hierarchical_allgather(ops: Ops, r, counts, hosts=None, inner: str = "ring", outer: str = "ring"):
    """hierarchical.allgather on even hosts of equal blocks whose columns are not in rank order (else False:
    declined; there "out" holds the columns, and a copy of "in" onto it may be one an in-place call leaves
    out): the outer allgather across its column, the inner one of the columns, the blocks put in rank order."""
    n = ops.n
    layouts = _even_layouts(n, r.tolist(), hosts, counts)
    if layouts is None or any(np.array_equal(t.arrays()[0], t.arrays()[2]) for t in layouts):
        return False
    into = _Embedded(ops)
    for rank, t in zip(r.tolist(), layouts):
        runs = _runs(t, "allgather", lambda: ((t.arrays()[0], t.arrays()[2]),), counts[0])
        cross = _phase("allgather", outer, t.host, t.H, outer in _RUNS_HELD, counts=[counts[0]] * t.H)        # (blocks of one size)
        intra = _phase("allgather", inner, t.me, t.L, True, counts=[counts[0] * t.H] * t.L)
        _in_turn(into, rank, ((cross, np.asarray(t.cols[t.me], np.int64)), (intra, np.asarray(t.local, np.int64)),
                             runs[0]))
    into.added()
    return None


def _hierarchical_reduce_scatter(ops: Ops, r, counts, hosts=None, inner: str = "ring", outer: str = "ring"):
    """hierarchical.reduce_scatter on even hosts of equal blocks (else False: declined): the input put in
    column order (unless it is), the inner reduce-scatter of the columns, the outer one across its column."""
    n = ops.n
    layouts = _even_layouts(n, r.tolist(), hosts, counts)
    if layouts is None:
        return False
    into = _Embedded(ops)
    for rank, t in zip(r.tolist(), layouts):
        grid, _, ar = t.arrays()
        runs = _runs(t, "reduce_scatter", lambda: (None if np.array_equal(grid, ar) else (ar, grid),), counts[0])
        intra = _phase("reduce_scatter", inner, t.me, t.L, True, counts=[counts[0] * t.H] * t.L)   # (blocks of one size)
        cross = _phase("reduce_scatter", outer, t.host, t.H, outer in _RUNS_HELD, counts=[counts[0]] * t.H)
        _in_turn(into, rank, (runs[0], (intra, np.asarray(t.local, np.int64)), (cross, np.asarray(t.cols[t.me], np.int64))))
    into.added()
    return None


def _ring_part(me: int, m: int, counts: list[int], reduce: bool) -> Compact:
    """``ring.reduce_scatter_phase(last=me)`` (``reduce``) or ``ring.allgather_phase(have=me)`` on a schedule
    of rank ``me`` of ``m``, alone: the arrays of ``torus._ring``'s phase (kept as ``_phase``'s; every rank's
    made at once: a torus's ranks of a host each take another's)."""
    def make() -> Compact:
        ops, c = Ops(m), np.asarray(counts, np.int64)
        if reduce:
            around(ops, ops.ranks, 0, c, -1, -2, red=1)
        else:
            around(ops, ops.ranks, 0, c, 0, -1)
        return ops.compact()
    return _one_of(("ring part", m, tuple(counts), reduce), me, make)


def _torus2d_allreduce(ops: Ops, r, count: int, hosts=None):
    """torus.allreduce: the copy in place, the row's ring reduce-scatter, the column's ring allreduce of the part
    this rank ends with (none where it is empty), the row's ring allgather; False where there is no grid."""
    got = torus.placed(ops.n, hosts)
    if got is None:
        return False
    rows, where = got
    ops.add(r, 0, COPY, 0, count, touch=_PLAIN, skip=True)
    into = _Embedded(ops)
    for rank in r.tolist():
        i, j = where(rank)
        row = rows[i]
        column = np.asarray([q[j] for q in rows], np.int64)
        parts = split_counts(count, len(row))
        across = None, None
        if parts[j]:
            subs = split_counts(parts[j], len(column))
            across = ((_ring_part(i, len(column), subs, True), column),
                      (_ring_part(i, len(column), subs, False), column))
        row = np.asarray(row, np.int64)
        _in_turn(into, rank, ((_ring_part(j, len(row), parts, True), row), *across,
                             (_ring_part(j, len(row), parts, False), row)), 1)
    into.added()
    return None


_MAKERS = {("allreduce", "ring"): _ring_allreduce, ("allreduce", "direct"): _direct_allreduce,
           ("allreduce", "bcube"): _bcube_allreduce,
           ("allreduce", "reduce_broadcast"): _reduce_broadcast, ("allgather", "ring"): _ring_allgather,
           ("reduce_scatter", "ring"): _ring_reduce_scatter, ("allgather", "direct"): _direct_allgather,
           ("reduce_scatter", "direct"): _direct_reduce_scatter, ("alltoall", "direct"): _direct_alltoall,
           ("alltoall", "pairwise"): _pairwise_alltoall,
           ("broadcast", "scatter_allgather/ring_phase"): _sag_ring_phase,
           ("reduce", "reduce_scatter_gather/reduce_scatter_phase_of"): _rsg_ring_phase,
           ("reduce", "reduce_scatter_gather"): _reduce_scatter_gather,
           ("allreduce", "hierarchical"): _hierarchical_allreduce,
           ("alltoall", "hierarchical"): _hierarchical_alltoall,
           ("allgather", "hierarchical"): _hierarchical_allgather,
           ("reduce_scatter", "hierarchical"): _hierarchical_reduce_scatter,
           ("allreduce", "torus2d"): _torus2d_allreduce}


def covers(primitive: str, name: str) -> bool:
    return (primitive, name) in _MAKERS


def arrays(primitive: str, name: str, ranks, nranks: int, args: dict) -> Compact | None:
    """The arrays of the schedules of ``ranks`` (increasing) of ``name`` on ``nranks`` ranks (``args``: its
    builder's arguments, ``hosts`` among them for a host-aware one), in the order written, as
    ``compact.convert`` makes them; None where this module does not cover the call."""
    make = _MAKERS.get((primitive, name))
    if make is None or nranks < 1:
        return None
    ops = Ops(nranks, ranks)
    if make(ops, ops.ranks, **args) is False:
        return None
    return ops.compact()
