"""pyxccl.sim.nccl, the port of NCCL's tuning model: each (algorithm, protocol) time against a hand
evaluation of NCCL 2.30.7's expressions (src/graph/tuning.cc ncclTopoTuneModel and ncclTopoGetAlgoTime)
on the same inputs, NCCL's choices that follow from them, and ``pyxccl sim --model nccl``."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pyxccl import cli
from pyxccl.sim import nccl
from pyxccl.sim.nccl import Comm, Graph

MiB, GiB = 1 << 20, 1 << 30


def times(collective, nbytes, comm) -> dict:
    """{(algorithm, protocol): us} of the port."""
    return {(r.algorithm, r.protocol): r.time for r in nccl.predict(collective, nbytes, comm)}


def t(lat, nbytes, bw):
    """ncclTopoGetAlgoTime: lat + nBytes / (1000 * bw), us for GB/s."""
    return lat + nbytes / (1000 * bw)


def close(got, want):
    # NCCL stores bandwidths and latencies as float: the port rounds as it does, the hand evaluation does not
    assert got == pytest.approx(want, rel=2e-6)


# --- ring -----------------------------------------------------------------------------------------------

def test_ring_allreduce_one_a100_node():
    """8 ranks, 12 channels x 20 GB/s over NVLink: busBw = 12 * 20; nsteps = 2 (8 - 1) = 14, no inter steps."""
    c = nccl.preset("dgx-a100", 1)
    n = MiB
    got = times("allreduce", n, c)
    bus = 12 * 20.0
    close(got["Ring", "LL"], t(6.6 + 14 * 0.6, n, min(87.7, bus * .5) * 8 / 14))          # llMaxBws[Ampere][N1]
    close(got["Ring", "LL128"], t(14.0 + 14 * 1.9, n, min(bus * 0.92, 12 * 20.0) * 8 / 14))
    close(got["Ring", "Simple"], t(8.4 + 14 * 3.4, n, bus * 8 / 14))          # one node: no ring plateau


@pytest.mark.parametrize("coll", ["allgather", "reduce_scatter"])
def test_ring_allgather_reducescatter_two_a100_nodes(coll):
    """16 ranks, 2 nodes: bw = bwIntra (nNodes <= 2), nsteps = 15, one inter step; AMD CPUs: the net
    overhead is 2 us (x3 for Simple) and replaces the NVLink latency where larger; LL capped by
    llMaxBws[AMD][N2] = 22.5."""
    c = nccl.preset("dgx-a100", 2)
    n = 64 * MiB
    got = times(coll, n, c)
    bus = 8 * 24.0
    ratio = 16 / 15
    close(got["Ring", "LL"], t(6.6 + 14 * max(0.6, 2.0) + 1 * 2.7, n, min(22.5, bus * .5) * ratio))
    close(got["Ring", "LL128"], t(14.0 + 14 * max(1.9, 2.0) + 1 * 4.0, n, min(bus * .92, 8 * 20.0) * ratio))
    close(got["Ring", "Simple"], t(8.4 + 14 * max(3.4, 6.0) + 1 * 14.0, n, bus * ratio))
    assert set(got) == {("Ring", "LL"), ("Ring", "LL128"), ("Ring", "Simple")}   # no NVLS on A100, no PAT with 8 per node


def test_ring_allreduce_four_h100_nodes_plateau():
    """32 ranks on 4 nodes: bw = bwInter; 2 (4 - 1) = 6 inter steps of 62; Intel: overhead 1 us (3 Simple);
    Simple's latency x 1.4 (sm90) once nBytes / (nChannels * nRanks) >= 64 (the ring plateau)."""
    c = nccl.preset("dgx-h100", 4)
    bus = 8 * 48.0
    lat = 8.4 + (62 - 6) * max(3.4, 3.0) + 6 * 14.0
    ratio = 32 / 62
    assert c.nChannels == 16         # comm->nChannels: the 8 search channels doubled by ncclTopoPostset
    small = 64 * 16 * 32 - 1         # just under the plateau's threshold
    close(times("allreduce", small, c)["Ring", "Simple"], t(lat, small, bus * ratio))
    close(times("allreduce", small + 1, c)["Ring", "Simple"], t(lat * 1.4, small + 1, bus * ratio))
    got = times("allreduce", GiB, c)
    # llMaxBws[index1 = 0: Intel CPUs][index2 = 2: more than 2 nodes] = 20.4
    close(got["Ring", "LL"], t(6.6 + 56 * max(0.6, 1.0) + 6 * 2.7, GiB, min(20.4, bus * .5) * ratio))
    close(got["Ring", "LL128"], t(14.0 + 56 * max(1.9, 1.0) + 6 * 4.0, GiB, min(bus * .92, 8 * 36.7) * ratio))


