"""The simulator: its physics against the alpha-beta model and the brief's claims, its symmetric
mode against the message level, and the command line."""
from __future__ import annotations

import json
import math

import pytest

from pyxccl import cli
from pyxccl.algorithms import registry
from pyxccl.sim import Cluster, Link, choose, run
from pyxccl.tuning import symmetric
from pyxccl.tuning.cost import Machine, at_size, estimate

GB = 1e9
NVLINK = Link(1e-6, 1 / (300 * GB))
IB = Link(5e-6, 1 / (25 * GB))


def _cluster(hosts, per_host, **kw) -> Cluster:
    kw.setdefault("intra", NVLINK)
    kw.setdefault("inter", IB)
    kw.setdefault("nics", per_host)
    return Cluster(hosts, per_host, **kw)


@pytest.mark.parametrize("hosts,per_host,bottleneck", [(8, 1, 25 * GB), (1, 8, 300 * GB), (4, 4, 25 * GB)])
def test_large_ring_busbw_tends_to_the_bottleneck_link(hosts, per_host, bottleneck):
    """busbw = 2(n-1)/n S / t -> the slowest link a ring crosses, as S grows (within 5%)."""
    c = _cluster(hosts, per_host, nics=1)      # a flat ring crosses each host boundary once: one NIC
    got = [run("allreduce", s, c, ["ring"])[0].busbw for s in (1 << 16, 1 << 24, 1 << 32)]
    assert got[0] < got[1] < got[2] <= bottleneck * 1.0001, got
    assert got[2] == pytest.approx(bottleneck, rel=0.05)
    assert got[0] < bottleneck * 0.95           # not at 64 KiB: latency shows


@pytest.mark.parametrize("n", [4, 16, 64])
def test_tiny_ring_time_tends_to_2_n_minus_1_latencies(n):
    """One element per chunk: the ring's 2(n-1) steps each cost the latency (the alpha term)."""
    c = _cluster(n, 1, inter=Link(7e-6, 1 / (25 * GB)))
    t = run("allreduce", 4 * n, c, ["ring"])[0].time
    assert t == pytest.approx(2 * (n - 1) * 7e-6, rel=0.01)
    assert run("allreduce", 4 * n, c, ["ring"])[0].steps == 1 + 2 * (n - 1)     # a first copy (no-op in place)


def test_alpha_beta_formula_of_the_brief():
    """seeds/000: ring allreduce T = 2 (n-1) (alpha + beta m / n), exactly, on links that share nothing."""
    n, m = 8, 1 << 26
    a, b = 4e-6, 1 / (10 * GB)
    c = _cluster(n, 1, inter=Link(a, b))
    assert run("allreduce", m, c, ["ring"])[0].time == pytest.approx(2 * (n - 1) * (a + b * m / n), rel=1e-9)


@pytest.mark.parametrize("nics", [1, 8])
@pytest.mark.parametrize("size", [1 << 20, 1 << 26, 1 << 30])
def test_hierarchical_beats_flat_ring_on_64_hosts_of_8(size, nics):
    """seeds/000: 64 machines in a fat tree: the hierarchical allreduce beats the flat ring (links
    inside a host 10x faster than between). With one NIC per host the large-message advantage is
    latency and the intra-host phases pipelined; with a NIC per rank, every column uses its own."""
    c = _cluster(64, 8, intra=Link(1e-6, 1 / (100 * GB)), inter=Link(5e-6, 1 / (10 * GB)), nics=nics)
    res = {r.algorithm: r for r in run("allreduce", size, c, ["ring", "hierarchical"], mode="symmetric")}
    assert res["hierarchical"].time < res["ring"].time, {k: v.time for k, v in res.items()}


