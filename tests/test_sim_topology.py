"""Topologies between hosts (sim/topology.py): tori and dragonflies route on shortest paths, the
links they hold carry every message's bytes once per hop, collectives on them cost at least what they
cost on a fat tree of the same hosts and links; the CLI takes them; and NICs are as the machine wires
them (one rank per host on a DGX uses its one NIC)."""
from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import replace
from itertools import product

import pytest

from pyxccl import cli
from pyxccl._errors import InvalidArgumentError
from pyxccl.algorithms import registry
from pyxccl.plan import hardware
from pyxccl.primitives import PRIMITIVES
from pyxccl.schedule import Send
from pyxccl.sim import Cluster, Link, run
from pyxccl.sim.net import ClusterNet
from pyxccl.sim.topology import coords, hops, square_dims

GB = 1e9
_LINKS = dict(intra=Link(1e-6, 1 / (300 * GB)), inter=Link(5e-6, 1 / (25 * GB)), gamma=1e-12)

SHAPES = {
    "torus2d-4x4": dict(hosts=16, topology="torus2d", dims=(4, 4)),
    "torus2d-3x5": dict(hosts=15, topology="torus2d", dims=(3, 5)),
    "torus2d-1x6": dict(hosts=6, topology="torus2d", dims=(1, 6)),
    "torus3d-2x3x4": dict(hosts=24, topology="torus3d", dims=(2, 3, 4)),
    "torus3d-3x3x3": dict(hosts=27, topology="torus3d", dims=(3, 3, 3)),
    "dragonfly-12/3": dict(hosts=12, topology="dragonfly", groups=3),
    "dragonfly-16/4": dict(hosts=16, topology="dragonfly", groups=4),
    "dragonfly-8/4": dict(hosts=8, topology="dragonfly", groups=4),     # 2 hosts a group: gateways shared
    "dragonfly-6/6": dict(hosts=6, topology="dragonfly", groups=6),     # a host a group: global links only
}


def _cluster(name, per_host=1, nics=1):
    kw = dict(SHAPES[name])
    return Cluster(kw.pop("hosts"), per_host, nics=nics, **kw, **_LINKS)


def _graph(c: Cluster) -> dict:
    """The topology's links from its definition (docs/sim.md), host -> neighbours: not from the routes."""
    adj = {h: set() for h in range(c.hosts)}
    if c.topology.startswith("torus"):
        for h in range(c.hosts):
            x = coords(h, c.dims)
            for k, size in enumerate(c.dims):
                for step in (1, -1):
                    y = list(x)
                    y[k] = (y[k] + step) % size
                    q = sum(v * s for v, s in zip(y, [_prod(c.dims[i + 1:]) for i in range(len(c.dims))]))
                    if q != h:
                        adj[h].add(q)
    else:
        a = c.hosts // c.groups
        for u, v in product(range(c.hosts), repeat=2):
            if u != v and u // a == v // a:
                adj[u].add(v)
        for g1, g2 in product(range(c.groups), repeat=2):
            if g1 != g2:        # the global link (g1, g2): host g2 mod a of g1 to host g1 mod a of g2
                adj[g1 * a + g2 % a].add(g2 * a + g1 % a)
    return adj


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _bfs(adj: dict, src: int, group=None) -> dict:
    """Hops from ``src`` to every host on the shortest path; with ``group`` (a dragonfly's host -> group),
    on the shortest minimal path: at most one global hop (a link between groups), as dragonflies route."""
    start = (src, 0)
    dist, q = {start: 0}, deque([start])
    while q:
        u, used = node = q.popleft()
        for v in adj[u]:
            g = 0 if group is None else int(group(u) != group(v))
            nxt = (v, used + g)
            if used + g <= 1 and nxt not in dist:
                dist[nxt] = dist[node] + 1
                q.append(nxt)
    out = {}
    for (v, _), d in dist.items():
        out[v] = min(out.get(v, d), d)
    return out


