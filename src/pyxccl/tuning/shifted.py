"""Some ranks' schedules of the algorithms that fold (a ring, a direct or pairwise exchange) as the C
core's arrays (``compact.py``), made in numpy rather than built as Python objects.

The tuner walks host 0's ranks of an algorithm that folds (``symmetric.py``) and checks its declared move
on a few other ranks; these algorithms hold O(ranks) operations a rank, so at thousands of ranks
building those schedules and converting them was most of pricing a size (issue 26: host 0's 8 ranks of
the ring allreduce on 4,096 ranks, 65k steps, 60 ms built and 25 ms converted, against 26 ms walked).

This is a second implementation of the builders it covers: the ring allreduce, allgather and
reduce-scatter (``algorithms/ring.py``), the direct allgather, reduce-scatter and alltoall and the pairwise
alltoall (``algorithms/direct.py``), and the ring phases of van de Geijn's broadcast and Rabenseifner's
reduce (``algorithms/pipeline.py``, priced apart: ``select._phase_estimate``). :func:`arrays` gives, bit for
bit, what ``compact.convert([the ranks' schedules], written=True)`` gives (``tests/test_tuner_shifted.py``
compares them over many layouts and sizes, empty blocks included). Like ``rooted.py``'s, the arrays hold
only what the walk reads.
"""
from __future__ import annotations

import numpy as np

from ..algorithms import hierarchical
from ..algorithms.registry import lookup
from ..schedule import split_counts
from .compact import COPY, RECV, SEND, Compact, convert
from .rooted import _Ops

#: bytes of the call's buffers ("in", "out", "tmp": ``cost.CALL_BUFFERS``) a copy touches per byte: a plain
#: copy's source and destination; a reducing copy's destination twice (read and written)
_PLAIN, _REDUCING = 2, 3


def _offsets(counts) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(counts, np.int64)
    off = np.zeros(len(c) + 1, np.int64)
    np.cumsum(c, out=off[1:])
    return c, off


def _around(ops: _Ops, r: np.ndarray, first: int, chunk, send_at: int, recv_at: int, red: int = 0) -> None:
    """A ring phase (``ring.reduce_scatter_phase``, ``ring.allgather_phase``) from step key ``first``: in its
    k-th step rank r sends chunk (r + send_at - k) % n to r + 1 and receives chunk (r + recv_at - k) % n from
    r - 1 (``red``: and reduces it)."""
    n = ops.n
    rank = np.repeat(r, n - 1)
    k = np.tile(np.arange(n - 1, dtype=np.int64), len(r))
    ops.add(rank, first + k, SEND, (rank + 1) % n, chunk[(rank + send_at - k) % n])
    ops.add(rank, first + k, RECV, (rank - 1) % n, chunk[(rank + recv_at - k) % n], red=red)


def _ring_allreduce(ops: _Ops, r, count: int) -> None:
    """ring.allreduce: the copy in place (left out in place), the reduce-scatter that leaves chunk r + 1 on
    rank r, the allgather from it."""
    n = ops.n
    pieces = np.asarray(split_counts(count, n), np.int64)
    ops.add(r, 0, COPY, 0, count, touch=_PLAIN, skip=True)
    _around(ops, r, 1, pieces, 0, -1, red=1)
    _around(ops, r, n, pieces, 1, 0)


def _ring_allgather(ops: _Ops, r, counts) -> None:
    c, off = _offsets(counts)
    ops.add(r, 0, COPY, 0, c[r], touch=_PLAIN, skip=off[r] == 0)
    _around(ops, r, 1, c, 0, -1)


def _ring_reduce_scatter(ops: _Ops, r, counts) -> None:
    """ring.reduce_scatter: the input copied to "tmp", the reduce-scatter that leaves chunk r on rank r,
    copied out."""
    n = ops.n
    c, off = _offsets(counts)
    ops.add(r, 0, COPY, 0, off[-1], touch=_PLAIN)
    _around(ops, r, 1, c, -1, -2, red=1)
    ops.add(r, n, COPY, 0, c[r], touch=_PLAIN)


