"""A host lost: its link goes down, or its processes are killed. Every rank on the other host
raises PeerLostError naming a rank of the lost host and the host, within 10 s; nothing hangs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns

pytestmark = [pytest.mark.root, pytest.mark.timeout(120),
              pytest.mark.skipif(netns.unavailable() is not None, reason=netns.unavailable() or "")]

WORKER = Path(__file__).with_name("fault_worker.py")


def _start(hosts, per_host: int, out: Path, port: int) -> list[subprocess.Popen]:
    procs = []
    for h in range(hosts.n):
        cmd = [sys.executable, "-m", "pyxccl", "run", "--nnodes", str(hosts.n), "--node-rank", str(h),
               "--nproc-per-node", str(per_host), "--master-addr", hosts.addrs[0], "--master-port", str(port),
               str(WORKER), str(out)]
        procs.append(hosts.popen(h, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=dict(os.environ, PYXCCL_TUNE="0")))
    deadline = time.monotonic() + 60
    while len(list(out.glob("ready.*"))) < hosts.n * per_host:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            logs = "\n".join((p.communicate(timeout=5)[0] if p.poll() is not None else "(running)") for p in procs)
            raise AssertionError(f"the job did not start:\n{logs[-4000:]}")
        time.sleep(0.05)
    time.sleep(0.3)            # well into the allreduce loop
    return procs


@pytest.mark.parametrize("how", ["link down", "processes killed"])
def test_survivors_name_the_lost_host_within_10_s(tmp_path, how):
    with netns.EmulatedHosts(2, prefix=None) as hosts:
        procs = _start(hosts, 2, tmp_path, 29400 + os.getpid() % 300)
        (tmp_path / "broken").write_text(repr(time.time()))
        if how == "link down":
            subprocess.run(["ip", "-n", hosts.names[1], "link", "set", "eth0", "down"], check=True, timeout=10)
        else:
            for pid in netns._pids_in(hosts.names[1]):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        # the survivors' (ranks 0 and 1): the cut-off host's ranks write theirs too, maybe first
        while not all((tmp_path / f"result.{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        results = {int(f.suffix[1:]): json.loads(f.read_text()) for f in tmp_path.glob("result.*")}
    survivors = [results.get(r) for r in (0, 1)]
    if not all(survivors):
        logs = procs[0].communicate(timeout=30)[0]
        raise AssertionError(f"a rank on host 0 did not report: {results}\n{logs[-3000:]}")
    for s in survivors:
        print(f"{how}: rank {s['rank']} {s['error']} after {s['after']:.2f} s: {s['message'][:160]}")
        assert s["error"] in ("PeerLostError", "CommAbortedError"), s
        assert s["peer"] in (2, 3) or "lost rank 2" in s["message"] or "lost rank 3" in s["message"], s
        assert hosts.names[1] in s["message"], s
        assert s["after"] < 10, s
