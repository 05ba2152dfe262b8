"""Running algorithms on a modelled cluster: the cost model's walk of the real schedules.

Message level: every rank's schedule, every message. Symmetric mode (``tuning/symmetric.py``):
host 0's ranks only, for algorithms whose schedules are the same on every host, moved;
it agrees with the message level where both run (tested) and reaches 100,000 ranks. It folds
only where the fold stays exact: on a fat tree, and on a ring of hosts while every message goes
at most one host on (``_far``). A torus or a dragonfly of hosts never folds (message level): moving
a schedule by whole hosts is not a symmetry of their links (host h + 1 is not host h's neighbour at
the end of a torus row; a dragonfly's gateways differ from host to host), so folded, transfers
would meet on other links than they do.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from .. import algorithms
from ..algorithms import registry
from ..algorithms.segment import Window
from ..primitives import PRIMITIVES
from ..schedule import Send
from ..tuning.cost import Link  # noqa: F401  (the docstrings' examples use it)
from ..tuning import fast, symmetric
from ..tuning.fast import run as walk_model     # tuning.cost.run, in C where it applies (tuning/fast.py)
from .cluster import Cluster
from .net import FOLDABLE, ClusterNet

MODES = ("auto", "message", "symmetric")
#: auto runs at message level up to this many operations (all ranks: about 5 s in the C core), else symmetric if it can
MESSAGE_BUDGET = 20_000_000


@dataclass
class Result:
    """One algorithm's simulated run of one call."""
    algorithm: str
    time: float          # seconds (the slowest rank)
    algbw: float         # bytes/s: the call's size over its time (nccl-tests)
    busbw: float         # bytes/s: algbw times the primitive's bus factor (nccl-tests)
    bytes_sent: int      # the most any rank sends
    messages: int        # all ranks' messages (of the ranks walked, times the hosts they stand for)
    steps: int           # the most any rank runs
    mode: str            # "message" or "symmetric"
    seconds: float       # wall time the simulation took

    def to_json(self) -> dict:
        return asdict(self)


def candidates(primitive: str, cluster: Cluster) -> list[str]:
    """The algorithms that can run ``primitive`` on ``cluster`` (the one-host fast path only on a
    measured CPU machine of one host)."""
    names = algorithms.algorithms(primitive)
    fast = cluster.cpu and cluster.hosts == 1 and cluster.per_host > 1
    recs = [registry.lookup(primitive, a) for a in names]
    return [a.name for a in recs if (fast or not a.segment) and a.runs(cluster.nranks)]


