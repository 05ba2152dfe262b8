"""NCCL's own tuning model, ported: the time NCCL predicts for every (algorithm, protocol) of a
collective, and the pair it picks.

Ported from NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 (NCCL 2.30.7,
``makefiles/version.mk``), files:

- ``src/graph/tuning.cc``: ``ncclTunerConstantsDefaults`` (baseLatencies, hwLatencies, llMaxBws,
  perChMax*Bws), ``nvlsEfficiency``, ``ncclTopoTuneModel`` (bandwidth and latency tables),
  ``treeCorrectionFactor`` and ``ncclTopoGetAlgoTime`` (time = lat + nBytes / (1000 * bw), us);
- ``src/enqueue.cc``: ``updateCollCostTable`` (which algorithms are tried) and ``topoGetAlgoInfo``
  (the first strict minimum, algorithms then protocols in NCCL's order);
- ``src/include/plugin/nccl_tuner.h``, ``src/include/graph.h``, ``src/include/device.h``,
  ``src/include/nccl_common.h``, ``src/include/enqueue.h``, ``src/graph/topo.h``: the enums and limits.

Other releases (``VERSIONS``: the ones published measurements ran) are an input, ``Comm.version``: their
constant tables read from ``tuning.cc`` at each tag, and the formula changes between them that touch
A100/H100 rings, trees and NVLS (``Version``).

Names follow the C code so that a reader can diff this file against ``tuning.cc``. What the C code
reads from the runtime topology search (``graphs[a]->nChannels, bwIntra, bwInter, typeIntra,
typeInter, latencyInter, sameChannels``, ``comm->maxTreePattern``) is an input here (``Graph``,
``Comm``); ``PRESETS`` holds what NCCL's search (``src/graph/search.cc``) finds on DGX A100 and
DGX H100 nodes, each value with where it comes from. Not ported: environment overrides
(NCCL_ALGO, NCCL_PROTO, NCCL_NET_OVERHEAD, ...: the defaults apply), tuner plugins, the CTA
efficiency policy and aggregation of several calls (``numPipeOps`` is 1: one call). NCCL keeps
bandwidths and latencies in single precision; the port rounds to float32 where the C code stores a
float, so its numbers agree with NCCL's to float rounding.

>>> c = preset("dgx-h100", nodes=1, per_node=8)
>>> best = choose("allreduce", 1 << 30, c)
>>> best.algorithm, best.protocol
('NVLS', 'Simple')
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from .._errors import InvalidArgumentError

# --- src/include/plugin/nccl_tuner.h ---------------------------------------------------------------
NCCL_ALGO_TREE = 0
NCCL_ALGO_RING = 1
NCCL_ALGO_COLLNET_DIRECT = 2
NCCL_ALGO_COLLNET_CHAIN = 3
NCCL_ALGO_NVLS = 4
NCCL_ALGO_NVLS_TREE = 5
NCCL_ALGO_PAT = 6
NCCL_NUM_ALGORITHMS = 7
NCCL_PROTO_LL = 0
NCCL_PROTO_LL128 = 1
NCCL_PROTO_SIMPLE = 2
NCCL_NUM_PROTOCOLS = 3
NCCL_HW_NVLINK = 0
NCCL_HW_PCI = 1
NCCL_HW_NET = 2
NCCL_VOLTA_COMPCAP_IDX = 0
NCCL_AMPERE_COMPCAP_IDX = 1
NCCL_HOPPER_COMPCAP_IDX = 2
NCCL_BLACKWELL_COMPCAP_IDX = 3
NCCL_ALGO_PROTO_IGNORE = -1.0
#: ``ncclAlgoStr`` / ``ncclProtoStr`` (src/collectives.cc)
ncclAlgoStr = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
ncclProtoStr = ("LL", "LL128", "Simple")

# --- src/include/nccl_common.h ---------------------------------------------------------------------
ncclFuncBroadcast = 0
ncclFuncReduce = 1
ncclFuncAllGather = 2
ncclFuncReduceScatter = 3
ncclFuncAllReduce = 4
NCCL_NUM_FUNCTIONS = 5
#: pyxccl's primitive names -> NCCL's functions (the collectives NCCL's tuning model covers)
FUNCS = {"broadcast": ncclFuncBroadcast, "reduce": ncclFuncReduce, "allgather": ncclFuncAllGather,
         "reduce_scatter": ncclFuncReduceScatter, "allreduce": ncclFuncAllReduce}

# --- src/include/graph.h -------------------------------------------------------------------------
PATH_LOC, PATH_NVL, PATH_NVB, PATH_C2C, PATH_PIX, PATH_PXB, PATH_P2C, PATH_PXN, PATH_PHB, PATH_SYS, PATH_NET = \
    range(11)
LINK_NVL = 1                                 # src/graph/topo.h (equal to PATH_NVL on purpose)
NCCL_TOPO_PATTERN_BALANCED_TREE = 1
NCCL_TOPO_PATTERN_SPLIT_TREE = 2
NCCL_TOPO_PATTERN_TREE = 3
NCCL_TOPO_PATTERN_RING = 4
NCCL_TOPO_PATTERN_NVLS = 5
NCCL_TOPO_PATTERN_COLLNET_DIRECT = 6

# --- src/graph/topo.h / src/include/device.h -----------------------------------------------------------
PCI_BW = 12.0
MAXCHANNELS = 64
NCCL_MAX_DIRECT_ARITY = 7
NCCL_MAX_NVLS_ARITY = 32

# --- src/graph/tuning.cc: ncclTunerConstantsDefaults ---------------------------------------------------
# [algorithm][protocol], algorithms Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT; protocols LL, LL128, Simple
baseLatencies = (
    (6.8, 14.0, 8.4), (6.6, 14.0, 8.4),      # Tree, Ring
    (0, 0, 0), (0, 0, 0),                    # Collnet Direct, Chain
    (0, 0, 0), (0, 0, 0),                    # NVLS, NVLS Tree
    (8.0, 8.0, 8.0),                         # PAT
)
# [NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET][algorithm][protocol]
hwLatencies = (
    (  # NVLINK
        (0.6, 1.25, 4.0), (0.6, 1.9, 3.4),
        (0, 0, 3.7), (0, 0, 2.8),
        (0, 0, 25), (0, 0, 25),
        (0, 0, 4.0),
    ),
    (  # PCI
        (1.0, 1.9, 4.0), (1.0, 2.5, 5.7),
        (0, 0, 3.7), (0, 0, 2.8),
        (0, 0, 0), (0, 0, 0),
        (0, 0, 4.0),
    ),
    (  # NET
        (5.0, 8.5, 14), (2.7, 4.0, 14.0),
        (0, 0, 31), (0, 0, 30),
        (0, 0, 18), (0, 0, 20.9),
        (0, 0, 14),
    ),
)
# [index1][index2]: index1 = GPU generation on one node, CPU vendor (0 Intel, 1 AMD) on several;
# index2 = nNodes 1, 2, more
llMaxBws = (
    (39.0, 39.0, 20.4),                      # Volta-N1/Intel-N2/Intel-N4
    (87.7, 22.5, 19.0),                      # Ampere-N1/AMD-N2/AMD-N4
    (141.0, 45.0, 35.0),                     # Hopper-N1/AMD-N2/AMD-N4
    (2 * 141.0, 2 * 45.0, 2 * 35.0),         # Blackwell-N1/AMD-N2/AMD-N4
)
# [compCapIndex][index2]
perChMaxRingLL128Bws = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
perChMaxTreeLL128Bws = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
perChMaxTreeBws = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
perChMaxNVLSTreeBws = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
# NVLS efficiency factor [Volta, Ampere, Hopper, Blackwell]
nvlsEfficiency = (0.0, 0.0, 0.85, 0.74)
# Trees are not perfectly sticking to the model for medium sizes: [protocol][log2(nBytes >> 6)], 64 B to 256 MB
treeCorrectionFactor = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)

# --- the releases the published measurements ran (NCCL version as an input) --------------------------------
@dataclass(frozen=True)
class Version:
    """One NCCL release's tuning constants (``src/graph/tuning.cc`` at ``commit``), as 7-algorithm tables
    (an algorithm the release does not have has zeros; ``algorithms`` says how many it has).

    Only the constant tables differ between releases here, and the few formula changes ``tune_model`` and
    ``algo_time`` name by version (NVLS/NVLSTree bandwidth before ``nvlsEfficiency``, the Ring LL/LL128
    factors, the network latency rules, the ring plateau); everything else is 2.30.7's code. The ports of
    releases before 2.19 (``legacy``) cover Tree and Ring on A100-class GPUs only: their CollNet and NVLS
    formulas were not ported."""
    name: str
    commit: str
    baseLatencies: tuple
    hwLatencies: tuple
    llMaxBws: tuple
    perChMaxRingLL128Bws: tuple
    perChMaxTreeLL128Bws: tuple
    perChMaxTreeBws: tuple
    perChMaxNVLSTreeBws: tuple | None = None      # None: the release caps NVLSTree by nothing of its own
    nvlsEfficiency: tuple | None = None           # None: NVLS bandwidth min(bwIntra, bwInter) (2.19-2.26)
    algorithms: int = 7

    @property
    def key(self) -> tuple:
        return tuple(int(x) for x in self.name.split("."))

    @property
    def legacy(self) -> bool:
        """A release before 2.19 (before the tuning rewrite that added NVLSTree and per-channel LL128 tables)."""
        return self.key < (2, 19)


def _rows(*rows, n=7):
    """Algorithm rows padded with zero rows to ``n`` (C's static arrays are zero-filled the same way)."""
    return tuple(rows) + ((0.0, 0.0, 0.0),) * (n - len(rows))


_Z = (0.0, 0.0, 0.0)
_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8))        # Volta, Ampere rows of perChMaxTreeBws since 2.12
_LL_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0))           # Volta, Ampere rows of llMaxBws since 2.12
_V2_30 = Version(
    "2.30.7", "5067397c2676d5aed50042fc39e5c8ee96eb0027", baseLatencies, hwLatencies, llMaxBws,
    perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws, perChMaxNVLSTreeBws, nvlsEfficiency)
