"""Collectives across emulated hosts (network namespaces with rate-limited links), as root.

    .venv/bin/python benchmarks/multihost.py allreduce [--hosts 2 --per-host 2 --rate 1gbit]
    .venv/bin/python benchmarks/multihost.py p2p [--nsocks 1,2]     # unshaped, vs netbench.py
    .venv/bin/python benchmarks/multihost.py compression [--rate 1gbit --specs none,int8,topk:0.01,auto]

``allreduce``: 64 MiB float32 allreduce over H hosts x L ranks, pyxccl's
hierarchical algorithm vs its flat ring vs Gloo (torch.distributed, one run,
interleaved), shared memory inside each host and TCP between them. Method as in
../shared/peers: barrier, time one call, iteration time = max over ranks,
median over iterations; algbw = size / time, busbw = algbw x 2(n-1)/n.

``p2p``: one rank on each of two hosts with unshaped links; 64 MiB send/recv
one way (time until the receiver has it all), pyxccl over TCP with each
PYXCCL_NSOCKS, against netbench.py's one-stream bulk figure between the same
hosts.

``compression``: the same 64 MiB float32 allreduce uncompressed and with each compressor of
``--specs`` (pyxccl bench --compression's table: time, bytes on the wire per rank, error), and
what ``compression="auto"`` picks; then the same on one host (the ranks of host 0 alone), where
auto must pick nothing.

Hosts come from tests/netns.py (the scripts in tests/emuhosts); they are removed at
the end, even on failure.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _worker(a) -> None:
    import numpy as np

    import pyxccl
    comm = pyxccl.init()
    n, r = comm.size, comm.rank
    count = a.size // 4

    def timed(fn) -> float:
        comm.barrier()
        t = time.perf_counter()
        fn()
        dt = np.array([time.perf_counter() - t])
        comm.allreduce(dt, op="max")
        return float(dt[0])

    if a.mode == "compression":
        from pyxccl.bench import compression
        specs = [None if x == "none" else x for x in a.specs.split(",")]
        rows = compression.run(comm, ["allreduce"], [a.size], specs, iters=a.iters, warmup=a.warmup)
        local = comm.split(comm.topology()[comm.rank]["host_index"], comm.rank)
        one = compression.run(local, ["allreduce"], [a.size], [None, "auto"], iters=a.iters, warmup=a.warmup)
        if r == 0:
            print(f"TABLE {comm.size} ranks on {len({t['host'] for t in comm.topology()})} hosts\n"
                  f"{compression.text(rows)}\nTABLE {local.size} ranks on host 0 alone\n{compression.text(one)}")
        local.close()
        comm.close()
        return
    if a.mode == "p2p":
        want = (np.arange(count) % 251).astype(np.float32)
        buf = want.copy() if r == 0 else np.zeros(count, np.float32)
        times = []
        for _ in range(a.warmup + a.iters):
            times.append(timed(lambda: comm.send(buf, 1) if r == 0 else comm.recv(buf, 0)))
        assert np.array_equal(buf, want), "p2p: wrong data"
        if r == 0:
            print(f"RESULT pyxccl-nsocks{os.environ.get('PYXCCL_NSOCKS', '1')} {statistics.median(times[a.warmup:])}")
        comm.close()
        return
    x = np.ones(count, np.float32)
    runs = {"pyxccl hierarchical": lambda: comm.allreduce(x, algorithm="hierarchical"),
            "pyxccl ring (flat)": lambda: comm.allreduce(x, algorithm="ring"),
            "pyxccl (tuner's choice)": lambda: comm.allreduce(x)}
    if a.gloo:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                                f"{int(os.environ['MASTER_PORT']) + 1}", rank=r, world_size=n)
        t = torch.ones(count)
        runs["gloo"] = lambda: dist.all_reduce(t)
    times = {k: [] for k in runs}
    for i in range(a.warmup + a.iters):
        for k, fn in runs.items():          # interleaved: each round runs every contender once
            dt = timed(fn)
            if i >= a.warmup:
                times[k].append(dt)
    chosen = comm.algorithm_for("allreduce", x.nbytes, x.dtype)
    for alg in ("hierarchical", "ring"):
        x[:] = 1
        comm.allreduce(x, algorithm=alg)
        assert np.all(x == n), f"{alg}: wrong result"
    if r == 0:
        for k, ts in times.items():
            print(f"RESULT {k.replace(' ', '_')} {statistics.median(ts)}")
        print(f"CHOSEN {chosen}")
    comm.close()


def _run_job(hosts, per_host: int, argv: list[str], env: dict, timeout: float) -> str:
    """One `pyxccl run` per host; rank 0's output."""
    port = 29700 + os.getpid() % 200
    procs = []
    for h in range(hosts.n):
        cmd = [sys.executable, "-m", "pyxccl", "run", "--nnodes", str(hosts.n), "--node-rank", str(h),
               "--nproc-per-node", str(per_host), "--master-addr", hosts.addrs[0], "--master-port", str(port),
               *argv]
        procs.append(hosts.popen(h, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=dict(os.environ, **env)))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
        if p.returncode:
            raise RuntimeError(f"a host's job failed ({p.returncode}):\n{out[-3000:]}")
    return outs[0]


