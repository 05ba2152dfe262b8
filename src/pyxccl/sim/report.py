"""``pyxccl sim``: simulate collectives on a modelled cluster and print (or plot) what they cost.

    pyxccl sim allreduce --hosts 64 --per-host 8 --size 1GiB --algo ring,tree,hierarchical
    pyxccl sim allgather --hosts 16 --per-host 8 --sweep 64K:1G --plot allgather.png
    pyxccl sim alltoall --measured --hosts 1 --per-host 4 --size 4M
    pyxccl sim alltoall --hosts 16 --per-host 8 --size 64M --topology torus2d --dims 4x4
    pyxccl sim allreduce --hosts 2 --per-host 8 --hardware dgx-a100 --size 1M --model nccl
    pyxccl sim allreduce --hosts 1 --per-host 8 --hardware dgx-h100 --size 4K --launch single-process
    pyxccl sim allreduce --hosts 2 --per-host 8 --hardware dgx-a100 --size 1M --nccl-version 2.26.2 --raw
    pyxccl sim alltoall --hosts 4 --per-host 8 --hardware dgx-h100 --size 64M

On the DGX presets (alltoall too: NCCL's grouped point-to-point) the figures are the ones the fidelity
table validates (``sim/published.py``): the fitted parameters of ``sim/fitted.py`` applied by
``sim/calibrated.py``, for the launch mode given; ``--raw`` leaves them out.
"""
from __future__ import annotations

import argparse
import json

from .._errors import InvalidArgumentError
from ..bench.methodology import parse_size, sweep
from . import calibrated
from . import simulate as simrun
from .cluster import TOPOLOGIES, Cluster, Link


def add_arguments(p) -> None:
    p.add_argument("collective", help="allreduce, allgather, reduce_scatter, alltoall, broadcast, reduce, gather, "
                   "scatter")
    p.add_argument("--hosts", type=int, default=2, help="hosts (default 2)")
    p.add_argument("--per-host", type=int, default=8, help="ranks per host (default 8)")
    p.add_argument("--size", default="1G", help="bytes of the call, nccl-tests' way (default 1G; e.g. 64K, 1GiB)")
    p.add_argument("--sweep", metavar="MIN:MAX", help="sizes from MIN to MAX, times 4 each row (e.g. 8:1G)")
    p.add_argument("--algo", help="algorithms, comma-separated (default: every one that can run)")
    p.add_argument("--hardware", help="a hardware preset or TOML file (pyxccl plan --list-hardware), e.g. dgx-a100; "
                   "default: the link flags below")
    p.add_argument("--measured", action="store_true",
                   help="this machine's measured figures (shared memory inside a host, TCP between)")
    p.add_argument("--intra-bw", type=float, default=300.0, help="GB/s of a rank's link inside a host (300)")
    p.add_argument("--intra-lat", type=float, default=1.0, help="microseconds of latency inside a host (1)")
    p.add_argument("--inter-bw", type=float, default=25.0, help="GB/s of one NIC (25: 200 Gb/s)")
    p.add_argument("--inter-lat", type=float, default=5.0, help="microseconds of latency between hosts (5)")
    p.add_argument("--nics", type=int, default=None, help="NICs per host (default: one per rank)")
    p.add_argument("--topology", choices=TOPOLOGIES, default=None,
                   help="between hosts (default fattree; docs/sim.md has the routes)")
    p.add_argument("--dims", type=parse_dims, default=None,
                   help="torus2d/torus3d: hosts per dimension, e.g. 4x4 or 4x2x2 (default: the most square)")
    p.add_argument("--groups", type=int, default=None,
                   help="dragonfly: groups of hosts (a divisor of --hosts; default: the most square split)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--mode", choices=simrun.MODES, default="auto",
                   help="message: every rank; symmetric: one host's ranks, for schedules alike on every host; "
                        "auto: message level while cheap")
    p.add_argument("--model", choices=("auto", "pyxccl", "nccl"), default="auto",
                   help="pyxccl: pyxccl's algorithms' schedules through its cost model; nccl: NCCL's own tuning "
                        "model (every algorithm x protocol it enables and the one it picks; alltoall: its grouped "
                        "point-to-point; needs --hardware dgx-a100 or dgx-h100, 8 per host); auto (default): nccl "
                        "where it describes the machine and the call (a DGX preset as it is, a collective of "
                        "NCCL's model or alltoall, --algo naming NCCL's algorithms if given), else pyxccl")
    p.add_argument("--launch", choices=calibrated.LAUNCH_MODES, default="per-gpu",
                   help="how the job is started, on the DGX presets: per-gpu (default: one process per GPU, as "
                        "torchrun and mpirun launch) or single-process (one process drives a node's GPUs, "
                        "nccl-tests -g 8: it adds the fitted launch latency)")
    p.add_argument("--nccl-version", default=None,
                   help="the NCCL release NCCL's model prices with (default: the newest ported, "
                        f"{calibrated.newest_version()}; ported: {', '.join(calibrated.ported_versions())})")
    p.add_argument("--raw", action="store_true",
                   help="the models without the figures fitted to published nccl-tests measurements "
                        "(sim/fitted.py; docs/sim.md, \"Fidelity against published NCCL measurements\")")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--plot", help="with --sweep: draw busbw against size into this PNG")


