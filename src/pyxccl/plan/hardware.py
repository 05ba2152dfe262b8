"""Hardware for the planner: link classes, GPUs and whole machines, read from the TOML files in
``plan/data`` (each with a ``source``), or this machine as pyxccl measured it.

A machine (``data/hardware/NAME.toml``) names its GPU (``data/gpus.toml``), the link between GPUs
of one host (``intra``) and the NICs between hosts (``inter``, ``nics`` of them per host) from
``data/links.toml``; a user's file may give any of them inline instead of by name::

    gpu = "h100-sxm"
    gpus_per_host = 8
    intra = { gbytes_per_s = 450, latency_us = 3, shared = false }
    inter = "ib-ndr"
    nics = 8

>>> hw = load("dgx-a100")
>>> (hw.gpu.name, hw.per_host, hw.intra.name, hw.inter.name, hw.nics)
('a100-sxm', 8, 'nvswitch-a100', 'ib-hdr', 8)
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..tuning.cost import Link

_DATA = resources.files(__package__) / "data"


@dataclass(frozen=True)
class LinkSpec:
    """A link class: ``bandwidth`` bytes/s per direction, ``latency`` s per message; ``shared``: one
    bus per host (PCIe switch), else a port per GPU (NVSwitch) or per NIC."""
    name: str
    bandwidth: float
    latency: float
    shared: bool = False
    description: str = ""
    source: str = field(default="", compare=False)

    @property
    def link(self) -> Link:
        return Link(self.latency, 1.0 / self.bandwidth)

    def to_json(self) -> dict:
        return {"name": self.name, "gbytes_per_s": self.bandwidth / 1e9, "latency_us": self.latency * 1e6,
                "shared": self.shared, "source": self.source}


@dataclass(frozen=True)
class Gpu:
    """Peak FLOP/s per dtype (dense) and HBM bytes/s of one GPU."""
    name: str
    flops: dict
    hbm: float = 2e12
    description: str = ""
    source: str = field(default="", compare=False)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for matrix multiplies in ``dtype`` (fp32 -> the fp32 figure)."""
        key = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
        if key in self.flops:
            return self.flops[key]
        if key == "fp8":        # GPUs without fp8 run it at their fp16 rate
            return self.flops.get("fp16", max(self.flops.values()))
        raise ValueError(f"GPU {self.name!r} has no peak figure for {dtype!r} (it has {sorted(self.flops)})")

    def to_json(self) -> dict:
        return {"name": self.name, "tflops": {k: v / 1e12 for k, v in self.flops.items()},
                "hbm_gbytes_per_s": self.hbm / 1e9, "source": self.source}


