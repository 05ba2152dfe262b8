"""How pyxccl's start-up, first calls and per-process resources grow with the ranks, beside MPICH's.

    python benchmarks/scale.py                                   # n = 2..64, pyxccl (auto) vs MPICH
    python benchmarks/scale.py --ranks 2,4,8,16,32,64,128 --transport shm,tcp --json out.json
    python benchmarks/scale.py --ranks '' --emulated 8x8         # 8 emulated hosts x 8 ranks only (root)

Per n, every library runs issue 26's job once per round, alternating (pyxccl with each
--transport, then MPICH), each in its own process tree with a deadline (a hang fails its row):
init, one 8 B allreduce, one 1 MiB allreduce, --calls (20) more 8 B allreduces. pyxccl starts under
its own launcher (`pyxccl run -n N`), MPICH under the mpiexec of the `pyxccl[peers]` extra, as
`pyxccl bench --vs mpi` starts it. Each rank is benchmarks/scale_rank.py (public API only).

Columns (times are the slowest rank's, so a straggler counts):
  start->init  process start (/proc, 10 ms resolution) to init returned
  init         the init call alone (pyxccl.init / MPI_Init)
  1st 8B       from the last rank's init returned to the last rank's first 8 B allreduce returned
  1st 1MiB     likewise from the last rank's 8 B call to the last rank's 1 MiB call
  8B steady    median over the --calls 8 B calls of the per-call maximum over ranks
  job          first process start to the last rank's last call (in the ranks)
  wall         the launcher's whole run, as a user waits for it (start-up and teardown included)
  threads, fds, RSS  per process after the calls: max / median over ranks
A --model table follows: a + b*(n-1) fitted per library (benchmarks/scale_model.py).

--emulated HxL runs the same job on H emulated hosts (network namespaces, tests/netns.py) of L ranks
each: pyxccl as one `pyxccl run --nnodes H` per host; MPICH as one mpiexec on host 0 whose hydra
starts its proxies on the others through emuhost_rsh.sh (its remote shell). Each library picks its
own transports (pyxccl: shared memory inside a host, TCP between hosts; MPICH: its defaults).

pyxccl's link figures are cached once, before the first row, in a file of this run
(PYXCCL_LINKS), so every init reads a warm cache as a user's second job does; and pyxccl's sources
are compiled to bytecode first (as pip does for a wheel, `make bytecode` for a checkout), unless
--no-compile: otherwise, under PYTHONDONTWRITEBYTECODE, every rank compiles pyxccl at import.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "scale_rank.py"
sys.path.insert(0, str(HERE))
import scale_model  # noqa: E402

#: What the ranks of a launched job must not inherit from a launcher around this one.
_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
           "GROUP_WORLD_SIZE")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCH and not k.startswith(("PMI_", "OMPI_", "SLURM_", "HYDRA_"))}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _kill(proc: subprocess.Popen, out: str) -> None:
    """End a job that overran: its launcher's group, then every rank that wrote its pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    for f in glob.glob(os.path.join(out, "pid.*")):
        try:
            os.kill(int(f.rsplit(".", 1)[1]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def run_job(cmd: list[str], env: dict, out: str, timeout: float) -> tuple[int | None, float, str]:
    """(exit code or None on timeout, wall seconds, the output's tail) of one job in its own session."""
    log = os.path.join(out, "log.txt")
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            _kill(p, out)
    wall = time.perf_counter() - t0
    with open(log, errors="replace") as f:
        return code, wall, f.read()[-2000:]


def mpiexec() -> list[str] | None:
    """MPICH's mpiexec as `pyxccl bench --vs mpi` finds it (pyxccl.bench.installs), or None."""
    from pyxccl.bench import installs
    if installs.missing("mpi"):
        return None
    exe = installs.mpich_mpiexec()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return [exe, "--oversubscribe", "--allow-run-as-root"] if "Open MPI" in version else [exe]


def command(lib: str, n: int, out: str, calls: int) -> list[str]:
    rank = [str(RANK), lib, out, str(calls)]
    if lib == "pyxccl":
        return [sys.executable, "-m", "pyxccl", "run", "-n", str(n), *rank]
    return [*mpiexec(), "-n", str(n), sys.executable, *rank]


def summarize(label: str, n: int, out: str, code, wall: float, tail: str) -> dict:
    """One table row from the ranks' files; ok=False (with why) unless every rank reported, right."""
    recs = []
    for f in glob.glob(os.path.join(out, "rank*.json")):
        with open(f) as fh:
            recs.append(json.load(fh))
    row = dict(label=label, n=n, wall_s=wall, code=code, ok=False)
    if len(recs) != n or code != 0:
        why = "timed out" if code is None else f"exit code {code}"
        row["why"] = f"{why}, {len(recs)} of {n} ranks reported; output ends: {tail[-600:]!r}"
        return row
    T = {k: [r["times"][k] for r in recs] for k in recs[0]["times"]}
    steady = [max(r["steady"][i] for r in recs) for i in range(len(recs[0]["steady"]))]
    med = statistics.median
    row.update(
        ok=sum(r["wrong"] for r in recs) == 0, wrong=sum(r["wrong"] for r in recs),
        start_init_s=max(b - a for a, b in zip(T["start"], T["init1"])),
        init_s=max(b - a for a, b in zip(T["init0"], T["init1"])),
        first8_s=max(T["first8"]) - max(T["init1"]), first1m_s=max(T["first1m"]) - max(T["first8"]),
        steady8_s=med(steady) if steady else float("nan"), job_s=max(T["calls"]) - min(T["start"]),
        hosts=len({r["host"] for r in recs}))
    for key in ("threads", "fds", "sockets", "rss_mib"):
        vals = [r[key] for r in recs]
        row[key], row[key + "_med"] = max(vals), med(vals)
    if not row["ok"]:
        row["why"] = f"{row['wrong']} wrong elements"
    return row


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}"


def table(rows: list[dict]) -> str:
    head = ["n", "library", "start->init ms", "init ms", "1st 8B ms", "1st 1MiB ms", "8B steady us", "job ms",
            "wall ms", "threads max/med", "fds max/med (sockets)", "RSS MiB max/med"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['n']} | {r['label']} | FAILED: {r['why'][:300]} |" + " |" * (len(head) - 3))
            continue
        lines.append(" | ".join([
            f"| {r['n']}", r["label"], _ms(r["start_init_s"]), _ms(r["init_s"]), _ms(r["first8_s"]),
            _ms(r["first1m_s"]), f"{r['steady8_s'] * 1e6:,.1f}", _ms(r["job_s"]), _ms(r["wall_s"]),
            f"{r['threads']}/{r['threads_med']:g}", f"{r['fds']}/{r['fds_med']:g} ({r['sockets']})",
            f"{r['rss_mib']:.1f}/{r['rss_mib_med']:.1f}"]) + " |")
    return "\n".join(lines)


def compile_pyxccl() -> None:
    """Bytecode for the pyxccl the ranks import (this process's: the same PYTHONPATH)."""
    import pyxccl
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(pyxccl.__file__)], check=True,
                   stdout=subprocess.DEVNULL)


