"""topology: the interfaces of this host, PYXCCL_SOCKET_IFNAME and the address a rank listens on.

The choice is tested on made-up interface lists (monkeypatched), then on this machine's real ones
(`ip` gives the reference when it is installed), then through pyxccl.init on two ranks. Across real
(emulated) hosts: test_multihost.py.
"""
import shutil
import socket
import subprocess

import pytest

from pyxccl import InvalidArgumentError
from pyxccl.transport import topology
from pyxccl.transport.topology import Interface, ifname_matches, local_address, parse_ifname

pytestmark = pytest.mark.timeout(60)

LO = Interface("lo", "127.0.0.1", True, True)
DOCKER = Interface("docker0", "172.17.0.1", True, False)
ETH0 = Interface("eth0", "10.0.0.5", True, False)
ETH1 = Interface("eth1", "10.1.0.5", True, False)
IB0 = Interface("ib0", "10.2.0.5", True, False)
DOWN = Interface("eth2", "10.3.0.5", False, False)
BARE = Interface("ifb0", "", False, False)       # no IPv4 address


@pytest.fixture
def host(monkeypatch):
    """Make up this host's interfaces and routes: host(ifaces, routes={target: source})."""
    def make(ifaces, routes=None):
        monkeypatch.setattr(topology, "interfaces",
                            lambda with_address=True: [i for i in ifaces if i.address or not with_address])
        monkeypatch.setattr(topology, "_route_source", lambda target: (routes or {}).get(target))
    return make


@pytest.mark.parametrize("spec, parsed", [
    ("eth", (False, False, ["eth"])),
    ("eth,ib", (False, False, ["eth", "ib"])),
    ("^docker,lo", (True, False, ["docker", "lo"])),
    ("=eth0", (False, True, ["eth0"])),
    ("^=eth0,eth1", (True, True, ["eth0", "eth1"])),
    (" eth , ib ,", (False, False, ["eth", "ib"])),
])
def test_parse_ifname(spec, parsed):
    assert parse_ifname(spec) == parsed


@pytest.mark.parametrize("spec, name, hit", [
    ("eth", "eth0", True), ("eth", "eth10", True), ("eth", "ens3", False), ("eth,ens", "ens3", True),
    ("=eth0", "eth0", True), ("=eth0", "eth01", False), ("=eth", "eth0", False),
    ("^docker,lo", "docker0", False), ("^docker,lo", "lo", False), ("^docker,lo", "eth0", True),
    ("^=eth0", "eth0", False), ("^=eth0", "eth01", True),
])
def test_ifname_matches(spec, name, hit):
    assert ifname_matches(spec, name) is hit


# --- the automatic choice ------------------------------------------------------------------------

def test_loopback_master_gives_loopback(host):
    host([LO, ETH0], {"127.0.0.1": "127.0.0.1"})
    assert local_address("127.0.0.1", environ={}) == "127.0.0.1"
    assert local_address("localhost", environ={}) == "127.0.0.1"


def test_remote_master_gives_the_interface_that_routes_to_it(host):
    host([LO, DOCKER, ETH0, ETH1], {"10.1.0.1": "10.1.0.5", "10.0.0.9": "10.0.0.5"})
    assert local_address("10.1.0.1", environ={}) == "10.1.0.5"
    assert local_address("10.0.0.9", environ={}) == "10.0.0.5"


def test_master_on_this_host_gives_that_address(host):
    host([LO, ETH0], {"10.0.0.5": "10.0.0.5"})     # rank 0's own address: the kernel routes it through lo
    assert local_address("10.0.0.5", environ={}) == "10.0.0.5"


def test_remote_master_never_gives_loopback(host):
    # no route (or a route through loopback): the first interface up that is not loopback nor docker
    host([LO, DOCKER, DOWN, ETH1, ETH0], {"10.9.9.9": "127.0.0.1"})
    assert local_address("10.9.9.9", environ={}) == "10.1.0.5"
    host([LO, DOCKER, ETH0])
    assert local_address("10.9.9.9", environ={}) == "10.0.0.5"