def test_compute_channels_as_postset_leaves_them():
    """comm->nChannels (the ring plateau's divisor): twice the search channels (24 on a DGX A100 node, as
    its logs' "24 coll channels"), +50% with CollNet when its chain's bwIntra > bwInter, twice again on
    sm90 across nodes below 16 when the ring's bwIntra > 45."""
    assert nccl.preset("dgx-a100", 1).nChannels == 24
    assert nccl.preset("dgx-a100", 2).nChannels == 16
    h = nccl.preset("dgx-h100", 2)
    assert h.nChannels == 16
    few = replace(h, ring=replace(h.ring, nChannels=4))
    assert few.nChannels == 16                     # 4 -> 8 -> 16
    assert replace(few, ring=replace(few.ring, bwIntra=45.0)).nChannels == 8
    chain = replace(SHARP_CHAIN, bwIntra=30.0)
    assert nccl.with_collnet(nccl.preset("dgx-a100", 2), SHARP_DIRECT, chain, heads=8).nChannels == 24


def test_ring_broadcast_same_channels_and_not():
    """Broadcast: nsteps = nRanks, algbw = busBw; one hop latency when the channels are the same, else
    nsteps of them (Simple: the tree's)."""
    c = nccl.preset("dgx-a100", 1)
    n = 4 * MiB
    got = times("broadcast", n, c)
    close(got["Ring", "LL"], t(6.6 + 0.6, n, min(87.7, 240 * .5)))
    close(got["Ring", "LL128"], t(14.0 + 1.9, n, min(240 * .92, 240.0)))
    close(got["Ring", "Simple"], t(8.4 + 3.4, n, 240.0))
    assert set(got) == {("Ring", "LL"), ("Ring", "LL128"), ("Ring", "Simple")}
    c2 = replace(nccl.preset("dgx-a100", 2), ring=replace(nccl.preset("dgx-a100", 2).ring, sameChannels=0))
    got = times("broadcast", n, c2)
    close(got["Ring", "LL"], t(6.6 + 16 * 2.7, n, min(22.5, 192 * .5)))        # NET ring LL latency, 16 steps
    close(got["Ring", "Simple"], t(8.4 + 16 * 14.0, n, 192.0))                 # NET *tree* Simple latency


def test_one_rank_per_node_uses_the_tree_network_latency_and_pat():
    """ppn = 1: interLat is the Tree's NET latency whatever the algorithm; PAT (allgather and reduce-scatter,
    Simple) runs: busBw x .75, lat 8 + log2(nNodes) interLat / 3.5 + 2.8 nRanks."""
    g = Graph(2, 12.0, 12.0, nccl.PATH_PIX, nccl.PATH_PIX)
    c = Comm(nNodes=4, nRanks=4, minCompCap=90, ring=g, tree=replace(g, pattern=nccl.NCCL_TOPO_PATTERN_BALANCED_TREE),
             nvsCount=0)
    n = 8 * MiB
    got = times("allgather", n, c)
    # intraHw is PCI (typeIntra is not NVLink); 3 steps, all inter; ring Simple interLat = NET Tree Simple 14
    close(got["Ring", "Simple"], t(8.4 + 0 * max(5.7, 3.0) + 3 * 14.0, n, 2 * 12.0 * 4 / 3))
    close(got["Ring", "LL"], t(6.6 + 3 * 5.0, n, min(35.0, 24 * .5) * 4 / 3))
    close(got["PAT", "Simple"], t(8.0 + 2 * (14.0 / 3.5) + 4 * 2.8, n, 2 * 12.0 * .75))
    assert ("PAT", "Simple") in times("reduce_scatter", n, c)
    assert all(a != "PAT" for a, _ in times("allreduce", n, c))
    assert all(a != "PAT" for a, _ in times("allgather", n, nccl.preset("dgx-h100", 2)))   # 8 per node: no PAT


