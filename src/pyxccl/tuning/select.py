"""The tuner: for a call, model every algorithm that can run on this communicator's
topology and take the cheapest (NCCL's argmin over a cost table, but the table
comes from the schedules, walked by the cost model). Choices are cached per size
bucket (powers of two).

Pricing: on a communicator whose hosts are alike (the same number of ranks, consecutive, one link
class inside a host, one stretch) every rank's message schedules are walked in the C core
(``fast.py``), as ``pyxccl sim`` walks them at message level; above ``FOLD_ABOVE`` ranks, an
algorithm whose schedules are the same on every host moved (``symmetric.find``: proven on four other
hosts) is walked for host 0's ranks only, folded: ``pyxccl sim``'s symmetric mode, which costs what
one host's ranks cost. Other algorithms (trees, rooted collectives) are walked for every rank. Odd
layouts (hosts of different sizes, ranks not consecutive on their hosts, a host unlike the others)
and the segment's schedules are walked in Python, as before."""
from __future__ import annotations

import logging
import os
from collections import Counter

import numpy as np

from .. import algorithms
from ..algorithms import registry
from ..algorithms.segment import Window
from ..primitives import PRIMITIVES
from . import compact, fast, linkcache, symmetric
from .cost import SOCKET_BUFFER, Estimate, Machine, Net
from .shared import SharedTable

log = logging.getLogger("pyxccl")

#: above this many ranks the tuner folds what folds. The fold equals the full walk where the hosts'
#: transfers do not meet on a host's link at the same instant in another order (most algorithms and
#: sizes); where they do, it differs (measured: pairwise alltoall on 4 x 4 and 8 x 4 hosts, up to
#: 23% low; hierarchical allreduce at 16 MiB, 1.6%): below it, every rank is walked, exactly.
FOLD_ABOVE = 64


