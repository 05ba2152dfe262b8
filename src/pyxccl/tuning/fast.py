"""The cost model's walk in C (``_simcore.c``) where it applies, else the Python reference.

:func:`run` is ``cost.run`` (same arguments, same answer to the last bit): message schedules on a
net whose hosts are alike (``net.shape()`` says how: the tuner's ``cost.Net`` of a regular
communicator, the simulator's ``ClusterNet``), folded (``net.sym``: ``symmetric.py``) or not, go
through the C core over the arrays of ``compact.py``; anything else (segment schedules, a net
without a shape, the C core not built, or ``PYXCCL_SIMCORE=0``) through ``cost.run``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _env
from . import compact as _compact
from . import cost, symmetric
from .cost import SOCKET_BUFFER, Estimate, Link

try:
    from . import _simcore
except ImportError:         # not built (it is optional): the Python reference runs
    _simcore = None


def available() -> bool:
    return _simcore is not None and _env.get("PYXCCL_SIMCORE")


@dataclass(frozen=True)
class Shape:
    """What the C core knows of a net: ``hosts`` x ``per_host`` ranks, rank r on host r // per_host,
    every host alike (the same links, NICs, stretch), and what a transfer holds (``ClusterNet.route``:
    ``nics`` per host, one bus per host with ``shared``, a ``ring`` of hosts, a torus of ``dims``, a
    dragonfly of ``groups``: ``sim/topology.py``'s routes). ``shm_inside`` (CPU
    machines): the link inside a host is shared memory ("shm", copied by the processes), else TCP on
    one host ("tcp_local")."""
    per_host: int
    hosts: int
    intra: Link
    inter: Link
    gamma: float
    copy: float
    stretch: float = 1.0
    cpu: bool = True
    reduce_overlap: bool = False
    nics: int = 1
    shared: bool = False
    ring: bool = False
    shm_inside: bool = True
    mem: float = 0.0
    cache: int = 32 << 20
    dims: tuple = ()            # a torus of hosts (2 or 3 dimensions)
    groups: int = 0             # a dragonfly of hosts
    mem_at: tuple = ()          # copies measured at a few sizes (cost.memory_term)

    @property
    def topology(self) -> int:
        """The C core's code: 0 no links between hosts beyond the NICs, 1 ring, 2 torus, 3 dragonfly."""
        return 2 if self.dims else 3 if self.groups else 1 if self.ring else 0

    @property
    def nranks(self) -> int:
        return self.hosts * self.per_host


def fold_kind(sym, shape: Shape) -> int | None:
    """0 (not folded), 1 (Shift), 2 (Xor), or None when the C core does not know the fold."""
    if sym is None:
        return 0
    if type(sym) is symmetric.Shift and sym.n == shape.nranks and sym.p == shape.per_host:
        return 1
    if type(sym) is symmetric.Xor and sym.n == shape.nranks and sym.p == shape.per_host:
        return 2
    return None


def _params(shape: Shape, fold: int, itemsize: int, working_set: int) -> tuple:
    """The C core's parameters; the memory term as ``Timing.__init__`` makes it (every rank has
    per_host ranks on its host)."""
    s = shape
    dims = (tuple(s.dims) + (1, 1, 1))[:3]
    memshare, membyte = cost.memory_term(s.mem, s.cache, s.mem_at, s.per_host, working_set, s.stretch) \
        if s.cpu else (0.0, 0.0)
    return (s.nranks, s.per_host, s.hosts, s.nics, int(bool(s.cpu)), int(bool(s.reduce_overlap)),
            int(bool(s.shared)), s.topology, fold, int(bool(s.shm_inside)), int(itemsize), SOCKET_BUFFER,
            float(s.intra.alpha), float(s.intra.beta), float(s.inter.alpha), float(s.inter.beta), float(s.gamma),
            float(s.copy), float(s.stretch), float(memshare), float(membyte), *dims, int(s.groups))


def _core(net) -> tuple[Shape, int] | None:
    """(the net's shape, its fold) when the C core can walk on it."""
    shape = net.shape() if hasattr(net, "shape") else None
    if shape is None:
        return None
    fold = fold_kind(getattr(net, "sym", None), shape)
    return None if fold is None else (shape, fold)


