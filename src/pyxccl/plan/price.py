"""Prices of the planner's calls: collectives through the simulator (the answer of ``pyxccl.sim.choose``:
the fastest algorithm that can run, what pyxccl's tuner would choose, on the group's modelled
cluster; found in the simulator's symmetric mode where an algorithm allows it), point-to-point
messages as ``alpha + bytes * beta`` of the link they cross.

A group that has whole DGX nodes to itself (8 GPUs of a ``dgx-a100``/``dgx-h100`` node each, no other
group on them) runs NCCL there: its collectives of NCCL's model are priced as NCCL prices them
(``sim/nccl.py``: the (algorithm, protocol) NCCL picks, NVLS and NVLSTree where the hardware has them),
its alltoall (EP's token dispatch and combine) as NCCL runs it (``sim/nccl_p2p.py``: grouped
point-to-point), what ``pyxccl sim`` answers on those presets (``sim.report.nccl_covers``), with the
same figures: the fitted parameters of ``sim/fitted.py`` applied by ``sim/calibrated.py`` (the fidelity
table's), for the ``Pricing`` given (NCCL release, launch mode, or raw); its "sent" is nccl-tests' bus
bytes (the bytes a ring moves per rank; an alltoall's: what a rank sends to others).

A group's cluster is that group alone (``Hardware.cluster``), with its fair share of what it shares
with the other groups of its kind running at the same time: a host's NICs (8 DP groups on a DGX,
one per TP rank, get one NIC each) and a shared PCIe bus.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..sim.calibrated import Pricing
from .hardware import Hardware
from .layout import Group, Layout
from .traffic import Traffic

_SIM_DTYPE = {1: "int8", 2: "float16", 4: "float32", 8: "float64"}
_cache: dict = {}


@dataclass(frozen=True)
class Priced:
    """A Traffic row with its group's place and the simulator's answer."""
    traffic: Traffic
    group: Group
    link: str            # the group's place in words
    link_class: str      # intra | inter | none
    algorithm: str
    time_per_call: float     # seconds, the largest call
    time: float              # seconds, all calls
    sent_per_call: int       # bytes the busiest rank sends in the largest call
    sent: int                # ... in all calls
    model: str = "pyxccl"    # who priced it: pyxccl's walk, or "nccl" (NCCL's model, whole DGX nodes)


def _sim(primitive: str, nbytes: int, cluster, itemsize: int, algo: str | None):
    """One simulated call, cached per (primitive, bytes, cluster, algorithm); ``algo`` None: the fastest
    of every algorithm that can run there (``pyxccl.sim.choose``'s answer)."""
    key = (primitive, nbytes, cluster, itemsize, algo)
    if key not in _cache:
        dt = _SIM_DTYPE.get(itemsize, "float32")
        if algo is None:
            from ..sim.simulate import candidates
            runs = [r for a in candidates(primitive, cluster) if (r := _run(primitive, nbytes, cluster, dt, a, False))]
            _cache[key] = min(runs, key=lambda r: (r.time, r.algorithm))
        else:
            _cache[key] = _run(primitive, nbytes, cluster, dt, algo, True)
    return _cache[key]


def _run(primitive: str, nbytes: int, cluster, dt: str, algo: str, must: bool):
    """``algo``'s run, in the simulator's symmetric mode when the algorithm has the symmetry (the same
    answer as the message level, tested in test_sim, and 10-100x faster on hundreds of ranks), else at
    message level; None when it cannot run this call (unless ``must``)."""
    from .. import sim
    if cluster.hosts > 1:
        try:
            return sim.run(primitive, nbytes, cluster, [algo], dtype=dt, mode="symmetric")[0]
        except ValueError:
            pass
    try:
        return sim.run(primitive, nbytes, cluster, [algo], dtype=dt)[0]
    except ValueError as e:
        if must or not ("cannot run" in str(e) or "not the same" in str(e)):
            raise
        return None


@dataclass(frozen=True)
class _Ran:
    """A call priced by NCCL's model, as the planner reads a simulator's result."""
    algorithm: str       # "Ring/LL128"
    time: float
    bytes_sent: int


def _nccl(primitive: str, nbytes: int, hw: Hardware, g: Group, algo: str | None, pricing: Pricing) -> _Ran | None:
    """NCCL's price of the call where the group has whole DGX nodes (see the module's docstring), else
    None. ``algo``: "Algorithm/Protocol" (a later size of the same calls runs what the first chose)."""
    from ..sim import calibrated, nccl, nccl_p2p
    from .hardware import load
    if g.groups_per_host != 1 or hw.name not in nccl.preset_names() or hw != load(hw.name):
        return None         # not the preset as it is (another GPU, fewer GPUs used a host, a user's file)
    a2a = primitive == "alltoall"
    try:
        coll = None if a2a else nccl.func(primitive)
        comm = nccl.preset(hw.name, g.hosts, g.per_host)
    except ValueError:
        return None
    if a2a:
        algo = None         # one way to run it; its protocol follows each call's size, as NCCL's does
    key = ("nccl", primitive, nbytes, hw.name, g.hosts, g.per_host, algo, pricing)
    if key not in _cache:
        comm = replace(comm, version=pricing.version)     # a release not ported for this GPU: its error
        cal = pricing.params("nccl", hw.name)
        if a2a:
            row = calibrated.alltoall_row(nbytes, comm, cal, pricing.launch)
            sent = int(nbytes * nccl_p2p.bus_factor(g.size))
        else:
            rows = calibrated.nccl(primitive, nbytes, comm, cal, pricing.launch)
            row = next(r for r in rows if r.chosen) if algo is None else \
                next(r for r in rows if f"{r.algorithm}/{r.protocol}" == algo)
            sent = int(nbytes * nccl.bus_factor(coll, g.size))
        _cache[key] = _Ran(f"{row.algorithm}/{row.protocol}", row.time, sent)
    return _cache[key]


def price(t: Traffic, layout: Layout, hw: Hardware, itemsize: int, pricing: Pricing | None = None) -> Priced:
    """Price every call of ``t``: the largest size chooses the algorithm (what the tuner would pick),
    the other sizes (a bucket's rest, an embedding unit) run that algorithm too. ``pricing``: how NCCL's
    model prices whole DGX nodes (default ``Pricing()``: the newest release, one process per GPU, fitted)."""
    pricing = pricing or Pricing()
    g = layout.group(t.group, hw.per_host)
    where = g.describe(hw)
    cls = "none" if g.size == 1 else ("inter" if g.crosses_hosts else "intra")
    if t.primitive == "send/recv":
        return _p2p(t, g, layout, hw)
    nic_share = hw.nics / g.groups_per_host
    bus_share = 1.0 / g.groups_per_host
    cluster = hw.cluster(g.hosts, g.per_host, nic_share=nic_share, bus_share=bus_share)
    sizes = sorted(t.sizes, key=lambda cn: -cn[1])
    first = _nccl(t.primitive, sizes[0][1], hw, g, None, pricing)
    model = "pyxccl" if first is None else "nccl"
    if first is not None:
        def again(nbytes):
            return _nccl(t.primitive, nbytes, hw, g, first.algorithm, pricing)
    else:
        first = _sim(t.primitive, sizes[0][1], cluster, itemsize, None)

        def again(nbytes):
            return _sim(t.primitive, nbytes, cluster, itemsize, first.algorithm)
    time = sent = 0.0
    for calls, nbytes in sizes:
        r = first if nbytes == sizes[0][1] else again(nbytes)
        time += calls * r.time
        sent += calls * r.bytes_sent
    return Priced(t, g, where, cls, first.algorithm, first.time, time, first.bytes_sent, int(sent), model)


def _p2p(t: Traffic, g: Group, layout: Layout, hw: Hardware) -> Priced:
    """Stage s's ranks send to stage s+1's: inside a host when the whole pipeline group fits in one, else
    across hosts (the slowest boundary paces the pipeline), every rank of the host at once through its
    NICs."""
    same_host = g.hosts == 1
    on_host = layout.ranks_on_host(hw.per_host)
    link = hw.p2p_link(same_host, nic_share=hw.nics / on_host, bus_share=1.0 / on_host)
    time = sent = 0.0
    for calls, nbytes in t.sizes:
        time += calls * (link.alpha + nbytes * link.beta)
        sent += calls * nbytes
    big = max(n for _, n in t.sizes)
    where = f"{'same host, ' + hw.intra.name if same_host else 'next host, ' + hw.inter.name}"
    return Priced(t, g, where, "intra" if same_host else "inter", "p2p", link.alpha + big * link.beta, time,
                  big, int(sent))


def clear_cache() -> None:
    _cache.clear()
