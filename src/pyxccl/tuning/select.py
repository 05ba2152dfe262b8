"""The tuner: for a call, model every algorithm that can run on this communicator's
topology and take the cheapest (NCCL's argmin over a cost table, but the table
comes from the schedules, walked by the cost model). Choices are cached per size
bucket (powers of two).

Pricing: on a communicator whose hosts are alike (the same number of ranks, consecutive, one link
class inside a host, one stretch) every rank's message schedules are walked in the C core
(``fast.py``), as ``pyxccl sim`` walks them at message level; above ``FOLD_ABOVE`` ranks, an
algorithm whose schedules are the same on every host moved (``symmetric.fold``: the move the
algorithm declares, checked on three ranks of other hosts, else proven on four other hosts) is walked
for host 0's ranks only, folded: ``pyxccl sim``'s symmetric mode, which costs what one host's ranks
cost. Other algorithms (trees, rooted collectives) are walked for every rank: those that ``rooted.py``
covers as arrays of every rank made at once in numpy (a tree's as cheap as a fold: walked with those
that fold), the others built rank by rank. Odd
layouts (hosts of different sizes, ranks not consecutive on their hosts, a host unlike the others)
and the segment's schedules are walked in Python: above ``SPOT_ABOVE`` ranks, where the algorithm's ranks are
alike (but for a root), for four ranks and the root standing for all (``cost.SpotTiming``)."""
from __future__ import annotations

import gc
import heapq
import logging
import os
from collections import Counter
from contextlib import contextmanager

import numpy as np

from .. import algorithms
from ..algorithms import registry
from ..algorithms.segment import Window
from ..primitives import PRIMITIVES
from . import bound, compact, cost, fast, linkcache, rooted, shifted, symmetric
from .cost import Estimate, HostLinks, Machine, Net
from .shared import SharedTable

log = logging.getLogger("pyxccl")

#: above this many ranks the tuner folds what folds. The fold equals the full walk where the hosts'
#: transfers do not meet on a host's link at the same instant in another order (most algorithms and
#: sizes); where they do, it differs (measured: pairwise alltoall on 4 x 4 to 16 x 8 hosts, up to
#: 9% low; hierarchical allreduce, 0.3%): below it, every rank is walked, exactly.
FOLD_ABOVE = 64
#: above this many ranks a segment algorithm whose ranks are alike is walked for a few ranks standing for
#: all (``cost.SpotTiming``): on one host every rank's schedule holds O(ranks) operations, so every rank's
#: walk grew as ranks squared (measured, allreduce at 16 MiB: 19 ms at 16 ranks, 221 at 64, 772 at 128)
SPOT_ABOVE = 8
#: a bound above this fraction of the best estimate is looked at with the smallest search first (``_search_sizes``)
NEAR = 0.9
#: before any estimate, the chains of an algorithm are looked at for ordering only if rank 0's or
#: rank n/2's schedule has at most this many operations (``_argmin``)
FIRST_LOOK_OPS = 2048


