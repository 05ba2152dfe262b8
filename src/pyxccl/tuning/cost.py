"""The alpha-beta-gamma cost model, run over schedules as a small event simulation.

The tuner prices algorithms with it on the communicator's own topology, and the
simulator (``pyxccl.sim``) runs it on modelled clusters: one model, walked over the
very schedules the engine runs, through the walker the engine uses (``walk.py``),
steps started in time order so that transfers sharing a link take it first come,
first served (each at the earliest interval its links are free: ``Booked``).

A message costs ``alpha`` plus ``bytes * beta`` of its link class; what ``alpha`` is
depends on the machine:

- **CPU machines** (this one, as pyxccl measured it): in Python the per-message cost
  is mostly software at both ends, not the wire, so half of ``alpha`` is paid by the
  sender's CPU and half by the receiver's; a rank's sends in a step go one after the
  other, and so do its receives; a receive that reduces costs ``bytes * gamma`` more,
  a local copy ``bytes * copy``. Shared-memory transfers are copies by the processes
  themselves. On a host with more ranks than cores every CPU cost (per-message
  overheads, copies, reductions, shared-memory transfers) stretches by
  ranks/cores. A call whose buffers do not fit the last-level cache (all of the
  host's ranks' together) moves through memory: each byte an operation reads from
  or writes to a user buffer (not a window of the segment, which stays in cache)
  costs ``mem``, one process's rate (a core streams at its own rate: two copies at
  once here run as fast each as one alone), stretched as CPU costs are where ranks
  share cores, when that is more than its rate in cache. (A host whose cores
  together outrun its memory bus is priced fast: the bus is not measured.)
  Messages between hosts cross their hosts' network links (see ``Net``), and a
  sender waits only until what is left fits its socket buffer.
- **DMA machines** (``sim.Cluster`` presets: GPUs, NICs): ``alpha`` is the latency
  end to end, paid once; sending takes no processor time, so a rank's transfers of a
  step run side by side, limited only by the links they share; a reducing receive
  reduces as the bytes arrive (or after them, ``reduce_overlap=False``).

A step ends when its sends are out and its receives are in; a receive can't
complete before the sender sent it. Segment schedules (the one-host fast path) are
priced by the same walk: a round's window becomes readable after the measured round
latency, and the copies and reductions on windows cost what copies and reductions
cost, except where the figures were measured (``sim.calibrate``: ``peer``, ``win_write``):
a window's lines live in the cache of the core that used them last, so reading a peer's
window, and writing the part of one's own window that the others read in its last round,
cost what they were measured to cost at their size (every rank at once; 4x a copy in
cache at 64-256 KiB on this machine), a reduction no less than a reduction of its size with
every rank reducing at once (``red``; 1.1-1.6x the probe's one figure here), and the bytes written
into a buffer the C executor writes with non-temporal stores at such copies' rate (``streamed``);
a piece put into several outputs one after another is read from memory once.

The model's answer for a collective is the time of the slowest rank.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import Counter, deque
from copy import copy as shallow_copy
from dataclasses import dataclass, field

from ..schedule import Copy, Get, Post, Put, Recv, Schedule
from ..walk import Semantics, walk


SOCKET_BUFFER = 4 << 20     # bytes a TCP send hands to the kernel before it waits for the wire
CALL_BUFFERS = ("in", "out", "tmp")    # buffers of the call (in memory when large); "win" is the segment's window


@dataclass(frozen=True)
class Link:
    alpha: float      # seconds per message
    beta: float       # seconds per byte


#: Figures of link classes nobody measured yet: shared memory, TCP on one host, TCP between hosts.
DEFAULT_LINKS = {"shm": Link(20e-6, 1 / 4e9), "tcp_local": Link(40e-6, 1 / 2e9), "tcp": Link(60e-6, 1 / 1.1e9),
                 "seg": Link(5e-6, 1 / 8e9)}


@dataclass
class Machine:
    """What one host's links and cores can do (measured by pyxccl/probe.py or read from a file)."""
    links: dict[str, Link] = field(default_factory=dict)
    gamma: float = 2e-10         # seconds per byte reduced
    copy: float = 1.5e-10        # seconds per byte copied locally
    cores: int = 1
    source: str = field(default="", compare=False)    # how the figures were got (probe.measure says)
    mem: float = 0.0             # seconds per byte read or written in memory, one process (0: not known)
    cache: int = 32 << 20        # bytes of the last-level cache
    cma: Link | None = None      # a single-copy read from another process (None: priced as a copy)
    peer: tuple = ()             # reading a window another rank just wrote: ((bytes, seconds), ...) (): a copy
    win_write: tuple = ()        # writing one's window the others read last round: the same (): a copy
    mem_at: tuple = ()           # a copy between two call buffers of each size, every rank at once, CPU time:
                                 # ((bytes, seconds), ...) (sim.calibrate; (): ``mem`` beyond ``cache``)
    mem_nt_at: tuple = ()        # the same copy with non-temporal stores (into the buffers ``streamed`` says)
    red: tuple = ()              # a reduction of each size, every rank at once, CPU time: the same (): gamma

    def link(self, klass: str) -> Link:
        """Measured figures of ``klass``, else the defaults."""
        return self.links.get(klass) or DEFAULT_LINKS[klass]

    def to_json(self) -> dict:
        return {"links": {k: [v.alpha, v.beta] for k, v in self.links.items()}, "gamma": self.gamma,
                "copy": self.copy, "cores": self.cores, "mem": self.mem, "cache": self.cache}

    @classmethod
    def from_json(cls, d: dict) -> "Machine":
        return cls({k: Link(*v) for k, v in d["links"].items()}, d["gamma"], d["copy"], d["cores"],
                   mem=d.get("mem", 0.0), cache=d.get("cache", 32 << 20))