def test_remote_master_with_only_loopback_is_an_error(host):
    host([LO, DOCKER, BARE])
    with pytest.raises(InvalidArgumentError, match=r"rank 2: the master 10\.9\.9\.9 .* no interface other than "
                                                   r"loopback .*PYXCCL_SOCKET_IFNAME") as e:
        local_address("10.9.9.9", rank=2, environ={})
    assert e.value.rank == 2


def test_no_master_picks_a_real_interface_else_loopback(host):
    host([LO, DOCKER, ETH0])
    assert local_address(None, environ={}) == "10.0.0.5"
    host([LO, DOCKER])
    assert local_address(None, environ={}) == "127.0.0.1"


def test_unresolvable_master_leaves_the_error_to_the_store(host):
    host([LO, ETH0])
    assert local_address("no-such-host.invalid", environ={}) == "127.0.0.1"


# --- PYXCCL_SOCKET_IFNAME ----------------------------------------------------------------------------

@pytest.mark.parametrize("spec, want", [
    ("eth", "10.0.0.5"),            # first match in interface order
    ("eth1", "10.1.0.5"),
    ("=eth1", "10.1.0.5"),
    ("ib,eth", "10.0.0.5"),         # interface order, not list order (as NCCL)
    ("ib", "10.2.0.5"),
    ("^eth,lo", "172.17.0.1"),      # exclusion: docker is allowed when asked for
    ("^docker,lo,eth", "10.2.0.5"),
    ("^=eth0,docker0,lo", "10.1.0.5"),
    ("lo", "127.0.0.1"),            # loopback when asked for by name, even with a remote master
    ("eth2,ib", "10.2.0.5"),        # eth2 is down: skipped
])
def test_ifname_chooses(host, spec, want):
    host([LO, DOCKER, ETH0, ETH1, DOWN, IB0], {"10.8.0.1": "10.8.0.5"})
    assert local_address("10.8.0.1", environ={"PYXCCL_SOCKET_IFNAME": spec}) == want


def test_ifname_prefers_the_matching_interface_that_routes_to_the_master(host):
    host([LO, ETH0, ETH1], {"10.1.0.1": "10.1.0.5"})
    assert local_address("10.1.0.1", environ={"PYXCCL_SOCKET_IFNAME": "eth"}) == "10.1.0.5"
    assert local_address("10.1.0.1", environ={"PYXCCL_SOCKET_IFNAME": "=eth0"}) == "10.0.0.5"
    assert local_address("127.0.0.1", environ={"PYXCCL_SOCKET_IFNAME": "eth1"}) == "10.1.0.5"
    assert local_address(None, environ={"PYXCCL_SOCKET_IFNAME": "eth1"}) == "10.1.0.5"


@pytest.mark.parametrize("spec", ["ib", "=eth", "^eth,lo,docker", "eth2", "ifb"])
def test_ifname_without_a_match_names_rank_variable_and_interfaces(host, spec):
    host([LO, DOCKER, ETH0, DOWN, BARE])
    with pytest.raises(InvalidArgumentError) as e:
        local_address("10.0.0.1", rank=3, environ={"PYXCCL_SOCKET_IFNAME": spec})
    msg = str(e.value)
    assert msg.startswith("rank 3: ") and e.value.rank == 3 and e.value.op == "init"
    assert f"PYXCCL_SOCKET_IFNAME={spec!r}" in msg
    assert ("lo (127.0.0.1), docker0 (172.17.0.1), eth0 (10.0.0.5), eth2 (10.3.0.5, down), "
            "ifb0 (no IPv4 address, down)") in msg


