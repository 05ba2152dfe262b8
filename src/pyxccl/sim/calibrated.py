"""The models with their fitted parameters (``sim/fitted.py``) applied: the one place that arithmetic lives.

The fidelity table (``sim/published.py``), ``pyxccl sim`` (``sim/report.py``) and ``pyxccl plan``
(``plan/price.py``) all price through these functions, so the figure the CLI prints is the one the
table validates (docs/sim.md, "What pyxccl sim answers on a DGX preset").

- ``nccl``: every (algorithm, protocol) NCCL's model enables for a call, with NCCL's bandwidths times
  the fitted efficiency and its network steps' latency raised by the fitted ``net_step_lat`` (``scaled``:
  so NCCL's choice sees both), and the fitted base and launch latency added;
- ``alltoall_row`` / ``alltoall``: NCCL's alltoall (grouped point-to-point, ``sim/nccl_p2p.py``) the same way;
- ``hardware``: a preset's links times the fitted efficiencies, for pyxccl's own walk;
- ``time``: a model's time with the fitted latencies added;
- ``Pricing``: what a user chooses (NCCL release, launch mode, raw or fitted) and the ``Params`` it gives.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .._errors import InvalidArgumentError
from . import fitted
from . import nccl as N
from . import nccl_p2p

#: how the job is started, as a user names it: one process per GPU (torchrun, mpirun: the default), or one
#: process driving every GPU of its node (nccl-tests ``-g 8``)
LAUNCH_MODES = ("per-gpu", "single-process")


def newest_version() -> str:
    """The newest NCCL release the port has (``pyxccl sim --nccl-version``'s default)."""
    return ported_versions()[-1]


@dataclass(frozen=True)
class Pricing:
    """How the CLI prices a call: the NCCL ``version`` modelled, the ``launch`` mode (``LAUNCH_MODES``), and
    ``raw`` (True: the models without the fitted figures)."""
    version: str = ""
    launch: str = "per-gpu"
    raw: bool = False

    def __post_init__(self):
        if not self.version:
            object.__setattr__(self, "version", newest_version())
        N.version(self.version)         # an unported release: the error names the ported ones
        if self.launch not in LAUNCH_MODES:
            raise InvalidArgumentError(f"launch {self.launch!r}: give one of {', '.join(LAUNCH_MODES)}")

    def params(self, model: str, preset: str | None) -> fitted.Params | None:
        """The fitted figures of (``model``, ``preset``), None when raw or when nothing was fitted there."""
        return None if self.raw or preset is None else fitted.FITTED.get((model, preset))

    def describe(self, model: str, preset: str | None, nccl: bool, applied: bool = True) -> dict:
        """What the figures are, for every JSON row: ``release`` (NCCL's model only), ``launch``, and
        ``calibration``: "fitted" (``applied`` and ``params`` has figures) or "raw"."""
        out = {"release": self.version} if nccl else {}
        fit = applied and self.params(model, preset) is not None
        out.update(launch=self.launch, calibration="fitted" if fit else "raw")
        return out

    def words(self, figures: dict, model: str, preset: str | None) -> str:
        """``describe``'s dict in words, for the table's header."""
        parts = [f"NCCL {figures['release']}"] if "release" in figures else []
        if figures["calibration"] == "fitted":
            parts += [f"{figures['launch']} launch", f"calibrated (sim/fitted.py: {model}, {preset})"]
        elif self.raw:
            parts.append("raw (--raw: without the fitted figures)")
        else:
            parts.append("raw (nothing fitted for this machine: fitted are the DGX presets as they are)")
        return ", ".join(parts)


def fitted_for(preset: str) -> bool:
    """Has ``fitted.FITTED`` figures for ``preset``?"""
    return any(p == preset for _, p in fitted.FITTED)


def ported_versions() -> list[str]:
    """The NCCL releases the port has, oldest first."""
    return sorted(N.VERSIONS, key=lambda v: N.version(v).key)


def time(t: float, cal: fitted.Params | None, launch: str = "unknown") -> float:
    """Seconds ``t`` of a model with ``cal``'s latencies (None: ``t``). ``launch``: the launch mode
    (``published.LAUNCHES``: "unknown" pays half of ``launch_lat``)."""
    if cal is None:
        return t
    if cal.form == "floor":
        # the host's time to issue a call bounds it from below (nccl-tests calls back to back): the
        # floor is a single-process launch's; the launch term lowers it for one process per GPU
        return max(t, cal.floor - cal.launch_lat + fitted.launch_term(cal, launch)) + cal.base_lat
    return max(t, cal.floor) + cal.base_lat + fitted.launch_term(cal, launch)


def net_steps(nNodes: int, coll: int, algorithm: int) -> int:
    """The network steps NCCL's latency model (tuning.cc, 2.23 on) charges ``algorithm`` for ``coll`` across
    ``nNodes`` nodes, each at its network latency: a ring's nNodes - 1 (2 (nNodes - 1) for allreduce), a tree's
    2 log2(nNodes) (Tree, NVLSTree), PAT's log2(nNodes), NVLS's and CollNet's one; none on one node."""
    if nNodes <= 1:
        return 0
    if algorithm == N.NCCL_ALGO_RING:
        return 2 * (nNodes - 1) if coll == N.ncclFuncAllReduce else nNodes - 1
    if algorithm in (N.NCCL_ALGO_TREE, N.NCCL_ALGO_NVLS_TREE):
        return 2 * N.log2i(nNodes)
    if algorithm == N.NCCL_ALGO_PAT:
        return N.log2i(nNodes)
    return 1


def inter_efficiency(cal: fitted.Params, per_node: int) -> float:
    """The fitted bandwidth efficiency across nodes of ``per_node`` GPUs each: ``inter_eff``, or none (1.0)
    for nodes of one GPU. ``inter_eff`` was fitted on full nodes only (every calibrate point across nodes
    runs 8 GPUs a node): what a node loses with all its rails busy at once (NCCL's model), or what pyxccl's
    algorithms lack against NCCL's there (NVLSTree); a node of one GPU drives one NIC alone and runs
    neither. Chosen after S02's 10 x 1 points (validate) were seen: docs/sim.md says what it changed."""
    return 1.0 if per_node == 1 else cal.inter_eff


def efficiency(cal: fitted.Params, comm: N.Comm) -> float:
    """The fitted bandwidth efficiency of NCCL's ``comm``: ``intra_eff`` on one node, else ``inter_efficiency``."""
    n = comm.nNodes
    return cal.intra_eff if n <= 1 else inter_efficiency(cal, comm.nRanks // n)


def scaled(model: N.Model, cal: fitted.Params) -> N.Model:
    """NCCL's bandwidths times the fitted efficiency (``efficiency``), and its latencies plus the fitted
    ``net_step_lat`` for each network step (``net_steps``), so NCCL's choice sees both."""
    n = model.comm.nNodes
    eff = efficiency(cal, model.comm)
    bw = tuple(tuple(tuple(b * eff for b in pr) for pr in al) for al in model.bandwidths)
    if n <= 1 or not cal.net_step_lat:
        return replace(model, bandwidths=bw)
    step = cal.net_step_lat * 1e6       # the model's latencies are in us
    lat = tuple(tuple(tuple(t + step * net_steps(n, c, a) for t in pr) for a, pr in enumerate(al))
                for c, al in enumerate(model.latencies))
    return replace(model, bandwidths=bw, latencies=lat)


def hardware(hw, cal: fitted.Params | None, per_host: int):
    """A ``plan.hardware.Hardware`` with its links' bandwidths times the fitted efficiencies for jobs of
    ``per_host`` GPUs a host (``inter_efficiency``; None: ``hw``)."""
    if cal is None:
        return hw
    return replace(hw, intra=replace(hw.intra, bandwidth=hw.intra.bandwidth * cal.intra_eff),
                   inter=replace(hw.inter, bandwidth=hw.inter.bandwidth * inter_efficiency(cal, per_host)))


@dataclass(frozen=True)
class Timed:
    """One (algorithm, protocol) of NCCL's model for a call: ``time`` in seconds (fitted where ``nccl`` was
    given figures); ``chosen``: the one NCCL picks among those allowed."""
    algorithm: str
    protocol: str
    time: float
    chosen: bool


def nccl(collective: str, nbytes: int, comm: N.Comm, cal: fitted.Params | None, launch: str = "per-gpu",
         algo: str | None = None, proto: str | None = None) -> list[Timed]:
    """Every (algorithm, protocol) NCCL's model enables for ``collective`` of ``nbytes`` on ``comm``, in NCCL's
    order, with ``cal``'s figures (None: the port as it is, ``nccl.predict``'s times). NCCL's pick is made on
    the scaled bandwidths, among the rows ``algo``/``proto`` allow (NCCL_ALGO / NCCL_PROTO; None: all);
    none allowed leaves every row unchosen."""
    model = N.tune_model(comm)
    if cal is not None:
        model = scaled(model, cal)
    table = N.cost_table(model, N.func(collective), nbytes)
    allowed = [[N.NCCL_ALGO_PROTO_IGNORE if (algo and N.ncclAlgoStr[a] != algo) or
                (proto and N.ncclProtoStr[q] != proto) else table[a][q] for q in range(N.NCCL_NUM_PROTOCOLS)]
               for a in range(N.NCCL_NUM_ALGORITHMS)]
    best = N.argmin(allowed)
    return [Timed(N.ncclAlgoStr[a], N.ncclProtoStr[q], time(table[a][q] * 1e-6, cal, launch), (a, q) == best)
            for a in range(N.NCCL_NUM_ALGORITHMS) for q in range(N.NCCL_NUM_PROTOCOLS) if table[a][q] >= 0]


#: the algorithm of NCCL's alltoall rows (the fidelity table's choice, ``pyxccl sim``'s and ``pyxccl plan``'s rows)
ALLTOALL = "grouped p2p"


def alltoall_row(nbytes: int, comm: N.Comm, cal: fitted.Params | None, launch: str = "per-gpu") -> Timed:
    """NCCL's alltoall of ``nbytes`` on ``comm`` (``nccl_p2p.alltoall``, NCCL's one way to run it, so
    ``chosen``), its bandwidths times the fitted efficiency (``efficiency``, as ``scaled``)
    and the fitted latencies added; the protocol NCCL's sends run (``nccl_p2p.protocol``: a label)."""
    eff = 1.0 if cal is None else efficiency(cal, comm)
    plan = nccl_p2p.alltoall(nbytes, comm, eff)
    return Timed(ALLTOALL, nccl_p2p.protocol(plan), time(plan.time * 1e-6, cal, launch), True)


def alltoall(nbytes: int, comm: N.Comm, cal: fitted.Params | None, launch: str = "per-gpu") -> float:
    """Seconds of ``alltoall_row``."""
    return alltoall_row(nbytes, comm, cal, launch).time