@contextmanager
def _no_collection():
    """The cyclic garbage collector paused (as it was, after): building schedules makes millions of
    tuples and no cycles, and the collections they set off cost more than the building (measured:
    1,024 ranks of Rabenseifner's reduce at 16 MiB, 1 M steps, 2.0 s built, 0.6 s without; host 0's
    8 ranks of the hierarchical alltoall on 4,096 ranks, 74k operations, 71-98 ms against 33-45 ms)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Ranks:
    """``get(rank)``: a call's schedule of ``rank``, built once; ``get.arrays()``: every rank's as the C
    core's arrays (``compact.Compact``, in the order written) made at once where ``rooted.py`` covers the
    algorithm, else None; ``get.part(ranks)``: those of some ranks, made in numpy where ``shifted.py``
    covers it, else None; ``get.one(rank)``: a rank's arrays from ``part``, else its schedule."""

    def __init__(self, algo: registry.Algorithm, nranks: int, hosts: list[int], window, args: dict):
        self.algo, self.n, self.hosts, self.window, self.args = algo, nranks, hosts, window, args
        self.built: dict[int, object] = {}
        self._arrays: list = []             # [arrays or None] once made
        self._parts: dict[tuple, compact.Compact | None] = {}

    def __call__(self, r: int):
        s = self.built.get(r)
        if s is None:
            s = self.built[r] = self.algo.schedule(r, self.n, hosts=self.hosts, window=self.window, **self.args)
        return s

    def part(self, ranks) -> compact.Compact | None:
        key = tuple(ranks)
        if key not in self._parts:
            a, args = self.algo, dict(self.args)
            if a.wants_hosts:
                args["hosts"] = self.hosts
            # (ranks made alone before, a spot or rank 0's for its bound, joined to the others', not made again)
            alone = {r for r in key if self._parts.get((r,)) is not None} if len(key) > 1 else ()
            rest = tuple(r for r in key if r not in alone)
            made = None if a.segment or not rest else shifted.arrays(a.primitive, a.name, rest, self.n, args)
            if alone and (made is not None or not rest):
                pieces, i = [], 0
                for r in key:           # in rank order: the others' in runs, taken from those made
                    if r in alone:
                        pieces.append(self._parts[(r,)])
                    elif pieces and type(pieces[-1]) is list:
                        pieces[-1][1] += 1
                    else:
                        pieces.append([i, i + 1])
                    i += r not in alone
                made = compact.joined([made.take(*p) if type(p) is list else p for p in pieces])
            self._parts[key] = made
        return self._parts[key]

    def one(self, r: int):
        got = self.part((r,))
        return self(r) if got is None else got

    def arrays(self) -> compact.Compact | None:
        if not self._arrays:
            a = self.algo
            self._arrays.append(None if a.segment or not rooted.covers(a.primitive, a.name) else
                                rooted.arrays(a.primitive, a.name, self.n, self.hosts if a.wants_hosts else None,
                                              dict(self.args)))
        return self._arrays[0]


