"""The per-peer model of benchmarks/scale.py: fit a + b * peers to the measured rows, extrapolate.

For each library and per-process figure (threads, open descriptors, RSS: of the largest rank and of
the median rank; init time of the slowest rank) an ordinary least-squares line over the rows with n >= fit_from, peers = n - 1 (every other
rank of the world: the peers today's pyxccl connects to at init). A library that connects on first
use keeps ``b`` near 0 for this job, which is the point of measuring it. The limits beside the
extrapolation are the published ones cited in docs/scale.md; this machine's own are read from /proc.
"""
from __future__ import annotations

import os

#: (row key, name): the slowest or largest rank's figure, and the median rank's where one rank (the
#: store's) differs from the others.
FIGURES = (("threads", "threads, max rank"), ("threads_med", "threads, median rank"), ("fds", "open fds, max rank"),
           ("fds_med", "open fds, median rank"), ("rss_mib", "RSS MiB, max rank"),
           ("rss_mib_med", "RSS MiB, median rank"), ("init_s", "init s, slowest rank"))
TARGETS = (4096, 100_000)
#: Linux's default soft RLIMIT_NOFILE (docs/scale.md cites it); the hard default is 4096 on systemd systems.
SOFT_NOFILE = 1024


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares line y = a + b x; b = 0 for one point."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def machine_limits() -> dict:
    """This machine's ceilings that a rank's figures meet first."""
    def read(path):
        try:
            with open(path) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return dict(nofile_soft=soft, nofile_hard=hard, nr_open=read("/proc/sys/fs/nr_open"),
                threads_max=read("/proc/sys/kernel/threads-max"), cpus=os.cpu_count())


def models(rows: list[dict], fit_from: int) -> dict[str, dict]:
    """{label: {figure: (a, b, [n used])}} for every label with two or more usable rows."""
    out: dict[str, dict] = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label and r.get("ok") and r["n"] >= fit_from]
        if len(mine) < 2:
            continue
        out[label] = {}
        for key, _ in FIGURES:
            xs = [r["n"] - 1 for r in mine]
            ys = [r[key] for r in mine]
            out[label][key] = (*fit(xs, ys), [r["n"] for r in mine])
    return out


def table(rows: list[dict], fit_from: int) -> str:
    """Markdown: the fit and its value at each target size, with the soft descriptor limit flagged."""
    ms = models(rows, fit_from)
    if not ms:
        return f"(no model: fewer than two complete rows with n >= {fit_from} for every library)"
    head = ["library", "figure", f"fit a + b*(n-1)", "from n", *[f"n = {t:,}" for t in TARGETS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, figs in ms.items():
        for key, name in FIGURES:
            a, b, used = figs[key]
            vals = []
            for t in TARGETS:
                v = a + b * (t - 1)
                flag = " (> soft NOFILE 1024)" if key.startswith("fds") and v > SOFT_NOFILE else ""
                vals.append(f"{v:,.1f}{flag}" if key.startswith(("init", "rss")) else f"{v:,.0f}{flag}")
            lines.append(f"| {label} | {name} | {a:.4g} + {b:.4g}*(n-1) | {','.join(map(str, used))} | "
                         + " | ".join(vals) + " |")
    lim = machine_limits()
    lines.append("")
    lines.append(f"This machine: RLIMIT_NOFILE soft {lim['nofile_soft']}, hard {lim['nofile_hard']}; "
                 f"fs.nr_open {lim['nr_open']}; kernel.threads-max {lim['threads_max']}; {lim['cpus']} CPUs.")
    return "\n".join(lines)