def test_flat_ring_beats_binary_tree_inside_one_host_for_large_messages():
    """seeds/000: inside one 8-GPU host a ring allreduce beats a tree for large messages (the
    tree's links carry the whole vector at every level)."""
    c = _cluster(1, 8)
    res = {r.algorithm: r.time for r in run("allreduce", 1 << 30, c, ["ring", "tree", "double_binary_tree"])}
    assert res["ring"] < res["tree"] and res["ring"] < res["double_binary_tree"], res
    small = {r.algorithm: r.time for r in run("allreduce", 64, c, ["ring", "tree"])}
    assert small["tree"] < small["ring"], small        # and the other way round for tiny ones


def test_ring_of_hosts_adds_contention_a_fat_tree_does_not_have():
    """Traffic between hosts that are not neighbours crosses the links in between, shared."""
    fat = _cluster(8, 2, nics=1)
    ring = _cluster(8, 2, nics=1, topology="ring")
    for algo in ("ring", "recursive_doubling"):
        a = run("allreduce", 1 << 26, fat, [algo])[0].time
        b = run("allreduce", 1 << 26, ring, [algo])[0].time
        if algo == "ring":         # neighbours only: the same
            assert b == pytest.approx(a, rel=1e-9)
        else:                      # partners 2 and 4 hosts away share the links in between
            assert b > a * 1.2, (a, b)


def test_memory_streams_at_one_process_rate_per_core():
    """Beyond the cache a rank's bytes move at the memory figure (one process's copy), whatever the number of
    ranks beside it: each core streams at its own rate (two copies at once ran as fast each as one alone on
    the 2-core machine this was written on; dividing the figure by the ranks priced the 2-rank 64 MiB
    allgather at 26 ms against 14 measured). Ranks sharing a core share its rate, as CPU costs stretch.
    A ring allgather of S bytes, links and the cache's rates negligible: a rank copies its block (read
    and written, S/n twice) and receives the rest (S (n-1)/n once), S (1 + 1/n) x mem."""
    size, mem = 64 << 20, 1e-9
    fast = dict(intra=Link(1e-7, 1e-12), inter=Link(1e-7, 1e-12), gamma=1e-12, copy=1e-12, cpu=True,
                reduce_overlap=False, cache=1 << 20)

    def time(n, cores, mem=mem):
        return run("allgather", size, Cluster(1, n, cores=cores, mem=mem, **fast), ["ring"])[0].time
    for n in (2, 4, 8):
        assert time(n, n) == pytest.approx(size * (1 + 1 / n) * mem, rel=0.01), n
    assert time(4, 2) == pytest.approx(2 * time(4, 4), rel=1e-6)        # two ranks a core
    assert time(2, 2, 2 * mem) == pytest.approx(2 * time(2, 2), rel=0.01)


def test_memory_at_the_calls_size_from_measured_copies():
    """With copies measured at a few sizes (``mem_at``: sim.calibrate's, every rank at once, CPU time), a
    call's bytes in its buffers cost what such a copy costs per byte read or written at the call's size
    (a copy of W/2 bytes reads and writes W; linear between the sizes), stretched where ranks share cores,
    whatever the cache and ``mem`` say. The ring allgather of the test above, S (1 + 1/n) x that rate."""
    size = 64 << 20
    fast = dict(intra=Link(1e-7, 1e-12), inter=Link(1e-7, 1e-12), gamma=1e-12, copy=1e-12, cpu=True,
                reduce_overlap=False, cache=1 << 40, mem=1e-6)
    table = ((1 << 20, (1 << 20) * 1e-10), (64 << 20, (64 << 20) * 4e-10))

    def time(n, cores, size=size):
        return run("allgather", size, Cluster(1, n, cores=cores, mem_at=table, **fast), ["ring"])[0].time
    for n in (2, 4):
        w = size // n + size        # a rank's input and output
        per_byte = at_size(table, w / 2) / w
        assert time(n, n) == pytest.approx(size * (1 + 1 / n) * per_byte, rel=0.01), n
    assert time(4, 2) == pytest.approx(2 * time(4, 4), rel=1e-6)        # two ranks a core
    assert time(2, 2, 1 << 19) == pytest.approx((1 << 19) * 1.5 * 1e-10 / 2, rel=0.02)    # below: its rate


