"""The cost model's view of a modelled cluster: where its ranks are, which links and resources a
transfer holds (``tuning/cost.py``'s ``Net``, for a ``Cluster``), and its shape for the C core
(``tuning/fast.py``). Below ``simulate.py``."""
from __future__ import annotations

from ..tuning.cost import DEFAULT_LINKS, Link, Net
from ..tuning.fast import Shape
from .cluster import Cluster
from .topology import hops

#: the topologies whose folded walk (``sym``) is exact: every host's links are host 0's only where the
#: hosts are alike under the move (``simulate._schedules`` says when)
FOLDABLE = ("fattree", "ring")


class ClusterNet(Net):
    """The cost model's view of a ``Cluster`` (see cluster.py for what is shared); with ``sym``,
    of its folded form, where every host is host 0."""

    timed = True        # steps started in time order: shared links taken first come, first served

    def __init__(self, c: Cluster, sym=None):
        if sym is not None and c.topology not in FOLDABLE:
            raise ValueError(f"a {c.topology} of hosts does not fold: its routes differ from host to host")
        self.c, self.sym = c, sym
        self._hops: dict = {}       # (host, host) -> the links between them (topology.hops)
        self.cpu, self.reduce_overlap = c.cpu, c.reduce_overlap
        self.gamma, self.copy, self.mem, self.cache, self.cma = c.gamma, c.copy, c.mem, c.cache, c.cma
        self.peer, self.win_write, self.mem_at, self.red = c.peer, c.win_write, c.mem_at, c.red
        self.mem_nt_at = c.mem_nt_at
        self.seg = c.seg or DEFAULT_LINKS["seg"]
        self.stretch = Same(max(1.0, c.per_host / c.cores) if c.cpu and c.cores else 1.0)
        self._inside, self._between = ("shm", "tcp") if c.cpu else ("intra", "inter")

    def local(self, r: int) -> int:
        return self.c.per_host

    def shape(self) -> Shape | None:
        """What the C core needs (None: a stretch that is not one value for every rank)."""
        c = self.c
        if type(self.stretch) is not Same:
            return None
        return Shape(c.per_host, c.hosts, c.intra, c.inter, self.gamma, self.copy, self.stretch.v, bool(self.cpu),
                     bool(self.reduce_overlap), c.nics, c.intra_shared, c.topology == "ring", True, self.mem,
                     self.cache, c.dims, c.groups, c.mem_at)

    def klass(self, a: int, b: int) -> str:
        p = self.c.per_host
        return self._inside if a // p == b // p else self._between

    def link(self, kl: str) -> Link:
        return self.c.intra if kl == self._inside else self.c.inter

    def route(self, a: int, b: int, kl: str) -> tuple:
        c, fold = self.c, self.sym is not None
        p = c.per_host
        ha, hb = a // p, b // p
        if kl == self._inside:
            if c.cpu:
                return ()       # copies by the processes themselves: priced on their clocks
            if c.intra_shared:
                return (("bus", 0 if fold else ha),)
            return ("out", a % p if fold else a), ("in", b % p if fold else b)
        res = [("nic-out", 0 if fold else ha, a % p % c.nics), ("nic-in", 0 if fold else hb, b % p % c.nics)]
        if c.topology != "fattree":
            links = self._hops.get((ha, hb))
            if links is None:
                links = self._hops[ha, hb] = hops(c, ha, hb)
            # folded (a ring of hosts whose messages go one host on: simulate._far), every host's links are
            # host 0's: a path's hops all one link (booked once, as the C core does)
            res += dict.fromkeys((k[0], 0) + k[2:] for k in links) if fold else links
        return tuple(res)

    def chan(self, a: int, b: int):
        return (a, b) if self.sym is None else self.sym.key(a, b)

    def wakes(self, r: int) -> int:
        return r if self.sym is None else self.sym.rep(r)


class Same:
    """A list of one value, as long as needed (the stretch of every rank)."""

    def __init__(self, v: float):
        self.v = v

    def __getitem__(self, r: int) -> float:
        return self.v
