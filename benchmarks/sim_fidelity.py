"""How well the simulator (``pyxccl.sim``) predicts what pyxccl measures on this machine (issue 15).

Run it (from the repository, with the package on the path):

    python benchmarks/sim_fidelity.py --save /work/bench/i15/measured.json     # measure, then predict
    python benchmarks/sim_fidelity.py --part local --save FILE                 # only the local ranks
    python benchmarks/sim_fidelity.py --load /work/bench/i15/measured.json     # predict a saved measurement
    python benchmarks/sim_fidelity.py --load FILE --terms       # ... and which term of the model is off
    python benchmarks/sim_fidelity.py --published [--json FILE]  # published nccl-tests figures (issue 27)
    python benchmarks/sim_fidelity.py --published --fit          # ... refitting on the calibrate part
    python benchmarks/sim_fidelity.py --published --net-latency  # ... pricing NET plugin latencies too
    python benchmarks/sim_fidelity.py --published --cross-validate   # the fit's forms, leaving a source out

``--published`` measures nothing: it predicts every point of ``pyxccl/sim/data/nccl_published.json``
(docs/sim-data.md) with the default simulator ("pyxccl") and the NCCL tuning model's port ("nccl"),
before calibration and with the fitted parameters of ``pyxccl/sim/fitted.py`` (``--fit``: fitted now,
on the calibrate part only, and printed), and prints the table, the median and worst |error| per part
(calibrate / validate) and model, suspect points apart, and per source (``pyxccl.sim.published``).

The hosts part needs root (network namespaces made by tests/netns.py, tests/emuhosts); without
root it is skipped with a note.

How it measures. Both parts time calls with pyxccl's own benchmark code (``pyxccl.bench.runner``:
nccl-tests sizes and buffers, float32, out of place, barrier before each call, per-iteration time
= the max over ranks, warm-up and timed iterations by size as ``bench/methodology.py`` says); the
sweep is repeated ``--rounds`` times in one job and a row's time is the median of all its timed
iterations. Each row records the algorithm the tuner chose for it (``comm.algorithm_for``), which is
the one that ran.

- local: ``-n 2`` and ``-n 4`` ranks on this host (shared memory), allreduce, allgather and
  alltoall from 64 KiB to 64 MiB (x4);
- hosts: 2 emulated hosts x 2 ranks joined by links shaped to ``--rate`` (1gbit), the same three
  collectives at 1, 4, 16 and 64 MiB.

Each job also records the link figures its communicator's tuner used (``comm.link_figures()``:
shared memory, the shared segment's round, copy and reduction rates from pyxccl's link cache, and
"tcp" between hosts measured at that job's init), so a saved measurement is predicted with the
figures measured when it ran, not with whatever the cache holds later. After its sweep a job
measures a few figures itself, as its ranks see them then (medians, not the probe's fastest
batches: ``_figures_now``), and the CPU time other processes took meanwhile is recorded (the
machine is shared: a busy neighbour doubles the 4-rank times).

How it predicts. Every measured row goes through ``pyxccl.sim.run(prim, nbytes, cluster,
[algorithm])`` with ``cluster = Cluster.measured(hosts, per_host, inter=<measured tcp>,
calibration=...)`` whose shared-memory, segment, copy, reduction and memory figures are those the
job's tuner recorded, and whose single-copy read rate, window reads and writes, copies and segment
round are those ``pyxccl.sim.calibrate.measure`` found in the job right before each timing of the row
(the row's prediction is the median of those; the machine's speed moves 2-3x within a minute, so a
calibration taken once before a sweep of a minute predicts other moments than the rows'). For a
measurement saved before rows had their own: calibrate's figures before the sweep, whose segment round is the
median of barrier calls sampled between the rows (10 after each; with 4 ranks on 2 cores it drifts
2-10x within minutes, so a figure taken once before the sweep predicts another machine state; for a
measurement saved before that existed: calibrate's round, or for one older still the round and the
single-copy rate as the job measured them after its sweep, and windows priced as copies). The error is
(predicted - measured) / measured; the table ends with the median |error| of each part and of all
rows, and the worst rows. The "now" columns predict with the figures the job measured after its
sweep (``cluster_now``); ``--terms`` changes one figure at a time (``_terms``). Nothing is fitted
to the rows being predicted.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KiB, MiB = 1 << 10, 1 << 20
PRIMS = ("allreduce", "allgather", "alltoall")
LOCAL_SIZES = [64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB]
HOST_SIZES = [MiB, 4 * MiB, 16 * MiB, 64 * MiB]
COLUMNS = ("collective", "ranks", "size", "algorithm", "measured", "predicted", "error")


# --- measuring ---------------------------------------------------------------------------------

def _worker(a) -> None:
    """One rank of a measuring job: time the sweep with the bench's own code; rank 0 writes a JSON."""
    import numpy as np

    import pyxccl
    from pyxccl.bench import methodology as M
    from pyxccl.bench.runner import Case, call_pyxccl, time_case

    comm = pyxccl.init()
    prims, sizes = a.prims.split(","), [int(s) for s in a.sizes.split(",")]
    topo = comm.topology()
    hosts = len({t["host"] for t in topo})
    if hosts == 1:
        from pyxccl.sim import calibrate
        calibration = calibrate.measure(comm)
    else:
        calibration = None
    times: dict = {}
    algos: dict = {}
    rounds_seen: list = []      # the segment's round, sampled between the rows (one host)
    row_cals: dict = {}         # calibrate's figures right before each timing of a row (one host)
    for _ in range(a.rounds):
        for prim in prims:
            for nbytes in sizes:
                case = Case(prim, nbytes, "float32", comm.rank, comm.size, False)
                if calibration is not None:
                    row_cals.setdefault((prim, case.nbytes), []).append(calibrate.measure(comm))
                w, it = M.iters_for(case.nbytes)
                if a.iters_scale != 1:
                    it = max(3, round(it * a.iters_scale))
                ts, wrong = time_case(comm, case, lambda c: call_pyxccl(comm, c, "sum", None), it, w)
                if wrong:
                    raise SystemExit(f"{prim} {nbytes}: {wrong} wrong values")
                times.setdefault((prim, case.nbytes), []).extend(ts)
                algos[(prim, case.nbytes)] = comm.algorithm_for(prim, case.nbytes, np.float32)
                if calibration is not None:
                    rounds_seen += _rounds(comm, 10)
    if rounds_seen:
        seg = np.array([statistics.median(rounds_seen)])
        comm.allreduce(seg, "max")
        calibration["seg_sweep"] = float(seg[0])
    m = comm.link_figures()
    now = _figures_now(comm, hosts, sorted({s for _, s in times}))
    if comm.rank == 0:
        rows = [dict(prim=p, hosts=hosts, per_host=comm.size // hosts, size=s, algorithm=algos[(p, s)],
                     time=statistics.median(ts), min=min(ts), iters=len(ts),
                     **({"calibrations": row_cals[(p, s)]} if (p, s) in row_cals else {}))
                for (p, s), ts in times.items()]
        doc = dict(rows=rows, machine=m.to_json() if m is not None else None,
                   source=getattr(m, "source", ""), ranks=comm.size, hosts=hosts, now=now,
                   calibration=calibration)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    comm.close()


