"""The simulator held against published nccl-tests measurements (issue 27, item 5).

``load()`` reads ``data/nccl_published.json`` (docs/sim-data.md: its sources, machines and split);
``model_input(point)`` says what each point is modelled as, or why it is left out; ``evaluate``
predicts every modelled point with both models and ``summarize`` gives the median and worst
|error| per part (calibrate / validate) and model, suspect points apart.

The two models:

- ``"pyxccl"``: the default simulator (``pyxccl.sim.run``) on the preset's cluster, the fastest
  algorithm's time (alltoall too), allreduce out of place as nccl-tests measures it;
- ``"nccl"``: the port of NCCL's tuning model (``sim/nccl.py``), the time of the (algorithm,
  protocol) NCCL picks. Alltoall is not in NCCL's tuning model: NCCL runs it as grouped
  point-to-point calls, every peer at once on its p2p channels, ported in ``sim/nccl_p2p.py``.

``calibration`` (``sim/fitted.py``): the few fitted parameters, applied to both models by
``sim/calibrated.py`` (the functions ``pyxccl sim`` and ``pyxccl plan`` price with); ``fit`` takes
calibrate points only and refuses any other.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from importlib import resources

from .._errors import InvalidArgumentError
from . import calibrated, fitted
from . import nccl as N

MODELS = ("pyxccl", "nccl")
#: how nccl-tests was started: one process driving every GPU of its node (``-g 8``), one process per GPU
#: (``mpirun -np <GPUs> ... -g 1``), or not shown by the source
LAUNCHES = ("single-process", "per-gpu", "unknown")
PARTS = ("calibrate", "validate")
#: nccl-tests' collective names -> pyxccl's primitives
PRIMS = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
         "alltoall": "alltoall"}
#: NCCL_ALGO / NCCL_PROTO spellings -> the port's names
_ALGOS = {a.lower(): a for a in N.ncclAlgoStr}
_PROTOS = {p.lower(): p for p in N.ncclProtoStr}


@dataclass(frozen=True)
class Point:
    """One published measurement: ``size`` bytes (nccl-tests' size), ``time`` seconds (out of place)."""
    id: int
    part: str
    suspect: bool
    source_id: str
    gpu: str
    nodes: int
    per_node: int
    nics: int | None
    nic_gbps: float | None
    network: str
    settings: str
    collective: str
    size: int
    time: float
    suspect_reason: str = ""
    launch: str = "unknown"            # LAUNCHES: how nccl-tests was started, as the source shows it
    nccl_version: str = ""             # as printed or stated ("2.26.2 (printed)", "not printed")
    net_latency_us: float | None = None    # the NET plugin's reported latency, where the source names the plugin

    @property
    def release(self) -> str:
        """The NCCL release the source states ("2.26.2"), or "unknown"."""
        m = re.match(r"\s*(\d+\.\d+\.\d+)", self.nccl_version)
        return m.group(1) if m else "unknown"

    @property
    def preset(self) -> str:
        """The hardware preset of the point's GPU (dgx-a100 / dgx-h100)."""
        if "H100" in self.gpu:
            return "dgx-h100"
        if "A100" in self.gpu:
            return "dgx-a100"
        raise InvalidArgumentError(f"published point {self.id}: no preset for GPU {self.gpu!r}: give an A100 or H100 "
                                   "point, or add a preset")


def load(path=None) -> list[Point]:
    """Every point of the table (``path``: another file of the same fields)."""
    if path is None:
        text = (resources.files(__package__) / "data" / "nccl_published.json").read_text()
    else:
        with open(path) as f:
            text = f.read()
    return [_point(d) for d in json.loads(text)]


def _point(d: dict) -> Point:
    return Point(d["id"], d["part"], bool(d["suspect"]), d["source_id"], d["gpu"], d["nodes"], d["gpus_per_node"],
                 d.get("nics_per_node"), d.get("nic_gbps"), d.get("network", ""), d.get("settings", ""),
                 d["collective"], int(d["size_bytes"]), float(d["time_us"]) * 1e-6, d.get("suspect_reason") or "",
                 d.get("launch", "unknown"), d.get("nccl_version", ""), d.get("net_latency_us"))


@dataclass(frozen=True)
class Input:
    """What a point is modelled as: ``preset`` with ``nodes`` x ``per_node`` GPUs, ``nics`` NICs of
    ``nic_GBps`` per node (None: the preset's), the NCCL algorithm/protocol forced (None: NCCL's choice),
    and ``note``: what was mapped and how."""
    preset: str
    nodes: int
    per_node: int
    nics: int | None = None
    nic_GBps: float | None = None
    algo: str | None = None
    proto: str | None = None
    note: str = ""
    version: str = N.DEFAULT_VERSION   # the NCCL release modelled (the source's, else the port's default)
    launch: str = "unknown"
    latency_inter: float = 0.0         # us: the NET plugin's latency (NCCL's graph latencyInter)


def forced(settings: str) -> tuple[str | None, str | None]:
    """(algorithm, protocol) a point's settings force (NCCL_ALGO / NCCL_PROTO, or a file named for Ring)."""
    algo = proto = None
    m = re.search(r"NCCL_ALGO=(\w+)", settings)
    if m:
        algo = _ALGOS.get(m.group(1).lower(), m.group(1))
    elif settings.startswith("Ring algorithm per the file name"):
        algo = "Ring"
    m = re.search(r"NCCL_PROTO=(\w+)", settings)
    if m:
        proto = _PROTOS.get(m.group(1).lower(), m.group(1))
    return algo, proto


#: price a NET plugin's reported latency (NCCL's graph latencyInter)? Off: no calibrate point has one, so
#: nothing checks what it does to the model's time (with it NCCL 2.17.1 prices S12's 1 KiB allreduce at
#: ~700 us against 161 us measured: the plugin's figure steers NCCL's choice, docs/sim.md)
PRICE_NET_LATENCY = False


def model_input(p: Point, net_latency: bool | None = None) -> tuple[Input | None, str]:
    """(the model input, a note) for a point, or (None, why it is left out). ``net_latency``: price the
    NET plugin latency the source names (None: ``PRICE_NET_LATENCY``)."""
    algo, proto = forced(p.settings)
    net = p.network.lower()
    if algo in ("CollNetChain", "CollNetDirect") or "sharp" in net:
        return None, ("CollNet/SHARP: nccl.py has no traced CollNet graphs and pyxccl no in-network reduction "
                      "algorithm")
    if "tcpxo" in net:
        return None, ("GPUDirect-TCPXO over Ethernet: a NET plugin whose latency the model lacks; the source states "
                      "neither NIC count nor speed")
    if algo is not None and algo not in N.ncclAlgoStr:
        return None, f"NCCL_ALGO={algo} is not an algorithm of the port"
    if p.nodes > 1 and p.nics is not None and p.nic_gbps is None:
        return None, f"{p.nics} NICs of unstated speed"
    if p.per_node not in (1, N.PRESET_GPUS) or (p.per_node == 1 and p.preset != "dgx-h100"):
        return None, f"{p.per_node} GPUs per node on {p.preset}: no traced NCCL graph"
    notes = []
    nics, gbps = p.nics, p.nic_gbps
    if p.nodes > 1 and nics is None:
        notes.append("NICs not stated: the preset's (one per GPU)")
    if p.nodes == 1:
        nics = gbps = None
    GBps = gbps / 8 if gbps else None
    if nics is not None and _same_per_gpu(p.preset, nics, GBps):
        notes.append(f"{nics} x {gbps:g} Gb/s = the preset's NIC bandwidth per GPU")
    elif nics is not None:
        notes.append(f"{nics} x {gbps:g} Gb/s NICs (a variant of the preset)")
    if algo or proto:
        notes.append("forced " + "/".join(x for x in (algo, proto) if x))
    version = p.release
    if version not in N.VERSIONS:
        notes.append(f"NCCL {version}" + (" not ported" if version != "unknown" else "") +
                     f": priced as {N.DEFAULT_VERSION}")
        version = N.DEFAULT_VERSION
    elif N.version(version).legacy and p.preset != "dgx-a100":
        return None, f"NCCL {version} is ported for A100 rings and trees only"
    if p.launch not in LAUNCHES:
        raise InvalidArgumentError(f"published point {p.id}: launch {p.launch!r}: give one of {', '.join(LAUNCHES)}")
    lat = p.net_latency_us or 0.0
    if lat and not (PRICE_NET_LATENCY if net_latency is None else net_latency):
        notes.append(f"NET plugin latency {lat:g} us not priced")
        lat = 0.0
    elif lat:
        notes.append(f"NET plugin latency {lat:g} us")
    inp = Input(p.preset, p.nodes, p.per_node, nics, GBps, algo, proto, "; ".join(notes), version, p.launch, lat)
    return inp, inp.note


def _same_per_gpu(preset: str, nics: int, GBps: float) -> bool:
    hw = _hardware(preset)
    return nics >= hw.per_host and math.isclose(nics * GBps, hw.nics * hw.inter.bandwidth / 1e9)


def _hardware(preset: str):
    from ..plan import hardware
    return hardware.load(preset)


# --- the models' inputs ------------------------------------------------------------------------------------

def cluster(inp: Input, cal: fitted.Params | None = None):
    """The default simulator's cluster for ``inp`` (``pyxccl sim --hardware``'s, with the point's NICs)."""
    hw = _hardware(inp.preset)
    if inp.nics is not None:
        hw = replace(hw, nics=inp.nics, inter=replace(hw.inter, bandwidth=inp.nic_GBps * 1e9))
    hw = calibrated.hardware(hw, cal, inp.per_node)
    return hw.with_per_host(inp.per_node).cluster(inp.nodes, inp.per_node, nic_share=hw.nics)


#: derived graphs for machines the presets do not trace (src/graph/search.cc, NCCL 2.30.7), see comm()
_SRC_DERIVED = "derived from search.cc's speed arrays and ncclTopoDupChannels (not traced in full, no log)"


def comm(inp: Input) -> N.Comm:
    """NCCL's ``Comm`` for ``inp``: the preset, or a variant where the point's NICs differ.

    Variants (derived, not traced in full): one H100 per node with its one 400 Gb/s NIC: the ring/tree
    search finds one channel at 48 GB/s (the GPU's PCIe Gen5 path), which ncclTopoDupChannels splits
    into 2 x 24; an A100 node whose NICs give each GPU less than the preset's (EFA: 4 x 100 Gb/s for
    8 GPUs): the ring a channel per NIC at the largest sm80 speedArrayInter entry not above one NIC's
    rate, no dup (below 25 GB/s); the tree the same channels, pass 2 raising bwIntra through the same
    speeds while the channels fit the GPU's 240 GB/s of NVLinks (4 x 48)."""
    if inp.per_node == 1:
        g = N.Graph(2, 24.0, 24.0, N.PATH_NVL, N.PATH_PIX, source=_SRC_DERIVED)
        return _versioned(N.Comm(nNodes=inp.nodes, nRanks=inp.nodes, minCompCap=90, cpuVendor=N.CPU_VENDOR_INTEL,
                                 ring=g, tree=replace(g, pattern=N.NCCL_TOPO_PATTERN_BALANCED_TREE),
                                 name="dgx-h100 1 GPU/node", source=_SRC_DERIVED), inp)
    c = _versioned(N.preset(inp.preset, inp.nodes, inp.per_node), inp)
    if inp.nics is None or inp.nodes == 1 or _same_per_gpu(inp.preset, inp.nics, inp.nic_GBps):
        return c
    if inp.preset != "dgx-a100":
        raise InvalidArgumentError(f"no derived NCCL graph for {inp.preset} with {inp.nics} NICs of "
                                   f"{inp.nic_GBps:g} GB/s: add one to pyxccl.sim.published.comm")
    speeds = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2)
    bw = next(s for s in speeds if s <= inp.nic_GBps)
    nch = min(inp.nics, inp.per_node)
    intra = next(s for s in speeds if nch * s <= 240.0)
    ring = N.Graph(nch, bw, bw, N.PATH_NVL, N.PATH_PXB, latencyInter=inp.latency_inter, source=_SRC_DERIVED)
    tree = N.Graph(nch, intra, bw, N.PATH_NVL, N.PATH_PXB, latencyInter=inp.latency_inter,
                   pattern=N.NCCL_TOPO_PATTERN_BALANCED_TREE, source=_SRC_DERIVED)
    return replace(c, ring=ring, tree=tree, name=f"{inp.preset} {inp.nics} NICs", source=_SRC_DERIVED)


