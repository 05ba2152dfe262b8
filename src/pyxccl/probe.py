"""Measuring link figures by driving a communicator (so it sits above it, as doctor and trace do):
a short ping-pong and bandwidth probe per link class, and the round of the one-host segment, at
the first init on a host; kept in a file (``tuning/linkcache.py``: by default
``~/.cache/pyxccl/links.json``, or ``PYXCCL_LINKS``). Links between hosts ("tcp") are measured at
every init instead: they depend on which hosts a job got and on the network between them.

A busy moment must not fool the tuner for good, so:

- every figure is the fastest of several short batches (load only ever adds time, so the minimum
  is the best estimate of what the link does when the job has its cores);
- at every init the cached latencies are checked by a quick re-measurement (a few ping-pongs and
  segment rounds, well under a millisecond when quiet). A cached latency far above what is seen
  now was recorded while the machine was busy: everything is measured again and the file
  rewritten. A latency now far above the cached one is a busy moment now: the cache stays. A
  re-measured figure is never above what the check saw, so a busy-recorded file costs one re-probe;
- an entry is only used on the machine, and with the software, that measured it, and for a week
  (``PYXCCL_LINKS_MAX_AGE``).
"""
from __future__ import annotations

import logging
import time

import numpy as np

from .transport.topology import job_cpus
from .tuning import linkcache
from .tuning.cost import Link, Machine
from .transport.copies import last_level_cache
from .tuning.figures import disagreements, local_figures, memory_figure

log = logging.getLogger("pyxccl")

_TAG = 0x7FFF0000          # a p2p tag users are unlikely to pick
_BW_BYTES = 4 << 20
# (batches, calls per batch): the figure is the fastest batch's mean
PROBE_PINGS, PROBE_ROUNDS, PROBE_BW = (5, 8), (3, 10), 3     # rounds: twice
CHECK_PINGS, CHECK_ROUNDS = (3, 4), (3, 8)


def ping_alpha(comm, peer: int, lead: bool, shape: tuple[int, int], clock=time.perf_counter) -> float:
    """One-way latency of a small message to ``peer``: the fastest of ``shape`` = (batches, round trips)."""
    small, best = np.zeros(2, np.float32), float("inf")
    batches, pings = shape
    for _ in range(batches):
        t = clock()
        for _ in range(pings):
            if lead:
                comm.send(small, peer, _TAG)
                comm.recv(small, peer, _TAG)
            else:
                comm.recv(small, peer, _TAG)
                comm.send(small, peer, _TAG)
        best = min(best, (clock() - t) / (2 * pings))
    return best