def warm_links(links: str, timeout: float) -> None:
    """Measure this host's links once into ``links`` (a 2-rank job), so no measured init does it."""
    with tempfile.TemporaryDirectory() as out:
        code, _, tail = run_job(command("pyxccl", 2, out, 1), _env(PYXCCL_LINKS=links), out, timeout)
    if code != 0:
        raise SystemExit(f"scale.py: the warm-up job failed (exit {code}): {tail}")


# --- emulated hosts -----------------------------------------------------------------------------------

def _emulated_job(hosts, lib: str, hosts_n: int, per_host: int, calls: int, env: dict, timeout: float) -> dict:
    """One job of ``lib`` on the emulated ``hosts``: pyxccl as one `pyxccl run --nnodes` per host, MPICH
    as one mpiexec on host 0 that starts its proxies on the others through emuhost_rsh.sh."""
    import netns
    n, port = hosts_n * per_host, 29650
    label = f"{'pyxccl' if lib == 'pyxccl' else 'MPICH'} {hosts_n}x{per_host} hosts"
    with tempfile.TemporaryDirectory() as out:
        os.chmod(out, 0o777)
        rank = [str(RANK), lib, out, str(calls)]
        if lib == "pyxccl":
            argvs = [[sys.executable, "-m", "pyxccl", "run", "--nnodes", str(hosts_n), "--node-rank", str(i),
                      "--nproc-per-node", str(per_host), "--master-addr", hosts.addrs[0], "--master-port",
                      str(port), *rank] for i in range(hosts_n)]
        else:
            env = dict(env, EMU_ROOT_MNT=f"/proc/{os.getpid()}/ns/mnt", EMU_INHOST=str(netns.NETNS_DIR / "inhost.sh"))
            argvs = [[*mpiexec(), "-launcher", "rsh", "-launcher-exec", str(HERE / "emuhost_rsh.sh"), "-hosts",
                      ",".join(hosts.names[:hosts_n]), "-n", str(n), "-ppn", str(per_host), sys.executable, *rank]]
        procs = []
        t0 = time.perf_counter()
        for i, argv in enumerate(argvs):
            f = open(os.path.join(out, f"host{i}.log"), "wb")
            procs.append((hosts.popen(i, argv, env=env, stdout=f, stderr=subprocess.STDOUT), f))
        codes = []
        for p, f in procs:
            try:
                codes.append(p.wait(timeout=max(0.1, t0 + timeout - time.perf_counter())))
            except subprocess.TimeoutExpired:
                codes.append(None)
            f.close()
        wall = time.perf_counter() - t0
        if None in codes:
            hosts.kill_all()
        bad = next((c for c in codes if c != 0), 0)
        tail = ""
        if bad != 0:
            i = codes.index(bad)
            with open(os.path.join(out, f"host{i}.log"), errors="replace") as fh:
                tail = f"host {i}: " + fh.read()[-1500:]
        row = summarize(label, n, out, bad, wall, tail)
    row["emulated"] = f"{hosts_n}x{per_host}"
    return row