_V2_26 = Version(
    "2.26.2", "f44ac759fee12ecb3cc6891e9e739a000f66fd70",
    _rows((6.8, 14.0, 8.4), (6.6, 14.0, 8.4)),
    (_rows((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25), (0, 0, 25)),
     _rows((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), _Z, _Z),
     _rows((5.0, 8.5, 14), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18), (0, 0, 14))),
    _LL_BW + ((141.0, 45.0, 35.0), (2 * 141.0, 2 * 45.0, 2 * 35.0)),
    ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (2 * 36.7,) * 3),
    ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (2 * 36.7, 2 * 36.7, 2 * 29.0)),
    _TREE_BW + ((38.7, 41.4, 36.0), (2 * 38.7, 2 * 41.4, 2 * 36.0)))
_V2_21 = Version(
    "2.21.5", "ab2b89c4c339bd7f816fbc114a4b05d386b66290",
    _rows((6.8, 14.0, 0), (6.6, 14.0, 8.4)),
    (_rows((0.6, 1.25, 28), (0.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25), (0, 0, 25)),
     _rows((1.0, 1.9, 28), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), _Z, _Z),
     _rows((5.0, 8.5, 28), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18), (0, 0, 14))),
    _LL_BW + ((141.0, 45.0, 35.0), _Z),
    ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, _Z),
    ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), _Z),
    _TREE_BW + ((38.7, 41.4, 36.0), _Z), algorithms=6)
_V2_19 = replace(
    _V2_21, name="2.19.3", commit="8c6c5951854a57ba90c4424fa040497f6defac46",
    hwLatencies=(_rows((0.6, 1.25, 28), (0.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 23), (0, 0, 23)),
                 _V2_21.hwLatencies[1], _V2_21.hwLatencies[2]),
    llMaxBws=_LL_BW + ((87.7, 22.5, 19.0), _Z))
_LEGACY_NVL = ((0.52, 1.25, 28), (0.47, 1.9, 3.4))
_LEGACY_PCI = ((1.0, 1.9, 28), (1.0, 2.5, 5.7))
_V2_17 = Version(
    "2.17.1", "5d3ab08b69754cb863ab1bf6e3fb6f7612bb725b",
    _rows((4.4, 4.4, 0), (3.6, 10.0, 8.4), (4.4, 4.4, 0), (4.4, 4.4, 0), (0, 0, 40.0)),
    (_rows(*_LEGACY_NVL, (0, 0, 8.0), (0, 0, 8.0), _Z), _rows(*_LEGACY_PCI, (0, 0, 8.0), (0, 0, 8.0), _Z),
     _rows((5.0, 8.5, 28), (2.7, 4.0, 9.6), (0, 0, 10.7), (0, 0, 10.7), _Z)),
    _LL_BW + ((87.7, 22.5, 19.0), _Z),
    ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, _Z),     # ll128MaxBwPerCh[compCapIndex], one figure for Ring and Tree
    ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, _Z),
    _TREE_BW + ((38.7, 41.4, 33.0), _Z), algorithms=5)
_V2_16 = replace(
    _V2_17, name="2.16.2", commit="28189e2df85885b78bf20384cefc3cedab023bf5",
    baseLatencies=_rows((4.4, 4.4, 0), (3.6, 10.0, 8.4), (4.4, 4.4, 0), (4.4, 4.4, 0)),
    hwLatencies=tuple(_rows(*h[:4]) for h in _V2_17.hwLatencies),
    perChMaxRingLL128Bws=((20.0,) * 3,) * 3 + (_Z,), perChMaxTreeLL128Bws=((20.0,) * 3,) * 3 + (_Z,),
    perChMaxTreeBws=_TREE_BW + (_TREE_BW[1], _Z), algorithms=4)
