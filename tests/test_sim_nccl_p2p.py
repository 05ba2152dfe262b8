"""sim.nccl_p2p: NCCL's alltoall as grouped point-to-point, pinned against hand computations of NCCL 2.29.2's
channel rules (paths.cc, enqueue.cc, channel.h) on the presets' graphs."""
import pytest

from pyxccl.sim import nccl as N
from pyxccl.sim import nccl_p2p as A

GiB, MiB = 1 << 30, 1 << 20
HALF_NVLINK = 20.6 / 2       # GB/s a p2p channel carries to an NVLink peer (2 channels per NVLink, H100)


def test_two_nodes_of_h100_4GiB():
    """2 x 8 H100 at 4 GiB (S02's point), by hand:
    comm->nChannels 16 (8 search channels doubled) -> p2pnChannels 16; per peer: NVLink 2 x (370.8 / 20.6) = 36,
    network ceil(48 / 14) = 4 -> 4; 4 x ceil(16 / 8) = 8 <= 16 keeps 4. An operation: 256 MiB to each peer,
    nChannelsMin 4 -> 1 (1 x 16 ranks <= 16), parts <= 128 KiB double it to 4 (not beyond p2pnChannelsPerPeer).
    Local rounds (group 0) on channels 0-3: 4 x 10.3 GB/s for 7 x 256 MiB; remote rounds (group 1) on
    channels 8-11; the node's 8 NICs (8 x 48 GB/s) carry 8 GPUs x 8 peers x 256 MiB."""
    plan = A.alltoall(4 * GiB, N.preset("dgx-h100", 2, 8))
    assert (plan.p2pnChannels, plan.perPeer, plan.nChannels) == (16, 4, 4)
    assert (plan.intraChannels, plan.netChannels) == (4, 4)
    intra = 7 * (256 * MiB) / (4 * HALF_NVLINK * 1e3)          # us
    net = 8 * 8 * (256 * MiB) / (8 * 48.0 * 1e3)
    assert plan.time == pytest.approx(max(intra, net), rel=1e-12)
    assert intra == pytest.approx(45607.97, abs=0.01) and net == pytest.approx(44739.24, abs=0.01)


def test_one_node_of_h100_channels_grow_with_size():
    """1 x 8 H100: p2pnChannels 32 (24 -> 32), p2pnChannelsPerPeer min(32, 36 -> 64) = 32; nChannelsMin
    32 -> 4 (4 x 8 ranks <= 32). 32 MiB: 4 MiB a peer, 4 channels of 1 MiB (<= 16 MiB parts); rounds 1-7
    start at reverseBits(r, 5) = 16, 8, 24, 4, 20, 12, 28: 28 channels. 4 GiB: 512 MiB a peer, doubled to
    32 channels of 16 MiB: every channel, 32 x 10.3 = 329.6 GB/s (below the 18 NVLinks' 370.8)."""
    c = N.preset("dgx-h100", 1, 8)
    small = A.alltoall(32 * MiB, c)
    assert (small.p2pnChannels, small.perPeer, small.nChannels, small.intraChannels) == (32, 32, 4, 28)
    assert small.time == pytest.approx(7 * 4 * MiB / (28 * HALF_NVLINK * 1e3), rel=1e-12)
    big = A.alltoall(4 * GiB, c)
    assert (big.nChannels, big.intraChannels) == (32, 32)
    assert big.time == pytest.approx(7 * 512 * MiB / (32 * HALF_NVLINK * 1e3), rel=1e-12)
    assert small.netBytes == big.netBytes == 0


def test_ten_nodes_one_channel_a_peer():
    """10 x 8 H100: 4 channels a peer halved to 1 (1 x ceil(80 / 8) = 10 <= 16); the 9 remote groups start at
    reverseBits(g, 4) = 8, 4, 12, 2, 10, 6, 14, 1, 9: 9 channels x 8 GPUs x 14 GB/s > 8 x 48, so the NICs bound."""
    c = N.preset("dgx-h100", 10, 8)
    size = 4294967040                     # nccl-tests' size (a multiple of 80 x 8 bytes)
    plan = A.alltoall(size, c)
    assert (plan.perPeer, plan.nChannels, plan.intraChannels, plan.netChannels) == (1, 1, 1, 9)
    chunk = size // 80
    assert plan.netBytes == 8 * 72 * chunk and plan.intraBytes == 7 * chunk
    assert plan.time == pytest.approx(8 * 72 * chunk / (8 * 48.0 * 1e3), rel=1e-12)


def test_a100_node_bound_by_its_nvlinks():
    """1 x 8 A100 at 4 GiB: 32 channels x 10 GB/s exceed the 12 NVLinks' 240 GB/s: the NVLinks bound."""
    plan = A.alltoall(4 * GiB, N.preset("dgx-a100", 1, 8))
    assert plan.intraChannels == 32 and plan.intraBw == pytest.approx(240.0)
    assert plan.time == pytest.approx(7 * 512 * MiB / (240.0 * 1e3), rel=1e-12)


def test_bytes_add_up_and_eff_scales():
    """A GPU's send buffer is its self chunk, its local peers' chunks and its share of the node's remote bytes;
    the fitted efficiency divides the time."""
    for nodes in (1, 2, 4, 10):
        c = N.preset("dgx-h100", nodes, 8)
        size = 80 * 8 * MiB
        plan = A.alltoall(size, c)
        assert plan.chunk + plan.intraBytes + plan.netBytes // 8 == size
        assert A.alltoall(size, c, 0.5).time == pytest.approx(2 * plan.time, rel=1e-12)


def test_reverse_bits_is_ncclS():
    """reverseBits (bitops.h): the low bits reversed, higher bits dropped."""
    assert [A._reverse_bits(g, 4) for g in range(10)] == [0, 8, 4, 12, 2, 10, 6, 14, 1, 9]
    assert A._reverse_bits(5, 2) == 2 and A._reverse_bits(3, 0) == 0


def test_more_than_one_group_a_node_is_refused():
    """Nodes of more than 8 GPUs split into several p2p schedule groups, which the port does not cover."""
    from dataclasses import replace
    from pyxccl._errors import InvalidArgumentError
    c = replace(N.preset("dgx-h100", 1, 8), nRanks=16)
    with pytest.raises(InvalidArgumentError, match="at most 8"):
        A.alltoall(GiB, c)


def test_protocol_label_follows_ncclS_ll_threshold():
    """``addP2pToPlan``: a send runs LL while it is at most nChannels x NCCL_P2P_LL_THRESHOLD bytes (one node
    of H100: a channel a send up to 64 KiB); the time does not depend on the label."""
    c = N.preset("dgx-h100", 1)
    at, above = A.alltoall(8 * A.P2P_LL_THRESHOLD, c), A.alltoall(8 * (A.P2P_LL_THRESHOLD + 1), c)
    assert (at.nChannels, above.nChannels) == (1, 1)
    assert (A.protocol(at), A.protocol(above)) == ("LL", "Simple")
    assert A.bus_factor(16) == 15 / 16
