"""pyxccl across hosts: emulated hosts (network namespaces, tests/netns.py), one `pyxccl run --nnodes`
per host, TCP between hosts and shared memory inside each.

One job per layout (module-scoped): every rank runs tests/multihost_worker.py, which runs all the
checks (rankfns.py's, against numpy) and writes one JSON line per primitive and rank; the tests
below assert on those lines, so a failing primitive is a failing test of its own. The namespaces
are made once for the module and removed at its end, even when a test fails; a job that hangs is
killed at its deadline (its checks then fail as "not reported").

The "8x8" layout (8 hosts x 8 ranks, issue 26) is slow: its own 8 namespaces, the worker's light
set of sizes and types (still every primitive), a deadline of its own; `make test-fast` leaves it out
(conftest.py SLOW_TESTS).

Needs root and `ip`: skipped otherwise. Runs in about 15 s here without 8x8.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns

REASON = netns.unavailable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or ""), pytest.mark.timeout(120)]

WORKER = Path(__file__).resolve().parent / "multihost_worker.py"
LAYOUTS = {                       # ranks per host; the first with an explicit PYXCCL_SOCKET_IFNAME
    "2x2": ([2, 2], {"PYXCCL_SOCKET_IFNAME": "=eth0"}),
    "2-1-2": ([2, 1, 2], {}),
    "8x8": ([8] * 8, {}),
}
JOB_SECONDS = 60                  # the whole job; each collective's own deadline is PYXCCL_TIMEOUT below
BIG = {"8x8": dict(seconds=900, timeout="120", light=True)}     # 64 ranks on this machine's few cores
SHARED_HOSTS = 3                  # the module's namespaces, for the layouts of up to this many hosts
PRIMITIVES = ["allreduce", "broadcast", "reduce", "allgather", "allgatherv", "reduce_scatter", "reduce_scatterv",
              "gather", "gatherv", "scatter", "scatterv", "alltoall", "alltoallv", "send_recv", "barrier",
              "objects_split"]
HIERARCHICAL = ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "gather", "scatter"]


class Job:
    """What one multi-host job left: launcher exit codes and output, and the ranks' records."""

    def __init__(self, counts, env: dict, port: int, out: Path, codes, seconds, hosts=None, deadline=JOB_SECONDS):
        self.counts, self.env, self.port, self.out, self.codes, self.seconds = counts, env, port, out, codes, seconds
        self.hosts, self.deadline = hosts, deadline
        self.node_of = [node for node, c in enumerate(counts) for _ in range(c)]
        self.records: dict[str, dict[int, dict]] = {}
        for f in sorted(out.glob("rank*.jsonl")):
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                self.records.setdefault(rec["check"], {})[rec["rank"]] = rec

    def log(self, node: int, stream: str = "err") -> str:
        p = self.out / f"host{node}.{stream}"
        return p.read_text(errors="replace") if p.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- host {i} stderr (tail) ---\n{self.log(i)[-3000:]}" for i in range(len(self.counts)))

    def assert_ok(self, check: str) -> None:
        got = self.records.get(check, {})
        missing = [r for r in range(len(self.node_of)) if r not in got]
        assert not missing, f"ranks {missing} reported nothing for {check!r} (codes {self.codes})\n{self.logs()}"
        fails = {r: rec["fails"] for r, rec in sorted(got.items()) if rec["fails"]}
        assert not fails, "\n".join(f"rank {r}: " + "\n  ".join(f) for r, f in fails.items())


def run_job(hosts: netns.EmulatedHosts, counts: list[int], out: Path, port: int, env: dict,
            deadline: float = JOB_SECONDS, timeout: str = "20", light: bool = False) -> Job:
    """`pyxccl run --nnodes H --node-rank i --nproc-per-node <counts>` of the worker on each host i
    (``timeout``: each collective's PYXCCL_TIMEOUT; ``light``: the worker's smaller set of cases)."""
    out.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYXCCL_", "MASTER_", "OMPI_", "PMI_", "SLURM_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    base.update(PYXCCL_TIMEOUT=timeout, PYXCCL_LINKS=str(out / "links.json"), **env)
    nproc = ",".join(map(str, counts))
    procs = []
    t = time.monotonic()
    for i in range(len(counts)):
        with open(out / f"host{i}.out", "wb") as o, open(out / f"host{i}.err", "wb") as e:
            procs.append(hosts.popen(i, [sys.executable, "-m", "pyxccl", "run", "--nnodes", str(len(counts)),
                                         "--node-rank", str(i), "--nproc-per-node", nproc, "--master-addr",
                                         hosts.addrs[0], "--master-port", str(port), str(WORKER), str(out),
                                         *(["light"] if light else [])],
                                     env=base, stdout=o, stderr=e))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, t + deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    if None in codes:
        hosts.kill_all()          # a hang: kill it, the tests report what did not finish
    return Job(counts, env, port, out, codes, time.monotonic() - t, hosts, deadline)


@pytest.fixture(scope="module")
def hosts():
    with netns.EmulatedHosts(SHARED_HOSTS) as h:
        yield h
    # (EmulatedHosts.destroy raised if any namespace of the set were left)


def _layout(name):
    if name not in BIG:
        return name
    return pytest.param(name, marks=[pytest.mark.slow, pytest.mark.timeout(BIG[name]["seconds"] + 120)])


