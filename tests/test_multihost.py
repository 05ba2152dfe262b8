"""pyxccl across hosts: emulated hosts (network namespaces, tests/netns.py), one `pyxccl run --nnodes`
per host, TCP between hosts and shared memory inside each.

One job per layout (module-scoped): every rank runs tests/multihost_worker.py, which runs all the
checks (rankfns.py's, against numpy) and writes one JSON line per primitive and rank; the tests
below assert on those lines, so a failing primitive is a failing test of its own. The namespaces
are made once for the module and removed at its end, even when a test fails; a job that hangs is
killed at its deadline (its checks then fail as "not reported").

Needs root and `ip`: skipped otherwise. Runs in about 15 s here.
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
}
JOB_SECONDS = 60                  # the whole job; each collective's own deadline is PYXCCL_TIMEOUT below
PRIMITIVES = ["allreduce", "broadcast", "reduce", "allgather", "allgatherv", "reduce_scatter", "reduce_scatterv",
              "gather", "gatherv", "scatter", "scatterv", "alltoall", "alltoallv", "send_recv", "barrier",
              "objects_split"]
HIERARCHICAL = ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "gather", "scatter"]


class Job:
    """What one multi-host job left: launcher exit codes and output, and the ranks' records."""

    def __init__(self, counts, env: dict, port: int, out: Path, codes, seconds):
        self.counts, self.env, self.port, self.out, self.codes, self.seconds = counts, env, port, out, codes, seconds
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
            deadline: float = JOB_SECONDS) -> Job:
    """`pyxccl run --nnodes H --node-rank i --nproc-per-node <counts>` of the worker on each host i."""
    out.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYXCCL_", "MASTER_", "OMPI_", "PMI_", "SLURM_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    base.update(PYXCCL_TIMEOUT="20", PYXCCL_LINKS=str(out / "links.json"), **env)
    nproc = ",".join(map(str, counts))
    procs = []
    t = time.monotonic()
    for i in range(len(counts)):
        with open(out / f"host{i}.out", "wb") as o, open(out / f"host{i}.err", "wb") as e:
            procs.append(hosts.popen(i, [sys.executable, "-m", "pyxccl", "run", "--nnodes", str(len(counts)),
                                         "--node-rank", str(i), "--nproc-per-node", nproc, "--master-addr",
                                         hosts.addrs[0], "--master-port", str(port), str(WORKER), str(out)],
                                     env=base, stdout=o, stderr=e))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, t + deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    if None in codes:
        hosts.kill_all()          # a hang: kill it, the tests report what did not finish
    return Job(counts, env, port, out, codes, time.monotonic() - t)


@pytest.fixture(scope="module")
def hosts():
    with netns.EmulatedHosts(max(len(c) for c, _ in LAYOUTS.values())) as h:
        yield h
    # (EmulatedHosts.destroy raised if any namespace of the set were left)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def job(request, hosts, tmp_path_factory):
    counts, env = LAYOUTS[request.param]
    port = 29611 + list(LAYOUTS).index(request.param)
    return run_job(hosts, counts, tmp_path_factory.mktemp(f"multihost-{request.param}"), port, env)


# --- the job as a whole ------------------------------------------------------------------------------

def test_every_host_ran_its_ranks(job, hosts):
    assert job.codes == [0] * len(job.counts), job.logs()
    for node in range(len(job.counts)):
        first = sum(job.counts[:node])
        # every line is prefixed with the global rank of one of this host's ranks
        assert sorted(job.log(node, "out").splitlines()) == sorted(
            f"[{r}] rank {r} of {len(job.node_of)} on {hosts.names[node]}: done"
            for r in range(first, first + job.counts[node])), job.log(node)
    job.assert_ok("closed")


def test_communicator_sees_the_hosts(job, hosts):
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


def test_nothing_is_left_running(job, hosts):
    assert job.seconds < JOB_SECONDS
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