def run_compact(comp, itemsize: int, net, working_set: int = 0, start=None,
                limit: float = float("inf")) -> tuple[Estimate, list[int]]:
    """The C core's walk of ``comp`` (a ``compact.Compact`` or ``compact.Derived``) on ``net`` (one with
    a shape); ValueError when it cannot. ``start``: each rank's clock at the start (indexed by rank).
    ``limit``: the walk stops once a rank's clock passes it; the estimate's time is then above the limit
    but not the whole walk's (a walk the tuner needs only to know is not below its best so far)."""
    core = _core(net)
    if core is None or _simcore is None:
        raise ValueError("the C core walks compact schedules on a net of hosts alike only (and must be built)")
    shape, fold = core
    if isinstance(comp, _compact.Derived):
        if comp.hosts * comp.per_host != shape.nranks:
            raise ValueError("derived schedules of another number of ranks than the net's")
        arrays, (ranks, tmpl, move, movekind) = comp.reps, comp.walked()
    else:
        arrays, ranks, movekind = comp, comp.ranks, 0
        tmpl, move = np.arange(len(ranks), dtype=np.int64), np.zeros(len(ranks), np.int64)
    if start is not None:
        start = np.ascontiguousarray(np.asarray(start, np.float64)[np.asarray(ranks)])
    t, sent, messages, stuck, ends = _simcore.walk(arrays.kind, arrays.red, arrays.peer, arrays.count,
                                                   arrays.step_start, arrays.rank_start, ranks, tmpl, move,
                                                   arrays.touch, _params(shape, fold, itemsize, working_set),
                                                   movekind, start, float(limit), arrays.rep,
                                                   arrays.stride, arrays.times)
    return Estimate(t, comp.steps, sent, messages, (ranks, np.frombuffer(ends))), stuck


def run(scheds, itemsize: int, net, inplace: bool = False, working_set: int = 0,
        start=None, limit: float = float("inf")) -> tuple[Estimate, list[int]]:
    """``cost.run``, in C when it can be; ``scheds`` may also be a ``compact.Compact`` or
    ``compact.Derived``. ``limit``: ``run_compact``'s (the Python reference walks to the end)."""
    if isinstance(scheds, (_compact.Compact, _compact.Derived)):
        return run_compact(scheds.inplace() if inplace else scheds, itemsize, net, working_set, start, limit)
    core = _core(net) if available() and scheds else None
    if core is not None and _compact.message_schedules(scheds):
        n = core[0].nranks
        ranks = [s.rank for s in scheds]
        if all(0 <= r < n for r in ranks) and len(set(ranks)) == len(ranks):    # (Timing indexes ranks)
            comp = _compact.convert(scheds, inplace)
            if not len(comp.peer) or (comp.peer.min() >= 0 and comp.peer.max() < n):
                return run_compact(comp, itemsize, net, working_set, start, limit)
    return cost.run(scheds, itemsize, net, inplace, working_set, start)


#: message level: every rank's schedule is derived from host 0's (not built) above this many operations
DERIVE_OPS = 500_000


def message_level(build, hosts: int, per_host: int) -> "list | _compact.Derived":
    """Every rank's schedule of ``build(rank)`` on ``hosts`` x ``per_host`` ranks: built rank by rank, or,
    when there are many operations and ``symmetric.find`` proves a Shift or XOR symmetry with equal
    counts (the samples' counts must be exactly host 0's), the arrays of all ranks derived from host 0's
    (``compact.all_ranks``: every rank and message is still walked; only construction is shared)."""
    n = hosts * per_host
    first = build(0)
    if available() and hosts > 1 and not first.segment and sum(map(len, first.steps)) * n > DERIVE_OPS:
        sym, reps = symmetric.find(lambda r: first if r == 0 else build(r), hosts, per_host, False, exact=True)
        if sym is not None:
            return _compact.Derived(_compact.convert(reps), sym, hosts, per_host)
    return [first] + [build(r) for r in range(1, n)]