def test_nics_shared_by_a_hosts_ranks():
    """Eight ranks through one NIC get an eighth of it each: a host-column ring (hierarchical's
    inter-host phase, 8 of them side by side) slows down with fewer NICs."""
    one, eight = _cluster(4, 8, nics=1), _cluster(4, 8, nics=8)
    t1 = run("allreduce", 1 << 30, one, ["hierarchical"])[0].time
    t8 = run("allreduce", 1 << 30, eight, ["hierarchical"])[0].time
    assert t1 > 3 * t8, (t1, t8)


SYMMETRIC = [("allreduce", "ring"), ("allreduce", "hierarchical"), ("allreduce", "halving_doubling"),
             ("allreduce", "recursive_doubling"), ("allreduce", "bcube"), ("allgather", "ring"),
             ("allgather", "hierarchical"), ("allgather", "bruck"), ("reduce_scatter", "ring"),
             ("reduce_scatter", "hierarchical"), ("alltoall", "pairwise"), ("alltoall", "hierarchical"),
             ("allreduce", "torus2d")]


@pytest.mark.parametrize("prim,algo", SYMMETRIC)
@pytest.mark.parametrize("hosts,per_host,topology,nics", [(4, 2, "fattree", 1), (8, 4, "fattree", 2),
                                                          (6, 2, "ring", 1), (16, 1, "fattree", 1)])
def test_symmetric_mode_agrees_with_the_message_level(prim, algo, hosts, per_host, topology, nics):
    """Within 2% wherever both run (the issue's bound); in fact to rounding, as the folded run is
    the same run."""
    c = _cluster(hosts, per_host, topology=topology, nics=nics, gamma=1e-12)
    for size in (1 << 10, 1 << 22):
        try:
            sym = run(prim, size, c, [algo], mode="symmetric")[0]
        except ValueError as e:
            assert "cannot run" in str(e)       # no symmetry here (e.g. XOR, or messages past the next host,
            assert topology == "ring" or algo in ("halving_doubling", "recursive_doubling") \
                or (algo == "torus2d" and per_host == 1)    # on a ring; torus rows of several one-rank hosts
            continue
        msg = run(prim, size, c, [algo], mode="message")[0]
        assert sym.mode == "symmetric" and msg.mode == "message"
        assert sym.time == pytest.approx(msg.time, rel=0.02), (size, sym.time, msg.time)
        assert sym.messages == msg.messages and sym.steps == msg.steps
        assert sym.bytes_sent == pytest.approx(msg.bytes_sent, rel=0.01)     # uneven chunks: an element


def test_symmetry_is_proven_not_assumed():
    """A tree has no symmetry: symmetric mode refuses it, and auto runs it at message level."""
    c = _cluster(8, 2)
    with pytest.raises(ValueError, match="not the same on every host"):
        run("allreduce", 1 << 20, c, ["tree"], mode="symmetric")
    assert run("allreduce", 1 << 20, c, ["tree"])[0].mode == "message"
    n, hosts = c.nranks, c.host_list()

    def skewed(r):      # a ring whose last host sends a chunk more: not the same moved
        s = registry.lookup("allreduce", "ring").schedule(r, n, hosts=hosts, count=1 << 12)
        if r // c.per_host == c.hosts - 1:
            s.steps.append(s.steps[-1])
        return s
    sym, why = symmetric.find(skewed, c.hosts, c.per_host, False)
    assert sym is None and "not the same" in why


