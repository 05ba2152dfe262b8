"""Lower bounds of the cost model's estimate (``cost.py``) of an algorithm, from a few ranks'
schedules: the tuner leaves out an algorithm whose bound is above the best estimate so far (its
estimate cannot be below it) and walks only the others.

- :func:`local`: what one rank spends on its own processor (``cost.Timing``): in each step its
  copies, then the larger of its sends (one after the other) and its receives (handled one by one).
- :func:`host_link`: host 0's link to other hosts, for an algorithm whose every rank sends what rank 0
  sends (moved): the time of all its ranks' transfers between hosts, one after another.
- :func:`relay`: a chain's (``Algorithm.relay``) first block, across its n - 1 hops one after another.
- :func:`path`: the longest chain of such steps and of the messages between them, among the ranks
  that a search from a few ranks (0, the last, the middle one: where a root's data ends up, or a
  chain ends) reaches through whom they receive from (``RANKS`` ranks in turn, at most
  ``OPS`` operations). A step cannot end before the step before it ended and its own work is done
  (``local``'s term), nor before each of its receives is in: the sender began that step (its step
  before ended, its copies are done), paid half of the link's alpha, the bytes crossed, then the
  receiver paid the other half and reduced. Ranks the search did not reach count as beginning every
  step at 0. Waits for shared links (a host's NIC) are left out: they only add. Where the
  dependency runs through many ranks (a ring's chain of hops at a few bytes, a tree's levels), this
  is far above ``local``: what lets the tuner skip those algorithms at scale without walking every
  rank's schedule.

All hold on a communicator whose hosts are alike (``fast.Shape``) for message schedules whose
pairs have the shape's link classes (``classes_ok``); elsewhere they are 0.
"""
from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

import numpy as np

from ..schedule import Recv
from . import compact
from .cost import SOCKET_BUFFER
from .fast import _simcore      # the C core, or None (then _longest, the reference)

#: how many ranks ``path`` looks at, in turn until its bound is high enough (a few first: often
#: enough to leave an algorithm out), and the most operations: what keeps its cost O(1) in the job's size
RANKS, OPS = (8, 32, 128, 512), 20_000
#: the ranks of a first look, which orders algorithms before there is an estimate (``select._argmin``)
FIRST = (128,)
#: relaxation passes over the ranks looked at (each pass's values are bounds already)
PASSES = 6
#: margin: sums in another order round differently from the walk's sum of the same terms
MARGIN = 1 - 1e-9


def _terms(c: compact.Compact, ranks: np.ndarray, shape, itemsize: int):
    """Per operation of ``c`` (message schedules, in the order written; ``ranks``: each op's rank):
    (its copy time, send time, receive time, and the time from the sender's step start to a
    receive's end), zero where it is not of that kind."""
    f, p = shape.stretch, shape.per_host
    nb = c.count.astype(float) * itemsize
    inside = c.peer // p == ranks // p
    alpha = np.where(inside, shape.intra.alpha, shape.inter.alpha) * f
    shm = inside & shape.shm_inside
    beta_nb = nb * np.where(inside, shape.intra.beta, shape.inter.beta)
    wire = np.where(shm, nb * shape.intra.beta * f, np.where(inside, nb * shape.intra.beta, 0.0))
    tcp = np.maximum(nb - SOCKET_BUFFER, 0.0) * shape.inter.beta * ~inside
    kind = c.kind
    is_copy, is_send, is_recv = kind == compact.COPY, kind == compact.SEND, kind == compact.RECV
    copy = np.where(is_copy, nb * np.where(c.red != 0, shape.gamma, shape.copy) * f, 0.0)
    send = np.where(is_send, alpha / 2 + wire + tcp, 0.0)
    recv = np.where(is_recv, alpha / 2 + np.where(shm, nb * shape.intra.beta * f, 0.0), 0.0)
    edge = np.where(is_recv, alpha + np.where(shm, beta_nb * f, beta_nb)
                    + np.where(c.red != 0, nb * shape.gamma * f, 0.0), 0.0)
    return copy, send, recv, edge


def _per_step(x: np.ndarray, step_start: np.ndarray) -> np.ndarray:
    cs = np.concatenate(([0.0], np.cumsum(x)))
    return cs[step_start[1:]] - cs[step_start[:-1]]