# --- tree -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,log", [(64 << 10, 10), (64, 0), (256 << 20, 22), (512 << 20, 23)])
def test_tree_allreduce_two_a100_nodes(n, log):
    """Tree allreduce: busBw = min(.92 x, nChannels perChMaxTreeBw[Ampere][N2] = 23.6), per protocol LL /3.8
    (capped by llMaxBw), LL128 x 120/128 (capped by perChMaxTreeLL128Bw), algbw = busBw / 2; latency
    2 ((ppn - 1) intraLat + log2(nNodes) interLat); the tree correction factor below 2^23 x 64 bytes."""
    c = nccl.preset("dgx-a100", 2)
    got = times("allreduce", n, c)
    bus = min(8 * 30.0 * .92, 8 * 23.6)          # bwIntra 30 on <= 2 nodes
    corr = [nccl.treeCorrectionFactor[p][log] if log < 23 else 1.0 for p in range(3)]
    close(got["Tree", "LL"], t(6.8 + 2 * (7 * 0.6 + 1 * 5.0), n, min(bus / 3.8, 22.5) * .5 * corr[0]))
    close(got["Tree", "LL128"], t(14.0 + 2 * (7 * 1.25 + 1 * 8.5), n, min(bus * 120 / 128, 8 * 20.0) * .5 * corr[1]))
    close(got["Tree", "Simple"], t(8.4 + 2 * (7 * 4.0 + 1 * 14), n, bus * .5 * corr[2]))


def test_tree_one_h100_node_and_the_tree_pattern_penalty():
    """One node: LL128 x 7/9; a TREE pattern (not BALANCED_TREE) costs x .85; trees only for allreduce."""
    c = nccl.preset("dgx-h100", 1)
    n = 1 << 30
    bus = min(12 * 30.0 * .92, 12 * 38.7)
    got = times("allreduce", n, c)
    close(got["Tree", "LL128"], t(14.0 + 2 * 7 * 1.25, n, min(bus * 7 / 9, 12 * 36.7) * .5))
    close(got["Tree", "Simple"], t(8.4 + 2 * 7 * 4.0, n, bus * .5))
    flat = replace(c, maxTreePattern=nccl.NCCL_TOPO_PATTERN_TREE)
    close(times("allreduce", n, flat)["Tree", "Simple"], t(8.4 + 2 * 7 * 4.0, n, bus * .85 * .5))
    for coll in ("allgather", "reduce_scatter", "broadcast", "reduce"):
        assert all(a == "Ring" or a == "NVLS" for a, _ in times(coll, n, c)), coll


# --- NVLS -----------------------------------------------------------------------------------------------

def test_nvls_one_h100_node():
    """intraBw = bwIntra x nvlsEfficiency[Hopper] .85 x (nCh - 1)/nCh, x 2 for allreduce, x (ppn - 1)/ppn
    else; bw = min(intraBw, bwInter); latency: the NVLink NVLS latency only (25 us); Simple only."""
    c = nccl.preset("dgx-h100", 1)
    intra = 40.0 * .85 * 7 / 8
    got = times("allreduce", GiB, c)
    close(got["NVLS", "Simple"], t(25, GiB, 8 * min(intra * 2, 60.0) * 8 / 14))
    assert ("NVLS", "LL") not in got and ("NVLSTree", "Simple") not in got        # NVLSTree: not on one node
    got = times("allgather", GiB, c)
    close(got["NVLS", "Simple"], t(25, GiB, 8 * min(intra * 7 / 8, 60.0)))    # not turned into algbw
    close(times("reduce_scatter", GiB, c)["NVLS", "Simple"], got["NVLS", "Simple"])
    assert "NVLS" not in {a for a, _ in times("allreduce", GiB, nccl.preset("dgx-a100", 1))}


def test_nvls_tree_two_and_four_h100_nodes():
    """NVLSTree: interBw x 2 on 2 nodes, capped by perChMaxNVLSTreeBws[Hopper] (57.7 N2, 45.5 N4); latency
    intraLat + 2 log2(nNodes) x NET NVLSTree 20.9."""
    intra = 40.0 * .85 * 7 / 8 * 2
    got = times("allreduce", GiB, nccl.preset("dgx-h100", 2))
    close(got["NVLSTree", "Simple"], t(25 + 2 * 1 * 20.9, GiB, 8 * min(intra, 48.0 * 2, 57.7) * 16 / 30))
    got = times("allreduce", GiB, nccl.preset("dgx-h100", 4))
    close(got["NVLSTree", "Simple"], t(25 + 2 * 2 * 20.9, GiB, 8 * min(intra, 48.0, 45.5) * 32 / 62))
    assert ("NVLS", "Simple") not in got          # NVLS across nodes needs CollNet (SHARP)


# --- CollNet (SHARP) -------------------------------------------------------------------------------------

SHARP_DIRECT = Graph(8, 24.0, 24.0, nccl.PATH_NVL, nccl.PATH_PIX, pattern=nccl.NCCL_TOPO_PATTERN_COLLNET_DIRECT)
SHARP_CHAIN = Graph(8, 24.0, 24.0, nccl.PATH_NVL, nccl.PATH_PIX, pattern=nccl.NCCL_TOPO_PATTERN_TREE)