def at_size(table, nbytes: int) -> float:
    """Seconds for ``nbytes`` from ``table``, (bytes, seconds) measured at a few sizes in increasing
    order: linear between two sizes, in proportion below the first, at the last one's rate beyond it."""
    b0, t0 = table[0]
    if nbytes <= b0:
        return t0 * nbytes / b0
    for b1, t1 in table[1:]:
        if nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
        b0, t0 = b1, t1
    return t0 * nbytes / b0


def streamed(scheds, itemsize: int, local: int, cache: int) -> frozenset:
    """The call buffers the C executor writes with non-temporal stores (``_native.c``, ``nt_bytes``): those
    written (a buffer posted for the others' Puts too: its owner's own Put streams) and never reduced into
    whose extent in the program, on each of the host's ``local`` ranks
    together, is larger than the last-level cache."""
    need: dict = {}
    written, reduced = set(), set()
    for s in scheds:
        for step in s.steps:
            for o in step:
                t = type(o)
                ends = ((o.src, o.src_off + o.count), (o.dst, o.dst_off + o.count)) if t is Copy else \
                    ((o.buf, o.off + o.count),) if t in (Get, Post, Put) else ()
                for b, end in ends:
                    need[b] = max(need.get(b, 0), end)
                to = o.dst if t is Copy else o.buf if t is Get or (t is Post and o.writes) else None
                if to is not None:
                    (reduced if t is not Post and o.reduce else written).add(to)
    return frozenset(b for b in written - reduced
                     if b in CALL_BUFFERS and need[b] * itemsize * local > cache)


def memory_term(mem: float, cache: int, mem_at: tuple, local: int, working_set: int,
                stretch: float) -> tuple[float, float]:
    """(share of a call's bytes in memory, seconds a rank pays per byte read or written there) for a call
    whose buffers take ``working_set`` bytes on each of its host's ``local`` ranks.

    With ``mem_at`` (a copy between two buffers, measured at a few sizes with every rank of the host
    copying at once, in CPU time: what the cache levels and the memory, shared with the ranks on the
    other cores, give a rank while it runs), every such byte costs what a copy costs per byte read or
    written at the call's size (a copy of W/2 bytes reads and writes W), stretched where ranks share
    cores: where the buffers fit a cache that is about a copy in cache, and ``Timing._cost`` keeps the
    larger of the two. Without it, the buffers of all the host's ranks either fit the last-level cache
    (nothing from memory) or not (all of it, at ``mem``, one process's rate alone, stretched)."""
    if not working_set:
        return 0.0, 0.0
    if mem_at:
        return 1.0, at_size(mem_at, working_set / 2) / working_set * stretch
    if mem:
        return (1.0 if local * working_set > cache else 0.0), mem * stretch
    return 0.0, 0.0