class Tuner:
    def __init__(self, nranks: int, hosts: list[int], klass, machine: Machine, cores: list[int],
                 segment: tuple | None = None, links: str | None = None):
        """``segment``: (bytes of a rank's window, single-copy reads work[, every rank has a core of
        its own]) of the one-host fast path (``Window.of``'s arguments), or None where there is none.
        ``links``: what, with ``hosts``, decides ``klass`` (the transport asked for); given, the host's
        processes share their choices (``shared.py``)."""
        self.n, self.hosts, self.klass, self.machine = nranks, hosts, klass, machine
        self.segment = segment
        per_host = Counter(hosts)
        self.stretch = [max(1.0, per_host[hosts[r]] / max(1, cores[r])) for r in range(nranks)]
        self._cache: dict[tuple, str] = {}
        self._net: Net | None = None
        self._pairs_ok: set[int] = set()      # pairs between hosts (a * n + b) that _classes found "tcp"
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
        if self._by_rule():
            inside = {self.klass.inside}
        else:
            inside = {self.klass(a, b) for a in range(n) for b in range(a - a % p, a - a % p + p) if a != b}
        if len(inside) > 1 or not inside <= {"shm", "tcp_local"}:
            return None
        kl = inside.pop() if inside else "shm"
        m = self.machine
        return fast.Shape(p, nh, m.link(kl), m.link("tcp"), m.gamma, m.copy, self.stretch[0], shm_inside=kl == "shm",
                          mem=m.mem, cache=m.cache)

    def _by_rule(self) -> bool:
        """``klass`` is a ``HostLinks`` of this communicator's hosts: no pair need be asked."""
        return type(self.klass) is HostLinks and self.klass.hosts == self.hosts

    def _classes(self, scheds, shape: fast.Shape) -> bool:
        """Every pair that ``scheds`` (message schedules, or their ``compact.Compact``) send or receive
        between has the class the shape says ("tcp" between hosts)."""
        if self._by_rule():
            return True                 # "tcp" between hosts, by the rule
        c = scheds if isinstance(scheds, compact.Compact) else compact.convert(scheds, written=True)
        if c.stride is not None:
            c = c.expanded()            # (every peer a run of a step moves to)
        ops = np.diff(c.step_start[c.rank_start])
        rank = np.repeat(c.ranks, ops)
        msg = c.kind != compact.COPY
        p, n = shape.per_host, shape.nranks
        keys = np.unique(rank[msg] * n + c.peer[msg])
        # pairs inside a host: _shape saw every one of the class it says; those between hosts, once each
        keys, ok = keys[keys // n // p != keys % n // p], self._pairs_ok
        for key in keys.tolist():
            if key not in ok:
                a, b = divmod(key, n)
                if self.klass(a, b) != "tcp" or self.klass(b, a) != "tcp":
                    return False
                ok.add(key)
        return True

    def _walked(self, algo: registry.Algorithm, get, every: bool = True) -> tuple[list | compact.Compact, Net] | None:
        """(the schedules to walk or their arrays, the net to walk them on): host 0's, folded, where the communicator
        and the algorithm allow; else every rank's (in the C core where the hosts are alike: as arrays
        made at once where ``rooted.py`` covers the algorithm), or, when not ``every`` and the
        communicator is above ``FOLD_ABOVE`` ranks, None (unless those arrays are cheap: ``rooted.cheap``).
        ``get(rank)``: the rank's schedule (built once)."""
        net = self.net()
        shape = net.shape()
        if shape is not None and shape.hosts > 1 and self.n > FOLD_ABOVE and not algo.segment:
            part = get.part if isinstance(get, _Ranks) and fast.available() else None
            # (fewer elements than ranks: chunks of a ring are empty on some hosts, and the fold seldom holds)
            probe = part is not None and max(PRIMITIVES[algo.primitive].buffers(0, get.args)) < self.n
            sym, reps = symmetric.fold(algo.symmetry, get, shape.hosts, shape.per_host, False, part, probe)
            if sym is not None and self._classes(reps, shape):
                if isinstance(reps, compact.Compact):
                    reps = compact.walker_order(reps)
                return reps, net.folded(sym)
        if algo.segment and algo.alike and self.n > SPOT_ABOVE and isinstance(get, _Ranks):
            root = get.args.get("root")
            with _no_collection():
                return cost.Spots([get(r) for r in cost.spot_ranks(self.n, root)], self.n, root), net
        later = not every and self.n > FOLD_ABOVE         # every rank's only when asked
        # a rooted algorithm's every rank as the C core's arrays, made at once (rooted.py), not built one by
        # one: a tree's are about as cheap to walk as a fold, a ring's only cheaper than building them
        arrays = None
        if shape is not None and isinstance(get, _Ranks) and fast.available():
            if not later or rooted.cheap(algo.primitive, algo.name):
                arrays = get.arrays()
            if arrays is None and not later:
                # (one that folds where it did not here, a ring at a few elements: in numpy where shifted.py
                # makes it, not built rank by rank)
                arrays = get.part(range(self.n))
        if arrays is not None and self._classes(arrays, shape):
            return compact.walker_order(arrays), net
        if later:
            return None
        with _no_collection():          # (``choose`` prices in one already; ``model`` does not)
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
        window = Window.of(self.segment[0], itemsize, *self.segment[1:]) if algo.segment else None
        return algo, _Ranks(algo, self.n, self.hosts, window, args)

    def model(self, primitive: str, name: str, nbytes: int, itemsize: int = 4) -> Estimate | None:
        """The model's estimate for ``name`` (None if the algorithm can't run this call here)."""
        got = self._builder(primitive, name, nbytes, itemsize)
        return None if got is None else self._estimate(*got, itemsize)

    def _phased(self, algo: registry.Algorithm) -> bool:
        """Whether ``algo`` is priced by its phases apart (``Algorithm.phases``): above ``FOLD_ABOVE`` ranks
        on hosts alike, where its ring phase folds (every rank's ring walked costs O(ranks^2) steps: the
        broadcast's scatter_allgather at 4,096 ranks, 22 s)."""
        shape = self.net().shape()
        return bool(algo.phases) and self.n > FOLD_ABOVE and shape is not None and shape.hosts > 1

    def _phase_estimate(self, algo, get: "_Ranks", itemsize: int) -> Estimate | None:
        """``algo``'s phases walked one after the other, each priced as an algorithm of its own: a phase
        walked for every rank starts on each where it ended the phase before; a folded one (whose hosts
        must start alike) on every rank when the last ended the phase before."""
        n = self.n
        ends, total = None, Estimate(0.0, 0, 0, 0)
        for part in algo.parts():
            pget = _Ranks(part, n, self.hosts, get.window, get.args)
            try:
                scheds, net = self._walked(part, pget)
            except ValueError:
                return None
            folded_after = ends is not None and net.sym is not None
            shift = float(ends.max()) if folded_after else 0.0
            est, stuck = fast.run(scheds, itemsize, net, start=None if folded_after else ends)
            if stuck:
                return None
            clock = dict(zip(map(int, est.ends[0]), map(float, est.ends[1])))
            rep = net.sym.rep if net.sym is not None else int
            ends = shift + np.array([clock[rep(r)] for r in range(n)])
            total = Estimate(float(ends.max()), total.steps + est.steps, total.bytes_sent + est.bytes_sent,
                             total.messages + est.messages)
        return total

    def _estimate(self, algo, get, itemsize: int, walked=None, limit: float = float("inf")) -> Estimate | None:
        """The model's estimate; where ``limit`` is given, an estimate whose time is above it may be only a
        time above it (its walk stopped there: ``fast.run_compact``)."""
        if walked is None and isinstance(get, _Ranks) and self._phased(algo):
            return self._phase_estimate(algo, get, itemsize)
        try:
            scheds, net = walked or self._walked(algo, get)
        except ValueError:
            return None
        # No working set: the tuner leaves out the memory term (cost.py). With it, the message path
        # over shared memory looks cheaper than the segment for large calls, and on a host with more
        # ranks than cores it is not: measured here, 4 ranks on 2 cores, a 64 MiB allgather takes
        # 71 ms by recursive doubling and 22-30 ms on the segment (docs/sim.md, "Fidelity").
        return fast.run(scheds, itemsize, net, limit=limit)[0]

    def bound(self, sched, itemsize: int) -> float:
        """``bound.local`` of rank ``sched.rank`` (its schedule or arrays): a time the model's estimate cannot
        be below."""
        shape = self.net().shape()
        return bound.local(sched, shape, itemsize, lambda s: self._classes(s, shape))

    def host_bound(self, get, itemsize: int) -> float:
        """``bound.host_link`` from rank 0's schedule, checked on the spot rank of the middle host
        (``get(rank)``: a rank's schedule)."""
        shape = self.net().shape()
        if shape is None or shape.hosts < 2:
            return 0.0
        spot = symmetric.spot_ranks(shape.hosts, shape.per_host)[-1]
        one = getattr(get, "one", get)          # (its arrays where they are made without building it)
        return bound.host_link(one(0), one(spot), shape, itemsize, lambda s: self._classes(s, shape))

    def relay_bound(self, get, itemsize: int) -> float:
        """``bound.relay`` of a chain from positions 1 and n - 1 (``get(rank)``: a rank's schedule)."""
        shape, root = self.net().shape(), get.args.get("root", 0)
        if shape is None:
            return 0.0
        second, last = get((root + 1) % self.n), get((root + self.n - 1) % self.n)
        return bound.relay(second, last, root, shape, itemsize, lambda s: self._classes(s, shape))

    def path_bound(self, get, itemsize: int, enough: float = float("inf"), ranks=None) -> float:
        """``bound.path`` (``get(rank)``: a rank's schedule): a time the model's estimate cannot be
        below, looked for until it is above ``enough`` (searching ``ranks`` ranks in turn, by default
        ``bound.RANKS``)."""
        shape = self.net().shape()
        return bound.path(get, shape, itemsize, lambda s: self._classes(s, shape), enough, ranks or bound.RANKS)

    @staticmethod
    def _search_sizes(lb: float, best: float) -> tuple:
        """The ranks ``path_bound`` looks at in turn, for an algorithm whose bound so far is ``lb`` against the best
        estimate ``best``: a bound within ``NEAR`` of it is raised past it by a chain of a few ranks (the seeds
        alone: a tree's root and its children's), which cost a third of ``bound.RANKS``' first look (measured,
        1,024 ranks, 8 B: binomial, halving-doubling and BCube allreduces at 0.9999 of the best)."""
        return (3, *bound.RANKS) if lb > NEAR * best else bound.RANKS

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
        with _no_collection():
            costs, skipped = self._argmin(primitive, bucket, itemsize)
            compact.forget()
        name = min(costs, key=lambda a: (costs[a].time, a))
        if log.isEnabledFor(logging.INFO):
            alts = ", ".join(f"{a} {c.time * 1e6:.1f}us" for a, c in sorted(costs.items(), key=lambda x: x[1].time))
            more = "".join(f", {a} >{b * 1e6:.1f}us" for a, b in sorted(skipped.items(), key=lambda x: x[1]))
            log.info("%s %d B on %d ranks: %s (model: %s%s)", primitive, bucket, self.n, name, alts, more)
        return name

    def _argmin(self, primitive: str, nbytes: int, itemsize: int) -> tuple[dict[str, Estimate], dict[str, float]]:
        """The table's entries that can be the argmin, and the bounds of those left out: their bound
        (``bound.py``) is above the best estimate so far, so their estimate cannot be below it, or their
        walk passed it (a walk stops there: ``fast.run_compact``'s limit).

        First the algorithms that are cheap to walk (on a communicator above ``FOLD_ABOVE`` ranks: those
        that fold, and the rooted trees whose every rank ``rooted.py`` makes at once), in the order of
        ``bound.local`` from rank 0's schedule (raised by ``bound.host_link`` for one that rotates, when it
        comes first); then the others (every rank
        walked), in the order of the larger of that and ``bound.path`` (those with O(ranks) operations
        on every rank last: ``FIRST_LOOK_OPS``), each walked only if that is not above the best so far."""
        todo = []
        for name in algorithms.algorithms(primitive):
            got = self._builder(primitive, name, nbytes, itemsize)
            if got is None:
                continue
            try:
                lb = 0.0 if got[0].segment else self.bound(got[1].one(0), itemsize)
                if got[0].relay:
                    lb = max(lb, self.relay_bound(got[1], itemsize))
            except ValueError:
                continue                # cannot run this call here
            # (the host link bound of one that rotates is looked for when it comes first: most never do)
            todo.append((lb, name, not got[0].rotates, got))
        heapq.heapify(todo)
        costs: dict[str, Estimate] = {}
        skipped: dict[str, float] = {}
        best = float("inf")

        def walk(name, algo, get, walked=None):
            nonlocal best
            est = self._estimate(algo, get, itemsize, walked, limit=best)
            if est is None:
                return
            if est.time > best:
                skipped[name] = est.time        # (its walk may have stopped there: a bound, then)
            else:
                costs[name] = est
                best = est.time

        every = []
        while todo:
            lb, name, host_done, (algo, get) = heapq.heappop(todo)
            if lb > best:
                skipped[name] = lb
                continue
            if not host_done:       # back in its place by the larger bound
                try:
                    heapq.heappush(todo, (max(lb, self.host_bound(get, itemsize)), name, True, (algo, get)))
                except ValueError:
                    pass            # cannot run this call here
                continue
            if self._phased(algo):          # its phases apart: as cheap as a fold
                walk(name, algo, get)
                continue
            try:
                walked = self._walked(algo, get, every=False)
            except ValueError:
                continue
            if walked is None:
                every.append((name, algo, get, lb))
            else:
                walk(name, algo, get, walked)
        # the first look at their chains orders them (a chain broadcast's is long): as far as the best so
        # far needs, or, with none yet, its first search; then each is walked unless its chains, followed
        # as far as the best then needs, are longer
        later = []
        for name, algo, get, lb in every:
            looked = best < float("inf")
            # (with none yet, a first search only where rank 0's or rank n/2's schedule is small (a root's
            # may hold O(ranks) operations alone): where every rank's does, the search costs the ranks it
            # builds, and once there is a best the local bound mostly leaves it out; it is put last and
            # looked at below, as far as the best then needs)
            deferred = False
            if lb <= best and not algo.segment:
                if looked or min(sum(map(len, get(r).steps)) for r in (0, self.n // 2)) <= FIRST_LOOK_OPS:
                    try:
                        lb = max(lb, self.path_bound(get, itemsize, best, self._search_sizes(lb, best)) if looked else
                                 self.path_bound(get, itemsize, 0.0, bound.FIRST))
                    except ValueError:
                        continue
                else:
                    deferred = True         # after those looked at: walking it first would cost most
            later.append((deferred, lb, name, algo, get, looked))
        for _, lb, name, algo, get, looked in sorted(later, key=lambda x: x[:3]):
            if lb <= best < float("inf") and not algo.segment and not looked:
                try:
                    lb = max(lb, self.path_bound(get, itemsize, best, self._search_sizes(lb, best)))
                except ValueError:
                    continue
            if lb > best:
                skipped[name] = lb
                continue
            walk(name, algo, get)
        return costs, skipped