def parse_dims(text: str) -> tuple[int, ...]:
    """"4x4" -> (4, 4)."""
    try:
        dims = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"--dims {text!r}: give hosts per dimension joined by x, e.g. 4x4 or 4x2x2")
    return dims


def cluster_of(a, cal=None) -> Cluster:
    """The cluster the arguments describe; ``cal``: the preset's links with those fitted figures."""
    if a.measured:
        c = Cluster.measured(a.hosts, a.per_host)
    elif a.hardware:
        from ..plan import hardware
        hw = calibrated.hardware(hardware.load(a.hardware), cal, a.per_host)
        c = hw.cluster(a.hosts, a.per_host, nic_share=hw.nics)      # the job is alone: every NIC its GPUs reach
    else:
        c = Cluster(a.hosts, a.per_host, intra=Link(a.intra_lat * 1e-6, 1 / (a.intra_bw * 1e9)),
                    inter=Link(a.inter_lat * 1e-6, 1 / (a.inter_bw * 1e9)), nics=a.nics or a.per_host,
                    name="flags")
    over = {k: v for k, v in (("nics", a.nics), ("topology", a.topology), ("dims", a.dims), ("groups", a.groups))
            if v is not None}
    if a.topology is not None:      # the preset's shape is its topology's: a new one is chosen for the new
        over.setdefault("dims", ())
        over.setdefault("groups", 0)
    if over:
        from dataclasses import replace
        c = replace(c, **over)
    return c


def describe(c: Cluster) -> str:
    def link(x: Link) -> str:
        return f"{1 / x.beta / 1e9:.4g} GB/s, {x.alpha * 1e6:.3g} us"
    shape = (f" {'x'.join(map(str, c.dims))}" if c.dims else "") + (f" of {c.groups} groups" if c.groups else "")
    inter = f"; between hosts {c.nics} x ({link(c.inter)}), {c.topology}{shape}" if c.hosts > 1 else ""
    return (f"{c.hosts} hosts x {c.per_host} ranks ({c.nranks}), {c.name or 'custom'}: inside a host "
            f"{link(c.intra)}{' shared' if c.intra_shared else ''}{inter}" + (f" [{c.source}]" if c.source else ""))


def _si(v: float, unit: str) -> str:
    for scale, p in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if v >= scale:
            return f"{v / scale:.3g} {p}{unit}"
    return f"{v:.3g} {unit}"


def _time(t: float) -> str:
    for scale, u in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
        if t >= scale:
            return f"{t / scale:.4g} {u}"
    return f"{t * 1e9:.4g} ns"


def _bytes(n: float) -> str:
    for shift, u in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {u}"
    return f"{int(n)} B"


def _sizes(a) -> list[int]:
    return [parse_size(a.size)] if not a.sweep else sweep(*(parse_size(x) for x in a.sweep.split(":")), 4)