@dataclass
class Estimate:
    time: float           # seconds, slowest rank
    steps: int            # most steps of any rank
    bytes_sent: int       # most bytes sent (or published) by any rank
    messages: int = field(default=0, compare=False)     # messages sent, all ranks together
    # (the ranks walked, each one's clock at its end), for a walk that goes on from there (select.py's phases)
    ends: tuple = field(default=((), ()), compare=False, repr=False)


class HostLinks:
    """The link classes of a communicator whose transports follow its hosts (a mesh's rule,
    ``transport/mesh.py`` ``kind_between``): ``inside`` ("shm", or "tcp_local" for a job over TCP)
    between two ranks of one host, "tcp" between hosts, "self" for a rank and itself. A ``klass``
    the tuner need not ask pair by pair (which is n x ranks-per-host calls at the first price of a
    communicator: 32,768 at 4,096 ranks)."""

    def __init__(self, hosts: list[int], inside: str):
        self.hosts, self.inside = hosts, inside

    def __call__(self, a: int, b: int) -> str:
        return "self" if a == b else self.inside if self.hosts[a] == self.hosts[b] else "tcp"


class Net:
    """What the model needs to know of where ranks are: the link class of a pair (``klass``),
    each class's figures (``link``), and the shared resources a transfer holds while it crosses
    (``route``: hashable keys; one transfer at a time on each).

    This one is the tuner's: a communicator's ranks on hosts (``hosts``, or None for one
    host), every transfer between hosts holding its source host's outgoing link and its
    destination host's incoming one. ``shape``: its ``fast.Shape`` when its hosts are alike (the C
    core can walk it); ``sym``: folded (``symmetric.py``), host 0's ranks standing for every host's.

    Steps are started in the order of time (``timed``), as the simulator's nets are: one model for
    both, so that the tuner chooses what ``pyxccl sim`` predicts. (Walked rank by rank, as before
    the simulator, a rank running ahead books a host's link into the future; the one measured case
    that walk got right, 2 hosts x 2 at 1 Gbit/s where time order picks alltoall pairwise over
    direct, 7-14% slower at 4-16 MiB, is the model pricing pairwise's steps too low.) On one host
    the two orders give the same estimates."""
    cpu = True
    reduce_overlap = False
    timed = True

    def __init__(self, machine: Machine, klass, stretch: list[float], hosts: list | None = None,
                 shape=None, sym=None):
        self.klass, self.stretch, self.hosts = klass, stretch, hosts
        self.gamma, self.copy, self.mem, self.cache = machine.gamma, machine.copy, machine.mem, machine.cache
        self.cma, self.peer, self.win_write = machine.cma, machine.peer, machine.win_write
        self.mem_at, self.mem_nt_at, self.red = machine.mem_at, machine.mem_nt_at, machine.red
        self._links = machine.link
        self.seg = machine.link("seg")
        self._shape, self.sym = shape, sym
        per = Counter(hosts) if hosts is not None else None
        self._local = [per[h] for h in hosts] if per else None

    def folded(self, sym) -> "Net":
        """This net folded by ``sym`` (its hosts alike: ``shape`` is not None)."""
        net = shallow_copy(self)
        net.sym = sym
        return net

    def shape(self):
        return self._shape

    def local(self, r: int) -> int:
        """Ranks on ``r``'s host (their buffers together decide whether a call fits the cache)."""
        return self._local[r] if self._local is not None else len(self.stretch)

    def link(self, kl: str) -> Link:
        return self._links(kl)

    def route(self, a: int, b: int, kl: str) -> tuple:
        if kl != "tcp" or self.hosts is None:
            return ()
        if self.sym is not None:        # every host's links are host 0's
            return ("up", 0), ("down", 0)
        return ("up", self.hosts[a]), ("down", self.hosts[b])

    def chan(self, a: int, b: int):
        """The key of the message channel a -> b (folded: what the move leaves unchanged)."""
        return (a, b) if self.sym is None else self.sym.key(a, b)

    def wakes(self, r: int) -> int:
        """The rank walked for ``r`` (a message to ``r`` may let it go on)."""
        return r if self.sym is None else self.sym.rep(r)