def emulated_hosts(script: str, n: int, rate: str | None = None, **kw):
    """tests/netns.py's ``EmulatedHosts(n)``, links shaped to ``rate`` ("0" or "": unshaped); exits
    naming ``script`` and why where they cannot be made (root, ip and tc are needed)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from netns import EmulatedHosts, unavailable
    why = unavailable()
    if why:
        sys.exit(f"{script}: {why}")
    return EmulatedHosts(n, rate=None if rate in ("0", "") else rate, **kw)


def _netbench(hosts, mib: int) -> float:
    """netbench.py bulk throughput host 0 -> host 1, in bytes/s."""
    from netns import NETNS_DIR
    srv = hosts.popen(1, [sys.executable, str(NETNS_DIR / "netbench.py"), "server", "--timeout", "60"])
    time.sleep(0.5)
    cli = hosts.popen(0, [sys.executable, str(NETNS_DIR / "netbench.py"), "client", hosts.addrs[1], "--mib",
                          str(mib), "--iters", "200"], stdout=subprocess.PIPE, text=True)
    out, _ = cli.communicate(timeout=120)
    srv.wait(timeout=60)
    m = re.search(r"= ([\d.]+) Gbit/s", out)
    if not m:
        raise RuntimeError(f"netbench.py said: {out}")
    return float(m.group(1)) * 1e9 / 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("allreduce", "p2p", "compression"))
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--rate", default="1gbit", help="tc rate per host link (allreduce mode); 0 = unshaped")
    ap.add_argument("--size", type=int, default=64 * MiB)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--nsocks", default="1,2,4", help="p2p mode: PYXCCL_NSOCKS values to try")
    ap.add_argument("--no-gloo", dest="gloo", action="store_false")
    ap.add_argument("--specs", default="none,fp16,int8,topk:0.01,auto", help="compression mode: the compressors")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return _worker(a)
    worker = [str(Path(__file__).resolve()), a.mode, "--worker", "--size", str(a.size), "--iters", str(a.iters),
              "--warmup", str(a.warmup), "--specs", a.specs] + ([] if a.gloo else ["--no-gloo"])
    if a.mode == "p2p":
        with emulated_hosts("multihost.py", 2, prefix="pxb", subnet="10.79.0") as hosts:
            raw = statistics.median(_netbench(hosts, a.size // MiB) for _ in range(3))
            print(f"# p2p {a.size // MiB} MiB host 0 -> host 1, unshaped; netbench.py one stream: "
                  f"{raw / 1e9:.2f} GB/s")
            print(f"{'pyxccl':<22}{'GB/s':>8}{'of netbench':>13}")
            for k in a.nsocks.split(","):
                out = _run_job(hosts, 1, worker, {"PYXCCL_NSOCKS": k, "PYXCCL_TRANSPORT": "tcp"}, 300)
                t = float(re.search(r"RESULT \S+ ([\d.e-]+)", out).group(1))
                print(f"{'NSOCKS=' + k:<22}{a.size / t / 1e9:>8.2f}{a.size / t / raw:>12.0%}")
        return
    with emulated_hosts("multihost.py", a.hosts, a.rate, prefix="pxb", subnet="10.79.0") as hosts:
        out = _run_job(hosts, a.per_host, worker, {}, 1800)
    if a.mode == "compression":
        print(f"# allreduce {a.size // MiB} MiB float32, {a.hosts} hosts x {a.per_host} ranks, link {a.rate} per "
              f"host, median of {a.iters}")
        print("\n".join(line[4:] if line.startswith("[0] ") else line for line in out.splitlines()
                        if "TABLE" in line or line.startswith("[0] ")).replace("TABLE", "#"))
        return
    n = a.hosts * a.per_host
    link = _rate_bytes(a.rate)
    print(f"# allreduce {a.size // MiB} MiB float32, {a.hosts} hosts x {a.per_host} ranks, "
          f"link {a.rate} per host, median of {a.iters}")
    print(f"{'what':<26}{'ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}" + (f"{'algbw/link':>12}" if link else ""))
    for name, t in re.findall(r"RESULT (\S+) ([\d.e-]+)", out):
        t = float(t)
        alg = a.size / t
        line = f"{name.replace('_', ' '):<26}{t * 1e3:>10.1f}{alg / 1e9:>12.3f}{alg * 2 * (n - 1) / n / 1e9:>12.3f}"
        print(line + (f"{alg / link:>12.0%}" if link else ""))
    m = re.search(r"CHOSEN (\S+)", out)
    print(f"# the tuner chose: {m.group(1) if m else '?'}")


def _rate_bytes(rate: str) -> float | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


if __name__ == "__main__":
    main()