def pingpong(comm, peer: int, lead: bool, clock=time.perf_counter) -> Link:
    """Latency and seconds per byte to ``peer`` (the lead's figures count): each the fastest of several."""
    alpha = ping_alpha(comm, peer, lead, PROBE_PINGS, clock)
    small, big, best = np.zeros(2, np.float32), np.zeros(_BW_BYTES // 4, np.float32), float("inf")
    for _ in range(PROBE_BW):
        t = clock()
        if lead:            # 4 MiB there, a small reply back: one transfer and two latencies
            comm.send(big, peer, _TAG)
            comm.recv(small, peer, _TAG)
        else:
            comm.recv(big, peer, _TAG)
            comm.send(small, peer, _TAG)
        best = min(best, clock() - t)
    return Link(alpha, max(1e-12, (best - 2 * alpha) / big.nbytes))


def round_alpha(comm, shape: tuple[int, int], clock=time.perf_counter) -> float:
    """Latency of one round of the one-host segment (its barrier; every rank takes part)."""
    batches, rounds = shape
    comm.barrier(algorithm="segment")        # everyone in, so the first batch does not time the stragglers
    best = float("inf")
    for _ in range(batches):
        t = clock()
        for _ in range(rounds):
            comm.barrier(algorithm="segment")
        best = min(best, (clock() - t) / rounds)
    return best


def observe(comm, peers: dict[str, int], seg: str | None, clock=time.perf_counter) -> dict[str, float]:
    """The quick check (collective): latency now of each class in ``peers`` (class -> rank 0's peer)
    and of the segment's round ``seg`` (or None). Meaningful on rank 0."""
    seen = {}
    for klass, peer in sorted(peers.items()):
        if comm.rank in (0, peer):
            seen[klass] = ping_alpha(comm, peer if comm.rank == 0 else 0, comm.rank == 0, CHECK_PINGS, clock)
    if seg is not None:
        seen[seg] = round_alpha(comm, CHECK_ROUNDS, clock)
    return seen


def _us(wrong: dict) -> str:
    return ", ".join(f"{k} {c * 1e6:.1f} us cached, {a * 1e6:.1f} us now" for k, (c, a) in sorted(wrong.items()))


def measure(comm, clock=time.perf_counter) -> Machine:
    """Collective: the link figures of ``comm``'s machine, the same Machine on every rank.

    Rank 0 reads the file; the cached latencies are checked against a quick re-measurement;
    what is missing, or wrong, is measured (rank 0 and one peer of each link class it has, every
    rank for the segment's round) and written back. ``Machine.source`` says which happened.
    """
    peers = {}
    for p in range(1, comm.size):
        peers.setdefault(comm.link_class(0, p), p)
    local = {k: p for k, p in peers.items() if k != "tcp"}      # "tcp" is measured at every init
    seg = f"seg:{comm.size}" if "segment" in comm.algorithms("barrier") else None
    want = sorted(local) + ([seg] if seg else [])
    path, fp, why = linkcache.cache_path(), None, ""
    entry = None
    if comm.rank == 0:
        fp = linkcache.fingerprint()
        entry, why = linkcache.load(path, fp)
    entry, why = comm.broadcast_object((entry, why), root=0)       # the same decisions on every rank
    seen, wrong = {}, {}
    if entry is not None:
        seen = observe(comm, {k: p for k, p in local.items() if k in entry.links},
                       seg if seg in entry.links else None, clock)
        wrong = comm.broadcast_object(disagreements(entry, seen) if comm.rank == 0 else None, root=0)
        if wrong:        # one busy moment made every figure of that entry: none is kept
            log.info("link figures in %s were measured on a busy machine (%s): measuring again", path, _us(wrong))
            entry, why = None, "re-measured: " + _us(wrong)
    missing = [k for k in want if entry is None or k not in entry.links]
    if entry is not None:
        why = "cached" + (f", measured {', '.join(missing)}" if missing else "")
    else:
        why = why if why.startswith("re-measured") else f"measured ({why})"
    if entry is None:
        gamma, copy = local_figures(clock) if comm.rank == 0 else (0.0, 0.0)
        entry = linkcache.Entry({}, gamma, copy, time.time())
    fill_mem = entry.mem == 0.0         # an entry from before the memory figure: completed here
    if fill_mem and comm.rank == 0:
        entry.mem = memory_figure(clock)
    # The segment's round is timed before and after the other probes: a busy spell (the scheduler
    # keeping both ranks on one core for tens of ms) then has to last through all of them.
    rounds = [round_alpha(comm, PROBE_ROUNDS, clock)] if seg in missing else []
    for klass in missing:
        if klass != seg and comm.rank in (0, local[klass]):
            link = pingpong(comm, local[klass] if comm.rank == 0 else 0, comm.rank == 0, clock)
            entry.links[klass] = Link(min(link.alpha, seen.get(klass, link.alpha)), link.beta)
    if rounds:
        rounds += [round_alpha(comm, PROBE_ROUNDS, clock), seen.get(seg, rounds[0])]
        entry.links[seg] = Link(min(rounds), 0.0)
    tcp = None
    if "tcp" in peers and comm.rank in (0, peers["tcp"]):
        tcp = pingpong(comm, peers["tcp"] if comm.rank == 0 else 0, comm.rank == 0, clock)
    comm.barrier()
    entry, tcp = comm.broadcast_object((entry, tcp), root=0)
    if (missing or fill_mem) and comm.rank == 0:
        linkcache.store(path, fp, entry)
    links = {k: v for k, v in entry.links.items() if not k.startswith("seg:")}
    if seg:
        links["seg"] = entry.links[seg]
    if tcp is not None:
        links["tcp"] = tcp
    if comm.rank == 0:
        log.info("link figures %s (%s)", why, path)
    return Machine(links, entry.gamma, entry.copy, job_cpus(), source=why, mem=entry.mem,
                   cache=last_level_cache())