class Booked:
    """The shared resources' busy intervals (a host's link, a NIC, a bus): a transfer of ``d`` seconds
    ready at ``t`` takes the earliest interval at or after ``t`` that is free on every resource it
    crosses (:meth:`take`). Steps are walked in time order, but one step books all its messages at
    once, at times spread by its sender's per-message cost; a link booked only up to "the end of the
    last booking" made every rank walked later wait behind them, though the link was free between
    (the 8 B direct alltoall on 16 x 8 ranks: 410 ms walked against 29 folded). The C core
    (``_simcore.c``'s ``book``) does the same operations in the same order."""

    def __init__(self):
        self.starts: dict = {}      # resource -> starts of its busy intervals, in order (disjoint)
        self.ends: dict = {}

    def take(self, res: tuple, t: float, d: float) -> float:
        """The start of the earliest ``d`` seconds free on every resource of ``res`` at or after
        ``t``, booked on each (touching intervals joined). A transfer of no length holds nothing: ``t``."""
        if d <= 0:
            return t
        s, moved = t, True
        while moved:
            moved = False
            for x in res:
                ends = self.ends.get(x)
                if ends:
                    j = bisect_right(ends, s)       # the first interval that ends after s
                    if j < len(ends) and self.starts[x][j] < s + d:
                        s, moved = ends[j], True
        e = s + d
        for x in res:
            starts, ends = self.starts.setdefault(x, []), self.ends.setdefault(x, [])
            j = bisect_right(ends, s)
            if j and ends[j - 1] == s:          # joins the one before
                if j < len(starts) and starts[j] == e:
                    ends[j - 1] = ends[j]
                    del starts[j], ends[j]
                else:
                    ends[j - 1] = e
            elif j < len(starts) and starts[j] == e:
                starts[j] = s
            else:
                starts.insert(j, s)
                ends.insert(j, e)
        return s