_V2_12 = Version(
    "2.12.12", "7aa1c46fd551d5514474cfc55848219dc67ca683",
    _rows((4.4, 4.4, 0), (3.6, 10.0, 8.4), (4.4, 4.4, 0)),          # Tree, Ring, CollNet (one algorithm then)
    (_rows(*_LEGACY_NVL, (0.5, 1.2, 8.0)), _rows(*_LEGACY_PCI, (1.0, 1.9, 8.0)),
     _rows((5.0, 8.5, 28), (2.7, 4.0, 28), (5.0, 5.0, 10.7))),
    _LL_BW + (_Z, _Z), ((20.0,) * 3,) * 2 + (_Z, _Z), ((20.0,) * 3,) * 2 + (_Z, _Z), _TREE_BW + (_Z, _Z),
    algorithms=3)
#: the ported releases, by version: the ones the published measurements ran (docs/sim-data.md) and 2.30.7.
#: 2.29.2's tables differ from 2.30.7's only in Blackwell's Ring LL128 and NVLSTree rows.
VERSIONS = {v.name: v for v in (
    _V2_30,
    replace(_V2_30, name="2.29.2", commit="ebd1e929285881cb4df02c3459588a2e12b2d8c0",
            perChMaxRingLL128Bws=perChMaxRingLL128Bws[:3] + ((34.5, 34.6, 34.5),),
            perChMaxNVLSTreeBws=perChMaxNVLSTreeBws[:3] + ((0.0, 96.0, 43.8),)),
    _V2_26, _V2_21, _V2_19, _V2_17, _V2_16, _V2_12)}
#: the release a Comm models unless told otherwise (the one this file is ported from)
DEFAULT_VERSION = "2.30.7"


def version(name: str) -> Version:
    """The ported release ``name`` ("2.26.2"), or an error naming the ported ones."""
    if name not in VERSIONS:
        raise InvalidArgumentError(f"NCCL {name}: its tuning constants are not ported; give one of "
                                   f"{', '.join(VERSIONS)}")
    return VERSIONS[name]


# getNetOverhead (tuning.cc): microseconds by CPU
CPU_ARCH_X86, CPU_ARCH_POWER, CPU_ARCH_ARM = "x86", "power", "arm"
CPU_VENDOR_INTEL, CPU_VENDOR_AMD, CPU_VENDOR_MIXED, CPU_VENDOR_OTHER = "intel", "amd", "mixed", "other"