def _one(sched) -> tuple[compact.Compact | None, int]:
    """(the arrays of ``sched``, a rank's message schedule or its arrays already made, in the order
    written; None for a segment schedule) and its rank."""
    if isinstance(sched, compact.Compact):      # (peers that move each run, copies held once: written out)
        return (sched if sched.stride is None and sched.times is None else sched.expanded()), int(sched.ranks[0])
    return (compact.convert([sched], written=True) if compact.message_schedules([sched]) else None), sched.rank


def local(sched, shape, itemsize: int, classes_ok) -> float:
    """What rank ``sched.rank`` spends on its own processor, from its schedule (or its arrays) alone (0
    where the bound does not hold: see the module's docstring)."""
    c, rank = _one(sched) if shape is not None else (None, 0)
    if c is None or not classes_ok(c):
        return 0.0
    copy, send, recv, _ = _terms(c, np.full(len(c.kind), rank), shape, itemsize)
    s = [_per_step(x, c.step_start) for x in (copy, send, recv)]
    return float(((s[0] + np.maximum(s[1], s[2])) * c.reps()).sum()) * MARGIN


def host_link(first, spot, shape, itemsize: int, classes_ok) -> float:
    """Host 0's outgoing link, for an algorithm whose every rank r sends what rank 0 sends, to the
    peers moved by r, within one element a message (``Algorithm.rotates``; ``first``: rank 0's schedule,
    ``spot``: another rank's, on which that is checked: 0 where it does not hold). Every transfer between
    hosts holds its host's link one after another for its bytes times the link's beta
    (``cost.Net.route``; folded, host 0's link stands for every host's), and is received before the walk
    ends: the sum over host 0's ranks of those times is a bound. Rank j of host 0 sends to j + d (mod n)
    at least what rank 0 sends to d less an element a message, and j + d leaves host 0 for the j in
    [p - d, n - d) (p ranks a host): rank 0's schedule is enough."""
    if shape is None or shape.hosts < 2:
        return 0.0
    (a, rank), (b, spot_rank) = _one(first), _one(spot)
    if rank != 0 or a is None or b is None or not (classes_ok(a) and classes_ok(b)):
        return 0.0
    n, p = shape.nranks, shape.per_host
    (total, msgs), (other, _) = _sent(a, rank, n), _sent(b, spot_rank, n)
    if (np.abs(other - total) > msgs).any():
        return 0.0          # not what rank 0 sends, moved: the algorithm does not rotate here
    d = np.arange(n)
    leaving = np.maximum(0, np.minimum(p, n - d) - np.maximum(0, p - d))
    least = np.maximum(total - msgs, 0).astype(float)
    return float((least * itemsize * leaving).sum() * shape.inter.beta) * MARGIN


def relay(second, last, root: int, shape, itemsize: int, classes_ok) -> float:
    """A chain's (``Algorithm.relay``; ``second``, ``last``: the schedules of positions 1 and n - 1 from
    ``root``): position i's first receive, from i - 1, comes after i - 1's own first receive ended and
    i - 1's next step began, so the first block crosses the n - 1 hops one after another, each at least
    ``path``'s time from the sender's step start to the receive's end. Checked on the last position (its
    first receive from position n - 2, as large as position 1's): 0 where it does not hold."""
    n = shape.nranks if shape is not None else 0
    if n < 3 or not compact.message_schedules([second, last]) or not classes_ok([second, last]):
        return 0.0
    firsts = [next((o for st in s.steps for o in st if type(o) is Recv), None) for s in (second, last)]
    if (None in firsts or firsts[0].peer != root or firsts[1].peer != (root + n - 2) % n
            or firsts[1].count < firsts[0].count or firsts[0].reduce):
        return 0.0
    pos = np.arange(1, n)
    hops = SimpleNamespace(kind=np.full(n - 1, compact.RECV, np.int8), red=np.zeros(n - 1, np.int8),
                           count=np.full(n - 1, firsts[0].count, np.int64), peer=(root + pos - 1) % n)
    return float(_terms(hops, (root + pos) % n, shape, itemsize)[3].sum()) * MARGIN