def sharp(name, nodes, **kw):
    return nccl.with_collnet(nccl.preset(name, nodes), SHARP_DIRECT, SHARP_CHAIN, heads=8, **kw)


@pytest.mark.parametrize("name,cc", [("dgx-a100", 80), ("dgx-h100", 90)])
def test_collnet_allreduce(name, cc):
    """CollNetDirect: bw = bwIntra, divided by the GPU/NIC factor (ppn/nCh, minus half its excess), x .85 on
    sm90, algbw = busBw / 2, latency 2 (min(1, ppn-1) intraLat + 0.4 (ppn-1)) + interLat (31);
    CollNetChain: latency 2 (ppn-1) intraLat + interLat (30); Simple only."""
    c = sharp(name, 4)
    got = times("allreduce", 256 * MiB, c)
    direct = 8 * 24.0 / 1.0 * (.85 if cc >= 90 else 1.0) * .5
    close(got["CollNetDirect", "Simple"], t(2 * (1 * 3.7 + 7 * 0.4) + 31, 256 * MiB, direct))
    close(got["CollNetChain", "Simple"], t(2 * 7 * 2.8 + 30, 256 * MiB, 8 * 24.0 * .5))
    assert ("CollNetDirect", "LL") not in got and ("CollNetChain", "LL128") not in got
    # half as many CollNetDirect channels as GPUs: factor 2 - (2 - 1)/2 = 1.5
    half = replace(c, collnetDirect=replace(SHARP_DIRECT, nChannels=4))
    close(times("allreduce", 256 * MiB, half)["CollNetDirect", "Simple"],
          t(2 * (3.7 + 7 * 0.4) + 31, 256 * MiB, 4 * 24.0 / 1.5 * (.85 if cc >= 90 else 1.0) * .5))


def test_collnet_allgather_needs_the_plugin_and_a_head_per_rank():
    """CollNetDirect allgather / reduce-scatter: busBw = ppn min(bwIntra, .9 bwInter), not turned into algbw,
    only with the plugin's iallgather / ireducescatter and as many heads as local ranks."""
    n = 64 * MiB
    assert ("CollNetDirect", "Simple") not in times("allgather", n, sharp("dgx-h100", 4))
    c = sharp("dgx-h100", 4, allgather=True, reducescatter=True)
    close(times("allgather", n, c)["CollNetDirect", "Simple"], t(2 * (3.7 + 7 * 0.4) + 31, n, 8 * min(24.0, 24.0 * .9)))
    close(times("reduce_scatter", n, c)["CollNetDirect", "Simple"], times("allgather", n, c)["CollNetDirect", "Simple"])
    few = nccl.with_collnet(nccl.preset("dgx-h100", 4), SHARP_DIRECT, SHARP_CHAIN, heads=4, allgather=True)
    assert ("CollNetDirect", "Simple") not in times("allgather", n, few)


def test_nvls_with_sharp_across_nodes():
    """NVLS across nodes (CollNet on): bw = min(intraBw, bwInter), latency intraLat + NET NVLS 18."""
    c = sharp("dgx-h100", 4)
    close(times("allreduce", GiB, c)["NVLS", "Simple"],
          t(25 + 18, GiB, 8 * min(40.0 * .85 * 7 / 8 * 2, 48.0) * 32 / 62))


# --- NCCL's choices ---------------------------------------------------------------------------------------

def test_nvls_beats_ring_for_large_allreduce_on_one_h100_node():
    c = nccl.preset("dgx-h100", 1)
    got = times("allreduce", GiB, c)
    assert got["NVLS", "Simple"] < got["Ring", "Simple"]
    best = nccl.choose("allreduce", GiB, c)
    assert (best.algorithm, best.protocol) == ("NVLS", "Simple")
    assert nccl.choose("allreduce", 4 << 10, c).algorithm == "Ring"     # small: NVLS's 25 us latency loses