def f32(x: float) -> float:
    """``x`` stored in a C float (NCCL's bandwidth and latency tables are float)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def log2i(n: int) -> int:
    """``log2i`` of src/include/utils.h: floor(log2(n)), -1 for 0."""
    return n.bit_length() - 1 if n > 0 else -1


@dataclass(frozen=True)
class Graph:
    """What NCCL's topology search found for one algorithm's graph (``struct ncclTopoGraph``):
    ``bwIntra``/``bwInter`` in GB/s per channel, ``typeIntra``/``typeInter`` path types (PATH_*)."""
    nChannels: int
    bwIntra: float
    bwInter: float
    typeIntra: int = PATH_NVL
    typeInter: int = PATH_PIX
    latencyInter: float = 0.0        # the NET plugin's latency; the IB and socket plugins set 0 ("Not set")
    sameChannels: int = 1
    pattern: int = NCCL_TOPO_PATTERN_RING
    source: str = field(default="", compare=False)


@dataclass(frozen=True)
class Comm:
    """The communicator fields ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` read.

    ``ring``, ``tree``, ``nvls``, ``collnetDirect``, ``collnetChain``: the graphs (NCCL's
    ``graphs[]`` maps NVLSTree to the NVLS graph and PAT to the tree graph); ``nvls`` None: no
    NVLS; ``collnetDirect``/``collnetChain`` None: no CollNet (SHARP). ``nvsCount``: NVSwitches
    in the topology (NCCL's topology has one NVS node per NVSwitch domain)."""
    nNodes: int
    nRanks: int
    minCompCap: int                   # 80: sm80 (A100), 90: sm90 (H100)
    ring: Graph
    tree: Graph
    maxCompCap: int = 0               # 0: minCompCap
    nvls: Graph | None = None
    collnetDirect: Graph | None = None
    collnetChain: Graph | None = None
    collNetHeadsNum: int = 0          # CollNetDirect heads per node (NICs with SHARP the search paired to GPUs)
    collNetAllGather: bool = False    # the CollNet plugin has iallgather / ireducescatter
    collNetReduceScatter: bool = False
    nvsCount: int = 1
    cpuArch: str = CPU_ARCH_X86
    cpuVendor: str = CPU_VENDOR_INTEL
    netDeviceHost: bool = True        # NCCL_NET_DEVICE_HOST (PAT needs it)
    maxTreePattern: int = -1          # -1: the tree graph's pattern
    cudartVersion: int = 12000
    version: str = DEFAULT_VERSION    # the NCCL release whose constants and formulas apply (VERSIONS)
    name: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self):
        v = version(self.version)
        if v.key < (2, 29) and (self.collnetDirect is not None or self.collnetChain is not None):
            raise InvalidArgumentError(f"NCCL model: CollNet formulas of NCCL {self.version} are not ported (only "
                                       "2.29.2's and 2.30.7's): model CollNet with one of those versions")
        if v.legacy and (self.minCompCap != 80 or self.nvls is not None):
            raise InvalidArgumentError(f"NCCL model: NCCL {self.version} is ported for A100 (sm80) rings and trees "
                                       "only: give a version from 2.19.3 on for other GPUs or NVLS")
        if self.nNodes < 1 or self.nRanks < self.nNodes:
            raise InvalidArgumentError(f"NCCL model: {self.nRanks} ranks on {self.nNodes} nodes: give nodes >= 1 "
                                       "and at least one rank per node")
        if self.nRanks % self.nNodes:
            raise InvalidArgumentError(f"NCCL model: {self.nRanks} ranks do not divide into {self.nNodes} nodes; "
                                       "the port assumes the same ranks on every node")

    @property
    def collnetEnable(self) -> bool:
        return self.collnetChain is not None and self.collnetChain.nChannels > 0

    @property
    def nvlsSupport(self) -> bool:
        return self.nvls is not None and self.nvls.nChannels > 0

    @property
    def localRanks(self) -> int:
        return self.nRanks // self.nNodes

    @property
    def nChannels(self) -> int:
        """``comm->nChannels`` when the model runs: init.cc's min(tree, ring) search channels as
        ``ncclTopoPostset`` (src/graph/connect.cc) leaves them with the defaults (no NCCL_MIN/MAX_NCHANNELS,
        a host network device): doubled, +50% for CollNet when its chain's bwIntra > bwInter and ppn > 1,
        doubled again on sm90 across nodes when the ring's bwIntra > 45 and fewer than 16."""
        n = min(self.tree.nChannels, self.ring.nChannels)
        n = min(MAXCHANNELS, n * 2)
        if self.collnetEnable and self.collnetChain.bwIntra > self.collnetChain.bwInter and self.nRanks > self.nNodes:
            n = min(MAXCHANNELS, n + n // 2)
        if self.minCompCap >= 90 and self.nNodes > 1 and self.ring.bwIntra > 45.0 and n < 16:
            n = 2 * n
        return min(MAXCHANNELS, n)

    def graphs(self) -> tuple:
        """``graphs[NCCL_NUM_ALGORITHMS]`` of init.cc: tree, ring, collNetDirect, collNetChain, nvls, nvls, tree."""
        empty = Graph(0, 0.0, 0.0)
        return (self.tree, self.ring, self.collnetDirect or empty, self.collnetChain or empty, self.nvls or empty,
                self.nvls or empty, self.tree)


@dataclass(frozen=True)
class Model:
    """``comm->bandwidths`` (GB/s, bus bandwidth turned to algorithm bandwidth) and ``comm->latencies``
    (us) as ``ncclTopoTuneModel`` leaves them: [function][algorithm][protocol]."""
    comm: Comm
    bandwidths: tuple
    latencies: tuple


def _getNetOverhead(comm: Comm) -> float:
    if comm.cpuArch == CPU_ARCH_X86 and comm.cpuVendor == CPU_VENDOR_INTEL:
        return 1.0
    if comm.cpuArch == CPU_ARCH_X86 and comm.cpuVendor == CPU_VENDOR_AMD:
        return 2.0
    return 1.0


def _ncclPatEnable(comm: Comm) -> int:
    if comm.minCompCap < 60:
        return 0
    if comm.nNodes != comm.nRanks:
        return 0                 # PAT only supports 1 GPU per node
    if not comm.netDeviceHost:
        return 0
    return 1


def tune_model(comm: Comm) -> Model:
    """``ncclTopoTuneModel``: the bandwidth and latency of every (function, algorithm, protocol)."""
    NF, NA, NP = NCCL_NUM_FUNCTIONS, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS
    bandwidths = [[[0.0] * NP for _ in range(NA)] for _ in range(NF)]
    latencies = [[[0.0] * NP for _ in range(NA)] for _ in range(NF)]
    nNodes, nRanks = comm.nNodes, comm.nRanks
    minCompCap = comm.minCompCap
    maxCompCap = comm.maxCompCap or comm.minCompCap
    graphs = comm.graphs()
    V = version(comm.version)
    k = V.key
    if nRanks <= 1:
        return Model(comm, _freeze(bandwidths), _freeze(latencies))

    compCapIndex = (NCCL_BLACKWELL_COMPCAP_IDX if minCompCap >= 100 else NCCL_HOPPER_COMPCAP_IDX if minCompCap >= 90
                    else NCCL_AMPERE_COMPCAP_IDX if minCompCap >= 80 else NCCL_VOLTA_COMPCAP_IDX)
    index2 = nNodes - 1 if nNodes <= 2 else 2
    # LL: for single node, we look at GPU type; for multi-node, we look at CPU type
    index1 = compCapIndex if nNodes == 1 else (1 if comm.cpuVendor in (CPU_VENDOR_AMD, CPU_VENDOR_MIXED) else 0)
    llMaxBw = V.llMaxBws[index1][index2]
    perChMaxTreeBw = V.perChMaxTreeBws[compCapIndex][index2]
    perChMaxRingLL128Bw = V.perChMaxRingLL128Bws[compCapIndex][index2]
    perChMaxTreeLL128Bw = V.perChMaxTreeLL128Bws[compCapIndex][index2]
    perChMaxNVLSTreeBw = V.perChMaxNVLSTreeBws[compCapIndex][index2] if V.perChMaxNVLSTreeBws else float("inf")
    hwLat = [[list(p) for p in hw] for hw in V.hwLatencies]
    # De-penalize Tree/Simple latency on Power systems to favor Tree than Ring
    if comm.cpuArch == CPU_ARCH_POWER:
        hwLat[NCCL_HW_PCI][NCCL_ALGO_TREE][NCCL_PROTO_SIMPLE] = hwLat[NCCL_HW_PCI][NCCL_ALGO_RING][NCCL_PROTO_SIMPLE]
    ppn = f32(nRanks / nNodes)
    maxTreePattern = comm.maxTreePattern if comm.maxTreePattern >= 0 else comm.tree.pattern

    intraHw = [NCCL_HW_NVLINK if g.typeIntra == LINK_NVL else NCCL_HW_PCI for g in graphs]
    hw = [intraHw[a] if nNodes == 1 else NCCL_HW_NET for a in range(NA)]

    for coll in range(NF):
        nsteps = (2 * (nRanks - 1) if coll == ncclFuncAllReduce
                  else nRanks - 1 if coll in (ncclFuncReduceScatter, ncclFuncAllGather) else nRanks)
        for a in range(NA):
            if a >= V.algorithms:
                continue                 # not in this release: bandwidth 0, never chosen
            if coll in (ncclFuncBroadcast, ncclFuncReduce) and a != NCCL_ALGO_RING:
                continue
            if coll in (ncclFuncReduceScatter, ncclFuncAllGather) and a not in (
                    NCCL_ALGO_PAT, NCCL_ALGO_RING, NCCL_ALGO_NVLS, NCCL_ALGO_COLLNET_DIRECT):
                continue
            if coll == ncclFuncAllReduce and a == NCCL_ALGO_PAT:
                continue
            g = graphs[a]
            for p in range(NP):
                if a in (NCCL_ALGO_NVLS, NCCL_ALGO_NVLS_TREE) and p != NCCL_PROTO_SIMPLE:
                    continue
                if coll in (ncclFuncReduceScatter, ncclFuncAllGather) and a == NCCL_ALGO_PAT and (
                        p != NCCL_PROTO_SIMPLE or _ncclPatEnable(comm) == 0):
                    continue
                collnet = a in (NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_COLLNET_CHAIN)
                bw = f32(g.bwIntra if nNodes <= 2 or collnet else g.bwInter)
                if a in (NCCL_ALGO_NVLS_TREE, NCCL_ALGO_NVLS) and V.nvlsEfficiency is None:
                    # 2.19-2.26: the graph's bandwidths, NVLSTree's inter-node one halved beyond 2 nodes
                    bw = f32(min(g.bwIntra, g.bwInter) if a == NCCL_ALGO_NVLS else
                             min(g.bwIntra, g.bwInter if nNodes <= 2 else f32(g.bwInter / 2)))
                elif a in (NCCL_ALGO_NVLS_TREE, NCCL_ALGO_NVLS):
                    # NVLS/NVLStree needs at least 2 channels
                    if g.nChannels < 2:
                        continue
                    # Convert to NVLS busBW/channel (float arithmetic, one rounding per operation)
                    intraBw = f32(f32(f32(g.bwIntra * f32(nvlsEfficiency[compCapIndex])) * (g.nChannels - 1))
                                  / g.nChannels)
                    # AllReduce pipelines two operations.
                    if coll == ncclFuncAllReduce:
                        intraBw = f32(intraBw * 2.0)
                    else:
                        intraBw = f32(intraBw * f32(f32(ppn - 1) / ppn))
                    # Handle 2 node case of NVLSTree
                    interBw = f32(g.bwInter * (2 if nNodes <= 2 and a == NCCL_ALGO_NVLS_TREE else 1))
                    bw = min(intraBw, interBw,
                             f32(perChMaxNVLSTreeBw) if a == NCCL_ALGO_NVLS_TREE else float("inf"))
                busBw = f32(g.nChannels * bw)

                # Various model refinements
                if V.legacy and compCapIndex == NCCL_AMPERE_COMPCAP_IDX:
                    busBw = min(busBw, f32(235.0))              # <= 2.17
                if a == NCCL_ALGO_RING and p == NCCL_PROTO_LL:
                    if k < (2, 21):
                        busBw = f32(min(llMaxBw, busBw * (1.0 / 4.0 if nNodes > 1 or coll in (
                            ncclFuncAllReduce, ncclFuncReduce) else 1.0 / 3.0)))
                    else:
                        busBw = f32(min(llMaxBw, busBw * .5))
                if a == NCCL_ALGO_RING and p == NCCL_PROTO_LL128:
                    # up to 2.21: 0.7 with one rank per node
                    busBw = f32(min(busBw * (0.7 if k < (2, 23) and ppn < 2 else 0.92), g.nChannels * perChMaxRingLL128Bw))
                if a == NCCL_ALGO_TREE and coll == ncclFuncAllReduce:
                    busBw = f32(min(busBw * .92, g.nChannels * perChMaxTreeBw))
                if a == NCCL_ALGO_TREE and p == NCCL_PROTO_LL:
                    busBw = f32(min(busBw * 1.0 / 3.8, llMaxBw))
                if a == NCCL_ALGO_TREE and p == NCCL_PROTO_LL128:
                    busBw = f32(min(busBw * (7.0 / 9.0 if nNodes == 1 else 120.0 / 128.0),
                                    g.nChannels * perChMaxTreeLL128Bw))
                if a == NCCL_ALGO_TREE and maxTreePattern == NCCL_TOPO_PATTERN_TREE and not V.legacy:
                    busBw = f32(busBw * .85)
                if a == NCCL_ALGO_PAT:
                    busBw = f32(busBw * .75)
                if a == NCCL_ALGO_COLLNET_DIRECT and p != NCCL_PROTO_SIMPLE:
                    busBw = 0.0     # Not used
                if a == NCCL_ALGO_COLLNET_CHAIN and p != NCCL_PROTO_SIMPLE:
                    busBw = 0.0     # Not used
                if a == NCCL_ALGO_COLLNET_DIRECT and p == NCCL_PROTO_SIMPLE:
                    if coll in (ncclFuncAllGather, ncclFuncReduceScatter):
                        busBw = f32(ppn * min(g.bwIntra, f32(g.bwInter * f32(0.9))))
                    elif g.nChannels == 0:
                        busBw = 0.0     # no graph: C divides 0 by an infinite factor
                    else:
                        # Collnet+Direct requires all GPUs to have a local NIC to work at full speed
                        factor = f32(ppn / (1.0 * g.nChannels))      # GPU/NIC ratio
                        factor = f32(factor - f32(f32(factor - 1) / 2))
                        busBw = f32(busBw / factor)
                        if minCompCap >= 90:
                            busBw = f32(busBw * .85)
                # disable collnet for allgather/reducescatter if #localranks > #heads
                # AllGather/ReduceScatter requires 1:1 GPU:NIC
                if (a in (NCCL_ALGO_NVLS, NCCL_ALGO_COLLNET_DIRECT) and p == NCCL_PROTO_SIMPLE
                        and coll in (ncclFuncAllGather, ncclFuncReduceScatter) and nNodes > 1):
                    nHeads = 0
                    if coll == ncclFuncAllGather and not comm.collNetAllGather:
                        busBw = 0.0
                    if coll == ncclFuncReduceScatter and not comm.collNetReduceScatter:
                        busBw = 0.0
                    if comm.collnetEnable:
                        nHeads = comm.collNetHeadsNum
                    else:
                        busBw = 0.0
                    if busBw > 0.0 and comm.localRanks > nHeads:
                        busBw = 0.0

                # Convert bus BW to algorithm BW (up to 2.21 for every function, NVLS's AllGather/ReduceScatter too)
                if k < (2, 23) or not (a != NCCL_ALGO_RING and coll in (ncclFuncAllGather, ncclFuncReduceScatter)):
                    ratio = 1.0
                    if a == NCCL_ALGO_RING or (a in (NCCL_ALGO_NVLS, NCCL_ALGO_NVLS_TREE) and V.nvlsEfficiency):
                        ratio = f32(ratio * ((1.0 * nRanks) / nsteps))
                    elif a in (NCCL_ALGO_NVLS, NCCL_ALGO_NVLS_TREE):
                        ratio = f32(ratio * 5.0 / 6.0)          # 2.19-2.26
                    else:
                        ratio = f32(ratio * .5)
                    busBw = f32(busBw * ratio)
                bandwidths[coll][a][p] = busBw
                lat = f32(V.baseLatencies[a][p])
                intraLat = f32(hwLat[intraHw[a]][a][p])
                if V.legacy:
                    # <= 2.17: the NET plugin's latency replaces NCCL's network latency; LL across nodes x1.8
                    interLat = f32(g.latencyInter if g.latencyInter else hwLat[NCCL_HW_NET][a][p])
                    if nNodes > 1 and p == NCCL_PROTO_LL:
                        intraLat = f32(intraLat * f32(1.8))
                else:
                    # With ppn=1 latencies are fully exposed, use the Tree network latency (from 2.23)
                    interLat = f32(hwLat[NCCL_HW_NET][NCCL_ALGO_TREE][p] if ppn == 1 and k >= (2, 23)
                                   else hwLat[NCCL_HW_NET][a][p])
                    interLat = f32(interLat + g.latencyInter)
                    # Also add the flush extra latency
                    if p == NCCL_PROTO_SIMPLE:
                        interLat = f32(interLat + g.latencyInter)

                if a == NCCL_ALGO_RING:
                    rlat = f32(hwLat[hw[a]][a][p])
                    if coll in (ncclFuncReduce, ncclFuncBroadcast):
                        if g.sameChannels:
                            lat = f32(lat + rlat)
                        else:
                            # Add some chunk latency, waiting for proper chunk modeling
                            if p == NCCL_PROTO_SIMPLE:
                                rlat = f32(hwLat[hw[a]][NCCL_ALGO_TREE][p])
                            lat = f32(lat + f32(nsteps * rlat))
                    else:
                        # Inter-node rings still have to launch nsteps * net overhead.
                        netOverhead = 0.0
                        if nNodes > 1 and not V.legacy:
                            netOverhead = f32(_getNetOverhead(comm))
                            if p == NCCL_PROTO_SIMPLE:
                                netOverhead = f32(netOverhead * 3)
                        intraLat = max(intraLat, netOverhead)
                        nInterSteps = 0 if nNodes == 1 else 2 * (nNodes - 1) if coll == ncclFuncAllReduce else nNodes - 1
                        if k < (2, 23) and coll == ncclFuncAllReduce and nNodes > 1:
                            nInterSteps = 2 * nNodes            # up to 2.21
                        lat = f32(lat + f32(f32((nsteps - nInterSteps) * intraLat) + f32(nInterSteps * interLat)))
                elif a == NCCL_ALGO_TREE:
                    if coll == ncclFuncAllReduce:
                        lat = f32(lat + f32(2 * f32(f32((nRanks // nNodes - 1) * intraLat)
                                                    + f32(log2i(nNodes) * interLat))))
                elif a == NCCL_ALGO_COLLNET_DIRECT:
                    # Add 0.4 us arity serialization latency
                    lat = f32(lat + (2 * (f32(min(1, nRanks // nNodes - 1) * intraLat) + (nRanks // nNodes - 1) * 0.4)
                                     + interLat))
                elif a == NCCL_ALGO_COLLNET_CHAIN:
                    lat = f32(lat + f32(f32(2 * (nRanks // nNodes - 1) * intraLat) + interLat))
                elif a == NCCL_ALGO_NVLS:
                    lat = intraLat
                    if nNodes > 1:
                        lat = f32(lat + interLat)
                elif a == NCCL_ALGO_NVLS_TREE:
                    lat = f32(lat + f32(intraLat + f32(2 * log2i(nNodes) * interLat)))
                elif a == NCCL_ALGO_PAT:
                    if coll in (ncclFuncAllGather, ncclFuncReduceScatter):
                        if k < (2, 27):
                            lat = f32(8.0)                      # "= 8 // Base time" (baseLat has no PAT row)
                        lat = f32(lat + (log2i(nNodes) * (interLat / 3.5) + nRanks * 2.8))
                latencies[coll][a][p] = lat

    # Protocols/Algorithms enable/disable: all are enabled except LL128, enabled by default only in certain cases
    for c in range(NF):
        for a in range(NA):
            g = graphs[a]
            algoEnable = 1
            # Disable NVLS Tree on a single node
            if nNodes == 1 and a == NCCL_ALGO_NVLS_TREE:
                algoEnable = 0
            # Disable Collnet+Direct, Collnet+Chain or Collnet+NVLS if collnet is not supported.
            if not comm.collnetEnable and (a in (NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_COLLNET_CHAIN)
                                           or (a == NCCL_ALGO_NVLS and nNodes > 1)):
                algoEnable = 0
            # (collNetChainSupport: a CollNet comm here always has its chain graph)
            # Disable CollNet+Direct if not on an NVSwitch system
            if comm.nvsCount == 0 and a == NCCL_ALGO_COLLNET_DIRECT:
                algoEnable = 0
            for p in range(NP):
                pEnable = 1
                if p == NCCL_PROTO_LL128:
                    if minCompCap >= 90:        # ncclParamLl128C2c() defaults to 1
                        # Enable LL128 by default only on Hopper/Blackwell for all connections up to P2C and PXN.
                        pEnable &= g.typeInter <= PATH_PXN
                    else:
                        # Enable LL128 only up to PXB.
                        pEnable &= g.typeInter <= PATH_PXB
                    pEnable &= g.typeIntra <= PATH_NVB
                    # Enable LL128 for interoperability between GPUs with different compcap (Hopper and above)
                    pEnable &= minCompCap == maxCompCap or minCompCap >= 90
                    pEnable &= not (minCompCap < 70 or (minCompCap == 90 and comm.cudartVersion == 11080
                                                         and c == ncclFuncAllReduce and a == NCCL_ALGO_RING
                                                         and nRanks == 2))
                if pEnable == 0 or algoEnable == 0:
                    bandwidths[c][a][p] = 0.0
    return Model(comm, _freeze(bandwidths), _freeze(latencies))


def _freeze(t) -> tuple:
    return tuple(tuple(tuple(p) for p in a) for a in t)


def algo_time(model: Model, coll: int, algorithm: int, protocol: int, nBytes: int) -> float:
    """``ncclTopoGetAlgoTime`` for one call (numPipeOps 1): microseconds, -1.0 where the bandwidth is 0."""
    comm = model.comm
    bw = model.bandwidths[coll][algorithm][protocol]
    lat = model.latencies[coll][algorithm][protocol]
    if bw == 0:
        return -1.0
    logSize = log2i(nBytes >> 6)
    if algorithm == NCCL_ALGO_TREE and coll == ncclFuncAllReduce and 0 <= logSize < 23:
        bw = f32(bw * treeCorrectionFactor[protocol][logSize])
    if (algorithm == NCCL_ALGO_NVLS_TREE and coll == ncclFuncAllReduce and 0 <= logSize < 24
            and comm.minCompCap >= 100 and comm.cpuArch == CPU_ARCH_X86):
        bw = f32(bw * treeCorrectionFactor[protocol][logSize])
    if version(comm.version).legacy:
        # <= 2.17: from nRanks/16 x 64 KiB; x1.9 (2.17: x1.5 from sm90)
        if (algorithm == NCCL_ALGO_RING and protocol == NCCL_PROTO_SIMPLE and comm.nNodes > 1
                and coll == ncclFuncAllReduce and nBytes >= comm.nRanks / 16.0 * 65536):
            lat = f32(lat * (1.5 if comm.version == "2.17.1" and comm.minCompCap >= 90 else 1.9))
    elif (algorithm == NCCL_ALGO_RING and protocol == NCCL_PROTO_SIMPLE and comm.nNodes > 1
            and coll == ncclFuncAllReduce and nBytes // (comm.nChannels * comm.nRanks) >= 64):
        lat = f32(lat * (1.9 if comm.minCompCap < 80 else 1.4))     # Plateau effect of ring
    latCount = 1        # numPipeOps = 1: DIVUP(1, NCCL_MAX_DEV_WORK_BATCH_COLLS) = 1 too
    # float arithmetic: nBytes (size_t) becomes a float in nBytes / (1000 * bw)
    return f32(f32(lat * latCount) + f32(f32(nBytes) / f32(1000 * bw)))


def cost_table(model: Model, coll: int, nBytes: int) -> list:
    """``updateCollCostTable`` (enqueue.cc): [algorithm][protocol] in us, -1.0 (NCCL_ALGO_PROTO_IGNORE) where
    NCCL does not try the pair or its bandwidth is 0. CollNet support is the comm's (sum of a supported type)."""
    comm = model.comm
    table = [[NCCL_ALGO_PROTO_IGNORE] * NCCL_NUM_PROTOCOLS for _ in range(NCCL_NUM_ALGORITHMS)]
    if comm.nRanks == 1:
        table[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 0.0
        return table
    collNetSupport = 1 if comm.collnetEnable else 0
    maxLocalRanks = comm.localRanks
    for a in range(NCCL_NUM_ALGORITHMS):
        if a in (NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_COLLNET_CHAIN) and collNetSupport != 1:
            continue
        # CollNetDirect and CollNetChain are only supported for up to 8 local GPUs
        if a in (NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_COLLNET_CHAIN) and maxLocalRanks > NCCL_MAX_DIRECT_ARITY + 1:
            continue
        if a in (NCCL_ALGO_NVLS, NCCL_ALGO_NVLS_TREE) and (
                not comm.nvlsSupport or (coll != ncclFuncAllReduce and comm.localRanks > NCCL_MAX_NVLS_ARITY)):
            continue
        if a == NCCL_ALGO_NVLS and collNetSupport != 1 and comm.nNodes > 1:
            continue
        for p in range(NCCL_NUM_PROTOCOLS):
            table[a][p] = algo_time(model, coll, a, p, nBytes)
    return table


@dataclass(frozen=True)
class Row:
    """One (algorithm, protocol) NCCL's model enables for a call: ``time`` in us, ``algbw``/``busbw`` in
    bytes/s as nccl-tests reports them for that time."""
    algorithm: str
    protocol: str
    time: float
    algbw: float
    busbw: float
    chosen: bool = False

    def to_json(self) -> dict:
        return {"algorithm": self.algorithm, "protocol": self.protocol, "time": self.time * 1e-6,
                "algbw": self.algbw, "busbw": self.busbw, "chosen": self.chosen}


def func(collective: str) -> int:
    """NCCL's function (``ncclFunc*``) of a pyxccl primitive name."""
    if collective not in FUNCS:
        raise InvalidArgumentError(f"NCCL's tuning model covers {', '.join(FUNCS)}, not {collective!r} "
                                   "(NCCL runs the others as point-to-point calls): give one of those")
    return FUNCS[collective]


def bus_factor(coll: int, nRanks: int) -> float:
    """nccl-tests' busbw / algbw: 2(n-1)/n for allreduce, (n-1)/n for allgather and reduce-scatter, 1 else."""
    if coll == ncclFuncAllReduce:
        return 2 * (nRanks - 1) / nRanks
    if coll in (ncclFuncAllGather, ncclFuncReduceScatter):
        return (nRanks - 1) / nRanks
    return 1.0


def predict(collective: str, nBytes: int, comm: Comm, model: Model | None = None) -> list[Row]:
    """Every (algorithm, protocol) NCCL's model times for ``collective`` of ``nBytes`` (nccl-tests' size:
    the whole buffer, NCCL's ``nBytes``), in NCCL's order; the one NCCL picks has ``chosen``."""
    coll = func(collective)
    model = model or tune_model(comm)
    table = cost_table(model, coll, nBytes)
    best = argmin(table)
    rows = []
    for a in range(NCCL_NUM_ALGORITHMS):
        for p in range(NCCL_NUM_PROTOCOLS):
            t = table[a][p]
            if t < 0:
                continue
            algbw = nBytes / (t * 1e-6) if t > 0 else float("inf")
            rows.append(Row(ncclAlgoStr[a], ncclProtoStr[p], t, algbw, algbw * bus_factor(coll, comm.nRanks),
                            (a, p) == best))
    return rows


def argmin(table) -> tuple | None:
    """``topoGetAlgoInfo``: the first strict minimum of the non-negative times, algorithms then protocols."""
    minTime, best = float("inf"), None
    for a in range(NCCL_NUM_ALGORITHMS):
        for p in range(NCCL_NUM_PROTOCOLS):
            t = table[a][p]
            if t == NCCL_ALGO_PROTO_IGNORE:
                continue
            if 0.0 <= t < minTime:
                best, minTime = (a, p), t
    return best


def choose(collective: str, nBytes: int, comm: Comm) -> Row:
    """The (algorithm, protocol) NCCL picks and its predicted time."""
    rows = predict(collective, nBytes, comm)
    for r in rows:
        if r.chosen:
            return r
    raise InvalidArgumentError(f"NCCL model: no algorithm/protocol available for {collective} on {comm.name or comm}")


# --- presets -------------------------------------------------------------------------------------------
# What ncclTopoCompute (src/graph/search.cc) finds on full DGX nodes, traced by hand from the source on the
# machines' topologies; "log:" marks a value a published NCCL_DEBUG=INFO log shows too.
#
# DGX A100 (sm80): GPU<->NVSwitch 12 NVLinks x SM80_NVLINK_BW 20.0 = 240 GB/s (topo.h; logs print NVL[240.0],
# "maxBw 240.0 totalBw 240.0"); PCIe Gen4 x16 24 GB/s (logs: PCI[24.0]); 8 ConnectX-6 HDR 200 Gb/s NICs
# (25 GB/s), two GPUs and two NICs behind each pair of PCIe switches (GPU-NIC path PXB); AMD EPYC CPUs.
#   Ring, one node: speedArrayIntra from 40: 6 channels x 40 = 240 >= totalBw, done; ncclTopoDupChannels
#     (bwIntra >= 25, sm80) doubles to 12 x 20.  log: "Pattern 4, crossNic 0, nChannels 12, bw 20.000000/
#     20.000000, type NVL/PIX, sameChannels 1" (public A100 NVSwitch logs).
#   Tree, one node: min = max = 12 channels; 20 x 12 fits totalBw x 8/7; no dup (20 < 25); pass 2 cannot
#     raise bwIntra to 30 (12 x 30 > 240): 12 x 20, pattern BALANCED_TREE.
#   Ring, several nodes: maxBw = GPU->NET path 24 (PCIe), speedArrayInter from 24: a channel per NIC,
#     8 x 24; no dup (24 < 25); 28 does not fit.  (Derived; not seen in a published log.)
#   Tree, several nodes: 8 channels (the ring's); 24, then pass 2 raises bwIntra while it fits the NVLinks:
#     28, 30 (8 x 30 = 240), not 48: 8 x bwIntra 30 / bwInter 24.  (Derived; not seen in a published log.)
# DGX H100 (sm90): GPU<->NVSwitch 18 NVLinks x SM90_NVLINK_BW 20.6 = 370.8 GB/s (logs: NVL[370.8]); PCIe Gen5
# x16 48 GB/s (logs: PCI[48.0]); 8 ConnectX-7 NDR 400 Gb/s NICs (50 GB/s), one per GPU behind a PCIe switch
# (PIX); Intel Xeon CPUs; NVSwitch with NVLink SHARP (NVLS).
#   Ring, one node: sm90SpeedArrayIntra from 60: 6 x 60 = 360 (< 370.8; 50, 40, 30 give no more in total);
#     dup (bwIntra 60 >= 50) to 12 x 30.  log (NVIDIA/nccl#1197, an 18-NVLink NVSwitch system on 2.19.4):
#     "Pattern 4, crossNic 0, nChannels 12, bw 30.000000/30.000000, type NVL/PIX".
#   Tree, one node: 12 channels at 30 (12 x 40 > 370.8 x 8/7), no dup (30 < 50): 12 x 30, BALANCED_TREE.
#     log (#1197): "Pattern 1, crossNic 0, nChannels 12, bw 30.000000/30.000000, type NVL/PIX".
#   NVLS, one node: 8 channels (min = max = 8 GPUs), the head GPU counts twice: 9 x bwIntra <= 370.8 ->
#     40; pass 2 raises bwInter (unconstrained inside a node) to 60: 8 x 40/60.  log (#1197): "Pattern 5,
#     crossNic 0, nChannels 8, bw 40.000000/60.000000".
#   Ring, several nodes: sm90SpeedArrayInter from 48 (GPU->NET path 48): a channel per NIC, 8 x 48; no dup
#     (48 < 50 with 8 > 4 channels).  log (2 x 8 H100, 8 x 400G rails): "Pattern 4, crossNic 2, nChannels 8,
#     bw 48.000000/48.000000, type NVL/PIX".
#   Tree, several nodes: 8 channels at 48 (speedIndex 0: pass 2 cannot raise it): 8 x 48/48, BALANCED_TREE.
#     (Derived; not seen in a published log.)
#   NVLS, several nodes: heads = GPUs with a NIC; a head's NVLink carries 2 x bwIntra: 8 channels need
#     9 x bwIntra <= 370.8 -> 40; pass 2 raises bwInter to 48 (the GPU->NET path): 8 x 40/48.
#     (Derived; not seen in a published log.)
# CollNet (SHARP) graphs are not preset: their search (ncclTopoSearchTryCollnetDirect, the SHARP plugin's
# NICs) was not traced; give Comm(collnetDirect=..., collnetChain=...) to model them.
_A100 = dict(minCompCap=80, cpuVendor=CPU_VENDOR_AMD, nvsCount=1)
_H100 = dict(minCompCap=90, cpuVendor=CPU_VENDOR_INTEL, nvsCount=1)
_SRC = "NCCL 2.30.7 src/graph/search.cc traced on the machine's topology (see pyxccl/sim/nccl.py)"
PRESETS = {
    ("dgx-a100", True): dict(
        _A100, ring=Graph(12, 20.0, 20.0, PATH_NVL, PATH_PIX, source=_SRC + "; public logs agree"),
        tree=Graph(12, 20.0, 20.0, PATH_NVL, PATH_PIX, pattern=NCCL_TOPO_PATTERN_BALANCED_TREE, source=_SRC)),
    ("dgx-a100", False): dict(
        _A100, ring=Graph(8, 24.0, 24.0, PATH_NVL, PATH_PXB, source=_SRC),
        tree=Graph(8, 30.0, 24.0, PATH_NVL, PATH_PXB, pattern=NCCL_TOPO_PATTERN_BALANCED_TREE, source=_SRC)),
    ("dgx-h100", True): dict(
        _H100, ring=Graph(12, 30.0, 30.0, PATH_NVL, PATH_PIX, source=_SRC + "; NVIDIA/nccl#1197 agrees"),
        tree=Graph(12, 30.0, 30.0, PATH_NVL, PATH_PIX, pattern=NCCL_TOPO_PATTERN_BALANCED_TREE,
                   source=_SRC + "; NVIDIA/nccl#1197 agrees"),
        nvls=Graph(8, 40.0, 60.0, PATH_NVL, PATH_PIX, sameChannels=0, pattern=NCCL_TOPO_PATTERN_NVLS,
                   source=_SRC + "; NVIDIA/nccl#1197 agrees")),
    ("dgx-h100", False): dict(
        _H100, ring=Graph(8, 48.0, 48.0, PATH_NVL, PATH_PIX, source=_SRC + "; a published 2-node log agrees"),
        tree=Graph(8, 48.0, 48.0, PATH_NVL, PATH_PIX, pattern=NCCL_TOPO_PATTERN_BALANCED_TREE, source=_SRC),
        nvls=Graph(8, 40.0, 48.0, PATH_NVL, PATH_PIX, sameChannels=0, pattern=NCCL_TOPO_PATTERN_NVLS, source=_SRC)),
}
#: GPUs per node the presets were traced for (the search's results change with the GPUs in the node)
PRESET_GPUS = 8


def preset_names() -> list[str]:
    return sorted({k[0] for k in PRESETS})


def preset(name: str, nodes: int, per_node: int = PRESET_GPUS) -> Comm:
    """The ``Comm`` NCCL builds for ``nodes`` full DGX nodes of ``name`` (``preset_names()``)."""
    if name not in preset_names():
        raise InvalidArgumentError(f"no NCCL-model preset {name!r}: give one of {', '.join(preset_names())}, or "
                                   "build a pyxccl.sim.nccl.Comm from your NCCL_DEBUG=INFO graph lines")
    if per_node != PRESET_GPUS:
        raise InvalidArgumentError(f"the NCCL-model preset {name!r} is traced for {PRESET_GPUS} GPUs per node, not "
                                   f"{per_node}: NCCL's topology search finds other graphs there; give --per-host "
                                   f"{PRESET_GPUS}, or build a Comm from your NCCL_DEBUG=INFO graph lines")
    kw = PRESETS[(name, nodes == 1)]
    return Comm(nNodes=nodes, nRanks=nodes * per_node, name=name, source=_SRC, **kw)


def with_collnet(comm: Comm, direct: Graph, chain: Graph, heads: int, *, allgather: bool = False,
                 reducescatter: bool = False) -> Comm:
    """``comm`` with CollNet (SHARP) graphs (``heads``: CollNetDirect heads per node)."""
    return replace(comm, collnetDirect=direct, collnetChain=chain, collNetHeadsNum=heads,
                   collNetAllGather=allgather, collNetReduceScatter=reducescatter)
