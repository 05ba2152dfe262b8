"""`pyxccl bench --vs gloo,mpi,impi,deepspeed,oneccl`: the same sweep with each library, in one run, side by side."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from . import installs, oneccl
from . import methodology as M

#: What the ranks of a launched peer must not inherit from a launcher around this one.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _mpich_command() -> list[str]:
    exe = installs.mpich_mpiexec()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return [exe, "--oversubscribe", "--allow-run-as-root"] if "Open MPI" in version else [exe]


def _impi(env: dict) -> list[str]:
    """Intel MPI under this Python's mpi4py: Intel's libmpi is ABI-compatible with MPICH's (libmpi.so.12),
    so mpi4py's MPICH build runs on it once MPI4PY_LIBMPI names it; Intel's own hydra starts the ranks."""
    root = installs.impi_root()
    env.update(I_MPI_ROOT=root, MPI4PY_LIBMPI=os.path.join(root, "lib", "libmpi.so.12"))
    # One host: shared memory only (no libfabric provider), hydra's control traffic on loopback.
    env.setdefault("I_MPI_FABRICS", "shm")
    env.setdefault("I_MPI_HYDRA_IFACE", "lo")
    return [os.path.join(root, "bin", "mpiexec"), "-launcher", "fork"]


def _pyxccl_path(tmp: str) -> str:
    """A directory holding only this pyxccl, for another venv's PYTHONPATH (this package's parent may be a
    whole site-packages, whose torch and numpy would shadow that venv's own)."""
    import pyxccl
    d = os.path.join(tmp, "pyxccl-only")
    if not os.path.isdir(d):
        os.makedirs(d)
        os.symlink(os.path.dirname(pyxccl.__file__), os.path.join(d, "pyxccl"))
    return d


def run_lib(lib: str, n: int, prims, sizes, args, out: str) -> list[dict] | str:
    """Rows of one library's sweep, or why it could not run."""
    from ..launcher import run
    py = [sys.executable, "-m"]
    peer_args = [out, ",".join(prims), ",".join(map(str, sizes)), args.dtype]
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    if lib == "pyxccl":
        cmd = [*py, "pyxccl", "bench", ",".join(prims), "-b", "1", "-e", "1", "--sizes", ",".join(map(str, sizes)),
               "--dtype", args.dtype, "--json", out, "--quiet"]
        if args.algo:
            cmd += ["--algo", args.algo]
        code = run(n, cmd)
    elif lib == "gloo":
        # torchrun binds nothing: the peers our launcher starts in its place are not bound either
        code = run(n, [*py, "pyxccl.bench.peers", "gloo", *peer_args], env=dict(env, GLOO_SOCKET_IFNAME="lo"),
                   bind=False)
    elif lib in ("mpi", "impi"):
        mpiexec = _mpich_command() if lib == "mpi" else _impi(env)
        code = subprocess.run([*mpiexec, "-n", str(n), *py, "pyxccl.bench.peers", lib, *peer_args],
                              env=env).returncode
    elif lib == "deepspeed":
        env.update(PYTHONPATH=_pyxccl_path(os.path.dirname(out)), GLOO_SOCKET_IFNAME="lo", DS_ACCELERATOR="cpu",
                   TORCH_EXTENSIONS_DIR=os.path.join(installs.peers_dir(), "torch_ext"))
        code = run(n, [installs.ds_python(), "-m", "pyxccl.bench.peers", "deepspeed", *peer_args], env=env,
                   bind=False)
    elif lib == "oneccl":     # float32 only (installs.unfit)
        return oneccl.run(n, [(p, *M.counts(p, s, 4, n)) for p in prims for s in sizes])
    if code != 0:
        return f"its run exited with code {code}"
    with open(out) as f:
        return json.load(f)


def parse_vs(text: str) -> list[str]:
    """--vs gloo,mpi,... -> the peers, checked against what --vs knows."""
    libs = [lib.strip() for lib in text.split(",") if lib.strip()]
    unknown = [lib for lib in libs if lib not in installs.PEERS]
    if unknown:
        raise SystemExit(f"pyxccl bench: --vs knows {', '.join(installs.PEERS)}, not {', '.join(unknown)}")
    return list(dict.fromkeys(libs))