@pytest.fixture(scope="module", params=[_layout(name) for name in LAYOUTS])
def job(request, tmp_path_factory):
    counts, env = LAYOUTS[request.param]
    port = 29611 + list(LAYOUTS).index(request.param)
    out = tmp_path_factory.mktemp(f"multihost-{request.param}")
    if len(counts) <= SHARED_HOSTS:
        return run_job(request.getfixturevalue("hosts"), counts, out, port, env)
    big = BIG[request.param]
    own = netns.EmulatedHosts(len(counts)).create()     # removed with this layout's tests, even on failure
    request.addfinalizer(own.destroy)
    return run_job(own, counts, out, port, env, deadline=big["seconds"], timeout=big["timeout"],
                   light=big["light"])


# --- the job as a whole ------------------------------------------------------------------------------

def test_every_host_ran_its_ranks(job):
    hosts = job.hosts
    assert job.codes == [0] * len(job.counts), job.logs()
    for node in range(len(job.counts)):
        first = sum(job.counts[:node])
        # every line is prefixed with the global rank of one of this host's ranks
        assert sorted(job.log(node, "out").splitlines()) == sorted(
            f"[{r}] rank {r} of {len(job.node_of)} on {hosts.names[node]}: done"
            for r in range(first, first + job.counts[node])), job.log(node)
    job.assert_ok("closed")


def test_communicator_sees_the_hosts(job):
    hosts = job.hosts
    job.assert_ok("init")
    n, nodes = len(job.node_of), job.node_of
    for r, rec in sorted(job.records["init"].items()):
        info, me = rec["info"], nodes[r]
        assert info["hostname"] == hosts.names[me]
        assert info["host_ranks"] == [p for p in range(n) if nodes[p] == me]
        assert info["hosts"] == len(job.counts)
        want = ["self" if p == r else "shm" if nodes[p] == me else "tcp" for p in range(n)]
        assert info["kinds"] == want
        assert info["link_kinds"][r] == want
        # TCP peers are reached at their host's address, and this rank listens on its own
        assert {int(p): a for p, a in info["peer_addrs"].items()} == {
            p: hosts.addrs[nodes[p]] for p in range(n) if nodes[p] != me}
        assert info["local_address"] == hosts.addrs[me]
        first = sum(job.counts[:me])
        assert info["env"] == {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r - first),
                               "LOCAL_WORLD_SIZE": str(job.counts[me]), "GROUP_RANK": str(me),
                               "GROUP_WORLD_SIZE": str(len(job.counts)), "MASTER_ADDR": hosts.addrs[0],
                               "MASTER_PORT": str(job.port),
                               "PYXCCL_SOCKET_IFNAME": job.env.get("PYXCCL_SOCKET_IFNAME")}
    # rank 0's store listens at MASTER_ADDR itself, not on every interface
    assert job.records["init"][0]["info"]["store_bound"] == [hosts.addrs[0], job.port]


@pytest.mark.parametrize("primitive", PRIMITIVES)
def test_primitive(job, primitive):
    job.assert_ok(primitive)


@pytest.mark.parametrize("primitive", HIERARCHICAL)
def test_hierarchical(job, primitive):
    from pyxccl.algorithms.registry import algorithms
    if "hierarchical" not in algorithms(primitive):
        pytest.skip(f"no hierarchical {primitive} registered")
    job.assert_ok(f"hierarchical_{primitive}")


def test_compressed_collectives_across_hosts(job):
    """Quantized and sparse collectives within their bounds, every rank the same bits; hierarchical
    compresses only the bytes between hosts (tests/compressfns.py)."""
    job.assert_ok("compressed")


def test_nothing_is_left_running(job):
    hosts = job.hosts
    assert job.seconds < job.deadline
    deadline = time.monotonic() + 5
    while any(hosts.pids().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(hosts.pids().values()), hosts.pids()


# --- PYXCCL_SOCKET_IFNAME that matches nothing ------------------------------------------------------

def test_unmatched_ifname_names_rank_variable_and_interfaces(hosts, tmp_path):
    out = tmp_path / "badif"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYXCCL_", "MASTER_"))}
    env.update(PYXCCL_TIMEOUT="20", PYXCCL_TUNE="0")
    script = "import pyxccl; pyxccl.init()"
    procs = []
    for i in range(2):
        with open(out / f"host{i}.err", "wb") as e:
            procs.append(hosts.popen(i, [sys.executable, "-m", "pyxccl", "run", "--nnodes", "2", "--node-rank", str(i),
                                         "-n", "1", "--master-addr", hosts.addrs[0], "--master-port", "29620",
                                         sys.executable, "-c", script],
                                     env=dict(env, PYXCCL_SOCKET_IFNAME="ib,=eth1") if i == 1 else env,
                                     stdout=subprocess.DEVNULL, stderr=e))
    try:
        assert procs[1].wait(timeout=30) == 1
    finally:
        hosts.kill_all()          # rank 0 would wait for rank 1 until its deadline
    err = (out / "host1.err").read_text()
    assert ("[1] pyxccl._errors.InvalidArgumentError: rank 1: PYXCCL_SOCKET_IFNAME='ib,=eth1' matches no "
            "interface") in err, err
    assert f"its interfaces: lo (127.0.0.1), eth0 ({hosts.addrs[1]})" in err, err

