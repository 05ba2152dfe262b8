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

The model's answer for a collective is the time of the slowest rank.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..schedule import Copy, Recv, Schedule, Send


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
    bytes_sent: int       # most bytes sent by any rank


def estimate(scheds: list[Schedule], itemsize: int, machine: Machine, klass, stretch: list[float],
             hosts: list | None = None) -> Estimate:
    """Model the run of ``scheds`` (one per rank).

    ``klass(a, b)`` is the link class between ranks a and b; ``stretch[r]`` the
    CPU oversubscription factor of rank r's host (>= 1). With ``hosts`` (the host
    of each rank), messages between hosts share their hosts' network links: a
    host's outgoing messages cross its link one after another, and so do its
    incoming ones (which is what makes combining a host's traffic pay).
    """
    n = len(scheds)
    up: dict = {}                  # host -> time its outgoing link is free (class "tcp" only)
    down: dict = {}
    clock = [0.0] * n
    chan: dict[tuple[int, int], deque] = {}
    pc, entered, got, sent = [0] * n, [False] * n, [0] * n, [0] * n
    out_done, recv_free = [0.0] * n, [0.0] * n
    progress = True
    while progress:
        progress = False
        for r in range(n):
            steps = scheds[r].steps
            while pc[r] < len(steps):
                step, f = steps[pc[r]], stretch[r]
                if not entered[r]:
                    t = clock[r]
                    for o in step:
                        if type(o) is Copy:
                            t += o.count * itemsize * (machine.gamma if o.reduce else machine.copy) * f
                    clock[r] = t
                    for o in step:
                        if type(o) is Send:
                            k = klass(r, o.peer)
                            link = machine.link(k)
                            nb = o.count * itemsize
                            t += link.alpha / 2 * f
                            if k == "tcp" and hosts is not None:
                                # the wire runs on after the kernel took the data: the sender waits
                                # only until what is left fits in the socket buffer
                                hs, hd = hosts[r], hosts[o.peer]
                                arrive = max(t, up.get(hs, 0.0), down.get(hd, 0.0)) + nb * link.beta
                                up[hs] = down[hd] = arrive
                                t = max(t, arrive - min(nb, SOCKET_BUFFER) * link.beta)
                            else:
                                t += nb * link.beta * (f if k == "shm" else 1.0)
                                arrive = t
                            sent[r] += nb
                            chan.setdefault((r, o.peer), deque()).append((arrive, link.alpha / 2 * f))
                    out_done[r], entered[r], got[r] = t, True, 0
                    recv_free[r] = clock[r]
                    progress = True
                recvs = [o for o in step if type(o) is Recv]
                while got[r] < len(recvs):
                    o = recvs[got[r]]
                    q = chan.get((o.peer, r))
                    if not q:
                        break
                    arrive, overhead = q.popleft()
                    done = max(recv_free[r], arrive) + overhead      # receives are handled one by one
                    recv_free[r] = done
                    if o.reduce:
                        done += o.count * itemsize * machine.gamma * f
                    out_done[r] = max(out_done[r], done)
                    got[r] += 1
                    progress = True
                if got[r] < len(recvs):
                    break
                clock[r] = out_done[r]
                pc[r] += 1
                entered[r] = False
    return Estimate(max(clock, default=0.0), max((len(s.steps) for s in scheds), default=0), max(sent, default=0))


def fast_estimate(primitive: str, n: int, nbytes: int, machine: Machine, stretch: float, area: int,
                  oneshot: int) -> Estimate:
    """The one-host fast path (fastpath.py), which moves data by rounds on a shared segment:
    ``alpha`` of link class "seg" per round, copies at ``copy``, reductions at ``gamma``,
    CPU costs stretched when the host has more ranks than cores."""
    a = machine.link("seg").alpha
    c, g = machine.copy * stretch, machine.gamma * stretch
    B, per_rank = nbytes, nbytes / n

    def rounds(span):
        return max(1, -(-int(span) // area)) if span else 0
    if primitive in ("allreduce", "reduce"):
        if B <= oneshot:
            t = rounds(B) * a + 2 * B * c + (n - 1) * B * g
        else:
            t = 2 * rounds(B) * a + 2 * B * c + (n - 1) * per_rank * g
    elif primitive == "reduce_scatter":
        t = rounds(B) * a + B * c + per_rank * c + (n - 1) * per_rank * g
    elif primitive in ("allgather", "gather"):
        t = rounds(per_rank) * a + per_rank * c + B * c
    elif primitive in ("alltoall", "scatter"):
        t = rounds(B) * a + 2 * B * c
    elif primitive == "broadcast":
        t = rounds(B) * a + 2 * B * c
    else:
        t = a
    return Estimate(t, max(1, rounds(B)), int(B))
