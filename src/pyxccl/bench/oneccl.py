"""oneCCL's column of `pyxccl bench --vs`: its C++ API has no Python binding a user would pick, so a small
binary (scripts/peers/oneccl_bench.cpp, built by scripts/setup_peers.sh oneccl) times each case with the
buffers of runner.Case as runner.time_case does, and prints one JSON line per case with the per-iteration
times; this module runs it and turns those lines into the rows every other library writes.

oneCCL runs its own algorithms over libfabric's shm provider with no worker thread (CCL_ATL_TRANSPORT=ofi,
CCL_ATL_SHM=1, FI_PROVIDER=shm, CCL_WORKER_OFFLOAD=0, set by the binary unless the environment says
otherwise): oneCCL's stock worker thread busy-polls beside the rank and costs 10-50 ms a call on 2 cores.
"""
from __future__ import annotations

import json
import subprocess
import sys

from . import installs
from . import methodology as M


def rows(text: str) -> list[dict]:
    """The binary's JSON lines -> rows as pyxccl.bench.peers writes them (other lines are ignored)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "times_us" not in r:
            continue
        times = [t * 1e-6 for t in r["times_us"]]
        out.append(dict(lib="oneccl", op=r["op"], n=r["n"], size=r["size"], count=r["count"], type=r["type"],
                        out_of_place=dict(M.summarize(times, r["size"], r["op"], r["n"]), wrong=r["wrong"])))
    return out


def run(n: int, cases: list[tuple[str, int, int]], timeout: float = 1800) -> list[dict] | str:
    """oneCCL's rows of these (primitive, total elements, elements per rank) of float32, or why it could not
    run. The counts come from methodology.counts, so the binary repeats no rule of sizes."""
    cmd = [installs.oneccl_bench(), "-n", str(n), "--cases", ",".join(f"{p}:{t}:{q}" for p, t, q in cases)]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no result in {timeout:.0f} s"
    if p.returncode != 0:
        # oneCCL logs a warning or two per rank on every run: show its stderr only when it failed
        sys.stderr.write(p.stderr[-3000:])
        return f"its run exited with code {p.returncode}"
    return rows(p.stdout)
