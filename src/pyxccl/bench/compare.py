"""`pyxccl bench --vs gloo,mpi`: the same sweep with each library, in one run, side by side."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


LIBS = ("pyxccl", "gloo", "mpi")


def _mpiexec() -> list[str] | None:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        return None
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return [exe, "--oversubscribe", "--allow-run-as-root"] if "Open MPI" in version else [exe]


def run_lib(lib: str, n: int, prims, sizes, args, out: str) -> list[dict] | str:
    """Rows of one library's sweep, or why it could not run."""
    from ..launcher import run
    py = [sys.executable, "-m"]
    if lib == "pyxccl":
        cmd = [*py, "pyxccl", "bench", ",".join(prims), "-b", "1", "-e", "1", "--sizes", ",".join(map(str, sizes)),
               "--dtype", args.dtype, "--json", out, "--quiet"]
        if args.algo:
            cmd += ["--algo", args.algo]
        code = run(n, cmd)
    elif lib == "gloo":
        try:
            import torch  # noqa: F401  (only: is it installed?)
        except ImportError:
            return "torch is not installed (pip install 'pyxccl[peers]')"
        code = run(n, [*py, "pyxccl.bench.peers", "gloo", out, ",".join(prims), ",".join(map(str, sizes)),
                       args.dtype], env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
    else:
        mpiexec = _mpiexec()
        if mpiexec is None:
            return "no mpiexec found (pip install 'pyxccl[peers]')"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        code = subprocess.run([*mpiexec, "-n", str(n), *py, "pyxccl.bench.peers", "mpi", out, ",".join(prims),
                               ",".join(map(str, sizes)), args.dtype], env=env).returncode
    if code != 0:
        return f"its run exited with code {code}"
    with open(out) as f:
        return json.load(f)


def compare(args, n: int, prims, sizes) -> int:
    libs = ["pyxccl"] + [lib for lib in args.vs.split(",") if lib]
    unknown = [lib for lib in libs if lib not in LIBS]
    if unknown:
        raise SystemExit(f"pyxccl bench: --vs knows gloo and mpi, not {', '.join(unknown)}")
    runs: dict[str, list[list[dict]]] = {lib: [] for lib in libs}
    skipped = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for lib in libs:
                if lib in skipped:
                    continue
                res = run_lib(lib, n, prims, sizes, args, os.path.join(tmp, f"{lib}{rnd}.json"))
                if isinstance(res, str):
                    skipped[lib] = res
                    print(f"# {lib}: skipped: {res}", file=sys.stderr)
                else:
                    runs[lib].append(res)
    table = {}        # (lib, op, size) -> dict(time_us, busbw, wrong)
    for lib, rounds in runs.items():
        for rows in zip(*rounds):
            r0 = rows[0]
            parts = [r["out_of_place"] for r in rows]
            table[(lib, r0["op"], r0["size"])] = dict(
                time_us=statistics.median(p["time_us"] for p in parts),
                busbw=statistics.median(p["busbw"] for p in parts), wrong=sum(p["wrong"] for p in parts))
    present = [lib for lib in libs if runs[lib]]
    wrong = _print(table, present, prims, n, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(lib=k[0], op=k[1], size=k[2], n=n, **v) for k, v in table.items()], f, indent=1)
    if args.plot:
        _plot(table, present, prims, n, args.plot)
    return 1 if args.check and wrong else 0


def _print(table, libs, prims, n, args) -> int:
    wrong = 0
    peers = [lib for lib in libs if lib != "pyxccl"]
    print(f"# pyxccl bench --vs {','.join(peers)}: {n} ranks, {args.dtype}, median of {args.rounds} round(s) "
          f"of per-size medians; time in us, busbw in GB/s; x = pyxccl busbw / peer busbw")
    for op in prims:
        head = f"{'size':>10} " + "".join(f"{lib + ' us':>12}{lib + ' bw':>10}" for lib in libs)
        head += "".join(f"{'x ' + lib:>9}" for lib in peers) + f"{'#wrong':>8}"
        print(f"#\n# {op}\n#{head[1:]}")
        for size in sorted({k[2] for k in table if k[1] == op}):
            cells, w = "", 0
            for lib in libs:
                v = table.get((lib, op, size))
                cells += f"{v['time_us']:>12.1f}{v['busbw']:>10.3f}" if v else f"{'-':>12}{'-':>10}"
                w += v["wrong"] if v else 0
            me = table.get(("pyxccl", op, size))
            for lib in peers:
                v = table.get((lib, op, size))
                cells += f"{me['busbw'] / v['busbw']:>9.2f}" if v and me and v["busbw"] > 0 else f"{'-':>9}"
            print(f"{size:>10} {cells}{w:>8}")
            wrong += w
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