def test_sharp_beats_ring_where_nccls_model_says():
    """With SHARP on 16 H100 nodes, in-network reduction (NVLS+SHARP) beats the ring at every size: the same
    bandwidth, a fraction of its latency; without SHARP there is no NVLS across nodes, and at 1 GiB NVLSTree
    (25 + 2 x 4 x 20.9 us, 8 x 45.5 GB/s) beats the ring (1.4 x 1190 us, 8 x 48 GB/s)."""
    plain, net = nccl.preset("dgx-h100", 16), sharp("dgx-h100", 16)
    for n in (64 << 10, 16 * MiB, GiB):
        got = times("allreduce", n, net)
        assert got["NVLS", "Simple"] < min(v for (a, _), v in got.items() if a == "Ring"), n
        assert nccl.choose("allreduce", n, net).algorithm == "NVLS"
    got = times("allreduce", GiB, plain)
    assert ("NVLS", "Simple") not in got
    ring = t(1.4 * (8.4 + (254 - 30) * 3.4 + 30 * 14.0), GiB, 8 * 48.0 * 128 / 254)
    nvlstree = t(25 + 2 * 4 * 20.9, GiB, 8 * 45.5 * 128 / 254)
    close(got["Ring", "Simple"], ring)
    close(got["NVLSTree", "Simple"], nvlstree)
    assert nvlstree < ring and nccl.choose("allreduce", GiB, plain).algorithm == "NVLSTree"
    # CollNetChain beats the ring at mid sizes on 16 A100 nodes (no NVLS there)
    got = times("allreduce", 4 * MiB, sharp("dgx-a100", 16))
    assert got["CollNetChain", "Simple"] < min(v for (a, _), v in got.items() if a == "Ring")


@pytest.mark.parametrize("name,nodes", [("dgx-a100", 1), ("dgx-a100", 2), ("dgx-h100", 1), ("dgx-h100", 4)])
@pytest.mark.parametrize("coll", ["allreduce", "allgather", "reduce_scatter", "broadcast"])
def test_ll_wins_small_and_simple_large(name, nodes, coll):
    """NCCL's pick is the least time; LL at 1 KiB (its latency is the lowest), Simple at 4 GiB."""
    c = nccl.preset(name, nodes)
    for n, proto in ((1 << 10, "LL"), (4 * GiB, "Simple")):
        rows = nccl.predict(coll, n, c)
        best = nccl.choose(coll, n, c)
        assert best.time == min(r.time for r in rows)
        assert best.protocol == proto, (n, best)


def test_ll128_enable_rules():
    """LL128: sm80 only up to PXB between GPU and NIC, sm90 up to PXN; never beyond NVB inside a node."""
    a100 = nccl.preset("dgx-a100", 2)
    assert ("Ring", "LL128") in times("allreduce", MiB, a100)
    pxn = replace(a100, ring=replace(a100.ring, typeInter=nccl.PATH_PXN))
    assert ("Ring", "LL128") not in times("allreduce", MiB, pxn)
    h100 = nccl.preset("dgx-h100", 2)
    assert ("Ring", "LL128") in times("allreduce", MiB, replace(h100, ring=replace(h100.ring, typeInter=nccl.PATH_PXN)))
    assert ("Ring", "LL128") not in times("allreduce", MiB, replace(h100, ring=replace(h100.ring, typeInter=nccl.PATH_PHB)))
    assert ("Ring", "LL128") not in times("allreduce", MiB, replace(h100, ring=replace(h100.ring, typeIntra=nccl.PATH_PIX)))


def test_collectives_and_presets_it_does_not_cover_are_refused():
    with pytest.raises(ValueError, match="alltoall"):
        nccl.predict("alltoall", MiB, nccl.preset("dgx-h100", 1))
    with pytest.raises(ValueError, match="8 GPUs per node"):
        nccl.preset("dgx-h100", 2, per_node=4)
    with pytest.raises(ValueError, match="no NCCL-model preset"):
        nccl.preset("h100-roce", 1)


# --- the command line ---------------------------------------------------------------------------------------

