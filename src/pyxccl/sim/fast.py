"""The cost model's walk in C (``_simcore.c``) where it applies, else the Python reference.

:func:`run` is ``tuning.cost.run`` (same arguments, same answer to the last bit): message schedules
on a ``ClusterNet`` (``simulate.py``, folded or not) go through the C core over the arrays of
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

try:
    from . import _simcore
except ImportError:         # not built (it is optional): the Python reference runs
    _simcore = None


def available() -> bool:
    return _simcore is not None and os.environ.get("PYXCCL_SIMCORE", "1") != "0"


def _fold(net) -> int | None:
    """0 (no folding), 1 (Shift), 2 (Xor), or None when the C core does not know the net."""
    from .simulate import ClusterNet, _Same
    if type(net) is not ClusterNet or type(net.stretch) is not _Same:
        return None
    sym = net.sym
    if sym is None:
        return 0
    if type(sym) is symmetric.Shift and sym.n == net.c.nranks and sym.p == net.c.per_host:
        return 1
    if type(sym) is symmetric.Xor and sym.n == net.c.nranks and sym.p == net.c.per_host:
        return 2
    return None


def _params(net, itemsize: int, fold: int) -> tuple:
    c = net.c
    return (c.nranks, c.per_host, c.hosts, c.nics, int(bool(net.cpu)), int(bool(net.reduce_overlap)),
            int(bool(c.intra_shared)), int(c.topology == "ring"), fold, int(itemsize), SOCKET_BUFFER,
            float(c.intra.alpha), float(c.intra.beta), float(c.inter.alpha), float(c.inter.beta), float(net.gamma),
            float(net.copy), float(net.stretch.v))


def run_compact(comp: _compact.Compact, itemsize: int, net) -> tuple[Estimate, list[int]]:
    """The C core's walk of ``comp`` on ``net`` (a ClusterNet); ValueError when it cannot."""
    fold = _fold(net)
    if fold is None or _simcore is None:
        raise ValueError("the C core walks compact schedules on a ClusterNet only (and must be built)")
    t, sent, messages, stuck = _simcore.walk(comp.kind, comp.red, comp.peer, comp.count, comp.step_start,
                                             comp.rank_start, comp.ranks, _params(net, itemsize, fold))
    return Estimate(t, comp.steps, sent, messages), stuck


def run(scheds, itemsize: int, net, inplace: bool = False) -> tuple[Estimate, list[int]]:
    """``tuning.cost.run``, in C when it can be; ``scheds`` may also be a ``compact.Compact``."""
    if isinstance(scheds, _compact.Compact):
        return run_compact(scheds, itemsize, net)
    if available() and scheds and _fold(net) is not None and _compact.message_schedules(scheds):
        n = net.c.nranks
        if all(0 <= s.rank < n for s in scheds):
            comp = _compact.convert(scheds, inplace)
            if not len(comp.peer) or (comp.peer.min() >= 0 and comp.peer.max() < n):
                return run_compact(comp, itemsize, net)
    return cost.run(scheds, itemsize, net, inplace)