def test_the_tuner_and_the_simulator_are_one_model():
    """A measured CPU machine in the simulator prices a call as the tuner's estimate does: the same
    semantics, the same walk (steps started in time order, on one host and between hosts)."""
    for hosts_n, per in ((1, 4), (2, 2)):
        c = Cluster.measured(hosts_n, per)
        m = Machine({"shm": c.intra, "tcp": c.inter, "seg": c.seg or Link(5e-6, 0.0)}, c.gamma, c.copy, c.cores)
        hosts = c.host_list()
        n = c.nranks
        for algo in ("ring", "hierarchical", "recursive_doubling"):
            scheds = [registry.lookup("allreduce", algo).schedule(r, n, hosts=hosts, count=1 << 18) for r in range(n)]
            klass = lambda a, b: "shm" if hosts[a] == hosts[b] else "tcp"      # noqa: E731
            stretch = [max(1.0, per / c.cores)] * n
            got = run("allreduce", 1 << 20, c, [algo], inplace=False)[0].time
            tuner = estimate(scheds, 4, m, klass, stretch, hosts if hosts_n > 1 else None).time
            assert got == pytest.approx(tuner, rel=1e-12), algo


def test_choose_is_the_fastest_and_skips_what_cannot_run():
    c = _cluster(3, 2)
    res = run("alltoall", 1 << 20, c)
    assert {r.algorithm for r in res} <= set(registry.algorithms("alltoall")) - {"segment"}
    assert choose("alltoall", 1 << 20, c).time == min(r.time for r in res)


def test_segment_algorithms_run_on_a_measured_host_only():
    with pytest.raises(ValueError, match="shared segment"):
        run("allreduce", 1 << 20, _cluster(1, 4), ["segment"])
    r = run("allreduce", 1 << 20, Cluster.measured(1, 4), ["segment"])[0]
    assert r.time > 0 and r.mode == "message"


def test_cluster_arguments_are_checked():
    with pytest.raises(ValueError, match="topology"):
        _cluster(2, 2, topology="torus")
    with pytest.raises(ValueError, match="at least one host"):
        _cluster(0, 2)
    with pytest.raises(ValueError, match="mode"):
        run("allreduce", 8, _cluster(2, 2), mode="fast")


