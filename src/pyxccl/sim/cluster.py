"""A modelled cluster: hosts of ranks, the links inside a host and between hosts, and what the
ranks' processors cost for copies and reductions.

Two kinds of machine, one model (``model.py``):

- **DMA machines** (the hardware presets: GPUs with NVLink or PCIe inside a host, NICs between
  hosts). A message costs its link's latency once, end to end, and ``bytes * beta`` of
  transfer; sending takes no processor time (a copy engine or the NIC moves the bytes), so a
  rank can have several transfers in flight. Transfers share what they cross: inside a host,
  each rank's port into the switch (NVSwitch; ``intra_shared=True`` makes it one bus per host,
  as PCIe through one switch), between hosts the hosts' NICs (rank j of a host uses NIC
  ``j % nics``) and, on a ``ring`` of hosts, a ``torus2d``/``torus3d`` or a ``dragonfly``, every
  link between hosts on the way (``topology.py``: the topologies and their routes). A ``fattree``
  has full bisection: only the NICs are shared. A shared resource serves one
  transfer at a time, first come first served (``model.py`` starts them in time order).
- **CPU machines** (``Cluster.measured()``: this machine as pyxccl measured it). Per-message
  costs are software at both ends (half of ``alpha`` each), and shared-memory transfers are
  copies by the processors, stretched when a host has more ranks than cores, and calls too large
  for the cache move at the memory's rate, one process's a core: the model of the tuner (``tuning/cost.py``),
  which decides what runs, so that the simulator predicts what the engine does.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .._errors import InvalidArgumentError
from ..tuning.cost import Link
from .topology import TOPOLOGIES, TORUS_DIMS, check_dims, check_groups


@dataclass(frozen=True)
class Cluster:
    """``hosts`` x ``per_host`` ranks; rank r is local rank ``r % per_host`` of host ``r // per_host``.

    >>> c = Cluster(hosts=64, per_host=8, intra=Link(1e-6, 1 / 300e9), inter=Link(5e-6, 1 / 25e9), nics=8)
    >>> c.nranks
    512
    """
    hosts: int
    per_host: int
    intra: Link                      # between ranks of one host
    inter: Link                      # between hosts: one NIC's latency and seconds per byte
    nics: int = 1                    # NICs per host (rank j of a host sends through NIC j % nics)
    topology: str = "fattree"        # between hosts: "fattree" (full bisection), "ring" of hosts, "torus2d",
                                     # "torus3d" or "dragonfly" (topology.py)
    dims: tuple = ()                 # torus: hosts per dimension (default: the most square factorization)
    groups: int = 0                  # dragonfly: groups of hosts (default: the most square split)
    gamma: float = 0.0               # seconds per byte reduced (an arriving chunk into a buffer)
    copy: float = 0.0                # seconds per byte of a local copy
    reduce_overlap: bool = True      # a reducing receive reduces while the bytes arrive (GPU kernels do)
    intra_shared: bool = False       # one bus per host inside it (PCIe through one switch), not a port per rank
    cpu: bool = False                # a CPU machine (see the module's docstring)
    cores: int = 0                   # CPU machines: cores per host (more ranks than cores stretch CPU costs)
    mem: float = 0.0                 # CPU machines: seconds per byte read or written in memory (0: unknown)
    cache: int = 32 << 20            # ... and bytes of the last-level cache
    cma: Link | None = None          # ... and a single-copy read from another process (None: as a copy)
    peer: tuple = ()                 # ... and reading a window another rank just wrote, ((bytes, seconds),
                                     # ...) measured at a few sizes (sim.calibrate; (): as a copy)
    win_write: tuple = ()            # ... and writing one's window that the others read in its last round
    peer_nt: tuple = ()              # ... and the two with the window written by non-temporal stores, which
    win_nt: tuple = ()               # calls take where that costs less (_native.c, nt_windows; (): never)
    mem_at: tuple = ()               # ... and a copy between two call buffers, every rank at once, at a few
                                     # sizes (sim.calibrate; (): ``mem`` beyond ``cache``: cost.memory_term)
    mem_nt_at: tuple = ()            # ... and the same copy with non-temporal stores (into the buffers the
                                     # C executor writes so: tuning.cost.streamed)
    red: tuple = ()                  # ... and a reduction, every rank at once, at a few sizes (sim.calibrate;
                                     # (): ``gamma``)
    seg: Link | None = None          # CPU machines on one host: the shared segment's round ("seg")
    segment_bytes: int = 2 << 20     # ... and each rank's window of it
    single_copy: bool = True         # ... and whether single-copy reads work
    name: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self):
        if self.hosts < 1 or self.per_host < 1:
            raise ValueError(f"a cluster needs at least one host and one rank per host, not {self.hosts} x "
                             f"{self.per_host}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology {self.topology!r}: give one of {', '.join(TOPOLOGIES)}")
        # the shape's parameters are normalized here (a frozen dataclass: set once), so that clusters that
        # are the same compare equal (the planner caches by cluster)
        if self.topology in TORUS_DIMS:
            object.__setattr__(self, "dims", check_dims(self.topology, self.hosts, self.dims))
        elif self.dims:
            raise InvalidArgumentError(f"dims={self.dims} is for a torus: give topology='torus2d' or 'torus3d' with "
                                       f"it", op="sim")
        if self.topology == "dragonfly":
            object.__setattr__(self, "groups", check_groups(self.hosts, self.groups))
        elif self.groups:
            raise InvalidArgumentError(f"groups={self.groups} is for a dragonfly: give topology='dragonfly' with "
                                       f"it", op="sim")
        if self.nics < 1:
            raise ValueError(f"nics={self.nics}: a host needs at least one NIC")

    @property
    def nranks(self) -> int:
        return self.hosts * self.per_host

    def host_of(self, r: int) -> int:
        return r // self.per_host

    def host_list(self) -> list[int]:
        """The host of every rank (what hierarchical algorithms are given)."""
        return [r // self.per_host for r in range(self.nranks)]

    def link(self, a: int, b: int) -> Link:
        return self.intra if a // self.per_host == b // self.per_host else self.inter

    def resized(self, hosts: int, per_host: int) -> "Cluster":
        """The same machine with other counts (a torus's dims and a dragonfly's groups chosen anew)."""
        return replace(self, hosts=hosts, per_host=per_host, dims=(), groups=0)

    @classmethod
    def measured(cls, hosts: int = 1, per_host: int = 2, inter: Link | None = None,
                 calibration: dict | None = None) -> "Cluster":
        """This machine as pyxccl measured it (the tuner's file of link figures, else its defaults):
        shared memory inside a host, TCP between hosts (``inter``: e.g. a shaped link's figures;
        default the measured or default "tcp"). ``calibration``: what ``sim.calibrate.measure`` found
        (the segment's round as calls see it, single-copy reads), in place of the probe's figures."""
        from ..transport.topology import job_cpus
        from ..tuning import linkcache
        from ..transport.copies import last_level_cache
        from ..tuning.cost import DEFAULT_LINKS
        entry, why = linkcache.load(linkcache.cache_path(), linkcache.fingerprint())
        links = dict(entry.links) if entry else {}
        seg = links.get(f"seg:{per_host}")
        c = cls(hosts, per_host, intra=links.get("shm", DEFAULT_LINKS["shm"]),
                inter=inter or links.get("tcp", DEFAULT_LINKS["tcp"]), nics=1,
                gamma=entry.gamma if entry else 2e-10, copy=entry.copy if entry else 1.5e-10,
                reduce_overlap=False, cpu=True, cores=job_cpus(), mem=entry.mem if entry else 0.0,
                cache=last_level_cache(), seg=seg or (DEFAULT_LINKS["seg"] if hosts == 1 else None),
                name="measured", source=f"{linkcache.cache_path()}: {why or 'cached'}" if entry else
                "defaults of tuning/cost.py (nothing measured on this machine yet: run pyxccl info -n 2)")
        if calibration:
            c = replace(c, seg=Link(calibration["seg"], 0.0) if hosts == 1 else c.seg,
                        cma=Link(*calibration["cma"]) if calibration.get("cma") else None,
                        peer=tuple(tuple(x) for x in calibration["peer"]) if calibration.get("peer") else (),
                        win_write=tuple(tuple(x) for x in calibration["win"]) if calibration.get("win") else (),
                        peer_nt=tuple(tuple(x) for x in calibration["peer_nt"]) if calibration.get("peer_nt") else (),
                        win_nt=tuple(tuple(x) for x in calibration["win_nt"]) if calibration.get("win_nt") else (),
                        mem_at=tuple(tuple(x) for x in calibration["mem"]) if calibration.get("mem") else (),
                        mem_nt_at=tuple(tuple(x) for x in calibration["mem_nt"]) if calibration.get("mem_nt") else (),
                        red=tuple(tuple(x) for x in calibration["red"]) if calibration.get("red") else (),
                        source=c.source + "; calibrated")
        return c