def _minimal(c: Cluster, adj: dict, src: int) -> dict:
    return _bfs(adj, src, (lambda h: h // (c.hosts // c.groups)) if c.groups else None)


def _walk(c: Cluster, ha: int, links: list) -> list[int]:
    """The hosts a route visits, link by link (each link must leave the host the previous one reached)."""
    at, seen = ha, [ha]
    a = c.hosts // c.groups if c.groups else 0
    for k in links:
        if k[0] == "torus":
            _, h, dim, step = k
            assert h == at, (links, seen)
            x = coords(h, c.dims)
            x[dim] = (x[dim] + step) % c.dims[dim]
            at = sum(v * _prod(c.dims[i + 1:]) for i, v in enumerate(x))
        elif k[0] == "local":
            _, u, v = k
            assert u == at and u // a == v // a and u != v, (links, seen)
            at = v
        else:
            _, g1, g2 = k
            assert at == g1 * a + g2 % a, (links, seen)        # leaves from the gateway of (g1, g2)
            at = g2 * a + g1 % a
        seen.append(at)
    return seen


@pytest.mark.parametrize("name", list(SHAPES))
def test_routes_are_shortest_paths(name):
    """Tori: shortest paths. Dragonflies: the shortest of the minimal paths (one global hop), which are the
    shortest paths unless groups are small (2 hosts a group of 4 groups: host 1 reaches group 2 through
    group 1 in 2 hops, minimal routing takes 3; checked below)."""
    c = _cluster(name)
    adj = _graph(c)
    for ha in range(c.hosts):
        dist = _minimal(c, adj, ha)
        assert len(dist) == c.hosts                         # connected
        for hb in range(c.hosts):
            links = hops(c, ha, hb)
            visited = _walk(c, ha, links)
            assert visited[-1] == hb
            assert all(v in adj[u] for u, v in zip(visited, visited[1:]))     # real links of the topology
            assert len(links) == dist[hb]                   # no shorter (minimal) way exists
            if c.topology.startswith("torus"):              # the Manhattan distance with wrap-around
                x, y = coords(ha, c.dims), coords(hb, c.dims)
                assert len(links) == sum(min((p - q) % d, (q - p) % d) for p, q, d in zip(x, y, c.dims))
            else:
                a = c.hosts // c.groups
                assert len(links) <= 3 and (ha == hb or ha // a != hb // a or len(links) == 1)
                assert sum(k[0] == "global" for k in links) == (ha // a != hb // a)
    if name == "dragonfly-8/4":
        assert len(hops(c, 1, 5)) == 3 and _bfs(adj, 1)[5] == 2
    elif c.topology == "dragonfly":     # groups large enough: minimal is shortest
        assert all(_bfs(adj, h) == _minimal(c, adj, h) for h in range(c.hosts))


def test_torus_dims_and_dragonfly_groups():
    assert Cluster(16, 1, topology="torus2d", **_LINKS).dims == (4, 4)
    assert Cluster(12, 1, topology="torus2d", **_LINKS).dims == (4, 3)
    assert Cluster(16, 1, topology="torus3d", **_LINKS).dims == (4, 2, 2)
    assert Cluster(64, 1, topology="torus3d", **_LINKS).dims == (4, 4, 4)
    assert Cluster(12, 1, topology="dragonfly", **_LINKS).groups == 4
    assert square_dims(7, 3) == (7, 1, 1)
    with pytest.raises(InvalidArgumentError, match=r"dims \(4, 4\) do not multiply to the hosts.*dims=\(4, 3\)"):
        Cluster(12, 1, topology="torus2d", dims=(4, 4), **_LINKS)
    with pytest.raises(InvalidArgumentError, match="give 3 dimensions"):
        Cluster(12, 1, topology="torus3d", dims=(3, 4), **_LINKS)
    with pytest.raises(InvalidArgumentError, match="5 groups do not divide"):
        Cluster(12, 1, topology="dragonfly", groups=5, **_LINKS)
    with pytest.raises(InvalidArgumentError, match="is for a torus"):
        Cluster(12, 1, dims=(4, 3), **_LINKS)
    with pytest.raises(ValueError, match="torus3d"):
        Cluster(12, 1, topology="mesh", **_LINKS)


@pytest.mark.parametrize("name", ["torus2d-4x4", "torus3d-2x3x4", "dragonfly-12/3"])
def test_link_loads_add_up(name):
    """An alltoall's bytes summed over the links between hosts (what the simulator holds, ClusterNet.route)
    are every message's bytes times its hops (the shortest distance, from the topology's definition); and
    the simulated time is at least the busiest link's bytes at its rate (one transfer at a time on it)."""
    c = _cluster(name, per_host=2, nics=2)
    net, dist = ClusterNet(c), {h: _minimal(c, _graph(c), h) for h in range(c.hosts)}
    nbytes = 4 << 20
    algo, prim = registry.lookup("alltoall", "direct"), PRIMITIVES["alltoall"]
    args = prim.sized(c.nranks, nbytes, 4)
    load, want, crossing = Counter(), 0, 0
    for r in range(c.nranks):
        for step in algo.schedule(r, c.nranks, hosts=c.host_list(), **args).steps:
            for o in step:
                if type(o) is not Send or c.host_of(o.peer) == c.host_of(r):
                    continue
                nb = o.count * 4
                links = [x for x in net.route(r, o.peer, net.klass(r, o.peer)) if not x[0].startswith("nic")]
                for x in links:
                    load[x] += nb
                want += nb * dist[c.host_of(r)][c.host_of(o.peer)]
                crossing += 1
    assert crossing == c.nranks * (c.nranks - c.per_host)
    assert sum(load.values()) == want > 0
    (res,) = run("alltoall", nbytes, c, ["direct"], mode="message")
    assert res.time >= max(load.values()) * c.inter.beta
    # a NIC carries less than the busiest link here: the links bound the time, and a fat tree is faster
    assert max(load.values()) > (nbytes * (c.nranks - c.per_host) // c.nranks) * c.per_host / c.nics
    (fat,) = run("alltoall", nbytes, replace(c, topology="fattree", dims=(), groups=0), ["direct"])
    assert fat.time < res.time


ALGOS = {"allreduce": ["ring", "hierarchical", "halving_doubling", "double_binary_tree"],
         "alltoall": ["direct", "pairwise", "bruck", "hierarchical"]}


@pytest.mark.parametrize("name", ["torus2d-4x4", "torus3d-2x3x4", "dragonfly-16/4", "dragonfly-8/4"])
@pytest.mark.parametrize("prim", list(ALGOS))
def test_collectives_cost_at_least_the_fat_trees(prim, name):
    c = _cluster(name, per_host=2, nics=2)
    fat = replace(c, topology="fattree", dims=(), groups=0)
    slower = 0
    for nbytes in (64 << 10, 16 << 20):
        for algo in ALGOS[prim]:
            try:
                (mine,) = run(prim, nbytes, c, [algo])
            except ValueError:                      # halving-doubling on 24 hosts x 2: not a power of two
                continue
            (theirs,) = run(prim, nbytes, fat, [algo])
            assert mine.mode == "message" and mine.bytes_sent == theirs.bytes_sent
            assert mine.time >= theirs.time, (algo, nbytes)
            slower += mine.time > theirs.time * 1.01
    assert slower          # the links between hosts are held: some algorithm pays for them


def test_a_torus_of_one_row_is_a_ring_of_hosts():
    torus, ring = _cluster("torus2d-1x6", per_host=2, nics=2), replace(_cluster("torus2d-1x6", per_host=2, nics=2),
                                                                       topology="ring", dims=())
    for prim, algo in (("allreduce", "halving_doubling"), ("allreduce", "ring"), ("alltoall", "direct"),
                       ("alltoall", "bruck")):
        try:
            (a,) = run(prim, 1 << 20, torus, [algo], mode="message")
        except ValueError:
            continue
        (b,) = run(prim, 1 << 20, ring, [algo], mode="message")
        assert a.time == b.time, (prim, algo)


def test_tori_and_dragonflies_do_not_fold():
    for name in ("torus2d-4x4", "dragonfly-16/4"):
        c = _cluster(name, per_host=2)
        with pytest.raises(ValueError, match="does not fold"):
            run("allreduce", 1 << 20, c, ["ring"], mode="symmetric")
        assert run("allreduce", 1 << 20, c, ["ring"], mode="auto")[0].mode == "message"
        with pytest.raises(ValueError, match="does not fold"):
            ClusterNet(c, sym=object())


def test_cli_takes_the_topologies(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert cli.main(["sim", "alltoall", "--hosts", "16", "--per-host", "2", "--size", "4M", "--algo", "pairwise",
                     "--topology", "torus2d", "--dims", "2x8", "--nics", "1", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert "torus2d 2x8" in d["cluster"]
    want = run("alltoall", 4 << 20, Cluster(16, 2, intra=Link(1e-6, 1 / 300e9), inter=Link(5e-6, 1 / 25e9), nics=1,
                                            topology="torus2d", dims=(2, 8)), ["pairwise"])[0]
    assert d["rows"][0]["time"] == want.time
    assert cli.main(["sim", "allreduce", "--hosts", "12", "--per-host", "2", "--size", "1M", "--algo", "ring",
                     "--topology", "dragonfly", "--groups", "3", "--json", str(out)]) == 0
    assert "dragonfly of 3 groups" in json.loads(out.read_text())["cluster"]
    assert cli.main(["sim", "allreduce", "--hosts", "8", "--per-host", "2", "--size", "1M", "--algo", "ring",
                     "--hardware", "dgx-a100", "--topology", "torus3d", "--json", str(out)]) == 0
    assert "torus3d 2x2x2" in json.loads(out.read_text())["cluster"]
    with pytest.raises(SystemExit, match=r"give 2 dimensions whose product is 12 \(e.g. dims=\(4, 3\), --dims 4x3\)"):
        cli.main(["sim", "allreduce", "--hosts", "12", "--topology", "torus2d", "--dims", "4x4"])
    with pytest.raises(SystemExit):
        cli.main(["sim", "allreduce", "--hosts", "12", "--topology", "torus2d", "--dims", "4by4"])
    with pytest.raises(SystemExit, match="does not fold"):
        cli.main(["sim", "allreduce", "--hosts", "4", "--topology", "torus2d", "--mode", "symmetric", "--algo",
                  "ring"])


def test_hardware_files_take_the_topologies():
    d = {"gpu": "h100-sxm", "gpus_per_host": 8, "intra": "nvswitch-h100", "inter": "ib-ndr", "nics": 8,
         "topology": "torus2d"}
    hw = hardware.from_dict(d)
    c = hw.cluster(16, 1, nic_share=1)
    assert (c.topology, c.dims) == ("torus2d", (4, 4))
    assert run("allreduce", 1 << 24, c, ["ring"])[0].time > 0
    with pytest.raises(ValueError, match="topology 'hypercube'"):
        hardware.from_dict(dict(d, topology="hypercube"))


# --- NICs as the machine wires them ----------------------------------------------------------------------

def _cli_busbw(tmp_path, hw, hosts, per_host, algo="ring", size="1G"):
    out = tmp_path / "r.json"
    assert cli.main(["sim", "allreduce", "--hardware", hw, "--hosts", str(hosts), "--per-host", str(per_host),
                     "--size", size, "--algo", algo, "--raw", "--json", str(out)]) == 0    # the wiring, unfitted
    return json.loads(out.read_text())["rows"][0]["busbw"]


def test_one_rank_per_host_uses_its_one_nic_on_a_dgx(tmp_path, capsys):
    nic = hardware.load("dgx-a100").inter.bandwidth                 # 200 Gb/s: 25 GB/s
    lone = _cli_busbw(tmp_path, "dgx-a100", 2, 1)
    assert lone == pytest.approx(nic, rel=0.05)                     # one NIC's, not eight
    assert hardware.load("dgx-a100").cluster(2, 1, nic_share=8).nics == 1
    # four GPUs a host: four NICs, one each; eight: all eight, and hierarchical uses them together
    c4 = hardware.load("dgx-a100").cluster(2, 4, nic_share=8)
    assert c4.nics == 4 and 1 / c4.inter.beta == pytest.approx(nic)
    full = _cli_busbw(tmp_path, "dgx-a100", 2, 8, "hierarchical")
    assert full > 6 * nic
    assert _cli_busbw(tmp_path, "dgx-h100", 2, 1) == pytest.approx(hardware.load("dgx-h100").inter.bandwidth,
                                                                   rel=0.05)


def test_a_shared_nic_is_shared_and_a_second_rail_is_used():
    # one NIC for 8 GPUs: a lone rank gets it whole, 8 ranks share it
    pcie = hardware.load("pcie-a100-eth")
    assert pcie.nics_per_gpu == 1.0
    one, eight = pcie.cluster(2, 1, nic_share=1), pcie.cluster(2, 8, nic_share=1)
    assert (one.nics, eight.nics) == (1, 1) and one.inter == eight.inter == pcie.inter.link
    (r,) = run("allreduce", 1 << 30, one, ["ring"])
    assert r.busbw == pytest.approx(pcie.inter.bandwidth, rel=0.05)
    # two NICs per GPU (16 for 8): a lone rank reaches its two
    two = hardware.from_dict({"gpu": "a100-sxm", "gpus_per_host": 8, "intra": "nvswitch-a100", "inter": "ib-hdr",
                              "nics": 16})
    c = two.cluster(2, 1, nic_share=16)
    assert two.nics_per_gpu == 2.0 and 1 / c.inter.beta == pytest.approx(2 * two.inter.bandwidth)
    # the planner's share still rules when it is smaller (8 DP groups on a DGX: one NIC each)
    dgx = hardware.load("dgx-a100")
    assert dgx.cluster(4, 1, nic_share=1).inter == dgx.inter.link


def test_fewer_ranks_a_host_than_gpus_reach_fewer_nics(capsys):
    """``pyxccl plan --per-host 1`` on a DGX: the one GPU used reaches one NIC, not the host's eight."""
    one = hardware.load("dgx-a100").with_per_host(1)
    assert (one.per_host, one.nics, one.nics_per_gpu) == (1, 1, 1.0)
    assert hardware.load("dgx-a100").with_per_host(4).nics == 4
    assert hardware.load("pcie-a100-eth").with_per_host(2).nics == 1        # the GPUs share their NIC
    c = one.cluster(2, 1, nic_share=one.nics)
    assert (c.nics, c.inter) == (1, one.inter.link)
    assert cli.main(["plan", "--model", "llama-7b", "--dp", "2", "--hardware", "dgx-a100", "--per-host", "1",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "1 NIC)" in json.dumps(out)
