"""The walker: how the steps of schedules run, for everything that runs them.

The engine's executors (real bytes), the checker (symbolic contributions)
and the cost model (time) all drive schedules through :func:`walk`, with
their own :class:`Semantics`; the order in which a step's operations run is
defined here and nowhere else:

1. a segment schedule's step k (a round) begins once every peer has
   published round k-1 (a window is reused every other round, so nobody may
   still be reading the one about to be written), but for a *free* round
   (:func:`free`): one that is not the call's first, writes nothing that the
   others read of the rank in a round (nothing into its window, no ``Post``,
   no ``Put``) and reads no window of the round before (``Get(prev=True)``,
   which relies on that wait). It begins at once, and the executors write no
   header in it (a peer may still be checking the one of two rounds before);
2. local operations, in order: ``Copy``, ``Post`` and ``Get(prev=True)``;
3. receives are posted (``Recv``; data may land from now on), then sends go out;
4. a segment schedule's round is published;
5. incoming operations complete in the order written (``Recv``, ``Get``,
   ``Put``, ``Sync``; a ``Put`` waits, as a ``Get`` does, for its peer's
   round): reductions in one order give the same bits on every rank;
6. the step ends.

:func:`walk` runs any number of ranks' schedules on one thread: each rank
goes as far as it can, then the next, until all are done or none can move
(a deadlock). A semantics whose waits block (the engine) walks its own rank
straight through. A semantics of time (``timed``: the cost model) has steps
started in the order of its clocks, earliest first, so that what ranks share
(a link) is taken in the order of time, whatever the order of the ranks.
"""
from __future__ import annotations

import heapq

from .schedule import Copy, Get, Post, Put, Recv, Schedule, Send, Sync


class Semantics:
    """What running an operation means. A wait that cannot be satisfied yet returns False;
    the base class runs nothing and never waits. ``blocking``: every wait blocks until it is
    satisfied (or raises), so one rank's schedule runs straight through."""
    blocking = False
    timed = False       # now(r) is rank r's clock: steps are started earliest first

    def now(self, r: int) -> float:
        return 0.0

    def wakes(self, r: int) -> int:                 # the rank walked for r (timed walks)
        return r

    def begin(self, r: int, k: int, free: bool) -> bool:    # segment round k may start (the peers
        return True                                          # published k-1, or it is free)

    def local(self, r: int, k: int, op) -> None:    # Copy, Post, Get(prev=True)
        pass

    def post(self, r: int, k: int, op) -> None:     # a Recv is posted
        pass

    def send(self, r: int, k: int, op) -> None:     # a Send goes out
        pass

    def publish(self, r: int, k: int) -> None:      # segment: round k's window is visible
        pass

    def take(self, r: int, k: int, op) -> bool:     # Recv, Get, Put, Sync: completes now?
        return True

    def end(self, r: int, k: int) -> None:
        pass


def free(k: int, step) -> bool:
    """Is segment round ``k`` (``step``) free (rule 1 above): begun without waiting for the peers?"""
    return k > 0 and not any(type(o) in (Post, Put) or (type(o) is Copy and o.dst == "win")
                             or (type(o) is Get and (o.buf == "win" or o.prev)) for o in step)


def phases(s: Schedule) -> list[tuple[tuple, tuple, tuple, bool]]:
    """Each step of ``s`` as (local, incoming, outgoing) operations, in the order they run, and whether
    it is a free round (a segment schedule's, :func:`free`). Computed once per schedule (plans keep
    their schedules)."""
    ph = s.__dict__.get("_phases")
    if ph is None:
        ph = []
        for k, step in enumerate(s.steps):
            local = tuple(o for o in step if type(o) in (Copy, Post) or (type(o) is Get and o.prev))
            incoming = tuple(o for o in step if type(o) in (Recv, Sync, Put) or (type(o) is Get and not o.prev))
            outgoing = tuple(o for o in step if type(o) is Send)
            ph.append((local, incoming, outgoing, s.segment and free(k, step)))
        s.__dict__["_phases"] = ph
    return ph


