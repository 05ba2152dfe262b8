"""The alpha-beta-gamma cost model, run over schedules as a small event simulation.

A message costs ``alpha`` plus ``bytes * beta`` of its link class. Half of
``alpha`` is paid by the sender's CPU and half by the receiver's (in Python
the per-message cost is mostly software at both ends, not the wire), so a
rank's sends in a step go one after the other, and so do its receives; a
receive that reduces costs ``bytes * gamma`` more, a local copy ``bytes *
copy``. A step ends when its sends are out and its receives are in; a receive
can't complete before the sender sent it. On a host with more ranks than
cores every CPU cost (per-message overheads, copies, reductions,
shared-memory transfers) stretches by ranks/cores.

Segment schedules (the one-host fast path) are priced by the same walk: a
round's window becomes readable after the measured round latency, and the
copies and reductions on windows cost what copies and reductions cost.

The model's answer for a collective is the time of the slowest rank.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..schedule import Copy, Get, Post, Recv, Schedule
from ..walk import Semantics, walk


SOCKET_BUFFER = 4 << 20     # bytes a TCP send hands to the kernel before it waits for the wire


@dataclass(frozen=True)
class Link:
    alpha: float      # seconds per message
    beta: float       # seconds per byte


#: Figures of link classes nobody measured yet: shared memory, TCP on one host, TCP between hosts.
DEFAULT_LINKS = {"shm": Link(20e-6, 1 / 4e9), "tcp_local": Link(40e-6, 1 / 2e9), "tcp": Link(60e-6, 1 / 1.1e9),
                 "seg": Link(5e-6, 1 / 8e9)}


@dataclass
class Machine:
    """What one host's links and cores can do (measured by probe.py or read from a file)."""
    links: dict[str, Link] = field(default_factory=dict)
    gamma: float = 2e-10         # seconds per byte reduced
    copy: float = 1.5e-10        # seconds per byte copied locally
    cores: int = 1
    source: str = field(default="", compare=False)    # how the figures were got (probe.measure says)

    def link(self, klass: str) -> Link:
        """Measured figures of ``klass``, else the defaults."""
        return self.links.get(klass) or DEFAULT_LINKS[klass]

    def to_json(self) -> dict:
        return {"links": {k: [v.alpha, v.beta] for k, v in self.links.items()}, "gamma": self.gamma,
                "copy": self.copy, "cores": self.cores}

    @classmethod
    def from_json(cls, d: dict) -> "Machine":
        return cls({k: Link(*v) for k, v in d["links"].items()}, d["gamma"], d["copy"], d["cores"])


@dataclass
class Estimate:
    time: float           # seconds, slowest rank
    steps: int            # most steps of any rank
    bytes_sent: int       # most bytes sent (or published) by any rank