def _exchange(ops: _Ops, r, step, sends, recvs) -> None:
    """One step's messages of a direct exchange: to r + 1, r + 2, ..., then from r - 1, r - 2, ...
    (``sends(rank, peer)``, ``recvs(rank, peer)``: their counts)."""
    n = ops.n
    rank = np.repeat(r, n - 1)
    k = np.tile(np.arange(1, n, dtype=np.int64), len(r))
    to, frm = (rank + k) % n, (rank - k) % n
    ops.add(rank, step, SEND, to, sends(rank, to))
    ops.add(rank, step, RECV, frm, recvs(rank, frm))


def _direct_allgather(ops: _Ops, r, counts) -> None:
    c, off = _offsets(counts)
    ops.add(r, 0, COPY, 0, c[r], touch=_PLAIN, skip=off[r] == 0)
    _exchange(ops, r, 0, lambda rank, to: c[rank], lambda rank, frm: c[frm])


def _direct_reduce_scatter(ops: _Ops, r, counts) -> None:
    """direct.reduce_scatter: block q of the input to rank q, the n - 1 received into "tmp", then reduced into
    "out" in rank order."""
    n = ops.n
    c, _ = _offsets(counts)
    mine = c[r]
    ops.add(r, 0, COPY, 0, mine, touch=_PLAIN)
    _exchange(ops, r, 0, lambda rank, to: c[to], lambda rank, frm: c[rank])
    ops.add(r, 1, COPY, 0, mine, touch=_PLAIN)
    ops.add(np.repeat(r, n - 1), 1, COPY, 0, np.repeat(mine, n - 1), red=1, touch=_REDUCING)


def _alltoall_copy(ops: _Ops, r, send_counts, recv_counts):
    sc, soff = _offsets(send_counts)
    rc, roff = _offsets(recv_counts)
    ops.add(r, 0, COPY, 0, sc[r], touch=_PLAIN, skip=soff[r] == roff[r])
    return sc, rc


def _direct_alltoall(ops: _Ops, r, send_counts, recv_counts) -> None:
    sc, rc = _alltoall_copy(ops, r, send_counts, recv_counts)
    _exchange(ops, r, 0, lambda rank, to: sc[to], lambda rank, frm: rc[frm])


def _pairwise_alltoall(ops: _Ops, r, send_counts, recv_counts) -> None:
    """direct.alltoall: in step k, to r + k and from r - k."""
    n = ops.n
    sc, rc = _alltoall_copy(ops, r, send_counts, recv_counts)
    rank = np.repeat(r, n - 1)
    k = np.tile(np.arange(1, n, dtype=np.int64), len(r))
    to, frm = (rank + k) % n, (rank - k) % n
    ops.add(rank, k, SEND, to, sc[to])
    ops.add(rank, k, RECV, frm, rc[frm])


def _sag_ring_phase(ops: _Ops, r, count: int, root: int) -> None:
    """pipeline.ring_phase: the ring allgather of the pieces, rank r holding piece r - root."""
    pieces = np.asarray(split_counts(count, ops.n), np.int64)
    _around(ops, r, 0, pieces, -root, -root - 1)


def _rsg_ring_phase(ops: _Ops, r, count: int, root: int) -> None:
    """pipeline.reduce_scatter_phase_of: the input copied to "tmp", the reduce-scatter that leaves piece r on
    rank r."""
    pieces = np.asarray(split_counts(count, ops.n), np.int64)
    ops.add(r, 0, COPY, 0, int(pieces.sum()), touch=_PLAIN)
    _around(ops, r, 1, pieces, -1, -2, red=1)


def _phase(prim: str, name: str, rank: int, nranks: int, made: dict, **args) -> Compact:
    """A phase's arrays (one rank's schedule of a flat algorithm): made here where covered, else built and
    converted; once per ``made``."""
    key = (prim, name, rank, nranks, *((k, tuple(v) if type(v) is list else v) for k, v in sorted(args.items())))
    got = made.get(key)
    if got is None:
        got = made[key] = (arrays(prim, name, (rank,), nranks, args) if covers(prim, name) else
                           convert([lookup(prim, name).build(rank, nranks, **args)], written=True))
    return got