def _rounds(comm, reps: int) -> list[float]:
    """This rank's times of ``reps`` barrier calls on the segment (one before each)."""
    ts = []
    for _ in range(reps):
        comm.barrier(algorithm="segment")
        t = time.perf_counter()
        comm.barrier(algorithm="segment")
        ts.append(time.perf_counter() - t)
    return ts


def _figures_now(comm, hosts: int, sizes: list[int]) -> dict:
    """Collective: figures measured by the job itself, right after its sweep, as its ranks see them
    (all ranks at once, medians, not minima): the segment's round (a barrier call), numpy's copy and
    add rates at each size (bytes per array), and between hosts the sustained rate of a host's link
    with every rank of host 0 exchanging 16 MiB with its counterpart on host 1 at once."""
    import numpy as np

    from pyxccl.transport.copies import page_aligned

    def timed(fn, reps):
        ts = []
        for _ in range(reps):
            comm.barrier()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return ts

    out: dict = {"load": os.getloadavg()[0]}
    per_host = comm.size // hosts
    if hosts == 1:
        ts = np.array(_rounds(comm, 60))
        comm.allreduce(ts, "max")
        out["seg"] = [float(np.median(ts)), float(ts.min())]
    rates = {}
    for nb in sizes:
        a, b = page_aligned(max(1, nb // 4), 1), page_aligned(max(1, nb // 4), 1)
        reps = max(3, min(40, (32 << 20) // max(nb, 1)))
        tc = np.array([statistics.median(timed(lambda: np.copyto(a, b), reps))])
        ta = np.array([statistics.median(timed(lambda: np.add(a, b, out=a), reps))])
        comm.allreduce(tc, "max")
        comm.allreduce(ta, "max")
        rates[str(nb)] = [float(tc[0]) / a.nbytes, float(ta[0]) / a.nbytes]     # (copy, gamma) s/B
    out["rates"] = rates
    if hosts == 1:
        out["cma"] = _cma_rates(comm, sorted(set(sizes) | {s // comm.size for s in sizes}), timed)
    if hosts > 1:
        nb = 16 << 20
        buf, got = np.ones(nb // 4, np.float32), np.zeros(nb // 4, np.float32)
        peer = (comm.rank + per_host) % comm.size if comm.rank < 2 * per_host else None

        def swap():
            if peer is not None:
                w = comm.isend(buf, peer, 0x7FFE0001)
                comm.recv(got, peer, 0x7FFE0001)
                w.wait()
        ts = np.array(timed(swap, 4)[1:])
        comm.allreduce(ts, "max")
        out["tcp_sustained_beta"] = float(np.median(ts)) / (per_host * nb)    # s/B of one host's link
    return out


def _cma_rates(comm, sizes: list[int], timed) -> dict:
    """Seconds per byte of a single-copy read (process_vm_readv, as the engine's Gets of posted
    buffers) of ``nb`` bytes from the next rank's buffer, every rank reading at once; {} if the
    kernel refuses."""
    import numpy as np

    from pyxccl.transport import cma
    from pyxccl.transport.copies import page_aligned
    bufs = {nb: page_aligned(max(1, nb // 4), 1) for nb in sizes}
    peers = comm.allgather_object((os.getpid(), {nb: b.ctypes.data for nb, b in bufs.items()}))
    pid, addrs = peers[(comm.rank + 1) % comm.size]
    out = {}
    for nb in sizes:
        dst = page_aligned(len(bufs[nb]), 0)
        one = cma.reader(pid, dst.ctypes.data, addrs[nb], dst.nbytes)
        ok = [True]

        def read():
            if not one():
                ok[0] = False
        ts = np.array([statistics.median(timed(read, max(5, min(40, (32 << 20) // max(nb, 1)))))
                       if ok[0] else -1.0])
        comm.allreduce(ts, "max")
        good = np.array([1 if ok[0] else 0])
        comm.allreduce(good, "min")
        if not good[0]:
            return {}
        out[str(nb)] = float(ts[0]) / dst.nbytes
    comm.barrier()          # nobody frees a buffer another still reads
    return out


def _worker_argv(out: str, sizes, rounds: int, iters_scale: float) -> list[str]:
    return [str(Path(__file__).resolve()), "--worker", "--out", out, "--prims", ",".join(PRIMS),
            "--sizes", ",".join(map(str, sizes)), "--rounds", str(rounds), "--iters-scale", str(iters_scale)]


class OthersLoad:
    """The CPU time other processes took while a job ran, in cores: the machine's busy time
    (/proc/stat) less what this process's children used (getrusage), over the wall time."""

    def __enter__(self):
        import resource
        self.t, self.busy = time.time(), self._busy()
        self.mine = self._children(resource)
        return self

    def __exit__(self, *exc):
        import resource
        hz = os.sysconf("SC_CLK_TCK")
        busy = (self._busy() - self.busy) / hz
        mine = self._children(resource) - self.mine
        self.cores = max(0.0, busy - mine) / max(1e-9, time.time() - self.t)

    @staticmethod
    def _busy() -> int:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4]         # all but idle and iowait

    @staticmethod
    def _children(resource) -> float:
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime


def measure_local(ns=(2, 4), sizes=LOCAL_SIZES, rounds: int = 2) -> dict:
    """Local ranks on this host: one job per rank count."""
    from pyxccl.launcher import run
    rows, machines = [], {}
    for n in ns:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows.json")
            t, load = time.time(), os.getloadavg()[0]
            with OthersLoad() as others:
                rc = run(n, _worker_argv(out, sizes, rounds, 1.0))
            if rc:
                raise SystemExit(f"the local job of {n} ranks failed ({rc})")
            doc = json.load(open(out))
        print(f"# measured {n} local ranks in {time.time() - t:.0f} s (other processes took "
              f"{others.cores:.2f} cores meanwhile)", file=sys.stderr)
        rows += doc["rows"]
        machines[str(n)] = dict(machine=doc["machine"], source=doc["source"], now=doc.get("now"),
                                calibration=doc.get("calibration"),
                                load_before=load, others_cores=others.cores)
    return dict(rows=rows, machines=machines)


def measure_hosts(hosts_n: int = 2, per_host: int = 2, rate: str = "1gbit", sizes=HOST_SIZES,
                  rounds: int = 1, iters_scale: float = 1.0, timeout: float = 900) -> dict:
    """``hosts_n`` emulated hosts x ``per_host`` ranks, links shaped to ``rate`` (needs root)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from netns import EmulatedHosts, unavailable
    why = unavailable()
    if why:
        raise RuntimeError(why)
    port = 29800 + os.getpid() % 150
    with tempfile.TemporaryDirectory() as d, EmulatedHosts(hosts_n, rate=rate, subnet="10.83.0") as hosts:
        os.chmod(d, 0o777)
        out = os.path.join(d, "rows.json")
        argv = _worker_argv(out, sizes, rounds, iters_scale)
        code = ("import sys; from pyxccl.launcher import run; "
                "sys.exit(run(int(sys.argv[1]), sys.argv[6:], nnodes=int(sys.argv[2]), node_rank=int(sys.argv[3]), "
                "master_addr=sys.argv[4], master_port=int(sys.argv[5])))")
        t, load = time.time(), os.getloadavg()[0]
        others = OthersLoad().__enter__()
        procs = [hosts.popen(h, [sys.executable, "-c", code, str(per_host), str(hosts_n), str(h), hosts.addrs[0],
                                 str(port), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, PYXCCL_LINKS=os.path.join(d, "links.json")))
                 for h in range(hosts_n)]     # (figures of emulated hosts stay out of the user's link file)
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            if p.returncode:
                raise RuntimeError(f"a host's job failed ({p.returncode}):\n{text[-3000:]}")
        others.__exit__(None, None, None)
        doc = json.load(open(out))
    print(f"# measured {hosts_n} x {per_host} emulated hosts in {time.time() - t:.0f} s (other processes took "
          f"{others.cores:.2f} cores meanwhile)", file=sys.stderr)
    return dict(rows=doc["rows"], machines={"hosts": dict(machine=doc["machine"], source=doc["source"],
                                                          now=doc.get("now"), load_before=load,
                                                          others_cores=others.cores)},
                rate=rate)


# --- predicting --------------------------------------------------------------------------------

def calibration_of(job: dict) -> dict | None:
    """What ``pyxccl.sim.calibrate.measure`` found in the job (before its sweep); for measurements saved
    before the job ran it, the same two figures from what the job measured after its sweep."""
    if job.get("calibration") or not job.get("now", {}).get("seg"):
        return job.get("calibration")
    now = job["now"]
    cma = now.get("cma", {})
    fit = None
    if "65536" in cma and "1048576" in cma:
        t0, t1 = cma["65536"] * 65536, cma["1048576"] * 1048576
        beta = max(0.0, (t1 - t0) / (1048576 - 65536))
        fit = [max(0.0, t0 - beta * 65536), beta]
    return {"seg": now["seg"][0], "cma": fit}


def cluster_for(row: dict, machine: dict | None, calibration: dict | None = None):
    """The simulator's cluster for a measured row: ``Cluster.measured`` with the figures the job used
    (its tuner's, and those ``pyxccl.sim.calibrate`` measured in it)."""
    from dataclasses import replace

    from pyxccl.sim import Cluster, Link
    links = {k: Link(*v) for k, v in (machine or {}).get("links", {}).items()}
    h, l = row["hosts"], row["per_host"]
    c = Cluster.measured(h, l, inter=links.get("tcp"), calibration=calibration)
    if machine:
        seg = links.get("seg") or links.get(f"seg:{l}")     # the job's own segment round
        if calibration and h == 1:
            # the round as sampled between the rows, when the job did; else as calibrate found it before
            seg = Link(calibration.get("seg_sweep") or calibration["seg"], 0.0)
        c = replace(c, intra=links.get("shm", c.intra), gamma=machine["gamma"], copy=machine["copy"],
                    cores=machine.get("cores") or c.cores, seg=seg if seg or h > 1 else c.seg,
                    mem=machine.get("mem") or c.mem, cache=machine.get("cache") or c.cache,
                    source="the measuring job's figures")
    return c


def cluster_now(row: dict, machine: dict | None, now: dict | None):
    """The same cluster with the figures the job measured right after its sweep (``_figures_now``),
    medians under the run's own conditions: the segment's round as a call sees it, numpy's copy and
    add rates at the row's size with every rank copying at once (from 16 MiB on they are the
    memory's: no memory term on top), for schedules that read the peers' buffers in place the
    single-copy read rate at the block's size, and between hosts the sustained rate of a host's
    link. The stretch of ranks over cores stays (ranks taking turns on a core copy one at a time).
    None when the measurement has none of them."""
    from dataclasses import replace

    from pyxccl.sim import Link
    if not now or str(row["size"]) not in now.get("rates", {}):
        return None
    c = cluster_for(row, machine)
    copy, gamma = now["rates"][str(row["size"])]
    reads = _single_copy_block(row, c)
    cma = now.get("cma", {})
    if reads and str(reads) in cma and str(reads) in now["rates"]:
        # the peers' blocks come by process_vm_readv, the own block by a copy (segment.py, _native.c)
        n = row["per_host"]
        copy = ((n - 1) * cma[str(reads)] + now["rates"][str(reads)][0]) / n
    # rates at the row's size already include the memory's (from 16 MiB on): no memory term on top
    c = replace(c, copy=copy, gamma=gamma, mem=0.0, mem_at=(), source="figures measured after the sweep")
    if now.get("seg"):
        c = replace(c, seg=Link(now["seg"][0], 0.0))
    if now.get("tcp_sustained_beta") and row["hosts"] > 1:
        c = replace(c, inter=Link(c.inter.alpha, now["tcp_sustained_beta"]))
    return c


def _single_copy_block(row: dict, c) -> int:
    """Bytes of the blocks a row's schedule reads from the peers' own buffers (single-copy ``Get``s of
    a ``Post``ed buffer), or 0 when it moves everything through the segment's windows."""
    import numpy as np

    from pyxccl.algorithms import registry
    from pyxccl.algorithms.segment import Window
    from pyxccl.primitives import PRIMITIVES
    from pyxccl.schedule import Post
    if c.hosts != 1:
        return 0
    algo = registry.lookup(row["prim"], row["algorithm"])
    if not getattr(algo, "segment", False):
        return 0
    n, item = c.nranks, np.dtype(np.float32).itemsize
    args = PRIMITIVES[row["prim"]].sized(n, row["size"], item)
    s = algo.schedule(0, n, hosts=c.host_list(), window=Window.of(c.segment_bytes, item, c.single_copy), **args)
    if not any(type(o) is Post for step in s.steps for o in step):
        return 0
    return row["size"] // n


def _job(doc: dict, part: str, row: dict) -> dict:
    ms = doc[part]["machines"]
    return (ms.get("hosts") if part == "hosts" else ms.get(str(row["per_host"]))) or {}


def machine_for(doc: dict, part: str, row: dict) -> dict | None:
    return _job(doc, part, row).get("machine")


def predict(doc: dict) -> list[dict]:
    """Every measured row of ``doc`` (what measure_* saved) with the simulator's time for it:
    ``predicted`` with the figures the job's tuner used, ``now`` (or None) with those the job
    measured after its sweep (``cluster_now``)."""
    out = []
    for part in ("local", "hosts"):
        if part not in doc:
            continue
        for row in doc[part]["rows"]:
            job = _job(doc, part, row)
            pred = _predicted(row, job)
            c = cluster_now(row, job.get("machine"), job.get("now"))
            now = _sim(c, row) if c is not None else None
            out.append(dict(row, part=part, others=job.get("others_cores"), predicted=pred,
                            error=(pred - row["time"]) / row["time"],
                            now=now, now_error=None if now is None else (now - row["time"]) / row["time"]))
    return out


def _sim(c, row: dict) -> float:
    """The simulator's time for a measured row on cluster ``c`` (the algorithm that ran, out of place)."""
    import pyxccl.sim
    return pyxccl.sim.run(row["prim"], row["size"], c, [row["algorithm"]], inplace=False)[0].time


def _predicted(row: dict, job: dict, change=None) -> float:
    """The row's time under the model (``change(cluster)``: with one figure changed, ``_terms``): with
    the figures calibrate measured right before each of the row's timings where the job took them (the
    median of those predictions, as the row's time is the median of its timings), else with those it
    measured once before the sweep."""
    cals = row.get("calibrations") or [calibration_of(job)]
    return statistics.median(_sim((change or (lambda c: c))(cluster_for(row, job.get("machine"), cal)), row)
                             for cal in cals)


def _host_buffers(row: dict) -> int:
    """Bytes of the call's buffers (input and output) on all ranks of a host."""
    from pyxccl.primitives import PRIMITIVES
    prim = PRIMITIVES[row["prim"]]
    nin, nout = prim.buffers(0, prim.sized(row["hosts"] * row["per_host"], row["size"], 4))
    return (nin + nout) * 4 * row["per_host"]


def _terms():
    """One change at a time to the figures the prediction uses, each a figure measured on this machine
    (by the job after its sweep), to see which term of the model the errors come from."""
    from dataclasses import replace

    from pyxccl.sim import Link

    def seg(c, row, now):
        return replace(c, seg=Link(now["seg"][0], 0.0)) if now.get("seg") and row["hosts"] == 1 else None

    def memory(c, row, now):
        return replace(c, cache=1, mem_at=()) if c.mem and _host_buffers(row) > c.cache else c

    def memory_probe(c, row, now):
        return replace(c, mem_at=()) if c.mem_at else None

    def tcp(c, row, now):
        return replace(c, inter=Link(c.inter.alpha, now["tcp_sustained_beta"])) \
            if now.get("tcp_sustained_beta") and row["hosts"] > 1 else None

    def cpu(c, row, now):
        if str(row["size"]) not in now.get("rates", {}):
            return None
        copy, gamma = now["rates"][str(row["size"])]
        return replace(c, copy=copy, gamma=gamma, mem=0.0, mem_at=())

    def windows(c, row, now):
        return replace(c, peer=(), win_write=()) if c.peer or c.win_write else None

    def reductions(c, row, now):
        return replace(c, red=()) if c.red else None

    def streamed(c, row, now):
        return replace(c, mem_nt_at=()) if c.mem_nt_at else None

    def seg_before(c, row, now):
        cal = now.get("_calibration") or {}
        return replace(c, seg=Link(cal["seg"], 0.0)) if cal.get("seg_sweep") and row["hosts"] == 1 else None

    def both(*fs):
        def f(c, row, now):
            for g in fs:
                c = g(c, row, now) or c
            return c
        return f
    return [
        ("windows as copies: without the calibrated reads of a peer's window and writes of one's own", windows),
        ("reductions at the probe's figure (gamma), not calibrate's reductions at their size", reductions),
        ("copies into buffers past the cache at the plain copies' rate, not the non-temporal ones'", streamed),
        ("segment round: median of barrier calls now, not the probe's fastest batch", seg),
        ("segment round: as calibrate found it before the sweep, not sampled between the rows", seg_before),
        ("memory: the probe's figure beyond the LLC, not calibrate's copies at the call's size", memory_probe),
        ("memory: all bytes from memory once the host's buffers exceed the LLC (cache=1), not a share", memory),
        ("between hosts: the sustained rate of a host link, every rank sending both ways", tcp),
        ("copies and reductions: numpy's rates at the row's size, all ranks at once", cpu),
        ("segment round + memory", both(seg, memory)),
        ("segment round + memory + between hosts", both(seg, memory, tcp)),
    ]


def terms(doc: dict, file=None) -> None:
    """Median |error| per part when one figure is changed (``_terms``): which term is off."""
    file = file or sys.stdout
    print("\n# which term: median |error| with one figure changed (each measured by the job after its sweep)",
          file=file)
    print(f"{'change':<100}{'local':>8}{'hosts':>8}{'all':>8}", file=file)
    for label, f in [("none (the tuner's figures and the job's calibration, as above)", lambda c, row, now: c)] + _terms():
        errs = {"local": [], "hosts": []}
        for part in errs:
            for row in doc.get(part, {}).get("rows", []):
                job = _job(doc, part, row)
                now = dict(job.get("now") or {}, _calibration=calibration_of(job))
                t = _predicted(row, job, lambda c: f(c, row, now) or c)
                errs[part].append(abs(t - row["time"]) / row["time"])
        cols = [statistics.median(e) if e else None for e in (errs["local"], errs["hosts"],
                                                             errs["local"] + errs["hosts"])]
        print(f"{label:<100}" + "".join(f"{v * 100:>7.1f}%" if v is not None else f"{'-':>8}" for v in cols),
              file=file)


# --- reporting ---------------------------------------------------------------------------------

def _size(n: int) -> str:
    for unit, k in (("M", MiB), ("K", KiB)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def _ms(t: float) -> str:
    return f"{t * 1e3:.3f}" if t < 0.01 else f"{t * 1e3:.1f}"


def _pct(e) -> str:
    return f"{e * 100:>+9.1f}" if e is not None else f"{'-':>9}"


def _median_abs(rows, key) -> float | None:
    es = [abs(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(es) if es else None


def report(rows: list[dict], file=None, worst: int = 5) -> dict:
    """Print a table per part, the median |error| per part and overall, the worst rows; return the
    medians ({"local": ..., "hosts": ..., "overall": ...}, and the same with "now " before each key
    for the predictions with the figures measured after the sweep)."""
    file = file or sys.stdout
    medians = {}
    now_any = any(r.get("now") is not None for r in rows)
    for part in ("local", "hosts"):
        rs = [r for r in rows if r["part"] == part]
        if not rs:
            continue
        title = "local ranks (shared memory)" if part == "local" else "emulated hosts (shaped TCP links)"
        print(f"# {title}", file=file)
        others = {(r["hosts"], r["per_host"]): r["others"] for r in rs if r.get("others") is not None}
        if others:
            print("# other processes took " + ", ".join(
                f"{v:.2f} cores during the {h}x{l} job" if h > 1 else f"{v:.2f} cores during the {l}-rank job"
                for (h, l), v in others.items()) + f" (of {os.cpu_count()})", file=file)
        print(f"{'collective':<11}{'ranks':>7}{'size':>6}  {'algorithm':<14}{'measured ms':>12}"
              f"{'predicted ms':>13}{'error %':>9}" + (f"{'now ms':>10}{'error %':>9}" if now_any else ""), file=file)
        for r in rs:
            ranks = f"{r['per_host']}" if r["hosts"] == 1 else f"{r['hosts']}x{r['per_host']}"
            line = (f"{r['prim']:<11}{ranks:>7}{_size(r['size']):>6}  {r['algorithm']:<14}{_ms(r['time']):>12}"
                    f"{_ms(r['predicted']):>13}{_pct(r['error'])}")
            if now_any:
                line += ((f"{_ms(r['now']):>10}" if r.get("now") is not None else f"{'-':>10}")
                         + _pct(r.get("now_error")))
            print(line, file=file)
        medians[part] = _median_abs(rs, "error")
        text = f"# median |error| ({part}): {medians[part] * 100:.1f}%"
        if now_any and _median_abs(rs, "now_error") is not None:
            medians["now " + part] = _median_abs(rs, "now_error")
            text += f"; with the figures measured after the sweep (now): {medians['now ' + part] * 100:.1f}%"
        print(text + f" ({len(rs)} rows)\n", file=file)
    if rows:
        medians["overall"] = _median_abs(rows, "error")
        text = f"# median |error| (overall): {medians['overall'] * 100:.1f}%"
        if now_any and _median_abs(rows, "now_error") is not None:
            medians["now overall"] = _median_abs(rows, "now_error")
            text += f"; now: {medians['now overall'] * 100:.1f}%"
        print(text + f" ({len(rows)} rows)", file=file)
        bad = sorted(rows, key=lambda r: -abs(r["error"]))[:worst]
        print("# worst: " + "; ".join(
            f"{r['prim']} {r['hosts']}x{r['per_host']} {_size(r['size'])} {r['algorithm']} {r['error'] * 100:+.0f}%"
            for r in bad), file=file)
    return medians


# --- published nccl-tests measurements (issue 27) -----------------------------------------------------

def published(fit: bool = False, json_path: str | None = None, file=None, net_latency: bool = False) -> dict:
    """Print the published-measurement comparison; return {"rows", "summary", "fitted"} (as written to JSON).
    ``net_latency``: price the NET plugin latencies the sources name (off by default, pyxccl.sim.published)."""
    from pyxccl.sim import fitted as F
    from pyxccl.sim import published as P
    file = file or sys.stdout
    P.PRICE_NET_LATENCY = net_latency
    points = P.load()
    cal = P.fit(P.calibration_points(points)) if fit else F.FITTED
    before, after = P.evaluate(points), P.evaluate(points, cal)
    print(f"{'id':>4} {'part':<5}{'source':<14}{'machine':<9}{'nodes':>6} {'collective':<14}{'size':>7}"
          f"{'measured us':>13}" + "".join(f"{m + ' us':>12}{'err %':>8}{'cal us':>11}{'err %':>8}  {m + ' choice':<18}"
                                           for m in P.MODELS), file=file)
    for b, a in zip(before, after):
        p = b.point
        tag = (p.part[:3] + ("*" if p.suspect else "")).ljust(5)
        head = (f"{p.id:>4} {tag}{p.source_id[:13]:<14}{p.preset:<9}{f'{p.nodes}x{p.per_node}':>6} "
                f"{p.collective:<14}{_size(p.size):>7}{p.time * 1e6:>13.1f}")
        if b.left_out:
            print(head + f"  left out: {b.note}", file=file)
            continue
        print(head + "".join(f"{b.pred[m] * 1e6:>12.1f}{b.error[m] * 100:>+8.1f}{a.pred[m] * 1e6:>11.1f}"
                             f"{a.error[m] * 100:>+8.1f}  {a.choice[m][:18]:<18}" for m in P.MODELS), file=file)
    print("# part* : suspect (docs/sim-data.md), kept out of the medians; err: (predicted - measured) / measured; "
          "cal: with the fitted parameters", file=file)
    sb, sa = P.summarize(before), P.summarize(after)
    print(f"\n{'part':<10}{'points':<9}{'model':<8}{'n':>4}{'median before':>15}{'worst before':>14}"
          f"{'median after':>14}{'worst after':>13}", file=file)
    for key in sb:
        x, y = sb[key], sa[key]
        if x["count"]:
            print(f"{key[0]:<10}{key[2]:<9}{key[1]:<8}{x['count']:>4}{x['median'] * 100:>14.1f}%"
                  f"{x['worst'] * 100:>13.0f}%{y['median'] * 100:>13.1f}%{y['worst'] * 100:>12.0f}%", file=file)
    print("\n# per source (clean points, after calibration): median / worst |error|", file=file)
    for src in sorted({r.point.source_id for r in after}):
        rs = [r for r in after if r.point.source_id == src and not r.left_out and not r.point.suspect]
        if rs:
            print(f"{src:<32}{rs[0].point.part:<10}{len(rs):>4}  " + "  ".join(
                f"{m} {statistics.median(abs(r.error[m]) for r in rs) * 100:5.1f}% / "
                f"{max(abs(r.error[m]) for r in rs) * 100:4.0f}%" for m in P.MODELS), file=file)
    left = sorted({(r.point.source_id, r.note) for r in before if r.left_out})
    for src, why in left:
        print(f"# left out: {src}: {why}", file=file)
    if fit:
        print("\n# fitted now (paste into pyxccl/sim/fitted.py FITTED):", file=file)
        for k, v in cal.items():
            print(f"    {k!r}: Params(intra_eff={v.intra_eff:.4f}, inter_eff={v.inter_eff:.4f}, "
                  f"base_lat={v.base_lat:.4g}, launch_lat={v.launch_lat:.4g}"
                  + (f", net_step_lat={v.net_step_lat:.4g}" if v.net_step_lat else "") + "),", file=file)
    doc = {"rows": [dict(r.to_json(), calibrated=dict(predicted=a.pred, error=a.error, choice=a.choice))
                    for r, a in zip(before, after)],
           "summary": [dict(part=k[0], model=k[1], points=k[2], before=sb[k], after=sa[k]) for k in sb],
           "fitted": [dict(model=k[0], preset=k[1], **vars(v)) for k, v in cal.items()]}
    if json_path:
        _save(doc, json_path)
    return doc


def cross_validated(file=None) -> dict:
    """Print and return {form: {model: (points, median, worst)}}: each calibrate source predicted by the
    fit on the other calibrate sources, in each of the fit's forms (``pyxccl.sim.published.cross_validate``),
    and per source for the form FITTED has."""
    from pyxccl.sim import published as P
    file = file or sys.stdout
    by_form = P.cross_validate(P.load())
    out = {}
    print(f"# leave one calibrate source out: each predicted by the fit on the others (validation points unused)\n"
          f"{'form':<26}{'model':<8}{'n':>5}{'median':>9}{'worst':>8}", file=file)
    for name, rows in by_form.items():
        for m in P.MODELS:
            errs = [abs(r.error[m]) for r in rows if not r.left_out]
            out.setdefault(name, {})[m] = (len(errs), statistics.median(errs), max(errs))
            print(f"{name:<26}{m:<8}{len(errs):>5}{statistics.median(errs) * 100:>8.1f}%{max(errs) * 100:>7.0f}%",
                  file=file)
    kept = next(iter(P.FIT_FORMS))
    print(f"\n# per source, form {kept!r}: median |error| left out", file=file)
    for src in sorted({r.point.source_id for r in by_form[kept]}):
        rs = [r for r in by_form[kept] if r.point.source_id == src and not r.left_out]
        print(f"{src:<32}{len(rs):>4}  " + "  ".join(
            f"{m} {statistics.median(abs(r.error[m]) for r in rs) * 100:5.1f}%" for m in P.MODELS), file=file)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("local", "hosts", "all"), default="all", help="what to measure")
    ap.add_argument("--save", default=None, help="write the measurement to this JSON file")
    ap.add_argument("--load", default=None, help="predict this saved measurement (measure nothing)")
    ap.add_argument("--no-predict", dest="predict", action="store_false", help="measure only")
    ap.add_argument("--terms", action="store_true", help="also: the median errors with one measured figure "
                    "changed at a time (which term of the model is off)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="sweeps per job (a row: the median of all its timed iterations)")
    ap.add_argument("--rate", default="1gbit", help="hosts part: tc rate of each host's link")
    ap.add_argument("--host-sizes", default=",".join(map(str, HOST_SIZES)))
    ap.add_argument("--worst", type=int, default=5)
    ap.add_argument("--published", action="store_true",
                    help="compare with published nccl-tests measurements (measures nothing)")
    ap.add_argument("--fit", action="store_true", help="with --published: fit on the calibrate part now")
    ap.add_argument("--json", default=None, help="with --published: write the rows and summaries here")
    ap.add_argument("--net-latency", action="store_true",
                    help="with --published: price the NET plugin latencies the sources name (S12: 150 us)")
    ap.add_argument("--cross-validate", action="store_true",
                    help="with --published: the fit's forms judged by leaving each calibrate source out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--prims", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--iters-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        _worker(a)
        return 0
    if a.published:
        if a.cross_validate:
            cross_validated()
        else:
            published(a.fit, a.json, net_latency=a.net_latency)
        return 0
    if a.load:
        with open(a.load) as f:
            doc = json.load(f)
    else:
        doc = dict(measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), host=os.uname().nodename)
        if a.part in ("local", "all"):
            doc["local"] = measure_local(rounds=a.rounds)
            _save(doc, a.save)
        if a.part in ("hosts", "all"):
            try:
                doc["hosts"] = measure_hosts(rate=a.rate, rounds=a.rounds,
                                             sizes=[int(s) for s in a.host_sizes.split(",")])
            except RuntimeError as e:
                print(f"# hosts part skipped: {e}", file=sys.stderr)
            _save(doc, a.save)
    if a.predict:
        report(predict(doc), worst=a.worst)
        if a.terms:
            terms(doc)
    return 0


def _save(doc: dict, path: str | None) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