def _versioned(c: N.Comm, inp: Input) -> N.Comm:
    """``c`` as NCCL ``inp.version`` models it, its graphs carrying the NET plugin's latency across nodes."""
    lat = inp.latency_inter if c.nNodes > 1 else 0.0
    graphs = {k: replace(getattr(c, k), latencyInter=lat) for k in ("ring", "tree", "nvls") if getattr(c, k)}
    return replace(c, version=inp.version, **graphs)


# --- predictions ----------------------------------------------------------------------------------------

def predict_pyxccl(p: Point, inp: Input, cal: fitted.Params | None = None) -> tuple[float, str]:
    """(seconds, algorithm): the default walk's fastest algorithm. A forced NCCL algorithm is not mapped:
    pyxccl's algorithms are not NCCL's (its ``ring`` is one ring through one NIC a host, NCCL's Ring a
    ring per channel, rail by rail), so the point is priced as pyxccl would run it."""
    from . import simulate
    res = simulate.run(PRIMS[p.collective], p.size, cluster(inp, cal), inplace=False)
    best = min(res, key=lambda r: (r.time, r.algorithm))
    return calibrated.time(best.time, cal, inp.launch), best.algorithm


def predict_nccl(p: Point, inp: Input, cal: fitted.Params | None = None) -> tuple[float, str]:
    """(seconds, "Algorithm/Protocol"): NCCL's choice among what the point allows; alltoall: NCCL's grouped
    point-to-point (``sim/nccl_p2p.py``: every peer at once, on NCCL's p2p channels)."""
    c = comm(inp)
    if p.collective == "alltoall":
        return calibrated.alltoall(p.size, c, cal, inp.launch), calibrated.ALLTOALL
    rows = calibrated.nccl(PRIMS[p.collective], p.size, c, cal, inp.launch, inp.algo, inp.proto)
    best = next((r for r in rows if r.chosen), None)
    if best is None:
        raise InvalidArgumentError(f"published point {p.id}: NCCL's model enables no {inp.algo}/{inp.proto} for "
                                   f"{p.collective} on {c.name}: leave the forcing out or model the graph")
    return best.time, f"{best.algorithm}/{best.protocol}"