def _embed(ops: _Ops, rank: int, sub: Compact, group: np.ndarray, at: int) -> None:
    """``schedule.embed(into, sub, group, bufs, at)`` of a phase whose buffers are mapped onto "out" and "tmp"
    (none onto "in": no copy of it is one an in-place call leaves out), its step k joining step ``at + k``."""
    steps = np.repeat(np.arange(len(sub.step_start) - 1, dtype=np.int64), np.diff(sub.step_start))
    peer = np.where(sub.kind == COPY, 0, group[sub.peer])
    ops.add(np.full(len(sub.kind), rank), at + steps, sub.kind, peer, sub.count, sub.red, sub.touch)


def _hierarchical_allreduce(ops: _Ops, r, count: int, hosts=None, inner: str = "ring", outer: str = "ring"):
    """hierarchical.allreduce on even hosts (else False: declined): the copy in place, then its pipeline of
    chunks, each an inner reduce-scatter, an outer allreduce across its column and an inner allgather, chunk
    c + 1's phases one outer allreduce behind c's (``embed``'s ``at``)."""
    n, made = ops.n, {}
    for rank in r.tolist():
        t = hierarchical._Layout(rank, n, hosts)
        if not t.even:
            return False
        local, cross, me, L = np.asarray(t.local, np.int64), np.asarray(t.cols[t.me], np.int64), t.me, t.L
        ops.add([rank], 0, COPY, 0, count, touch=_PLAIN, skip=True)
        chunks = (max(1, min(hierarchical.PIPELINE_CHUNKS, count // hierarchical.PIPELINE_MIN))
                  if len(cross) > 1 and L > 1 else 1)
        parts = split_counts(count, chunks)
        for c, part in enumerate(parts):
            shards = split_counts(part, L)
            rs = _phase("reduce_scatter", inner, me, L, made, counts=shards)
            ar = _phase("allreduce", outer, t.host, len(cross), made, count=shards[me])
            ag = _phase("allgather", inner, me, L, made, counts=shards)
            at = 1 + c * (len(ar.step_start) - 1)
            rs_steps = len(rs.step_start) - 1
            _embed(ops, rank, rs, local, at)
            _embed(ops, rank, ar, cross, at + rs_steps)
            _embed(ops, rank, ag, local, at + rs_steps + len(ar.step_start) - 1)
    return None


_MAKERS = {("allreduce", "ring"): _ring_allreduce, ("allgather", "ring"): _ring_allgather,
           ("reduce_scatter", "ring"): _ring_reduce_scatter, ("allgather", "direct"): _direct_allgather,
           ("reduce_scatter", "direct"): _direct_reduce_scatter, ("alltoall", "direct"): _direct_alltoall,
           ("alltoall", "pairwise"): _pairwise_alltoall,
           ("broadcast", "scatter_allgather/ring_phase"): _sag_ring_phase,
           ("reduce", "reduce_scatter_gather/reduce_scatter_phase_of"): _rsg_ring_phase,
           ("allreduce", "hierarchical"): _hierarchical_allreduce}


def covers(primitive: str, name: str) -> bool:
    return (primitive, name) in _MAKERS


def arrays(primitive: str, name: str, ranks, nranks: int, args: dict) -> Compact | None:
    """The arrays of the schedules of ``ranks`` (increasing) of ``name`` on ``nranks`` ranks (``args``: its
    builder's arguments, ``hosts`` among them for a host-aware one), in the order written, as
    ``compact.convert`` makes them; None where this module does not cover the call."""
    make = _MAKERS.get((primitive, name))
    if make is None or nranks < 1:
        return None
    ops = _Ops(nranks, ranks)
    if make(ops, ops.ranks, **args) is False:
        return None
    return ops.compact()
