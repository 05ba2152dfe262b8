"""NCCL's alltoall as NCCL runs it: every peer's send and receive posted at once (grouped point-to-point).

NCCL's tuning model (``sim/nccl.py``) has no alltoall: ``ncclAlltoAll`` (2.28 on; nccl-tests' alltoall
calls it from NCCL 2.28, and before that posts the same ``ncclSend``/``ncclRecv`` pair to every peer in
one group) appends one send and one receive task per peer, and the planner puts them all in one kernel.
Ported from NVIDIA/nccl at tag v2.29.2-1 (commit ebd1e929285881cb4df02c3459588a2e12b2d8c0, the release
of the published alltoall runs), files:

- ``src/enqueue.cc``: ``taskAppend`` (alltoall -> a send and a receive task per peer);
  ``scheduleP2pTasksToPlan`` (every round of ``comm->p2pSchedule`` in one plan; ``nChannelsMin`` halved
  while ``nChannelsMin * nRanks > p2pnChannels``); ``addP2pToPlan`` (an operation's channels: from
  ``min(nChannelsMin, bytes / minPartSize)``, doubled while a part exceeds ``maxPartSize``; parts of
  ``p2pChunkSize / 2 .. p2pChunkSize`` across nodes, ``/8 .. x32`` inside one);
  ``ncclAddWorkBatchToPlan`` (a channel runs up to ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` = 8 operations of
  one group of rounds in one batch, concurrently);
- ``src/init.cc``: ``ncclP2pSchedule`` (rounds: group deltas, i.e. node by node across nodes, then the
  local deltas inside a group of up to 8 GPUs); ``computeBuffSizes`` (``p2pChunkSize``: 128 KiB across
  nodes, 512 KiB on one NVLink node);
- ``src/include/channel.h``: ``ncclP2pChannelBaseForRound`` (the first channel of a round: its group
  delta across nodes, its round on one node, bit-reversed over ``log2(p2pnChannels)`` bits);
- ``src/graph/paths.cc``: ``ncclTopoGetNchannels`` (channels per peer: 2 per NVLink of the path to an
  NVLink peer, ``max(NICs, netBw / NCCL_P2P_PER_CHANNEL_NET_BW)`` to a remote one, 14 GB/s a channel),
  ``ncclTopoComputeP2pChannels`` (``p2pnChannels`` = ``comm->nChannels`` to a power of two; across nodes
  the channels per peer halved until every group of 8 peers has its own channels: "the network is the
  bottleneck ... fit all the peers within a single round").

So every peer's transfer is in flight at once, and the call takes as long as its busiest resource:

- a GPU's local traffic ((L-1) chunks) through the channels that carry its local rounds, each channel
  at half an NVLink (NCCL sizes a peer's channels as 2 per NVLink, ``2 * path->bw / nvlBw``), and at most
  the GPU's NVLinks (``nvlink_bw``);
- a node's traffic to other nodes (L x (n - L) chunks) over its NICs: the multi-node ring graph's
  ``nChannels * bwInter`` (a channel per NIC at the NIC's search speed), and at most the channels that
  carry the remote rounds at 14 GB/s each. Where the traffic crosses (PXN: to the GPU on the
  destination's rail first, over NVLink) changes no NIC's load: each NIC carries its GPU's share either
  way; the NVLink hop is not priced (it is below the NIC time by 7x on the presets).

Not modelled: the self copy, the kernel's own latency (NCCL gives no figure for point-to-point; the
fitted base and launch latencies of ``sim/calibrated.py`` are added as to every call), LL for small
parts (``NCCL_P2P_LL_THRESHOLD``: the published points start at 32 MiB), the releases' differences (2.30.7
counts ``p2pMaxPeers`` where 2.29.2 counts ``nRanks``, the same for alltoall; releases before 2.19 use
2 channels per network peer): every release is priced by 2.29.2's rules.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._errors import InvalidArgumentError
from . import nccl as N

NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8      # src/include/device.h
P2P_LL_THRESHOLD = 16384                 # NCCL_P2P_LL_THRESHOLD (enqueue.cc): LL up to this many bytes a channel
P2P_PER_CHANNEL_NET_BW = 14.0            # GB/s, NCCL_P2P_PER_CHANNEL_NET_BW (paths.cc)
P2P_NET_CHUNKSIZE = 1 << 17              # NCCL_P2P_NET_CHUNKSIZE (init.cc)
P2P_NVL_CHUNKSIZE = 1 << 19              # NCCL_P2P_NVL_CHUNKSIZE (init.cc)
#: ncclTopoNVLinkBw (src/graph/topo.h: SM80_NVLINK_BW, SM90_NVLINK_BW), GB/s a link
NVLINK_BW = {80: 20.0, 90: 20.6}
#: NVLinks from a GPU to the NVSwitches on the presets' machines (DGX A100: 12, DGX H100: 18; sim/nccl.py)
NVLINKS = {80: 12, 90: 18}


@dataclass(frozen=True)
class Plan:
    """How NCCL runs one alltoall on ``comm`` and what it costs: ``time`` in microseconds; bytes per GPU
    (``intraBytes``: to its node's other GPUs) and per node (``netBytes``: to other nodes); bandwidths in
    GB/s; channels as NCCL assigns them."""
    p2pnChannels: int
    perPeer: int          # comm->p2pnChannelsPerPeer
    nChannels: int        # channels of one operation (addP2pToPlan)
    chunk: int            # bytes to each peer
    intraChannels: int    # channels carrying a GPU's local rounds
    netChannels: int      # channels carrying a GPU's remote rounds
    intraBytes: int
    netBytes: int
    intraBw: float
    netBw: float
    time: float


def _pow2up(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def _reverse_bits(x: int, bits: int) -> int:
    """``reverseBits`` (src/include/bitops.h): the low ``bits`` bits of ``x``, reversed."""
    return int(format(x & ((1 << bits) - 1), f"0{bits}b")[::-1], 2) if bits else 0


def nvlink_bw(comm: N.Comm) -> float:
    """GB/s of a GPU's NVLinks (``path->bw`` from a GPU to its NVSwitch peers)."""
    cc = 90 if comm.minCompCap >= 90 else 80
    return NVLINKS[cc] * NVLINK_BW[cc]


def net_bw_per_gpu(comm: N.Comm) -> float:
    """GB/s of network a GPU has: its node's NIC bandwidth as the multi-node ring graph finds it (a channel
    per NIC at the NIC's search speed), shared by the node's GPUs."""
    return comm.ring.nChannels * comm.ring.bwInter / comm.localRanks


def p2p_channels(comm: N.Comm) -> tuple[int, int]:
    """(``p2pnChannels``, ``p2pnChannelsPerPeer``) as ``ncclTopoComputeP2pChannels`` leaves them."""
    p2pn = _pow2up(min(comm.nChannels, N.MAXCHANNELS))
    per = N.MAXCHANNELS
    cc = 90 if comm.minCompCap >= 90 else 80
    if comm.localRanks > 1:                   # NVLink peers: 2 channels per NVLink of the path
        per = min(per, 2 * max(1, int(nvlink_bw(comm) / NVLINK_BW[cc])))
    if comm.nNodes > 1:                       # network peers: one local NIC, 14 GB/s a channel
        per = min(per, max(1, -(-int(net_bw_per_gpu(comm)) // int(P2P_PER_CHANNEL_NET_BW))))
    per = _pow2up(per)
    if comm.nNodes > 1:
        groups = -(-comm.nRanks // NCCL_MAX_DEV_WORK_P2P_PER_BATCH)
        while per * groups > p2pn and per > 1:
            per //= 2
    else:
        per = min(p2pn, per)
    return p2pn, per


def op_channels(comm: N.Comm, nbytes: int, p2pn: int, per: int) -> int:
    """Channels of one send (or receive) of ``nbytes`` (``scheduleP2pTasksToPlan`` and ``addP2pToPlan``)."""
    nmin = per
    while nmin * comm.nRanks > p2pn and nmin > 1:
        nmin //= 2
    step = P2P_NET_CHUNKSIZE if comm.nNodes > 1 else P2P_NVL_CHUNKSIZE
    lo, hi = (step // 2, step) if comm.nNodes > 1 else (step // 8, step * 32)
    if nbytes <= 0:
        return 1
    nch = min(nmin, -(-nbytes // lo))
    part = max(lo, -(-nbytes // nch))
    while part > hi and nch <= per // 2:
        nch *= 2
        part = -(-nbytes // nch)
    return nch


def protocol(plan: Plan) -> str:
    """The protocol NCCL runs each send of ``plan`` with (``addP2pToPlan``: LL while a send is at most
    ``nChannels * NCCL_P2P_LL_THRESHOLD`` bytes, else Simple). Only a label: ``alltoall`` prices every
    size by bandwidth alone (the module's "Not modelled")."""
    return "LL" if plan.chunk <= plan.nChannels * P2P_LL_THRESHOLD else "Simple"


def bus_factor(nRanks: int) -> float:
    """nccl-tests' alltoall busbw / algbw, (n-1)/n (``alltoall.cu``: the bytes a rank sends to others)."""
    return (nRanks - 1) / nRanks


def _busy(bases, nch: int, p2pn: int) -> int:
    """Channels the rounds starting at ``bases`` occupy, ``nch`` each (``ncclP2pChannelForPart``)."""
    return len({(b + k) & (p2pn - 1) for b in bases for k in range(nch)})


def alltoall(nBytes: int, comm: N.Comm, eff: float = 1.0) -> Plan:
    """NCCL's alltoall of ``nBytes`` (nccl-tests' size: a rank's whole send buffer) on ``comm``: every
    peer's transfer at once, as long as the busiest resource takes (the module's docstring). ``eff``
    scales every bandwidth (the fitted efficiency, as ``calibrated.scaled`` scales NCCL's)."""
    n, L, nodes = comm.nRanks, comm.localRanks, comm.nNodes
    if L > NCCL_MAX_DEV_WORK_P2P_PER_BATCH:
        raise InvalidArgumentError(f"NCCL alltoall model: {L} GPUs a node; the port covers nodes of at most "
                                   f"{NCCL_MAX_DEV_WORK_P2P_PER_BATCH} (one p2p schedule group a node): give fewer")
    chunk = nBytes // n
    p2pn, per = p2p_channels(comm)
    nch = op_channels(comm, chunk, p2pn, per)
    bits = p2pn.bit_length() - 1
    if nodes == 1:          # one group of rounds: round r (local delta r) from reverseBits(r)
        intra_ch = _busy([_reverse_bits(r, bits) for r in range(1, L)], nch, p2pn)
        net_ch = 0
    else:                   # a group of rounds per node delta g, from reverseBits(g); g = 0 is the local one
        # (a node of at most 8 GPUs is one group: p2pSchedGroupSize = L, one batch of rounds a group)
        intra_ch = _busy([_reverse_bits(0, bits)], nch, p2pn) if L > 1 else 0
        net_ch = _busy([_reverse_bits(g, bits) for g in range(1, nodes)], nch, p2pn)
    intra_bytes = chunk * (L - 1)
    net_bytes = L * chunk * (n - L)
    cc = 90 if comm.minCompCap >= 90 else 80
    intra_bw = min(nvlink_bw(comm), intra_ch * NVLINK_BW[cc] / 2) * eff if intra_ch else 0.0
    net_bw = min(comm.ring.nChannels * comm.ring.bwInter, L * net_ch * P2P_PER_CHANNEL_NET_BW) * eff if net_ch else 0.0
    t = max(intra_bytes / (1e3 * intra_bw) if intra_bytes else 0.0,
            net_bytes / (1e3 * net_bw) if net_bytes else 0.0)
    return Plan(p2pn, per, nch, chunk, intra_ch, net_ch, intra_bytes, net_bytes, intra_bw, net_bw, t)