@dataclass
class Row:
    """One point's predictions: ``pred[model]`` seconds, ``error[model]`` (pred - measured) / measured."""
    point: Point
    note: str
    left_out: bool = False
    pred: dict = field(default_factory=dict)
    choice: dict = field(default_factory=dict)
    error: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        p = self.point
        return dict(id=p.id, part=p.part, suspect=p.suspect, source=p.source_id, machine=p.preset, nodes=p.nodes,
                    per_node=p.per_node, collective=p.collective, size=p.size, measured=p.time,
                    left_out=self.left_out, note=self.note, predicted=self.pred, choice=self.choice, error=self.error)


def evaluate(points: list[Point], calibration: dict | None = None) -> list[Row]:
    """Every point predicted by both models (``calibration``: {(model, preset): fitted.Params}, None: raw)."""
    rows = []
    for p in points:
        inp, note = model_input(p)
        row = Row(p, note, left_out=inp is None)
        if inp is not None:
            for m, fn in (("pyxccl", predict_pyxccl), ("nccl", predict_nccl)):
                cal = calibration.get((m, p.preset)) if calibration else None
                t, choice = fn(p, inp, cal)
                row.pred[m], row.choice[m], row.error[m] = t, choice, (t - p.time) / p.time
        rows.append(row)
    return rows