@dataclass(frozen=True)
class Hardware:
    """Hosts of ``per_host`` GPUs; ``intra`` between GPUs of a host, ``nics`` NICs of ``inter`` per host.
    ``measured``: the links are this machine's as pyxccl measured them (``pyxccl.sim.Cluster.measured``);
    the GPU then only supplies the compute figures."""
    name: str
    gpu: Gpu
    per_host: int
    intra: LinkSpec
    inter: LinkSpec
    nics: int = 1
    topology: str = "fattree"
    measured: bool = False
    description: str = ""
    source: str = field(default="", compare=False)

    @property
    def nics_per_gpu(self) -> float:
        """NICs each GPU reaches: its own when the host has a NIC per GPU or more (a rail each), else one
        it shares with the other GPUs behind it."""
        return max(1.0, self.nics / self.per_host)

    def with_per_host(self, per_host: int) -> "Hardware":
        """The machine with ``per_host`` ranks (GPUs) used a host, and the NICs those GPUs reach: their own
        ones where each GPU has its NICs (1 GPU of a DGX: 1 NIC), all of them where the GPUs share them.

        >>> load("dgx-a100").with_per_host(1).nics, load("pcie-a100-eth").with_per_host(2).nics
        (1, 1)
        """
        if per_host < 1:
            raise ValueError(f"{self.name}: {per_host} ranks a host: give at least 1")
        nics = self.nics
        if self.nics >= self.per_host:         # a rail per GPU: the GPUs used reach theirs only
            nics = min(self.nics, -(-per_host * self.nics // self.per_host))
        return replace(self, per_host=per_host, nics=nics)

    def with_gpu(self, gpu: Gpu | str) -> "Hardware":
        return replace(self, gpu=gpu if isinstance(gpu, Gpu) else load_gpu(gpu))

    def cluster(self, hosts: int, per_host: int, *, nic_share: float = 1.0, bus_share: float = 1.0):
        """The ``pyxccl.sim.Cluster`` of one communication group: ``hosts`` x ``per_host`` of its ranks.

        ``nic_share``: NICs of a host this group may use (other groups on the host use the rest at the same
        time). NICs are wired to GPUs (``nics_per_gpu``): with as many NICs as GPUs or more (rail-optimized
        DGX-class hosts) each GPU has its own, and a group's ranks reach only their own, so a lone rank on a
        host gets one NIC, not the host's eight (NCCL measures one NIC's bandwidth for 2 nodes x 1 GPU);
        with fewer NICs than GPUs a NIC is shared by the GPUs behind it and a rank reaches one. Of what the
        group can use (the smaller of the share and what its ranks reach), whole NICs become ``nics``, a
        fraction scales the inter link's bandwidth. ``bus_share``: the part of a shared intra bus (PCIe)
        this group gets.

        >>> c = load("dgx-a100").cluster(2, 1, nic_share=8)
        >>> c.nics, round(1 / c.inter.beta / 1e9)       # one GPU, its one 200 Gb/s NIC
        (1, 25)
        """
        from ..sim import Cluster
        usable = min(nic_share, per_host * self.nics_per_gpu)
        n = max(1, min(int(usable), per_host))
        inter_scale = n / usable             # > 1: slower (a fraction of a NIC); < 1: a rank has more than one
        intra_scale = 1.0 / bus_share if self.intra.shared else 1.0
        if self.measured:
            c = Cluster.measured(hosts, per_host)
            return replace(c, inter=Link(c.inter.alpha, c.inter.beta * inter_scale),
                           intra=Link(c.intra.alpha, c.intra.beta * intra_scale))
        copy = 2.0 / self.gpu.hbm           # a copy reads and writes each byte
        return Cluster(hosts, per_host, intra=Link(self.intra.latency, intra_scale / self.intra.bandwidth),
                       inter=Link(self.inter.latency, inter_scale / self.inter.bandwidth), nics=n,
                       topology=self.topology, gamma=1.5 * copy, copy=copy, reduce_overlap=True,
                       intra_shared=self.intra.shared, name=self.name, source=self.source)

    def p2p_link(self, same_host: bool, *, nic_share: float = 1.0, bus_share: float = 1.0) -> Link:
        """The link a point-to-point message crosses, with this sender's share of the NIC or bus."""
        if self.measured:
            from ..sim import Cluster
            c = Cluster.measured(1 if same_host else 2, 2)
            base = c.intra if same_host else c.inter
        else:
            base = (self.intra if same_host else self.inter).link
        scale = (1.0 / bus_share if self.intra.shared else 1.0) if same_host else 1.0 / min(nic_share, 1.0)
        return Link(base.alpha, base.beta * scale)

    def to_json(self) -> dict:
        return {"name": self.name, "gpu": self.gpu.to_json(), "gpus_per_host": self.per_host,
                "intra": self.intra.to_json(), "inter": self.inter.to_json(), "nics": self.nics,
                "topology": self.topology, "measured": self.measured, "source": self.source}


def _table(fname: str) -> dict:
    return tomllib.loads((_DATA / fname).read_text())


@lru_cache(maxsize=None)
def _links() -> dict:
    return _table("links.toml")


@lru_cache(maxsize=None)
def _gpus() -> dict:
    return _table("gpus.toml")


def _linkspec(name: str, d: dict) -> LinkSpec:
    if "gbytes_per_s" in d:
        bw = float(d["gbytes_per_s"]) * 1e9
    elif "gbits_per_s" in d:
        bw = float(d["gbits_per_s"]) * 1e9 / 8
    else:
        raise ValueError(f"link {name!r}: give gbytes_per_s or gbits_per_s")
    return LinkSpec(name, bw, float(d.get("latency_us", 5.0)) * 1e-6, bool(d.get("shared", False)),
                    d.get("description", ""), d.get("source", ""))


def _gpu(name: str, d: dict) -> Gpu:
    flops = {k: float(v) * 1e12 for k, v in d["tflops"].items()}
    return Gpu(name, flops, float(d.get("hbm_gbytes_per_s", 2000)) * 1e9, d.get("description", ""),
               d.get("source", ""))


def load_link(spec) -> LinkSpec:
    """A link class by name (``link_names()``) or from an inline table."""
    if isinstance(spec, dict):
        return _linkspec(spec.get("name", "custom"), spec)
    if spec not in _links():
        raise ValueError(f"no link class {spec!r}: give one of {', '.join(link_names())} or an inline table")
    return _linkspec(spec, _links()[spec])


def load_gpu(spec) -> Gpu:
    """A GPU by name (``gpu_names()``) or from an inline table (``tflops = {bf16 = ..}``)."""
    if isinstance(spec, dict):
        return _gpu(spec.get("name", "custom"), spec)
    if spec not in _gpus():
        raise ValueError(f"no GPU {spec!r}: give one of {', '.join(gpu_names())} or an inline table")
    return _gpu(spec, _gpus()[spec])


def link_names() -> list[str]:
    return sorted(_links())


def gpu_names() -> list[str]:
    return sorted(_gpus())


def names() -> list[str]:
    """The machine presets (``data/hardware/*.toml``)."""
    return sorted(p.name[:-5] for p in (_DATA / "hardware").iterdir() if p.name.endswith(".toml"))


def from_dict(d: dict, name: str = "custom") -> Hardware:
    """A machine from a config table (see the module's docstring)."""
    known = {"name", "description", "source", "gpu", "gpus_per_host", "intra", "inter", "nics", "topology"}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"hardware {name!r}: unknown keys {unknown} (known: {sorted(known)})")
    for k in ("gpu", "gpus_per_host", "intra", "inter"):
        if k not in d:
            raise ValueError(f"hardware {name!r}: {k} is missing")
    from ..sim.topology import TOPOLOGIES
    topology = d.get("topology", "fattree")
    if topology not in TOPOLOGIES:      # a torus's dims and a dragonfly's groups are chosen per group's hosts
        raise ValueError(f"hardware {name!r}: topology {topology!r}: give one of {', '.join(TOPOLOGIES)}")
    return Hardware(d.get("name", name), load_gpu(d["gpu"]), int(d["gpus_per_host"]), load_link(d["intra"]),
                    load_link(d["inter"]), int(d.get("nics", 1)), topology,
                    description=d.get("description", ""), source=d.get("source", ""))


def load(name_or_path: str | Path) -> Hardware:
    """A machine preset by name (``names()``) or a TOML file.

    >>> load("dgx-h100").inter.bandwidth / 1e9
    50.0
    """
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        with open(p, "rb") as f:
            return from_dict(tomllib.load(f), p.stem)
    f = _DATA / "hardware" / f"{name_or_path}.toml"
    if not f.is_file():
        raise ValueError(f"no hardware {str(name_or_path)!r}: give a file.toml or one of {', '.join(names())}")
    return from_dict(tomllib.loads(f.read_text()), str(name_or_path))


def measured(per_host: int | None = None, gpu: Gpu | str = "a100-sxm") -> Hardware:
    """This machine's links as pyxccl measured them (shared memory inside a host, TCP between hosts:
    ``pyxccl.sim.Cluster.measured``); it has no GPU, so the compute figures come from ``gpu``.
    ``per_host``: ranks per host (default: this machine's CPUs)."""
    from ..sim import Cluster
    from ..transport.topology import job_cpus
    per_host = per_host or max(1, job_cpus())
    c = Cluster.measured(1, per_host)
    g = gpu if isinstance(gpu, Gpu) else load_gpu(gpu)
    intra = LinkSpec("measured-shm", 1 / c.intra.beta, c.intra.alpha, False, "shared memory", c.source)
    tcp = Cluster.measured(2, per_host).inter
    inter = LinkSpec("measured-tcp", 1 / tcp.beta, tcp.alpha, False, "TCP between hosts", c.source)
    return Hardware("measured", g, per_host, intra, inter, 1, "fattree", True,
                    f"this machine as pyxccl measured it ({per_host} ranks per host); compute of {g.name}",
                    c.source)
