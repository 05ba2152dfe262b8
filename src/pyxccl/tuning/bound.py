"""Lower bounds of the cost model's estimate (``cost.py``) of an algorithm, from a few ranks'
schedules: the tuner leaves out an algorithm whose bound is above the best estimate so far (its
estimate cannot be below it) and walks only the others.

- :func:`local`: what one rank spends on its own processor (``cost.Timing``): in each step its
  copies, then the larger of its sends (one after the other) and its receives (handled one by one).
- :func:`path`: the longest chain of such steps and of the messages between them, among the ranks
  that a search from a few ranks (0, the last, the middle one: where a root's data ends up, or a
  chain ends) reaches through whom they receive from (at most ``RANKS`` ranks and
  ``OPS`` operations). A step cannot end before the step before it ended and its own work is done
  (``local``'s term), nor before each of its receives is in: the sender began that step (its step
  before ended, its copies are done), paid half of the link's alpha, the bytes crossed, then the
  receiver paid the other half and reduced. Ranks the search did not reach count as beginning every
  step at 0. Waits for shared links (a host's NIC) are left out: they only add. Where the
  dependency runs through many ranks (a ring's chain of hops at a few bytes, a tree's levels), this
  is far above ``local``: what lets the tuner skip those algorithms at scale without walking every
  rank's schedule.

Both hold on a communicator whose hosts are alike (``fast.Shape``) for message schedules whose
pairs have the shape's link classes (``classes_ok``); elsewhere they are 0.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..schedule import Recv
from . import compact
from .cost import SOCKET_BUFFER

#: the most ranks and operations ``path`` looks at: what keeps its cost O(1) in the job's size
RANKS, OPS = 64, 20_000
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


def local(sched, shape, itemsize: int, classes_ok) -> float:
    """What rank ``sched.rank`` spends on its own processor, from its schedule alone (0 where the
    bound does not hold: see the module's docstring)."""
    if shape is None or not compact.message_schedules([sched]) or not classes_ok([sched]):
        return 0.0
    c = compact.convert([sched], written=True)
    copy, send, recv, _ = _terms(c, np.full(len(c.kind), sched.rank), shape, itemsize)
    s = [_per_step(x, c.step_start) for x in (copy, send, recv)]
    return float((s[0] + np.maximum(s[1], s[2])).sum()) * MARGIN


class _Rank:
    """One rank's terms for ``path``: per step its copies and its local time; per step its receives
    as (sender, which receive from that sender this is, the time from the sender's step start to
    this receive's end); per peer the steps of its sends to that peer, in order."""

    def __init__(self, c: compact.Compact, rank: int, shape, itemsize: int):
        copy, send, recv, edge = _terms(c, np.full(len(c.kind), rank), shape, itemsize)
        s = [_per_step(x, c.step_start) for x in (copy, send, recv)]
        self.copies = s[0].tolist()
        self.local = (s[0] + np.maximum(s[1], s[2])).tolist()
        nsteps = len(self.copies)
        step_of = np.repeat(np.arange(nsteps), np.diff(c.step_start))
        self.recvs: list[list] = [[] for _ in range(nsteps)]
        self.sends_to: dict[int, list[int]] = {}
        seen: dict[int, int] = {}
        kind, peer = c.kind.tolist(), c.peer.tolist()
        for i in np.flatnonzero(c.kind != compact.COPY).tolist():
            q = peer[i]
            if kind[i] == compact.SEND:
                self.sends_to.setdefault(q, []).append(int(step_of[i]))
            else:
                j = seen.get(q, 0)
                seen[q] = j + 1
                self.recvs[step_of[i]].append((q, j, float(edge[i])))
        self.senders = list(seen)


def path(get, shape, itemsize: int, classes_ok) -> float:
    """The longest chain of steps and messages among the ranks a search from ranks 0, n - 1 and n / 2
    reaches (see the module's docstring); ``get(rank)``: the rank's schedule."""
    if shape is None:
        return 0.0
    n = shape.nranks
    seeds = list(dict.fromkeys((0, n - 1, n // 2)))
    order, seen, queue, ops = [], set(seeds), deque(seeds), 0
    scheds = {}
    while queue and len(order) < RANKS and ops < OPS:
        r = queue.popleft()
        s = get(r)
        if not compact.message_schedules([s]):
            return 0.0
        scheds[r] = s
        order.append(r)
        for step in s.steps:
            ops += len(step)
            for o in step:
                if type(o) is Recv and o.peer not in seen:
                    seen.add(o.peer)
                    queue.append(o.peer)
    if not classes_ok(list(scheds.values())):
        return 0.0
    info = {r: _Rank(compact.convert([s], written=True), r, shape, itemsize) for r, s in scheds.items()}
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
    return max((e[-1] for e in ends.values() if e), default=0.0) * MARGIN