def test_cli_prints_time_algbw_busbw_per_algorithm(capsys, tmp_path):
    out = tmp_path / "rows.json"
    assert cli.main(["sim", "allreduce", "--hosts", "4", "--per-host", "2", "--size", "64MiB",
                     "--algo", "ring,tree,hierarchical", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("ring", "tree", "hierarchical", "busbw", "algbw", "4 hosts x 2 ranks"):
        assert word in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["algorithm"] for r in rows] == ["ring", "tree", "hierarchical"]
    ring = rows[0]
    assert ring["busbw"] == pytest.approx(ring["algbw"] * 2 * 7 / 8)
    assert math.isclose(ring["algbw"], (64 << 20) / ring["time"])


def test_cli_sweep_draws_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    assert cli.main(["sim", "allgather", "--hosts", "2", "--per-host", "4", "--sweep", "1K:1M",
                     "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.count("1 MiB") >= 2


def test_calibration_measures_what_calls_see(pools):
    """pyxccl.sim.calibrate on 2 local ranks: the segment's round and a single-copy read, the same on
    every rank; a measured cluster takes them."""
    import rankfns
    got = pools(2).run(rankfns.calibrate, transport="shm")
    assert got[0] == got[1]
    fig = got[0]
    assert 0 < fig["seg"] < 0.01
    if fig["cma"] is not None:       # process_vm_readv allowed here
        alpha, beta = fig["cma"]
        assert alpha >= 0 and 1 / 200e9 < beta < 1 / 0.1e9
    for key in ("peer", "win", "red"):     # window reads and writes, reductions: (bytes, seconds) at rising sizes
        sizes = [nb for nb, _ in fig[key]]
        assert sizes == sorted(set(sizes)) and sizes[0] > 0
        assert all(0 < t < 0.01 for _, t in fig[key])
    c = Cluster.measured(1, 2, calibration=fig)
    assert c.seg.alpha == fig["seg"] and (c.cma is None) == (fig["cma"] is None)
    assert c.peer == tuple(map(tuple, fig["peer"])) and c.win_write == tuple(map(tuple, fig["win"]))
    assert c.red == tuple(map(tuple, fig["red"]))
    assert run("allgather", 4 << 20, c, ["segment"])[0].time > 0


def test_windows_are_priced_as_rounds_use_them():
    """A window read from a peer costs what the calibration measured at its size (when more than a copy);
    writing one's window costs it for the share the others read in that round: all of it in allgather,
    the peer's block of two in alltoall; nothing is charged without the figures."""
    from dataclasses import replace

    from pyxccl.tuning.cost import at_size
    KiB = 1 << 10
    c = Cluster(1, 2, intra=Link(20e-6, 1e-9), inter=Link(60e-6, 1e-9), cpu=True, cores=2, copy=2e-11,
                gamma=2e-11, seg=Link(4e-6, 0.0), cma=None, single_copy=False)
    peer = ((16 * KiB, 2e-6), (64 * KiB, 3e-6))
    win = ((16 * KiB, 3e-6), (64 * KiB, 8e-6))
    assert at_size(win, 8 * KiB) == pytest.approx(1.5e-6) and at_size(win, 40 * KiB) == pytest.approx(5.5e-6) \
        and at_size(win, 128 * KiB) == pytest.approx(16e-6)
    t = {k: run(prim, 64 * KiB, replace(c, **kw), ["segment"], inplace=False)[0].time
         for k, (prim, kw) in {"ag": ("allgather", {}), "ag+": ("allgather", dict(peer=peer, win_write=win)),
                               "a2a": ("alltoall", {}), "a2a+": ("alltoall", dict(peer=peer, win_write=win))}.items()}
    # allgather, a round: my 32 KiB block to my window (the peer reads all of it), my block and the peer's out
    nb = 32 * KiB
    assert t["ag"] == pytest.approx(4e-6 + 3 * nb * 2e-11)
    assert t["ag+"] == pytest.approx(4e-6 + at_size(win, nb) + nb * 2e-11 + at_size(peer, nb))
    # alltoall: my two 32 KiB blocks to my window, of which the peer reads one (half of each write is held)
    b = 32 * KiB
    assert t["a2a"] == pytest.approx(4e-6 + 4 * b * 2e-11)
    assert t["a2a+"] == pytest.approx(4e-6 + 2 * (b / 2 * 2e-11 + at_size(win, b / 2)) + b * 2e-11 + at_size(peer, b))
    # two ranks on one core: the figures are one rank's CPU time (as calibrate measures them), stretched as
    # the copies are (before session 19 they were not, and 4 ranks on 2 cores were priced 25-50% fast)
    shared = run("allgather", 64 * KiB, replace(c, cores=1, peer=peer, win_write=win), ["segment"], inplace=False)
    assert shared[0].time == pytest.approx(4e-6 + 2 * (at_size(win, nb) + nb * 2e-11 + at_size(peer, nb)))


def test_windows_written_the_cheaper_way():
    """With window figures for non-temporal stores too (sim.calibrate's peer_nt and win_nt), a segment call
    is priced the way that costs less, as calls pick it (_native.c, nt_windows); without them, plainly."""
    from dataclasses import replace
    KiB = 1 << 10
    c = Cluster(1, 2, intra=Link(20e-6, 1e-9), inter=Link(60e-6, 1e-9), cpu=True, cores=2, copy=2e-11,
                gamma=2e-11, seg=Link(4e-6, 0.0), cma=None, single_copy=False,
                peer=((16 * KiB, 2e-6), (64 * KiB, 3e-6)), win_write=((16 * KiB, 3e-6), (64 * KiB, 8e-6)))
    cheap = ((16 * KiB, 1e-6), (64 * KiB, 2e-6))
    dear = ((16 * KiB, 9e-6), (64 * KiB, 30e-6))

    def time(c):
        return run("allgather", 64 * KiB, c, ["segment"], inplace=False)[0].time
    plain = time(c)
    assert time(replace(c, peer_nt=dear, win_nt=dear)) == plain
    both_cheap = replace(c, peer_nt=cheap, win_nt=cheap)
    assert time(both_cheap) < plain
    assert time(both_cheap) == time(replace(c, peer=cheap, win_write=cheap))
    # read figures of their own, or the plain ones
    assert time(replace(c, win_nt=cheap)) == time(replace(c, win_write=cheap))


def test_reductions_at_least_the_measured_reductions_of_their_size():
    """With reductions measured at a few sizes (``red``: sim.calibrate's, every rank at once, CPU time), a
    segment reduction costs no less than the table's time at its size, stretched where ranks share cores;
    a table below the gamma rate changes nothing. A 64 KiB allreduce on 2 ranks: one round, each rank
    reduces one 64 KiB block."""
    from dataclasses import replace

    from pyxccl.tuning.cost import at_size
    KiB = 1 << 10
    c = Cluster(1, 2, intra=Link(20e-6, 1e-9), inter=Link(60e-6, 1e-9), cpu=True, cores=2, copy=2e-11,
                gamma=2e-11, seg=Link(4e-6, 0.0), cma=None, single_copy=False)
    red = ((16 * KiB, 2e-6), (128 * KiB, 9e-6))

    def time(**kw):
        return run("allreduce", 64 * KiB, replace(c, **kw), ["segment"], inplace=False)[0].time
    more = at_size(red, 64 * KiB) - 64 * KiB * 2e-11
    assert more > 0
    assert time(red=red) - time() == pytest.approx(more)
    assert time(red=red, cores=1) - time(cores=1) == pytest.approx(2 * more)      # two ranks a core
    assert time(red=((64 * KiB, 1e-9),)) == time()


_MiB = 1 << 20
_PLAIN = ((_MiB, _MiB * 1e-10), (64 * _MiB, 64 * _MiB * 1.5e-10))     # copies past the 32 MiB cache: 1.5x
_NT = ((_MiB, _MiB * 1e-10), (64 * _MiB, 64 * _MiB * 1e-10))          # ... not with non-temporal stores


def _at_64_mib(prim, **kw):
    """The model's time of a 64 MiB segment call on 2 ranks (a core each) whose memory is what slows them."""
    from dataclasses import replace
    c = Cluster(1, 2, intra=Link(20e-6, 1e-9), inter=Link(60e-6, 1e-9), cpu=True, cores=2, copy=2e-11,
                gamma=2e-11, seg=Link(4e-6, 0.0), cma=None, single_copy=False, mem_at=_PLAIN, cache=32 * _MiB)
    return run(prim, 64 * _MiB, replace(c, **kw), ["segment"], inplace=False)[0].time


def _segment_schedules(prim, count, window):
    from pyxccl.primitives import PRIMITIVES
    args = PRIMITIVES[prim].args(2, count)
    return [registry.lookup(prim, "segment").schedule(r, 2, window=window, **args) for r in range(2)]


def test_buffers_written_with_non_temporal_stores_are_priced_so():
    """The C executor writes a call's buffer with non-temporal stores when it is written, never reduced into,
    and on every rank of the host together larger than the cache (``cost.streamed``, as ``_native.c``'s
    ``nt_bytes``); its bytes then cost what calibrate's such copies cost (``mem_nt_at``), the others' what
    plain copies cost."""
    from pyxccl.algorithms.segment import Window
    from pyxccl.tuning.cost import streamed
    w = Window(1 << 18, 8)          # through the windows (no single copies, no pieces)
    ag, rs = _segment_schedules("allgather", 4 * _MiB, w), _segment_schedules("reduce_scatter", 4 * _MiB, w)
    assert streamed(ag, 4, 2, 32 * _MiB) == {"out"}              # 2 ranks x 32 MiB of output > 32 MiB
    assert streamed(ag, 4, 2, 64 * _MiB) == frozenset()
    assert streamed(rs, 4, 2, 1 * _MiB) == frozenset()            # reduced into: plain stores
    assert _at_64_mib("allgather", mem_nt_at=_NT) < 0.9 * _at_64_mib("allgather")
    assert _at_64_mib("allgather", mem_nt_at=_NT, cache=1 << 40) == _at_64_mib("allgather", cache=1 << 40)
    # (one core: the reduce-scatter's one-round form, which reduces into the output)
    assert _at_64_mib("reduce_scatter", mem_nt_at=_NT, cores=1) == _at_64_mib("reduce_scatter", cores=1)


def test_an_allgathers_puts_read_each_piece_once_and_stream_into_its_own_output():
    """An allgather where every rank has a core puts its block into every output a piece at a time: the model
    reads a piece from memory for the rank's own Put only (the next Puts find it in the cache), and prices
    the own Put into a buffer the C executor streams (posted for the others' Puts: ``cost.streamed``) at
    non-temporal copies' rate. Memory-bound, 2 ranks: 3 block-sized passes over memory against an alltoall's
    4 (its own block and the other's, each read and written)."""
    from pyxccl.algorithms.segment import Window
    from pyxccl.tuning.cost import streamed
    ag = _segment_schedules("allgather", 4 * _MiB, Window.of(2 << 20, 4, True, True))
    assert any(type(o).__name__ == "Put" for o in ag[0].steps[0])
    assert streamed(ag, 4, 2, 32 * _MiB) == {"out"}
    assert 0.7 < _at_64_mib("allgather", single_copy=True) / _at_64_mib("alltoall", single_copy=True) < 0.8
    assert _at_64_mib("allgather", single_copy=True, mem_nt_at=_NT) < 0.85 * _at_64_mib("allgather", single_copy=True)


def test_docstring_examples_run():
    """The examples in the simulator's and planner's docstrings are what they print."""
    import doctest

    import pyxccl.plan
    import pyxccl.sim.cluster
    import pyxccl.sim.simulate
    for mod in (pyxccl.sim, pyxccl.sim.cluster, pyxccl.sim.simulate, pyxccl.plan):
        res = doctest.testmod(mod)
        assert res.failed == 0 and res.attempted > 0, mod.__name__


def test_a_gather_by_puts_is_priced_on_the_writers_cores():
    """A gather from single-copy sizes: each writer's core pays its Put (its block but the tail, at the
    single-copy rate), the root's its own block (a copy) and the tails it reads, at once; the root ends
    when the last writer's next round says its Put is done."""
    from pyxccl.algorithms.segment import Window, _root_reads
    from pyxccl.schedule import Put
    from pyxccl.tuning.cost import Machine, Net
    from pyxccl.tuning.cost import run as walk_cost
    n, c, copy = 3, 1 << 20, 1e-10
    window = Window(1 << 20, 8, single_copy=1)
    scheds = [registry.lookup("gather", "segment").schedule(r, n, window=window, counts=[c] * n, root=0)
              for r in range(n)]
    assert all(any(type(o) is Put and o.peer == 0 for o in s.steps[0]) for s in scheds)
    tail = _root_reads(c, n)
    for beta in (copy, 1e-9):
        m = Machine(links={"seg": Link(0.0, 0.0)}, copy=copy, cma=Link(0.0, beta))
        est, stuck = walk_cost(scheds, 4, Net(m, lambda a, b: "shm", [1.0] * n))
        root = 4 * c * copy + (n - 1) * 4 * tail * max(copy, beta)
        writer = 4 * (c - tail) * max(copy, beta)
        assert not stuck and est.time == pytest.approx(max(root, writer)), (beta, root, writer)