class Tuner:
    def __init__(self, nranks: int, hosts: list[int], klass, machine: Machine, cores: list[int],
                 segment: tuple[int, bool] | None = None, links: str | None = None):
        """``segment``: (bytes of a rank's window, single-copy reads work) of the one-host fast path,
        or None where there is none. ``links``: what, with ``hosts``, decides ``klass`` (the
        transport asked for); given, the host's processes share their choices (``shared.py``)."""
        self.n, self.hosts, self.klass, self.machine = nranks, hosts, klass, machine
        self.segment = segment
        per_host = Counter(hosts)
        self.stretch = [max(1.0, per_host[hosts[r]] / max(1, cores[r])) for r in range(nranks)]
        self._cache: dict[tuple, str] = {}
        self._net: Net | None = None
        self._shared = None
        if links is not None and nranks > 1:
            inputs = (links, nranks, hosts, self.stretch, machine.to_json(), machine.cma, segment)
            self._shared = SharedTable.open(os.path.dirname(linkcache.cache_path()), inputs, linkcache.max_age())

    def usable(self, algo: registry.Algorithm) -> bool:
        return (self.segment is not None or not algo.segment) and algo.runs(self.n)

    def net(self) -> Net:
        """The cost model's view of this communicator (made once: its shape checks every pair of a host)."""
        if self._net is None:
            self._net = Net(self.machine, self.klass, self.stretch, self.hosts, self._shape())
        return self._net

    def _shape(self) -> fast.Shape | None:
        """The communicator as the C core sees it, when its hosts are alike: consecutive blocks of
        ranks of one size, one stretch, one link class inside every host ("shm" or "tcp_local";
        between hosts the class is checked on the pairs walked, ``_classes``)."""
        n, hosts = self.n, self.hosts
        nh = len(set(hosts))
        if nh < 1 or n % nh or len(set(self.stretch)) != 1:
            return None
        p = n // nh
        if any(len(set(hosts[b:b + p])) != 1 for b in range(0, n, p)):
            return None
        inside = {self.klass(a, b) for a in range(n) for b in range(a - a % p, a - a % p + p) if a != b}
        if len(inside) > 1 or not inside <= {"shm", "tcp_local"}:
            return None
        kl = inside.pop() if inside else "shm"
        m = self.machine
        return fast.Shape(p, nh, m.link(kl), m.link("tcp"), m.gamma, m.copy, self.stretch[0], shm_inside=kl == "shm",
                          mem=m.mem, cache=m.cache)

    def _classes(self, scheds, shape: fast.Shape) -> bool:
        """Every pair that ``scheds`` (message schedules) send or receive between has the class the
        shape says ("tcp" between hosts)."""
        c = compact.convert(scheds, written=True)
        ops = np.diff(c.step_start[c.rank_start])
        rank = np.repeat(c.ranks, ops)
        msg = c.kind != compact.COPY
        p, n = shape.per_host, shape.nranks
        inside = "shm" if shape.shm_inside else "tcp_local"
        for key in np.unique(rank[msg] * n + c.peer[msg]).tolist():
            a, b = divmod(key, n)
            want = inside if a // p == b // p else "tcp"
            if self.klass(a, b) != want or self.klass(b, a) != want:
                return False
        return True

    def _walked(self, algo: registry.Algorithm, get) -> tuple[list, Net]:
        """(the schedules to walk, the net to walk them on): host 0's, folded, where the communicator
        and the algorithm allow; else every rank's (in the C core where the hosts are alike).
        ``get(rank)``: the rank's schedule (built once)."""
        net = self.net()
        shape = net.shape()
        if shape is not None and shape.hosts > 1 and self.n > FOLD_ABOVE and not algo.segment:
            sym, reps = symmetric.find(get, shape.hosts, shape.per_host, False)
            if sym is not None and self._classes(reps, shape):
                return reps, net.folded(sym)
        scheds = [get(r) for r in range(self.n)]
        if shape is not None and compact.message_schedules(scheds) and not self._classes(scheds, shape):
            net = Net(self.machine, self.klass, self.stretch, self.hosts)       # Python: klass pair by pair
        return scheds, net

    def _builder(self, primitive: str, name: str, nbytes: int, itemsize: int):
        """(the algorithm, its schedule of a rank, built once), or None where it cannot run here."""
        algo = registry.lookup(primitive, name)
        if not self.usable(algo):
            return None
        args = PRIMITIVES[primitive].sized(self.n, nbytes, itemsize)
        window = Window.of(self.segment[0], itemsize, self.segment[1]) if algo.segment else None
        built: dict[int, object] = {}

        def get(r: int):
            s = built.get(r)
            if s is None:
                s = built[r] = algo.schedule(r, self.n, hosts=self.hosts, window=window, **args)
            return s
        return algo, get

    def model(self, primitive: str, name: str, nbytes: int, itemsize: int = 4) -> Estimate | None:
        """The model's estimate for ``name`` (None if the algorithm can't run this call here)."""
        got = self._builder(primitive, name, nbytes, itemsize)
        return None if got is None else self._estimate(*got, itemsize)

    def _estimate(self, algo, get, itemsize: int) -> Estimate | None:
        try:
            scheds, net = self._walked(algo, get)
        except ValueError:
            return None
        # No working set: the tuner leaves out the memory term (cost.py). With it, the message path
        # over shared memory looks cheaper than the segment for large calls, and on a host with more
        # ranks than cores it is not: measured here, 4 ranks on 2 cores, a 64 MiB allgather takes
        # 71 ms by recursive doubling and 22-30 ms on the segment (docs/sim.md, "Fidelity").
        return fast.run(scheds, itemsize, net)[0]

    def bound(self, sched, itemsize: int) -> float:
        """A time the model's estimate of the algorithm cannot be below: what rank ``sched.rank`` spends
        on its own processor (``cost.Timing``: its copies; in each step the larger of its sends, one
        after the other, and its receives, handled one by one), from its schedule alone; 0 where the
        communicator has no shape, ``sched`` is not a message schedule or its peers' classes are not the
        shape's."""
        shape = self.net().shape()
        if shape is None or not compact.message_schedules([sched]) or not self._classes([sched], shape):
            return 0.0
        c = compact.convert([sched], written=True)
        f, p = shape.stretch, shape.per_host
        nb = c.count.astype(float) * itemsize
        inside = c.peer // p == sched.rank // p
        half = np.where(inside, shape.intra.alpha, shape.inter.alpha) / 2 * f
        shm = inside & shape.shm_inside
        wire = np.where(shm, nb * shape.intra.beta * f, np.where(inside, nb * shape.intra.beta, 0.0))
        tcp = np.maximum(nb - SOCKET_BUFFER, 0.0) * shape.inter.beta * ~inside
        copy = nb * np.where(c.red != 0, shape.gamma, shape.copy) * f
        kind = c.kind
        per = [np.where(kind == compact.COPY, copy, 0.0), np.where(kind == compact.SEND, half + wire + tcp, 0.0),
               np.where(kind == compact.RECV, half + np.where(shm, nb * shape.intra.beta * f, 0.0), 0.0)]
        sums = []
        for x in per:
            cs = np.concatenate(([0.0], np.cumsum(x)))
            sums.append(cs[c.step_start[1:]] - cs[c.step_start[:-1]])
        # cumulative sums round: a margin keeps the bound below the walk's sum of the same terms
        return float((sums[0] + np.maximum(sums[1], sums[2])).sum()) * (1 - 1e-9)

    def table(self, primitive: str, nbytes: int, itemsize: int = 4) -> dict[str, Estimate]:
        out = {}
        for name in algorithms.algorithms(primitive):
            est = self.model(primitive, name, nbytes, itemsize)
            if est is not None:
                out[name] = est
        return out

    def choose(self, primitive: str, nbytes: int, itemsize: int = 4) -> str:
        bucket = 1 << max(3, (max(1, nbytes) - 1).bit_length())
        key = (primitive, bucket, itemsize)
        name = self._cache.get(key)
        if name is None:
            if self._shared is None:
                name = self._priced(primitive, bucket, itemsize)
            else:
                name = self._shared.choice(f"{primitive}/{bucket}/{itemsize}",
                                           lambda: self._priced(primitive, bucket, itemsize))
            self._cache[key] = name
        return name

    def _priced(self, primitive: str, bucket: int, itemsize: int) -> str:
        costs, skipped = self._argmin(primitive, bucket, itemsize)
        name = min(costs, key=lambda a: (costs[a].time, a))
        if log.isEnabledFor(logging.INFO):
            alts = ", ".join(f"{a} {c.time * 1e6:.1f}us" for a, c in sorted(costs.items(), key=lambda x: x[1].time))
            more = "".join(f", {a} >{b * 1e6:.1f}us" for a, b in sorted(skipped.items(), key=lambda x: x[1]))
            log.info("%s %d B on %d ranks: %s (model: %s%s)", primitive, bucket, self.n, name, alts, more)
        return name

    def _argmin(self, primitive: str, nbytes: int, itemsize: int) -> tuple[dict[str, Estimate], dict[str, float]]:
        """The table's entries that can be the argmin: algorithms walked in the order of their bounds
        (``bound``, from rank 0's schedule), and those whose bound is above the best estimate so far
        left out (their estimates cannot be below it). (estimates, bounds of those left out)"""
        todo = []
        for name in algorithms.algorithms(primitive):
            got = self._builder(primitive, name, nbytes, itemsize)
            if got is None:
                continue
            try:
                lb = 0.0 if got[0].segment else self.bound(got[1](0), itemsize)
            except ValueError:
                continue                # cannot run this call here
            todo.append((lb, name, got))
        todo.sort(key=lambda x: (x[0], x[1]))
        costs: dict[str, Estimate] = {}
        skipped: dict[str, float] = {}
        best = None
        for lb, name, (algo, get) in todo:
            if best is not None and lb > best:
                skipped[name] = lb
                continue
            est = self._estimate(algo, get, itemsize)
            if est is not None:
                costs[name] = est
                best = est.time if best is None else min(best, est.time)
        return costs, skipped