def nccl_covers(a) -> bool:
    """Does ``--model auto`` take NCCL's model for these arguments? Where the machine is a DGX preset
    NCCL's model describes (as the preset is: no other topology or NIC count), the collective is one of
    its tuning model's or alltoall (NCCL's grouped point-to-point, ``sim/nccl_p2p.py``), and ``--algo``,
    if given, names NCCL's algorithms (``ring`` is both NCCL's Ring and pyxccl's ring: NCCL's here;
    alltoall has none to name). On those machines it is the closer of the two to published NCCL
    measurements (docs/sim.md, "Fidelity against published NCCL measurements")."""
    if a.model != "auto":
        return a.model == "nccl"
    if not a.hardware or a.measured or any(v is not None for v in (a.topology, a.nics, a.dims, a.groups)):
        return False
    from ..plan import hardware
    from . import nccl
    try:
        if a.collective != "alltoall":      # alltoall: NCCL's grouped point-to-point (sim/nccl_p2p.py)
            nccl.func(a.collective)
        nccl.preset(hardware.load(a.hardware).name, a.hosts, a.per_host)
    except (ValueError, OSError):
        return False
    if a.collective == "alltoall":          # NCCL runs it one way: --algo names pyxccl's algorithms
        return not a.algo
    names = {x.lower() for x in nccl.ncclAlgoStr}
    return not a.algo or all(x.lower() in names for x in a.algo.split(","))


def _pricing(a) -> calibrated.Pricing:
    try:
        return calibrated.Pricing(a.nccl_version or "", a.launch, a.raw)
    except InvalidArgumentError as e:
        raise SystemExit(f"pyxccl sim: {e}") from None


def _fitted_preset(a) -> str | None:
    """The preset whose fitted figures apply to pyxccl's walk: a DGX preset as it is (its own topology and
    NICs, as the fit saw it), else None."""
    if not a.hardware or a.measured or any(v is not None for v in (a.topology, a.nics, a.dims, a.groups)):
        return None
    from ..plan import hardware
    hw = hardware.load(a.hardware)
    try:
        same = hw == hardware.load(hw.name)
    except (ValueError, OSError):       # a user's file under a name that is no preset
        return None
    return hw.name if same and calibrated.fitted_for(hw.name) else None


def _fitted(r, nbytes: int, cal, launch: str):
    """A walk's result with the fitted latencies added (its bandwidths follow its time)."""
    if cal is None:
        return r
    from dataclasses import replace
    t = calibrated.time(r.time, cal, launch)
    return replace(r, time=t, algbw=nbytes / t, busbw=nbytes / t * (r.busbw / r.algbw if r.algbw else 0.0))


def main(a) -> int:
    if nccl_covers(a):
        return main_nccl(a)
    pricing = _pricing(a)
    preset = _fitted_preset(a)
    cal = pricing.params("pyxccl", preset)
    try:
        c = cluster_of(a, cal)
    except InvalidArgumentError as e:       # a shape that does not fit the hosts: say what to give, no traceback
        raise SystemExit(f"pyxccl sim: {e}") from None
    sizes = _sizes(a)
    algos = a.algo.split(",") if a.algo else None
    figures = pricing.describe("pyxccl", preset, nccl=False, applied=cal is not None)
    print(f"# {a.collective} on {describe(c)}")
    print(f"# figures: {pricing.words(figures, 'pyxccl', preset)}")
    print(f"{'size':>10} {'algorithm':>20} {'time':>11} {'algbw':>12} {'busbw':>12} {'sent/rank':>11} "
          f"{'messages':>12} {'mode':>9} {'wall':>7}")
    rows = []
    for nb in sizes:
        try:
            res = simrun.run(a.collective, nb, c, algos, dtype=a.dtype, mode=a.mode)
        except ValueError as e:     # an algorithm or mode that cannot run here: the message says what to do
            raise SystemExit(f"pyxccl sim: {e}") from None
        res = [_fitted(r, nb, cal, pricing.launch) for r in res]
        best = min(res, key=lambda r: r.time).algorithm if res else None
        for r in res:
            rows.append(dict(size=nb, **r.to_json(), **figures))
            print(f"{_bytes(nb):>10} {r.algorithm + (' *' if r.algorithm == best and len(res) > 1 else ''):>20} "
                  f"{_time(r.time):>11} {_si(r.algbw, 'B/s'):>12} {_si(r.busbw, 'B/s'):>12} "
                  f"{_bytes(r.bytes_sent):>11} {r.messages:>12} {r.mode:>9} {r.seconds:>6.1f}s")
    if len(rows) > len(sizes):
        print("# * the fastest: what the tuner would choose there")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cluster": describe(c), "model": "pyxccl", "collective": a.collective, **figures,
                       "rows": rows}, f, indent=1)
    if a.plot:
        plot(rows, a.plot, f"{a.collective}: {describe(c)}")
        print(f"# wrote {a.plot}")
    return 0