def summarize(rows: list[Row]) -> dict:
    """{(part, model, "clean"|"suspect"): {"median", "worst", "count"}} of |error| over modelled points."""
    out = {}
    for part in PARTS:
        for m in MODELS:
            for kind in ("clean", "suspect"):
                errs = [abs(r.error[m]) for r in rows if r.point.part == part and not r.left_out
                        and r.point.suspect == (kind == "suspect") and m in r.error]
                out[(part, m, kind)] = dict(median=statistics.median(errs) if errs else None,
                                            worst=max(errs) if errs else None, count=len(errs))
    return out


# --- calibration --------------------------------------------------------------------------------------

def calibration_points(points: list[Point]) -> list[Point]:
    """The points a fit may use: the calibrate part, not suspect, modelled."""
    return [p for p in points if p.part == "calibrate" and not p.suspect and model_input(p)[0] is not None]


def fit(points: list[Point], form: str = "add", net_step: bool = True, pooled: bool = True) -> dict:
    """The fitted parameters, {(model, preset): fitted.Params}, from calibrate points only (``fitted.fit``;
    ``net_step``: NCCL's model's latency per network step fitted too; ``pooled``: one base and launch
    latency for every preset)."""
    bad = [p.id for p in points if p.part != "calibrate"]
    if bad:
        raise InvalidArgumentError(f"fit: points {bad[:8]} are not in the calibrate part: fit on "
                                   "calibration_points(load()) only")
    return fitted.fit(points, evaluate, form, steps=net_steps if net_step else None, pooled=pooled)