def run_emulated(hosts_n: int, per_host: int, libs: list[str], rounds: int, calls: int, links: str,
                 timeout: float) -> list[dict]:
    """The job of each of ``libs`` on ``hosts_n`` emulated hosts (tests/netns.py) of ``per_host`` ranks
    each, alternating for ``rounds``; the hosts are removed afterwards, even on failure."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import netns
    why = netns.unavailable()
    if why:
        raise SystemExit(f"scale.py --emulated: {why}")
    rows = []
    with netns.EmulatedHosts(hosts_n) as hosts:
        for rnd in range(rounds):
            for lib in libs:
                row = _emulated_job(hosts, lib, hosts_n, per_host, calls, _env(PYXCCL_LINKS=links), timeout)
                row["round"] = rnd
                rows.append(row)
                print(f"# emulated {hosts_n}x{per_host} {row['label']} round {rnd}: "
                      f"{'ok' if row['ok'] else 'FAILED ' + row['why'][:300]}", file=sys.stderr, flush=True)
    return rows


# --- main ---------------------------------------------------------------------------------------------

def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4,8,16,32,64", help="comma list of n (default 2..64; add 128 for the long run)")
    ap.add_argument("--transport", default="auto",
                    help="pyxccl's transport(s), comma list of tcp, shm, auto; each is a column of its own")
    ap.add_argument("--libs", default="pyxccl,mpi", help="pyxccl and/or mpi (MPICH via mpi4py)")
    ap.add_argument("--rounds", type=int, default=1, help="jobs per n and library, alternated (rows: the last)")
    ap.add_argument("--calls", type=int, default=20, help="steady 8 B calls after the first two")
    ap.add_argument("--timeout", type=float, default=None, help="deadline of one job, s (default 60 + 3 s per rank)")
    ap.add_argument("--emulated", metavar="HOSTSxRANKS",
                    help="also run the job across emulated hosts, e.g. 8x8 (root; network namespaces)")
    ap.add_argument("--no-compile", action="store_true", help="do not compile pyxccl to bytecode first")
    ap.add_argument("--fit-from", type=int, default=4, help="fit the model on rows with n >= this")
    ap.add_argument("--json", help="write every row (all rounds) to this file")
    a = ap.parse_args(argv)
    a.ranks = [int(x) for x in a.ranks.split(",") if x]
    a.transport = [x.strip() for x in a.transport.split(",") if x.strip()]
    a.libs = [x.strip() for x in a.libs.split(",") if x.strip()]
    if bad := [t for t in a.transport if t not in ("tcp", "shm", "auto")]:
        ap.error(f"--transport takes tcp, shm, auto, not {bad}")
    if bad := [x for x in a.libs if x not in ("pyxccl", "mpi")]:
        ap.error(f"--libs takes pyxccl, mpi, not {bad}")
    if a.emulated:
        try:
            a.hosts, a.per_host = (int(x) for x in a.emulated.lower().split("x"))
        except ValueError:
            ap.error(f"--emulated takes HOSTSxRANKS (e.g. 8x8), not {a.emulated!r}")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if "mpi" in a.libs and mpiexec() is None:
        print("# mpi: skipped: MPICH/mpi4py missing (pip install 'pyxccl[peers]')", file=sys.stderr)
        a.libs.remove("mpi")
    columns = [(f"pyxccl {t}", "pyxccl", {"PYXCCL_TRANSPORT": t}) for t in a.transport] if "pyxccl" in a.libs else []
    if "mpi" in a.libs:
        columns.append(("MPICH", "mpi", {}))
    rows, last = [], {}
    with tempfile.TemporaryDirectory() as work:
        links = os.path.join(work, "links.json")
        if "pyxccl" in a.libs or a.emulated:
            if not a.no_compile:
                compile_pyxccl()
            warm_links(links, 120)
        for n in a.ranks:
            timeout = a.timeout or 60 + 3 * n
            for rnd in range(a.rounds):
                for label, lib, extra in columns:
                    out = tempfile.mkdtemp(dir=work)
                    env = _env(PYXCCL_LINKS=links, **extra)
                    code, wall, tail = run_job(command(lib, n, out, a.calls), env, out, timeout)
                    row = summarize(label, n, out, code, wall, tail)
                    row["round"] = rnd
                    rows.append(row)
                    last[(n, label)] = row
                    state = "ok" if row["ok"] else "FAILED " + row["why"][:200]
                    print(f"# n={n} {label} round {rnd}: {state} ({wall:.1f} s)", file=sys.stderr, flush=True)
        if a.emulated:
            h, l = a.hosts, a.per_host
            for row in run_emulated(h, l, a.libs, a.rounds, a.calls, links, a.timeout or 120 + 3 * h * l):
                rows.append(row)
                last[(h * l, row["label"])] = row
    shown = list(last.values())
    print(table(shown))
    fit_rows = [r for r in shown if not r.get("emulated")]
    print()
    print(f"Model (per process; least squares over n >= {a.fit_from}, peers = n - 1):")
    print()
    print(scale_model.table(fit_rows, a.fit_from))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(rows=rows, limits=scale_model.machine_limits(), argv=sys.argv[1:],
                           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())), f, indent=1)
    return 0 if all(r["ok"] for r in shown) else 1


if __name__ == "__main__":
    sys.exit(main())