def run(primitive: str, nbytes: int, cluster: Cluster, algos=None, *, dtype="float32", mode: str = "auto",
        inplace: bool = True) -> list[Result]:
    """Simulate one ``primitive`` call of ``nbytes`` (nccl-tests' sizes: the whole buffer) with each of
    ``algos`` (default: every algorithm that can run there) on ``cluster``.

    ``mode``: "message" walks every rank; "symmetric" host 0's ranks only (ValueError when the
    algorithm has no symmetry); "auto" the message level while it is cheap, else symmetric when
    it can be. ``inplace``: the call's input is its output (no first copy), as torch calls are.

    >>> c = Cluster(hosts=2, per_host=4, intra=Link(1e-6, 1 / 100e9), inter=Link(5e-6, 1 / 10e9))
    >>> [r.algorithm for r in run("allreduce", 1 << 20, c, ["ring", "hierarchical"])]
    ['ring', 'hierarchical']
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: give one of {', '.join(MODES)}")
    prim = PRIMITIVES[primitive]
    dt = np.dtype(dtype)
    n, hosts = cluster.nranks, cluster.host_list()
    args = prim.sized(n, nbytes, dt.itemsize)
    # (the broadcast's small pieces where every rank has a core, as a communicator's segment decides)
    window = Window.of(cluster.segment_bytes, dt.itemsize, cluster.single_copy,
                       pipelined=0 < cluster.per_host <= cluster.cores)
    out = []
    for name in algos or candidates(primitive, cluster):
        algo = registry.lookup(primitive, name)
        if algo.segment and name not in candidates(primitive, cluster):
            raise ValueError(f"{primitive} {name!r} runs on one host's shared segment: only on a measured "
                             f"CPU machine of one host (Cluster.measured(1, L))")

        def build(r, algo=algo):
            return algo.schedule(r, n, hosts=hosts, window=window, **args)
        t0 = time.perf_counter()
        try:
            scheds, net, folded = _schedules(build, cluster, mode, name)
        except ValueError as e:
            if algos:
                raise
            if "cannot run" in str(e) or "not the same" in str(e):
                continue
            raise
        ip = inplace and prim.name == "allreduce"
        nin, nout = prim.buffers(0, args)
        ws = (nout if ip else nin + nout) * dt.itemsize
        est, stuck = walk_model(scheds, dt.itemsize, net, ip, working_set=ws)
        if algo.segment and cluster.win_nt and not stuck and not folded:
            # calls write their windows by non-temporal stores where that costs less (_native.c, nt_windows)
            nt = replace(cluster, peer=cluster.peer_nt or cluster.peer, win_write=cluster.win_nt)
            est = min(est, walk_model(scheds, dt.itemsize, ClusterNet(nt), ip, working_set=ws)[0], key=lambda e: e.time)
        if stuck:
            raise RuntimeError(f"{primitive} {name}: ranks {stuck[:8]} could not finish (a deadlock in the "
                               f"schedules: pyxccl.checker.check says where)")
        algbw = nbytes / est.time if est.time > 0 else float("inf")
        out.append(Result(name, est.time, algbw, algbw * prim.busbw_factor(n), est.bytes_sent,
                          est.messages * (cluster.hosts if folded else 1), est.steps,
                          "symmetric" if folded else "message", time.perf_counter() - t0))
    return out


def _schedules(build, cluster: Cluster, mode: str, name: str):
    """(the schedules to walk, the net to walk them on, folded?) for ``mode``."""
    n = cluster.nranks
    if mode != "message":
        first = _try(build, 0, name)
        big = sum(len(st) for st in first.steps) * n > MESSAGE_BUDGET
        if (mode == "symmetric" or big) and cluster.topology not in FOLDABLE:
            if mode == "symmetric":
                raise ValueError(f"{name} cannot run in symmetric mode here: a {cluster.topology} of hosts does "
                                 f"not fold (its routes differ from host to host): run it at message level")
        elif mode == "symmetric" or big:
            sym, reps = symmetric.find(lambda r: first if r == 0 else build(r), cluster.hosts, cluster.per_host,
                                       cluster.topology == "ring")
            if sym is not None and cluster.topology == "ring" and _far(reps, cluster):
                sym, reps = None, ("messages cross several links of the ring of hosts: transfers that share "
                                   "links take them one after another, so hosts do not run alike")
            if sym is not None:
                return reps, ClusterNet(cluster, sym), True
            if mode == "symmetric":
                raise ValueError(f"{name} cannot run in symmetric mode here: {reps}")
    scheds = fast.message_level(lambda r: _try(build, r, name), cluster.hosts, cluster.per_host)
    return scheds, ClusterNet(cluster), False


def _far(reps, c: Cluster) -> bool:
    """Does any message of ``reps`` go further than the next host on a ring of hosts?"""
    for s in reps:
        h = s.rank // c.per_host
        for step in s.steps:
            for o in step:
                if type(o) is Send:
                    d = (o.peer // c.per_host - h) % c.hosts
                    if min(d, c.hosts - d) > 1:
                        return True
    return False


def _try(build, r: int, name: str):
    try:
        return build(r)
    except ValueError as e:
        raise ValueError(f"{name} cannot run this call here: {e}") from None


def choose(primitive: str, nbytes: int, cluster: Cluster, *, dtype="float32", mode: str = "auto") -> Result:
    """The fastest algorithm for the call on ``cluster``: what pyxccl's tuner would choose there.

    >>> c = Cluster(hosts=64, per_host=8, intra=Link(1e-6, 1 / 300e9), inter=Link(5e-6, 1 / 25e9), nics=8)
    >>> choose("allreduce", 1 << 30, c).algorithm
    'bcube'
    """
    res = run(primitive, nbytes, cluster, dtype=dtype, mode=mode)
    return min(res, key=lambda r: (r.time, r.algorithm))