def plan(peers, prims, dtype: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Which primitives each library runs, and why the others are left out (missing, or nothing to time)."""
    todo, skipped = {"pyxccl": list(prims)}, {}
    for lib in peers:
        why = installs.missing(lib) or installs.unfit(lib, prims, dtype)
        if why:
            skipped[lib] = why
        else:
            todo[lib] = installs.primitives(lib, prims)
    return todo, skipped


def compare(args, n: int, prims, sizes) -> int:
    todo, skipped = plan(parse_vs(args.vs), prims, args.dtype)
    for lib, why in skipped.items():
        print(f"# {lib}: skipped: {why}", file=sys.stderr)
    libs = list(todo)
    runs: dict[str, list[list[dict]]] = {lib: [] for lib in libs}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for lib in libs:
                if lib in skipped:
                    continue
                res = run_lib(lib, n, todo[lib], sizes, args, os.path.join(tmp, f"{lib}{rnd}.json"))
                if isinstance(res, str):
                    skipped[lib] = res
                    print(f"# {lib}: skipped: {res}", file=sys.stderr)
                else:
                    runs[lib].append(res)
    table = merge(runs)
    present = [lib for lib in libs if runs[lib]]
    wrong = _print(table, present, prims, n, args, skipped)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(lib=k[0], op=k[1], size=k[2], n=n, **v) for k, v in table.items()], f, indent=1)
    if args.plot:
        _plot(table, present, prims, n, args.plot)
    return 1 if args.check and wrong else 0


def merge(runs: dict[str, list[list[dict]]]) -> dict[tuple, dict]:
    """Every library's rounds of rows -> (lib, op, size) -> the medians over the rounds and #wrong summed."""
    table = {}
    for lib, rounds in runs.items():
        for rows in zip(*rounds):
            r0 = rows[0]
            parts = [r["out_of_place"] for r in rows]
            table[(lib, r0["op"], r0["size"])] = dict(
                time_us=statistics.median(p["time_us"] for p in parts),
                busbw=statistics.median(p["busbw"] for p in parts), wrong=sum(p["wrong"] for p in parts))
    return table


def _print(table, libs, prims, n, args, skipped) -> int:
    wrong = 0
    peers = [lib for lib in libs if lib != "pyxccl"]
    print(f"# pyxccl bench --vs {','.join(peers)}: {n} ranks, {args.dtype}, median of {args.rounds} round(s) "
          f"of per-size medians; time in us, busbw in GB/s; x = pyxccl busbw / peer busbw")
    wid = {lib: len(lib) + 4 for lib in libs}      # every column as wide as its name, at least 10
    wid = {lib: max(10, w) for lib, w in wid.items()}
    for op in prims:
        head = f"{'size':>10}" + "".join(f" {lib + ' us':>{wid[lib]}} {lib + ' bw':>{wid[lib]}}" for lib in libs)
        head += "".join(f" {'x ' + lib:>{wid[lib]}}" for lib in peers) + f" {'#wrong':>6}"
        print(f"#\n# {op}\n#{head[1:]}")
        for size in sorted({k[2] for k in table if k[1] == op}):
            cells, w = "", 0
            for lib in libs:
                v = table.get((lib, op, size))
                cells += f" {v['time_us']:>{wid[lib]}.1f} {v['busbw']:>{wid[lib]}.3f}" if v else \
                    f" {'-':>{wid[lib]}} {'-':>{wid[lib]}}"
                w += v["wrong"] if v else 0
            me = table.get(("pyxccl", op, size))
            for lib in peers:
                v = table.get((lib, op, size))
                cells += f" {me['busbw'] / v['busbw']:>{wid[lib]}.2f}" if v and me and v["busbw"] > 0 else \
                    f" {'-':>{wid[lib]}}"
            print(f"{size:>10}{cells} {w:>6}")
            wrong += w
    for lib, why in skipped.items():        # again here, where the table's reader looks
        print(f"# {lib}: skipped: {why}")
    print(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
    return wrong


def _plot(table, libs, prims, n, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = min(4, len(prims))
    rows = -(-len(prims) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(prims):]:
        ax.set_visible(False)
    for ax, op in zip(axes.flat, prims):
        for lib in libs:
            pts = sorted((k[2], v["busbw"]) for k, v in table.items() if k[0] == lib and k[1] == op)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=lib)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, {n} ranks")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