def _sent(c: compact.Compact, rank: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(elements, messages) that ``rank``'s arrays ``c`` send to each rank moved back by its own: index d is
    rank + d (mod n)."""
    mine = c.kind == compact.SEND
    d = (c.peer[mine] - rank) % n
    times = c.op_reps()[mine]           # (a step repeated sends its messages as often)
    return (np.bincount(d, weights=c.count[mine] * times, minlength=n).astype(np.int64),
            np.bincount(d, weights=times, minlength=n).astype(np.int64))


class _Rank:
    """One rank's terms for ``path``: per step its copies and its local time; per step its receives
    as (sender, which receive from that sender this is, the time from the sender's step start to
    this receive's end); per peer the steps of its sends to that peer, in order."""

    def __init__(self, copies: list[float], local: list[float]):
        self.copies, self.local = copies, local
        self.recvs: list[list] = [[] for _ in copies]
        self.sends_to: dict[int, list[int]] = {}
        self.seen: dict[int, int] = {}


def _ranks(scheds: list, shape, itemsize: int) -> dict[int, _Rank]:
    """The terms of every rank of ``scheds`` (converted and priced together: one numpy pass, not one
    per rank)."""
    c = compact.convert(scheds, written=True)
    owner = np.repeat(c.ranks, np.diff(c.step_start[c.rank_start]))
    copy, send, recv, edge = _terms(c, owner, shape, itemsize)
    s = [_per_step(x, c.step_start) for x in (copy, send, recv)]
    copies, local = s[0].tolist(), (s[0] + np.maximum(s[1], s[2])).tolist()
    first = c.rank_start.tolist()
    out, base = {}, {}
    for i, r in enumerate(c.ranks.tolist()):
        out[r] = _Rank(copies[first[i]:first[i + 1]], local[first[i]:first[i + 1]])
        base[r] = first[i]
    step_of = np.repeat(np.arange(len(c.step_start) - 1), np.diff(c.step_start))
    msg = np.flatnonzero(c.kind != compact.COPY)
    for kind, q, k, r, w in zip(c.kind[msg].tolist(), c.peer[msg].tolist(), step_of[msg].tolist(),
                                owner[msg].tolist(), edge[msg].tolist()):
        me = out[r]
        k -= base[r]
        if kind == compact.SEND:
            me.sends_to.setdefault(q, []).append(k)
        else:
            j = me.seen.get(q, 0)
            me.seen[q] = j + 1
            me.recvs[k].append((q, j, w))
    return out


def _chains(scheds: list, shape, itemsize: int) -> tuple:
    """``_ranks``'s terms as the C core's arrays (``_simcore.longest``), in numpy: (per step, ranks in the
    order of ``scheds``: its local time, its copies; each rank's first step; each step's first receive;
    per receive, the sender's step that sends it (-1: none looked at) and its time from that step's start)."""
    c = compact.convert(scheds, written=True)
    n = shape.nranks
    owner = np.repeat(c.ranks, np.diff(c.step_start[c.rank_start]))
    copy, send, recv, edge = _terms(c, owner, shape, itemsize)
    s = [_per_step(x, c.step_start) for x in (copy, send, recv)]
    nsteps = len(c.step_start) - 1
    step_of = np.repeat(np.arange(nsteps, dtype=np.int64), np.diff(c.step_start))

    def ordinal(key):
        """Each op's number among the ops of its key before it, in the order written."""
        order = np.argsort(key, kind="stable")
        k = key[order]
        new = np.concatenate(([True], k[1:] != k[:-1]))
        firsts = np.flatnonzero(new)
        out = np.empty(len(key), np.int64)
        out[order] = np.arange(len(k)) - np.repeat(firsts, np.diff(np.append(firsts, len(k))))
        return out

    sends, recvs = np.flatnonzero(c.kind == compact.SEND), np.flatnonzero(c.kind == compact.RECV)
    skey = owner[sends] * n + c.peer[sends]          # sender -> receiver
    rkey = c.peer[recvs] * n + owner[recvs]
    sj, rj = ordinal(skey), ordinal(rkey)
    # the j-th receive of r from q matches the j-th send of q to r (none: q was not looked at, or sent less)
    width = max(len(sends), len(recvs)) + 1
    sfull, rfull = skey * width + sj, rkey * width + rj
    send_step = np.full(len(recvs), -1, np.int64)
    if len(sends):
        order = np.argsort(sfull, kind="stable")
        match = order[np.minimum(np.searchsorted(sfull, rfull, sorter=order), len(order) - 1)]
        hit = sfull[match] == rfull
        send_step[hit] = step_of[sends][match[hit]]
    # (receives in the order written are in the order of their steps: recv_start cuts them)
    recv_start = compact.prefix_sums(np.bincount(step_of[recvs], minlength=nsteps))
    local = s[0] + np.maximum(s[1], s[2])
    return (local, s[0], c.rank_start.astype(np.int64), recv_start, send_step,
            np.ascontiguousarray(edge[recvs], dtype=float))


def _search(get, n: int, ranks: int, per_host: int = 0) -> tuple[list[int], list, bool] | None:
    """(the ranks a search from 0, n - 1 and n / 2 through whom they receive from reaches, at most
    ``ranks`` of them and about ``OPS`` operations; their schedules; whether it could go on), or None
    when a schedule is not a message schedule. Breadth first, except that a sender on another host
    (of ``per_host`` ranks each) is looked at next: the long chains run from host to host (a ring of
    hosts, a tree's levels), and breadth first spent the ranks on each host's own first (at 1,024
    ranks, 8 B: 4 hosts reached with 32 ranks, not 32; the bounds found with 16 ranks went from 0.3 to
    0.8-1.0 of the winner's estimate, and the tuner's first call from 32 to 23 ms)."""
    seeds = list(dict.fromkeys((0, n - 1, n // 2)))
    order, seen, queue, ops, scheds = [], set(seeds), deque(seeds), 0, []
    while queue and len(order) < ranks and ops < OPS:
        r = queue.popleft()
        s = get(r)
        if not compact.message_schedules([s]):
            return None
        scheds.append(s)
        order.append(r)
        for step in s.steps:
            ops += len(step)
            for o in step:
                if type(o) is Recv and o.peer not in seen:
                    seen.add(o.peer)
                    if per_host and o.peer // per_host != r // per_host:
                        queue.appendleft(o.peer)
                    else:
                        queue.append(o.peer)
    return order, scheds, bool(queue) and ops < OPS


def _longest(order: list[int], info: dict[int, _Rank]) -> float:
    """The latest step end of ``order``'s ranks, relaxed ``PASSES`` times over the chains."""
    ends = {r: [0.0] * len(info[r].local) for r in order}
    for _ in range(PASSES):
        changed = False
        for r in reversed(order):         # the farthest first: what they send reaches the nearer
            me, mine, prev = info[r], ends[r], 0.0
            for k, work in enumerate(me.local):
                v = prev + work
                for q, j, w in me.recvs[k]:
                    them = info.get(q)
                    start = 0.0
                    if them is not None:
                        st = them.sends_to.get(r)
                        if st is not None and j < len(st):
                            kk = st[j]
                            start = (ends[q][kk - 1] if kk else 0.0) + them.copies[kk]
                    if start + w > v:
                        v = start + w
                if v > mine[k]:
                    mine[k] = v
                    changed = True
                prev = mine[k]
        if not changed:
            break
    return max((e[-1] for e in ends.values() if e), default=0.0)


def path(get, shape, itemsize: int, classes_ok, enough: float = math.inf, ranks=RANKS) -> float:
    """The longest chain of steps and messages among the ranks a search from ranks 0, n - 1 and n / 2
    reaches (see the module's docstring); ``get(rank)``: the rank's schedule. The search grows
    through ``ranks`` (``RANKS``) until the bound is above ``enough`` (all the caller needs to know) or
    it can go no further."""
    if shape is None:
        return 0.0
    best = 0.0
    for most in ranks:
        got = _search(get, shape.nranks, most, shape.per_host)
        if got is None:
            return 0.0
        order, scheds, more = got
        if not classes_ok(scheds):
            return 0.0
        if _simcore is not None:
            end = _simcore.longest(*_chains(scheds, shape, itemsize), PASSES)
        else:
            end = _longest(order, _ranks(scheds, shape, itemsize))
        best = max(best, end * MARGIN)
        if best > enough or not more:
            break
    return best
