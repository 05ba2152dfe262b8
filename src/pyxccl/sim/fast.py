"""The cost model's walk in C (``_simcore.c``) where it applies, else the Python reference.

:func:`run` is ``tuning.cost.run`` (same arguments, same answer to the last bit): message schedules
on a ``ClusterNet`` (``net.py``, folded or not) go through the C core over the arrays of
``compact.py``; anything else (segment schedules, another Net, the C core not built, or
``PYXCCL_SIMCORE=0``) through ``tuning.cost.run``.
"""
from __future__ import annotations

import os

import numpy as np

from ..tuning import cost
from ..tuning.cost import SOCKET_BUFFER, Estimate
from . import compact as _compact
from . import symmetric
from .net import ClusterNet, Same

try:
    from . import _simcore
except ImportError:         # not built (it is optional): the Python reference runs
    _simcore = None


def available() -> bool:
    return _simcore is not None and os.environ.get("PYXCCL_SIMCORE", "1") != "0"


def _fold(net) -> int | None:
    """0 (no folding), 1 (Shift), 2 (Xor), or None when the C core does not know the net."""
    if type(net) is not ClusterNet or type(net.stretch) is not Same:
        return None
    sym = net.sym
    if sym is None:
        return 0
    if type(sym) is symmetric.Shift and sym.n == net.c.nranks and sym.p == net.c.per_host:
        return 1
    if type(sym) is symmetric.Xor and sym.n == net.c.nranks and sym.p == net.c.per_host:
        return 2
    return None


def _params(net, itemsize: int, fold: int, working_set: int) -> tuple:
    """What the C core needs of ``net``; the memory term as ``Timing.__init__`` makes it (every rank of a
    ClusterNet has per_host ranks on its host)."""
    c = net.c
    memshare, membyte = 0.0, 0.0
    if net.cpu and net.mem and working_set:
        memshare = 1.0 if net.local(0) * working_set > net.cache else 0.0
        membyte = net.mem * net.local(0)
    return (c.nranks, c.per_host, c.hosts, c.nics, int(bool(net.cpu)), int(bool(net.reduce_overlap)),
            int(bool(c.intra_shared)), int(c.topology == "ring"), fold, int(itemsize), SOCKET_BUFFER,
            float(c.intra.alpha), float(c.intra.beta), float(c.inter.alpha), float(c.inter.beta), float(net.gamma),
            float(net.copy), float(net.stretch.v), float(memshare), float(membyte))


def run_compact(comp, itemsize: int, net, working_set: int = 0) -> tuple[Estimate, list[int]]:
    """The C core's walk of ``comp`` (a ``compact.Compact`` or ``compact.Derived``) on ``net`` (a
    ClusterNet); ValueError when it cannot."""
    fold = _fold(net)
    if fold is None or _simcore is None:
        raise ValueError("the C core walks compact schedules on a ClusterNet only (and must be built)")
    if isinstance(comp, _compact.Derived):
        if comp.hosts * comp.per_host != net.c.nranks:
            raise ValueError("derived schedules of another number of ranks than the cluster's")
        arrays, (ranks, tmpl, move, movekind) = comp.reps, comp.walked()
    else:
        arrays, ranks, movekind = comp, comp.ranks, 0
        tmpl, move = np.arange(len(ranks), dtype=np.int64), np.zeros(len(ranks), np.int64)
    t, sent, messages, stuck = _simcore.walk(arrays.kind, arrays.red, arrays.peer, arrays.count, arrays.step_start,
                                             arrays.rank_start, ranks, tmpl, move, arrays.touch,
                                             _params(net, itemsize, fold, working_set), movekind)
    return Estimate(t, comp.steps, sent, messages), stuck


def run(scheds, itemsize: int, net, inplace: bool = False, working_set: int = 0) -> tuple[Estimate, list[int]]:
    """``tuning.cost.run``, in C when it can be; ``scheds`` may also be a ``compact.Compact`` or
    ``compact.Derived``."""
    if isinstance(scheds, (_compact.Compact, _compact.Derived)):
        return run_compact(scheds.inplace() if inplace else scheds, itemsize, net, working_set)
    if available() and scheds and _fold(net) is not None and _compact.message_schedules(scheds):
        n = net.c.nranks
        ranks = [s.rank for s in scheds]
        if all(0 <= r < n for r in ranks) and len(set(ranks)) == len(ranks):    # (Timing indexes ranks)
            comp = _compact.convert(scheds, inplace)
            if not len(comp.peer) or (comp.peer.min() >= 0 and comp.peer.max() < n):
                return run_compact(comp, itemsize, net, working_set)
    return cost.run(scheds, itemsize, net, inplace, working_set)


#: message level: every rank's schedule is derived from host 0's (not built) above this many operations
DERIVE_OPS = 500_000


def message_level(build, cluster) -> "list | _compact.Derived":
    """Every rank's schedule of ``build(rank)`` on ``cluster``: built rank by rank, or, when there are many
    operations and ``symmetric.find`` proves a Shift or XOR symmetry with equal counts (the samples'
    counts must be exactly host 0's), the arrays of all ranks derived from host 0's
    (``compact.all_ranks``: every rank and message is still walked; only construction is shared)."""
    n = cluster.nranks
    first = build(0)
    if (available() and cluster.hosts > 1 and not first.segment
            and sum(map(len, first.steps)) * n > DERIVE_OPS):
        sym, reps = symmetric.find(lambda r: first if r == 0 else build(r), cluster.hosts, cluster.per_host, False,
                                   exact=True)
        if sym is not None:
            return _compact.Derived(_compact.convert(reps), sym, cluster.hosts, cluster.per_host)
    return [first] + [build(r) for r in range(1, n)]