class Timing(Semantics):
    """Time instead of data: each rank's clock, messages carrying their arrival time, windows the
    time they become readable, shared resources their busy intervals (:class:`Booked`)."""
    # (SpotTiming) the walked ranks that the ranks not walked are like (all but a root), empty where every rank
    # is walked: what the others read of such a rank's window is what it reads of theirs, and a rank not
    # walked publishes a round when the last of them does
    like: frozenset = frozenset()

    def __init__(self, scheds: list[Schedule], itemsize: int, net: Net, inplace: bool = False,
                 working_set: int = 0):
        n = len(scheds)
        self.index = {s.rank: i for i, s in enumerate(scheds)}
        self.like_at = [self.index[r] for r in self.like]     # (SpotTiming) where the ranks in ``like`` are
        self.rank_of = [s.rank for s in scheds]
        self.itemsize, self.net, self.inplace = itemsize, net, inplace
        self.timed = net.timed
        self.seg = scheds[0].segment if scheds else False
        self.half = net.seg.alpha / 2 if self.seg else 0.0
        self.stretch = [net.stretch[s.rank] for s in scheds]
        # the share of the call's bytes that live in memory, not in cache, and what a byte read or
        # written there costs each rank of the host
        self.memshare, self.membyte = 0.0, [0.0] * n
        self.streamed: frozenset = frozenset()     # buffers the C executor writes with non-temporal stores
        if net.cpu and scheds:
            local = net.local(scheds[0].rank)
            terms = [memory_term(net.mem, net.cache, getattr(net, "mem_at", ()), local, working_set, st)
                     for st in self.stretch]
            self.memshare, self.membyte = terms[0][0], [b for _, b in terms]
            nt_at = getattr(net, "mem_nt_at", ())
            if self.seg and nt_at and working_set:
                self.streamed = streamed(scheds, itemsize, local, net.cache)
                self.membyte_nt = [memory_term(net.mem, net.cache, nt_at, local, working_set, st)[1]
                                   for st in self.stretch]
        self.cma = getattr(net, "cma", None)       # a single-copy read's own rate, when measured
        self.peer = getattr(net, "peer", ())       # a read of a window another rank just wrote, when measured
        self.win_write = getattr(net, "win_write", ())     # a write of a window the others read, when measured
        self.red = getattr(net, "red", ())         # a reduction at its size, every rank at once, when measured
        self.held = self._held(scheds) if self.seg and self.win_write else {}
        self.posted: set = set()                   # (rank, round) that posted a user buffer to read in place
        self.posting = [None] * n                  # the buffer each rank posted last (its own Puts' target)
        self.put_from = [None] * n                 # what each rank's last Put read: (buffer, offset, count)
        self.booked = Booked()                     # the shared resources' busy times
        self.clock = [0.0] * n
        self.chan: dict = {}
        self.cur = [-1] * n                        # the step whose sends and receives are being timed
        self.t, self.recv_free, self.out_done, self.sent = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
        self.messages = 0
        self.published = [-1] * n
        self.visible: dict[tuple[int, int], float] = {}     # (rank, round) -> when others can read its window

    def _held(self, scheds) -> dict:
        """(rank, round) -> the share of what the rank writes to its window in the round that other ranks
        read (in the round, or in the next with ``prev``): as calls repeat, their cores hold those
        lines when it writes them again."""
        posts = {(s.rank, k) for s in scheds for k, step in enumerate(s.steps) if any(type(o) is Post for o in step)}
        rounds = {k for _, k in posts}
        unwalked_too = (getattr(scheds, "nranks", len(scheds)) - len(scheds) + len(self.like)) / max(1, len(self.like))
        read: Counter = Counter()
        written: Counter = Counter()
        for s in scheds:
            for k, step in enumerate(s.steps):
                for o in step:
                    t = type(o)
                    if t is Get and o.peer != s.rank:
                        k0 = k - 1 if o.prev else k
                        if not self.like or s.rank not in self.like:    # every rank walked, or the root reads
                            if (o.peer, k0) not in posts:
                                read[(o.peer, k0)] += o.count
                        elif o.peer in self.like or o.peer not in self.index:
                            if k0 not in rounds:    # the others read of mine what I read of theirs
                                read[(s.rank, k0)] += o.count
                        elif (o.peer, k0) not in posts:     # every rank like me reads the root's as I do
                            read[(o.peer, k0)] += o.count * unwalked_too
                    if t in (Copy, Get) and (o.dst if t is Copy else o.buf) == "win" and not o.reduce:
                        written[(s.rank, k)] += o.count
        return {key: min(1.0, read[key] / w) for key, w in written.items() if w}

    def now(self, r) -> float:
        return self.clock[self.index[r]]

    def wakes(self, r) -> int:
        return self.net.wakes(r)

    def _enter(self, i, k) -> None:
        if self.cur[i] != k:        # local operations are done: time the rest of the step from here
            self.cur[i] = k
            self.t[i] = self.recv_free[i] = self.out_done[i] = self.clock[i]

    def _cost(self, i, nbytes, rate, touches, streamed=False) -> float:
        """``nbytes`` at ``rate`` (seconds per byte in cache) by rank index i, ``touches`` of them in user
        buffers: their share in memory costs what the host's memory gives each rank, if that is more
        (``streamed``: into a buffer written with non-temporal stores, what such a copy costs)."""
        cpu = rate * self.stretch[i]
        if not self.memshare or not touches:
            return nbytes * cpu
        byte = (self.membyte_nt if streamed else self.membyte)[i]
        return nbytes * (cpu * (1 - self.memshare) + self.memshare * max(cpu, touches * byte))

    def _put(self, i, o: Put) -> float:
        """A Put: the writer's core copies its block into the posted buffer (user buffers both), by a single
        copy into another process (priced at the single-copy read's figures) unless it is its own (then
        into a streamed buffer as ``streamed`` says). The piece the Put before read is in the cache: an
        allgather's block put into every output a piece at a time is read from memory once."""
        again = self.put_from[i] == (o.buf, o.off, o.count)
        self.put_from[i] = (o.buf, o.off, o.count)
        touches = (o.buf in CALL_BUFFERS and not again) + 1
        nbytes = o.count * self.itemsize
        if o.peer != self.rank_of[i] and self.cma is not None:
            return self.cma.alpha * self.stretch[i] + self._cost(i, nbytes, max(self.net.copy, self.cma.beta), touches)
        return self._cost(i, nbytes, self.net.copy, touches, o.peer == self.rank_of[i] and self.posting[i] in self.streamed)

    def _work(self, i, k, o, src_user: bool) -> float:
        """A local copy or reduction, or a Get (``src_user``: of a buffer its owner posted, read in place
        by a single copy from another process when it is not this rank's), in round ``k``."""
        to = o.dst if type(o) is Copy else o.buf
        touches = src_user + (to in CALL_BUFFERS) * (2 if o.reduce else 1)
        rate = self.net.gamma if o.reduce else self.net.copy
        nbytes = o.count * self.itemsize
        t = None
        if type(o) is Get and o.peer != self.rank_of[i]:
            if src_user and self.cma is not None:
                return self.cma.alpha * self.stretch[i] + self._cost(i, nbytes, max(rate, self.cma.beta), touches)
            if not src_user and self.peer:
                # the bytes come from the writer's core's cache; the figures are one rank's CPU time with
                # all the host's ranks at once (stretched where ranks share cores, as the copies)
                t = max(self._cost(i, nbytes, rate, touches), at_size(self.peer, nbytes) * self.stretch[i])
        if t is None:
            t = self._cost(i, nbytes, rate, touches, to in self.streamed)
        if o.reduce and self.red:       # (measured in CPU time: stretched where ranks share cores)
            t = max(t, at_size(self.red, nbytes) * self.stretch[i])
        held = self.held.get((self.rank_of[i], k), 0.0) if to == "win" and not o.reduce else 0.0
        if held:
            # writing the window: the lines the others read in its last round are in their cores' caches
            # and must be taken back (the rest costs what a copy costs)
            t = max(t, self._cost(i, nbytes * (1 - held), rate, touches)
                    + at_size(self.win_write, nbytes * held) * self.stretch[i])
        return t

    def begin(self, r, k, free):
        if k and not free and any(p < k - 1 for p in self.published):
            return False
        i = self.index[r]
        if k and not free:       # (a rank not walked, like this one, published when this one did)
            self.clock[i] = max([self.clock[i]] + [self.visible[(p, k - 1)] for p in range(len(self.clock))
                                                   if p != i or p in self.like_at])
        return True

    def local(self, r, k, o):
        i = self.index[r]
        if type(o) is Post:
            if not o.writes:        # (a buffer the others write into: they send)
                self.sent[i] += o.count * self.itemsize
            self.posted.add((r, k))
            self.posting[i] = o.buf
            return
        if self.inplace and type(o) is Copy and o.src == "in" and o.dst == "out" and o.src_off == o.dst_off:
            return      # the same buffer: the engine does not copy
        self.clock[i] += self._work(i, k, o, o.src in CALL_BUFFERS if type(o) is Copy else (o.peer, k - 1) in self.posted)
        if type(o) is Copy and o.dst == "win":
            self.sent[i] += o.count * self.itemsize

    def send(self, r, k, o):
        i, net = self.index[r], self.net
        self._enter(i, k)
        kl = net.klass(r, o.peer)
        link, res = net.link(kl), net.route(r, o.peer, kl)
        nb = o.count * self.itemsize
        self.sent[i] += nb
        self.messages += 1
        if not net.cpu:             # a DMA engine moves it: the sender's processor goes on at once
            start = self.booked.take(res, self.t[i], nb * link.beta)
            end = start + nb * link.beta
            self.out_done[i] = max(self.out_done[i], end)
            self.chan.setdefault(net.chan(r, o.peer), deque()).append((end + link.alpha, start))
            return
        f = self.stretch[i]
        t = self.t[i] + link.alpha / 2 * f
        if res:
            # the wire runs on after the kernel took the data: the sender waits only until what is
            # left fits in the socket buffer
            arrive = self.booked.take(res, t, nb * link.beta) + nb * link.beta
            t = max(t, arrive - min(nb, SOCKET_BUFFER) * link.beta)
        else:
            t += self._cost(i, nb, link.beta, 1) if kl == "shm" else nb * link.beta
            arrive = t
        self.t[i] = t
        self.chan.setdefault(net.chan(r, o.peer), deque()).append((arrive, link.alpha / 2 * f))

    def publish(self, r, k):
        i = self.index[r]
        self.clock[i] += self.half
        self.visible[(i, k)] = self.clock[i] + self.half
        self.published[i] = k

    def take(self, r, k, o):
        i = self.index[r]
        if type(o) is Recv:
            self._enter(i, k)
            q = self.chan.get(self.net.chan(o.peer, r))
            if not q:
                return False
            arrive, extra = q.popleft()
            net, nb = self.net, o.count * self.itemsize
            if not net.cpu:         # extra: when the transfer started
                done = arrive
                if o.reduce:
                    done = max(arrive, extra + nb * net.gamma) if net.reduce_overlap else arrive + nb * net.gamma
                self.out_done[i] = max(self.out_done[i], done)
                return True
            if net.klass(o.peer, r) == "shm":     # the receiver copies out of the ring itself, one at a time
                arrive = max(arrive, self.recv_free[i] + self._cost(i, nb, net.link("shm").beta, 1 + o.reduce))
            done = max(self.recv_free[i], arrive) + extra       # receives are handled one by one
            self.recv_free[i] = done
            if o.reduce:
                done += nb * net.gamma * self.stretch[i]
            self.out_done[i] = max(self.out_done[i], done)
            return True
        p = self.index.get(o.peer)
        if p is None:       # (SpotTiming) a rank not walked publishes its round when the last one it is like does
            if min(self.published[j] for j in self.like_at) < k:
                return False
            self.clock[i] = max([self.clock[i]] + [self.visible[(j, k)] for j in self.like_at])
        elif self.published[p] < k:
            return False
        elif p != i:
            self.clock[i] = max(self.clock[i], self.visible[(p, k)])
        if type(o) is Get:
            self.clock[i] += self._work(i, k, o, (o.peer, k) in self.posted)
        elif type(o) is Put:
            self.clock[i] += self._put(i, o)
            if p != i:
                self.sent[i] += o.count * self.itemsize
        return True

    def end(self, r, k):
        if not self.seg:
            i = self.index[r]
            self._enter(i, k)
            self.clock[i] = max(self.out_done[i], self.t[i])