#: the fit's forms ``cross_validate`` compares: name -> ``fit``'s (form, net_step, pooled); the first is FITTED's
FIT_FORMS = {"add + net step, pooled": ("add", True, True), "add + net step": ("add", True, False),
             "add": ("add", False, False), "floor + net step, pooled": ("floor", True, True),
             "floor + net step": ("floor", True, False)}


def cross_validate(points: list[Point], forms: dict = FIT_FORMS) -> dict:
    """{form name: [Row, ...]}: leave one source out over the calibrate part. Each calibrate source's points
    are predicted with the parameters ``fit`` (in that form) finds on the other calibrate sources, so every
    row is a prediction of a source its fit did not see: the error to expect from sources no fit has seen,
    by which a form with more fitted figures is judged fairly against one with fewer (on its own fit's
    points more figures always fit better). Uses calibrate points only, as ``fit``."""
    points = calibration_points(points)
    out = {}
    for name, how in forms.items():
        rows = []
        for src in sorted({p.source_id for p in points}):
            held = [p for p in points if p.source_id == src]
            rows += evaluate(held, fit([p for p in points if p.source_id != src], *how))
        out[name] = rows
    return out


def net_steps(p: Point, choice: str) -> int:
    """The network steps NCCL's latency model counts for ``choice`` ("Algorithm/Protocol") at point ``p``
    (alltoall, NCCL's grouped point-to-point, has none of its tuning model's: 0)."""
    if p.collective == "alltoall":
        return 0
    return calibrated.net_steps(p.nodes, N.func(PRIMS[p.collective]), N.ncclAlgoStr.index(choice.split("/")[0]))