class _Timing(Semantics):
    """Time instead of data: each rank's clock, messages carrying their arrival time, windows the
    time they become readable."""

    def __init__(self, scheds, itemsize, machine, klass, stretch, hosts):
        n = len(scheds)
        self.itemsize, self.m, self.klass, self.stretch, self.hosts = itemsize, machine, klass, stretch, hosts
        self.seg = scheds[0].segment if scheds else False
        self.half = machine.link("seg").alpha / 2 if self.seg else 0.0
        self.up: dict = {}          # host -> time its outgoing link is free (class "tcp" only)
        self.down: dict = {}
        self.clock = [0.0] * n
        self.chan: dict[tuple[int, int], deque] = {}
        self.cur = [-1] * n                        # the step whose sends and receives are being timed
        self.t, self.recv_free, self.out_done, self.sent = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
        self.published = [-1] * n
        self.visible: dict[tuple[int, int], float] = {}     # (rank, round) -> when others can read its window

    def _enter(self, r, k) -> None:
        if self.cur[r] != k:        # local operations are done: time the rest of the step from here
            self.cur[r] = k
            self.t[r] = self.recv_free[r] = self.out_done[r] = self.clock[r]

    def _work(self, r, count, reduce) -> float:
        return count * self.itemsize * (self.m.gamma if reduce else self.m.copy) * self.stretch[r]

    def begin(self, r, k):
        if k and any(p < k - 1 for p in self.published):
            return False
        if k:
            self.clock[r] = max([self.clock[r]] + [self.visible[(p, k - 1)] for p in range(len(self.clock))
                                                   if p != r])
        return True

    def local(self, r, k, o):
        if type(o) is Post:
            self.sent[r] += o.count * self.itemsize
            return
        self.clock[r] += self._work(r, o.count, o.reduce)
        if type(o) is Copy and o.dst == "win":
            self.sent[r] += o.count * self.itemsize

    def send(self, r, k, o):
        self._enter(r, k)
        f, kl = self.stretch[r], self.klass(r, o.peer)
        link = self.m.link(kl)
        nb = o.count * self.itemsize
        t = self.t[r] + link.alpha / 2 * f
        if kl == "tcp" and self.hosts is not None:
            # the wire runs on after the kernel took the data: the sender waits only until what is
            # left fits in the socket buffer
            hs, hd = self.hosts[r], self.hosts[o.peer]
            arrive = max(t, self.up.get(hs, 0.0), self.down.get(hd, 0.0)) + nb * link.beta
            self.up[hs] = self.down[hd] = arrive
            t = max(t, arrive - min(nb, SOCKET_BUFFER) * link.beta)
        else:
            t += nb * link.beta * (f if kl == "shm" else 1.0)
            arrive = t
        self.t[r] = t
        self.sent[r] += nb
        self.chan.setdefault((r, o.peer), deque()).append((arrive, link.alpha / 2 * f))

    def publish(self, r, k):
        self.clock[r] += self.half
        self.visible[(r, k)] = self.clock[r] + self.half
        self.published[r] = k

    def take(self, r, k, o):
        if type(o) is Recv:
            self._enter(r, k)
            q = self.chan.get((o.peer, r))
            if not q:
                return False
            arrive, overhead = q.popleft()
            if self.klass(o.peer, r) == "shm":     # the receiver copies out of the ring itself, one at a time
                nb = o.count * self.itemsize
                arrive = max(arrive, self.recv_free[r] + nb * self.m.link("shm").beta * self.stretch[r])
            done = max(self.recv_free[r], arrive) + overhead       # receives are handled one by one
            self.recv_free[r] = done
            if o.reduce:
                done += o.count * self.itemsize * self.m.gamma * self.stretch[r]
            self.out_done[r] = max(self.out_done[r], done)
            return True
        if self.published[o.peer] < k:
            return False
        if o.peer != r:
            self.clock[r] = max(self.clock[r], self.visible[(o.peer, k)])
        if type(o) is Get:
            self.clock[r] += self._work(r, o.count, o.reduce)
        return True

    def end(self, r, k):
        if not self.seg:
            self._enter(r, k)
            self.clock[r] = max(self.out_done[r], self.t[r])


def estimate(scheds: list[Schedule], itemsize: int, machine: Machine, klass, stretch: list[float],
             hosts: list | None = None) -> Estimate:
    """Model the run of ``scheds`` (one per rank) through the walker.

    ``klass(a, b)`` is the link class between ranks a and b; ``stretch[r]`` the
    CPU oversubscription factor of rank r's host (>= 1). With ``hosts`` (the host
    of each rank), messages between hosts share their hosts' network links: a
    host's outgoing messages cross its link one after another, and so do its
    incoming ones (which is what makes combining a host's traffic pay).
    Segment schedules: publishing a round costs half the measured round latency
    ("seg" alpha) and the window becomes readable the other half later; copies
    and reductions from windows cost their per-byte rates.
    """
    sem = _Timing(scheds, itemsize, machine, klass, stretch, hosts)
    walk(scheds, sem)
    return Estimate(max(sem.clock, default=0.0), max((len(s.steps) for s in scheds), default=0),
                    max(sem.sent, default=0))