class Spots(list):
    """The segment schedules of a few ranks (``spot_ranks``) of ``nranks`` whose ranks are alike but for
    ``root`` (``Algorithm.alike``; a rooted call's root among them), to be walked for all of them
    (:class:`SpotTiming`)."""

    def __init__(self, scheds: list[Schedule], nranks: int, root: int | None = None):
        super().__init__(scheds)
        self.nranks, self.root = nranks, root


def spot_ranks(n: int, root: int | None = None) -> list[int]:
    """The ranks walked for all: rank 0 (a reduction's first, whose own block it copies rather than
    reduces), rank 1, the middle one, the last, and a rooted call's root."""
    return sorted({0, min(1, n - 1), n // 2, n - 1} | ({root} if root is not None else set()))


class _SpotPosts(set):
    """(rank, round) that posted a buffer; a rank not walked posted in a round where those it is like did."""

    def __init__(self, walked, like):
        super().__init__()
        self.walked, self.like = walked, like

    def __contains__(self, key) -> bool:
        r, k = key
        if r in self.walked:
            return set.__contains__(self, key)
        return any(set.__contains__(self, (j, k)) for j in self.like)


class SpotTiming(Timing):
    """:class:`Timing` of a few ranks of a segment call whose ranks are alike (but for a root, walked),
    standing for all: a rank not walked publishes each round when the last of the walked ranks it is like
    does; what the others read of a walked rank's window is what it reads of theirs, and what they read
    of the root's, what it reads of the root's. Its estimate is every rank's walk's within what an element
    a block costs (the shares of ``split_counts``), at the cost of four or five ranks instead of n (whose
    schedules hold n operations each on one host)."""

    def __init__(self, scheds: Spots, itemsize: int, net: Net, working_set: int = 0):
        walked = {s.rank for s in scheds}
        if scheds.nranks > len(scheds):         # ranks not walked (else: Timing's walk of every rank)
            self.like = frozenset(walked - {scheds.root})
        super().__init__(scheds, itemsize, net, False, working_set)
        self.posted = _SpotPosts(walked, self.like)


def run(scheds: list[Schedule], itemsize: int, net: Net, inplace: bool = False,
        working_set: int = 0, start=None) -> tuple[Estimate, list[int]]:
    """Walk ``scheds`` under the model on ``net``: (the estimate, the ranks that could not finish).
    ``working_set``: bytes of a rank's buffers in the call (0: assume they stay in cache). ``Spots``:
    a few ranks' segment schedules walked for all (:class:`SpotTiming`). ``start``: each rank's clock
    at the start (indexed by rank; None: 0)."""
    sem = (SpotTiming(scheds, itemsize, net, working_set) if isinstance(scheds, Spots) else
           Timing(scheds, itemsize, net, inplace, working_set))
    if start is not None:
        sem.clock = [float(start[s.rank]) for s in scheds]
    stuck = walk(scheds, sem)
    return Estimate(max(sem.clock, default=0.0), max((len(s.steps) for s in scheds), default=0),
                    max(sem.sent, default=0), sem.messages, (sem.rank_of, sem.clock)), stuck


def estimate(scheds: list[Schedule], itemsize: int, machine: Machine, klass, stretch: list[float],
             hosts: list | None = None, working_set: int = 0) -> Estimate:
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
    return run(scheds, itemsize, Net(machine, klass, stretch, hosts), working_set=working_set)[0]