def _start(r: int, k: int, local, incoming, outgoing, segment: bool, sem: Semantics) -> None:
    """Steps 2-4 above: local operations, receives posted, sends, the round published."""
    for o in local:
        sem.local(r, k, o)
    for o in incoming:
        if type(o) is Recv:
            sem.post(r, k, o)
    for o in outgoing:
        sem.send(r, k, o)
    if segment:
        sem.publish(r, k)


def walk(scheds: list[Schedule], sem: Semantics) -> list[int]:
    """Run ``scheds`` (one per rank) under ``sem`` as far as they go; return the ranks that could
    not finish (empty when all did)."""
    if len(scheds) == 1 and sem.blocking:        # the engine: its own rank, every wait blocks
        s = scheds[0]
        r, seg = s.rank, s.segment
        for k, (local, incoming, outgoing, at_once) in enumerate(phases(s)):
            if seg:
                sem.begin(r, k, at_once)
            _start(r, k, local, incoming, outgoing, seg, sem)
            for o in incoming:
                sem.take(r, k, o)
            sem.end(r, k)
        return []
    steps = [phases(s) for s in scheds]
    if sem.timed:
        return _walk_timed(scheds, steps, sem)
    n = len(scheds)
    pc, begun, taken = [0] * n, [False] * n, [0] * n   # per rank: its step, started?, incoming ops done
    progress = True
    while progress:
        progress = False
        for i, s in enumerate(scheds):
            progress |= _advance(i, s, steps[i], sem, pc, begun, taken)
    return [s.rank for i, s in enumerate(scheds) if pc[i] < len(steps[i])]


def _advance(i: int, s: Schedule, mine, sem: Semantics, pc, begun, taken, started=None, ended=None) -> bool:
    """Run rank ``i``'s steps (``mine``, its phases) as far as they go; True if anything moved.
    ``started(outgoing)`` is told of each step's sends once they went out; ``ended()`` after each
    step: True stops here (another rank goes first)."""
    r, seg, moved = s.rank, s.segment, False
    while pc[i] < len(mine):
        k = pc[i]
        local, incoming, outgoing, at_once = mine[k]
        if not begun[i]:
            if seg and not sem.begin(r, k, at_once):
                return moved
            _start(r, k, local, incoming, outgoing, seg, sem)
            begun[i], taken[i], moved = True, 0, True
            if started is not None:
                started(outgoing)
        while taken[i] < len(incoming) and sem.take(r, k, incoming[taken[i]]):
            taken[i] += 1
            moved = True
        if taken[i] < len(incoming):
            return moved
        sem.end(r, k)
        pc[i], begun[i] = k + 1, False
        if ended is not None and ended():
            return moved
    return moved


def _walk_timed(scheds: list[Schedule], steps, sem: Semantics) -> list[int]:
    """:func:`walk` with the rank whose clock is earliest going next. A rank that must wait
    parks until a message is sent to it or a round is published (segment schedules), then
    queues again at its clock."""
    n = len(scheds)
    pc, begun, taken = [0] * n, [False] * n, [0] * n
    where = {s.rank: i for i, s in enumerate(scheds)}
    seg = bool(scheds) and scheds[0].segment
    wake = sem.wakes
    heap = [(sem.now(s.rank), i) for i, s in enumerate(scheds)]
    heapq.heapify(heap)
    queued, parked = [True] * n, set()

    def queue(j: int) -> None:
        queued[j] = True
        heapq.heappush(heap, (sem.now(scheds[j].rank), j))

    def started(outgoing) -> None:      # wake the ranks these sends (or this round) may let go on
        woken = parked if seg else {where.get(wake(o.peer), -1) for o in outgoing} & parked
        for j in list(woken):
            parked.discard(j)
            if not queued[j]:
                queue(j)

    while heap:
        _, i = heapq.heappop(heap)
        queued[i] = False

        def ended(i=i) -> bool:         # another rank's step comes first: queue again behind it
            if heap and sem.now(scheds[i].rank) > heap[0][0]:
                queue(i)
                return True
            return False
        _advance(i, scheds[i], steps[i], sem, pc, begun, taken, started, ended)
        if pc[i] < len(steps[i]) and not queued[i]:
            parked.add(i)
    return [s.rank for i, s in enumerate(scheds) if pc[i] < len(steps[i])]