def main_nccl(a) -> int:
    """``--model nccl`` (and ``auto`` where ``nccl_covers``): NCCL's own tuning model (``sim/nccl.py``) on a
    DGX preset, a row per (algorithm, protocol) NCCL enables, the one NCCL picks starred; alltoall: NCCL's
    grouped point-to-point (``sim/nccl_p2p.py``), its one row."""
    from dataclasses import replace

    from . import nccl, nccl_p2p
    if not a.hardware or a.measured:
        raise SystemExit(f"--model nccl needs --hardware, one of {', '.join(nccl.preset_names())}")
    a2a = a.collective == "alltoall"
    if a2a and a.algo:
        raise SystemExit("pyxccl sim: NCCL runs alltoall one way (grouped point-to-point, no algorithm to "
                         "choose): leave --algo out, or give --model pyxccl for pyxccl's alltoall algorithms")
    from ..plan import hardware
    name = hardware.load(a.hardware).name
    pricing = _pricing(a)
    try:
        coll = None if a2a else nccl.func(a.collective)
        comm = replace(nccl.preset(name, a.hosts, a.per_host), version=pricing.version)
    except ValueError as e:
        raise SystemExit(f"pyxccl sim: {e}") from None
    cal = pricing.params("nccl", name)
    figures = pricing.describe("nccl", name, nccl=True)
    algos = {x.lower() for x in a.algo.split(",")} if a.algo else None
    how = ("NCCL's grouped point-to-point (sim/nccl_p2p.py: 2.29.2's rules for every release, priced by "
           "bandwidth, the protocol a label)" if a2a else "NCCL's tuning model")
    print(f"# {a.collective} on {a.hosts} x {a.per_host} {name}, {how}; graphs: {comm.source}")
    print(f"# figures: {pricing.words(figures, 'nccl', name)}")
    print(f"{'size':>10} {'algorithm':>15} {'protocol':>9} {'time':>11} {'algbw':>12} {'busbw':>12}")
    rows = []
    for nb in _sizes(a):
        try:
            timed = ([calibrated.alltoall_row(nb, comm, cal, pricing.launch)] if a2a else
                     calibrated.nccl(a.collective, nb, comm, cal, pricing.launch))
        except ValueError as e:     # a release not ported for this GPU: the message names the ported ones
            raise SystemExit(f"pyxccl sim: {e}") from None
        for r in timed:
            if algos and r.algorithm.lower() not in algos:
                continue
            algbw = nb / r.time if r.time > 0 else float("inf")
            busbw = algbw * (nccl_p2p.bus_factor(comm.nRanks) if a2a else nccl.bus_factor(coll, comm.nRanks))
            rows.append(dict(size=nb, algorithm=r.algorithm, protocol=r.protocol, time=r.time, algbw=algbw,
                             busbw=busbw, chosen=r.chosen, **figures))
            print(f"{_bytes(nb):>10} {r.algorithm:>15} {r.protocol + (' *' if r.chosen else ''):>9} "
                  f"{_time(r.time):>11} {_si(algbw, 'B/s'):>12} {_si(busbw, 'B/s'):>12}")
    print(("# * NCCL's one way to run it" if a2a else "# * what NCCL picks (the least time of its model)") +
          ("; --model pyxccl: pyxccl's own algorithms on this machine" if a.model == "auto" else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cluster": f"{a.hosts} x {a.per_host} {name}", "model": "nccl", "collective": a.collective,
                       "source": comm.source, **figures, "rows": rows}, f, indent=1)
    if a.plot:
        for r in rows:
            r["algorithm"] = f"{r['algorithm']}/{r['protocol']}"
        plot(rows, a.plot, f"{a.collective}: {a.hosts} x {a.per_host} {name}, NCCL's model")
        print(f"# wrote {a.plot}")
    return 0


def plot(rows: list[dict], path: str, title: str) -> None:
    """busbw against size, a line per algorithm."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'pyxccl[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for algo in sorted({r["algorithm"] for r in rows}):
        pts = [(r["size"], r["busbw"] / 1e9) for r in rows if r["algorithm"] == algo]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title, fontsize=8, wrap=True)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