def test_cli_prints_nccls_rows(capsys, tmp_path):
    """``--raw``: the port as it is (``nccl.predict``'s times, to the bit); the fitted figures and the launch
    mode are tested against the fidelity table's in test_sim_published.py."""
    out = tmp_path / "rows.json"
    assert cli.main(["sim", "allreduce", "--hosts", "2", "--per-host", "8", "--hardware", "dgx-a100",
                     "--size", "1048576", "--model", "nccl", "--raw", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("Tree", "Ring", "LL128 *", "Simple", "algbw", "busbw", "protocol", "NCCL 2.30.7, raw"):
        assert word in text, word
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert (doc["release"], doc["calibration"]) == ("2.30.7", "raw")
    want = nccl.predict("allreduce", MiB, nccl.preset("dgx-a100", 2))
    assert [(r["algorithm"], r["protocol"]) for r in rows] == [(w.algorithm, w.protocol) for w in want]
    for r, w in zip(rows, want):
        assert r["size"] == MiB and r["time"] == w.time * 1e-6 and r["chosen"] == w.chosen
        assert (r["release"], r["launch"], r["calibration"]) == ("2.30.7", "per-gpu", "raw")
        assert r["algbw"] == pytest.approx(MiB / r["time"]) and r["busbw"] == pytest.approx(r["algbw"] * 2 * 15 / 16)
    assert [r["chosen"] for r in rows].count(True) == 1


def test_cli_refuses_what_the_model_does_not_cover():
    with pytest.raises(SystemExit, match="needs --hardware"):
        cli.main(["sim", "allreduce", "--model", "nccl"])
    with pytest.raises(SystemExit, match="NCCL runs alltoall one way"):     # no algorithm of NCCL's to choose
        cli.main(["sim", "alltoall", "--hardware", "dgx-h100", "--model", "nccl", "--algo", "pairwise"])
    with pytest.raises(SystemExit, match="8 GPUs per node"):
        cli.main(["sim", "alltoall", "--hardware", "dgx-h100", "--model", "nccl", "--per-host", "4"])


def test_cli_prints_nccls_alltoall(capsys, tmp_path):
    """``--model nccl`` alltoall: NCCL's grouped point-to-point, one row a size (``calibrated.alltoall_row``,
    to the bit; ``--raw``: ``nccl_p2p.alltoall``), nccl-tests' busbw ((n-1)/n of algbw), the protocol NCCL's
    sends run at that size (LL for the small ones); the fitted figures: test_sim_published.py."""
    from pyxccl.sim import calibrated, nccl_p2p
    out = tmp_path / "rows.json"
    for hosts, size, proto in ((1, 1024, "LL"), (2, 1 << 26, "Simple")):
        assert cli.main(["sim", "alltoall", "--hosts", str(hosts), "--hardware", "dgx-h100", "--size", str(size),
                         "--model", "nccl", "--raw", "--json", str(out)]) == 0
        assert "NCCL's grouped point-to-point" in capsys.readouterr().out
        (r,) = json.loads(out.read_text())["rows"]
        comm = nccl.preset("dgx-h100", hosts)
        plan = nccl_p2p.alltoall(size, comm)
        assert (r["algorithm"], r["protocol"], r["chosen"]) == ("grouped p2p", proto, True)
        assert r["time"] == plan.time * 1e-6 == calibrated.alltoall_row(size, comm, None).time
        assert r["busbw"] == pytest.approx(size / r["time"] * (8 * hosts - 1) / (8 * hosts))


def test_docstring_example_runs():
    import doctest
    res = doctest.testmod(nccl)
    assert res.failed == 0 and res.attempted > 0


@pytest.mark.parametrize("args,model", [
    (["allreduce", "--hardware", "dgx-a100"], "nccl"),
    (["allgather", "--hardware", "dgx-h100", "--hosts", "4"], "nccl"),
    (["allreduce", "--hardware", "dgx-a100", "--algo", "ring,Tree"], "nccl"),        # NCCL's names
    (["alltoall", "--hardware", "dgx-a100"], "nccl"),                               # NCCL's grouped p2p
    (["alltoall", "--hardware", "dgx-h100", "--hosts", "3"], "nccl"),
    (["alltoall", "--hardware", "dgx-h100", "--algo", "pairwise"], "pyxccl"),       # pyxccl's algorithm
    (["alltoall", "--hardware", "dgx-h100", "--per-host", "4"], "pyxccl"),          # not the preset's node
    (["allreduce", "--hardware", "dgx-a100", "--algo", "hierarchical"], "pyxccl"),  # pyxccl's algorithm
    (["allreduce", "--hardware", "dgx-a100", "--per-host", "4"], "pyxccl"),         # not the preset's node
    (["allreduce", "--hardware", "dgx-a100", "--topology", "torus2d"], "pyxccl"),
    (["allreduce", "--hardware", "dgx-a100", "--model", "pyxccl"], "pyxccl"),
    (["allreduce"], "pyxccl"),                                                      # link flags: no preset
])
def test_auto_answers_with_nccls_model_where_it_describes_machine_and_call(args, model, tmp_path, capsys):
    """``--model auto`` (the default): NCCL's rows (with protocols) on a DGX preset as it is, for a
    collective of NCCL's model (alltoall too: its grouped point-to-point) and NCCL's algorithm names;
    pyxccl's walk anywhere else."""
    out = tmp_path / "rows.json"
    assert cli.main(["sim", *args, "--size", "1M", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(("protocol" in r) == (model == "nccl") for r in rows)
    head = capsys.readouterr().out.splitlines()[0]
    assert ("NCCL's tuning model" in head or "NCCL's grouped point-to-point" in head) == (model == "nccl")


# --- NCCL releases (Comm.version): each release's constants and the formula changes between them ----------

def ver(c, v):
    return replace(c, version=v)


def test_default_release_is_the_ported_one_and_2_29_matches_it_on_hopper():
    c = nccl.preset("dgx-h100", 4)
    assert c.version == nccl.DEFAULT_VERSION == "2.30.7"
    for coll in ("allreduce", "allgather"):
        for n in (4 << 10, 64 * MiB):
            assert times(coll, n, ver(c, "2.29.2")) == times(coll, n, c)     # only Blackwell rows differ
    assert nccl.version("2.29.2").perChMaxRingLL128Bws[3] == (34.5, 34.6, 34.5)


def test_release_2_26_nvls_and_nvls_tree():
    """2.26.2: NVLS bw = min(bwIntra, bwInter), NVLSTree min(bwIntra, bwInter (/2 beyond 2 nodes)), algbw = busBw
    x 5/6, no nvlsEfficiency and no perChMaxNVLSTreeBws; NET NVLSTree latency 14 (2.30.7: 20.9); PAT's
    latency "= 8 + ..." with no baseLat row."""
    got = times("allreduce", GiB, ver(nccl.preset("dgx-h100", 1), "2.26.2"))
    close(got["NVLS", "Simple"], t(25, GiB, 8 * min(40.0, 60.0) * 5 / 6))
    got = times("allgather", GiB, ver(nccl.preset("dgx-h100", 1), "2.26.2"))
    close(got["NVLS", "Simple"], t(25, GiB, 8 * 40.0))                  # AllGather: no algbw ratio from 2.23
    got = times("allreduce", GiB, ver(nccl.preset("dgx-h100", 2), "2.26.2"))
    close(got["NVLSTree", "Simple"], t(25 + 2 * 1 * 14, GiB, 8 * min(40.0, 48.0) * 5 / 6))
    got = times("allreduce", GiB, ver(nccl.preset("dgx-h100", 4), "2.26.2"))
    close(got["NVLSTree", "Simple"], t(25 + 2 * 2 * 14, GiB, 8 * min(40.0, 48.0 / 2) * 5 / 6))
    # rings and trees: 2.26.2's tables equal 2.30.7's there
    assert got["Ring", "Simple"] == times("allreduce", GiB, nccl.preset("dgx-h100", 4))["Ring", "Simple"]
    g = Graph(2, 12.0, 12.0, nccl.PATH_PIX, nccl.PATH_PIX)
    pat = Comm(nNodes=4, nRanks=4, minCompCap=90, ring=g, tree=g, nvsCount=0, version="2.26.2")
    close(times("allgather", 8 * MiB, pat)["PAT", "Simple"], t(8.0 + 2 * (14.0 / 3.5) + 4 * 2.8, 8 * MiB, 24 * .75))


def test_releases_2_19_and_2_21():
    """2.19.3 / 2.21.5: Tree Simple latency 28 on NVLink and the network, no Tree Simple base latency; Ring LL
    busBw x 1/4 (allreduce, or across nodes) or 1/3 (2.19; .5 from 2.21); Ring LL128 x 0.7 with one rank per
    node; 2 nNodes inter steps for a ring allreduce; the algorithm's own network latency with one rank per
    node; NVLS 23 us on NVLink in 2.19 (25 in 2.21); no PAT."""
    c = ver(nccl.preset("dgx-a100", 2), "2.19.3")
    n = 64 * MiB
    got = times("allreduce", n, c)
    bus = 8 * 24.0
    close(got["Ring", "LL"], t(6.6 + 26 * max(0.6, 2.0) + 4 * 2.7, n, min(22.5, bus / 4) * 16 / 30))
    close(got["Ring", "Simple"], t((8.4 + 26 * max(3.4, 6.0) + 4 * 14.0) * 1.4, n, bus * 16 / 30))
    tb = min(8 * 30.0 * .92, 8 * 23.6)
    corr = nccl.treeCorrectionFactor[2][log2(n >> 6)]
    close(got["Tree", "Simple"], t(0 + 2 * (7 * 28 + 1 * 28), n, tb * .5 * corr))
    one = ver(nccl.preset("dgx-a100", 1), "2.19.3")
    close(times("allgather", n, one)["Ring", "LL"], t(6.6 + 7 * 0.6, n, min(87.7, 240 / 3) * 8 / 7))
    close(times("allgather", n, ver(one, "2.21.5"))["Ring", "LL"], t(6.6 + 7 * 0.6, n, min(87.7, 240 * .5) * 8 / 7))
    g = Graph(2, 24.0, 24.0, nccl.PATH_NVL, nccl.PATH_PIX)
    ppn1 = Comm(nNodes=2, nRanks=2, minCompCap=90, ring=g, tree=g, version="2.21.5")
    got = times("allreduce", n, ppn1)
    # nsteps 2 but 2 nNodes = 4 inter steps: the intra steps go negative in 2.21 too; Ring's own NET LL128 4.0
    close(got["Ring", "LL128"], t(14.0 + (2 - 4) * max(1.9, 1.0) + 4 * 4.0, n, min(48 * 0.7, 2 * 36.7) * 2 / 2))
    assert all(a != "PAT" for a, _ in times("allgather", n, ppn1))
    h = nccl.preset("dgx-h100", 1)
    close(times("allreduce", GiB, ver(h, "2.19.3"))["NVLS", "Simple"], t(23, GiB, 320 * 5 / 6))
    # 2.19/2.21 turn NVLS allgather bandwidth into algbw (x 5/6) too
    close(times("allgather", GiB, ver(h, "2.21.5"))["NVLS", "Simple"], t(25, GiB, 320 * 5 / 6))


def log2(n):
    return nccl.log2i(n)


def test_legacy_releases_on_a100():
    """2.12.12 / 2.16.2 / 2.17.1 (A100 rings and trees): busBw capped at 235 on Ampere; LL's intra-node latency
    x 1.8 across nodes; a NET plugin's latency replaces NCCL's network latency (2.18 on adds it); no net
    overhead; ring plateau x 1.9 from nBytes >= nRanks/16 x 64 KiB; NET Ring Simple latency 9.6 (2.16, 2.17)
    or 28 (2.12); Tree Simple 28 with no base latency."""
    c = ver(nccl.preset("dgx-a100", 2), "2.17.1")
    n = 64 * MiB
    got = times("allreduce", n, c)
    bus = 8 * 24.0
    close(got["Ring", "LL"], t(3.6 + 26 * 0.47 * 1.8 + 4 * 2.7, n, min(22.5, bus / 4) * 16 / 30))
    close(got["Ring", "LL128"], t(10.0 + 26 * 1.9 + 4 * 4.0, n, min(bus * .92, 8 * 20.0) * 16 / 30))
    close(got["Ring", "Simple"], t((8.4 + 26 * 3.4 + 4 * 9.6) * 1.9, n, bus * 16 / 30))
    small = 16 * 65536 // 16 - 1                   # below the plateau's threshold (nRanks/16 x 64 KiB)
    close(times("allreduce", small, c)["Ring", "Simple"], t(8.4 + 26 * 3.4 + 4 * 9.6, small, bus * 16 / 30))
    tb = min(8 * 30.0 * .92, 8 * 23.6)
    corr = nccl.treeCorrectionFactor[2][log2(n >> 6)]
    close(got["Tree", "Simple"], t(0 + 2 * (7 * 28 + 1 * 28), n, tb * .5 * corr))
    efa = replace(c, ring=replace(c.ring, latencyInter=150.0), tree=replace(c.tree, latencyInter=150.0))
    got = times("allreduce", n, efa)
    close(got["Tree", "Simple"], t(0 + 2 * (7 * 28 + 1 * 150), n, tb * .5 * corr))
    close(got["Ring", "Simple"], t((8.4 + 26 * 3.4 + 4 * 150) * 1.9, n, bus * 16 / 30))
    # 2.30.7 adds the plugin latency to its own (twice for Simple: the flush)
    got = times("allreduce", n, replace(efa, version="2.30.7"))
    close(got["Tree", "Simple"], t(8.4 + 2 * (7 * 4.0 + 1 * (14 + 300)), n, tb * .5 * corr))
    one = nccl.preset("dgx-a100", 1)
    close(times("allreduce", n, ver(one, "2.16.2"))["Ring", "Simple"], t(8.4 + 14 * 3.4, n, 235.0 * 8 / 14))
    two12 = ver(nccl.preset("dgx-a100", 2), "2.12.12")
    close(times("allreduce", n, two12)["Ring", "Simple"], t((8.4 + 26 * 3.4 + 4 * 28) * 1.9, n, bus * 16 / 30))
    assert {a for a, _ in times("allreduce", n, two12)} == {"Tree", "Ring"}


def test_releases_refused_where_not_ported():
    with pytest.raises(Exception, match="not ported"):
        ver(nccl.preset("dgx-a100", 1), "2.18.1")
    with pytest.raises(Exception, match="A100"):
        ver(nccl.preset("dgx-h100", 1), "2.17.1")            # NVLS / Hopper formulas of <= 2.17 not ported
    with pytest.raises(Exception, match="CollNet"):
        ver(sharp("dgx-a100", 2), "2.26.2")