@pytest.mark.parametrize("spec", [",", "^", "=", "^=", " , "])
def test_ifname_that_names_nothing_is_an_error(host, spec):
    host([LO, ETH0])
    with pytest.raises(InvalidArgumentError, match="names no interface"):
        local_address("10.0.0.1", rank=0, environ={"PYXCCL_SOCKET_IFNAME": spec})


def test_empty_ifname_is_automatic(host):
    host([LO, ETH0], {"10.0.0.1": "10.0.0.5"})
    assert local_address("10.0.0.1", environ={"PYXCCL_SOCKET_IFNAME": ""}) == "10.0.0.5"


def test_ifname_is_read_from_the_environment(host, monkeypatch):
    host([LO, ETH0, ETH1], {"10.0.0.1": "10.0.0.5"})
    monkeypatch.setenv("PYXCCL_SOCKET_IFNAME", "=eth1")
    assert local_address("10.0.0.1") == "10.1.0.5"


# --- this machine's real interfaces --------------------------------------------------------------

def test_real_interfaces_agree_with_ip():
    found = topology.interfaces()
    assert Interface("lo", "127.0.0.1", True, True) in found
    every = topology.interfaces(with_address=False)
    assert [i.name for i in every] == [name for _, name in socket.if_nameindex()]
    assert [i for i in every if i.address] == found
    if shutil.which("ip"):
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
        first = {}
        for line in out.splitlines():        # "2: eth0    inet 10.0.0.5/24 brd ... scope global eth0"
            f = line.split()
            first.setdefault(f[1], f[3].split("/")[0])
        assert {i.name: i.address for i in found} == first


def test_real_choice_is_consistent():
    real = [i for i in topology.interfaces() if i.up and not i.loopback]
    assert local_address("127.0.0.1", environ={}) == "127.0.0.1"
    assert local_address("127.0.0.1", environ={"PYXCCL_SOCKET_IFNAME": "=lo"}) == "127.0.0.1"
    if real:
        assert local_address(real[0].address, environ={}) == real[0].address
        assert local_address("127.0.0.1", environ={"PYXCCL_SOCKET_IFNAME": f"={real[0].name}"}) == real[0].address
        assert local_address("127.0.0.1", environ={"PYXCCL_SOCKET_IFNAME": "^lo"}) != "127.0.0.1"


# --- through pyxccl.init -----------------------------------------------------------------------------

def peer_addresses(comm):
    """(address of each TCP peer as this rank dialled or accepted it, the rank's own listener address)."""
    return [comm.connection(p)["host"].rsplit("(", 1)[1].rstrip(")") for p in range(comm.size) if p != comm.rank]


def test_init_listens_on_the_chosen_interface():
    from pyxccl.testing import RankPool
    real = [i for i in topology.interfaces() if i.up and not i.loopback]
    want = real[0] if real else topology.interfaces()[0]
    with RankPool(2, transports=("tcp",), env={"PYXCCL_SOCKET_IFNAME": f"={want.name}", "PYXCCL_TUNE": "0"}) as pool:
        assert pool.run(peer_addresses) == [[want.address], [want.address]]
    with RankPool(2, transports=("tcp",), env={"PYXCCL_SOCKET_IFNAME": "=lo", "PYXCCL_TUNE": "0"}) as pool:
        assert pool.run(peer_addresses) == [["127.0.0.1"], ["127.0.0.1"]]


def test_init_with_a_bad_ifname_fails_naming_the_rank():
    from pyxccl.testing import RankError, RankPool
    with pytest.raises(RankError) as e:
        RankPool(2, transports=("tcp",), env={"PYXCCL_SOCKET_IFNAME": "nosuchif", "PYXCCL_TUNE": "0"}, timeout=30)
    errs = e.value.errors
    assert set(errs) == {0, 1}
    for r, (exc, tb) in errs.items():
        assert isinstance(exc, InvalidArgumentError), tb
        assert f"rank {r}: PYXCCL_SOCKET_IFNAME='nosuchif' matches no interface" in str(exc)
        assert "lo (127.0.0.1)" in str(exc)
