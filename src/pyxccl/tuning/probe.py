"""Measuring link figures: a short ping-pong and bandwidth probe per link class,
run once per host at the first init and cached in ``~/.cache/pyxccl/links.json``
(or read from the file named by ``PYXCCL_LINKS``). Links between hosts ("tcp")
are measured at every init instead: they depend on which hosts a job got and
on the network between them, and a home directory may be shared by hosts."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from .cost import Link, Machine

_PINGS, _BW_BYTES, _BW_REPS = 20, 4 << 20, 3
_TAG = 0x7FFF0000          # a p2p tag users are unlikely to pick


def cache_path() -> str:
    return os.environ.get("PYXCCL_LINKS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pyxccl", "links.json")


def local_figures() -> tuple[float, float]:
    """(gamma, copy): seconds per byte of an in-place numpy add and of a copy, on 4 MiB."""
    a, b = np.ones(1 << 20, np.float32), np.ones(1 << 20, np.float32)
    best_add = best_copy = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.add(a, b, out=a)
        best_add = min(best_add, time.perf_counter() - t)
        t = time.perf_counter()
        np.copyto(a, b)
        best_copy = min(best_copy, time.perf_counter() - t)
    return best_add / a.nbytes, best_copy / a.nbytes


def _pingpong(comm, peer: int, lead: bool) -> Link:
    small, big = np.zeros(2, np.float32), np.zeros(_BW_BYTES // 4, np.float32)
    t = time.perf_counter()
    for _ in range(_PINGS):
        if lead:
            comm.send(small, peer, _TAG)
            comm.recv(small, peer, _TAG)
        else:
            comm.recv(small, peer, _TAG)
            comm.send(small, peer, _TAG)
    alpha = (time.perf_counter() - t) / (2 * _PINGS)
    t = time.perf_counter()
    for _ in range(_BW_REPS):
        if lead:
            comm.send(big, peer, _TAG)
        else:
            comm.recv(big, peer, _TAG)
    if lead:
        comm.recv(small, peer, _TAG)
    else:
        comm.send(small, peer, _TAG)
    total = time.perf_counter() - t
    beta = max(1e-12, (total - 2 * alpha) / (_BW_REPS * big.nbytes))
    return Link(alpha, beta)


def _rounds(comm) -> Link:
    """Latency of one round of the one-host fast path (its barrier)."""
    for _ in range(5):
        comm.barrier(algorithm="shm")
    t = time.perf_counter()
    for _ in range(50):
        comm.barrier(algorithm="shm")
    return Link((time.perf_counter() - t) / 50, 0.0)


def measure(comm) -> Machine:
    """Collective: rank 0 probes one peer of each link class it has (and the one-host segment's
    round); returns the same Machine on every rank."""
    classes = {}
    for p in range(1, comm.size):
        classes.setdefault(comm.link_class(0, p), p)
    segment = "shm" in comm.algorithms("barrier")
    if segment:
        classes = dict(classes, seg=-1)      # measured below, with every rank taking part
    known, complete = None, False
    if comm.rank == 0:
        try:
            with open(cache_path()) as f:
                known = Machine.from_json(json.load(f))
            known.links.pop("tcp", None)
            complete = set(classes) <= set(known.links)
        except (OSError, ValueError, KeyError, TypeError):
            known = None
    known_json, complete = comm.broadcast_object((known.to_json() if known else None, complete), root=0)
    known = Machine.from_json(known_json) if known_json else None     # the same on every rank
    if complete:
        known.cores = len(os.sched_getaffinity(0))
        return known
    if known is not None:
        gamma, copy = known.gamma, known.copy
    else:
        gamma, copy = local_figures() if comm.rank == 0 else (0.0, 0.0)
    links = dict(known.links) if known else {}       # keep classes measured by earlier jobs
    for klass, peer in sorted(classes.items()):
        if klass in links or klass == "seg":
            continue
        if comm.rank in (0, peer):
            links[klass] = _pingpong(comm, peer if comm.rank == 0 else 0, comm.rank == 0)
    if segment and "seg" not in links:
        links["seg"] = _rounds(comm)
    comm.barrier()
    m = Machine(links, gamma, copy, len(os.sched_getaffinity(0)))
    d = comm.broadcast_object(m.to_json(), root=0)
    if comm.rank == 0:
        try:
            os.makedirs(os.path.dirname(cache_path()), exist_ok=True)
            tmp = cache_path() + f".{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(dict(d, links={k: v for k, v in d["links"].items() if k != "tcp"}), f)
            os.replace(tmp, cache_path())
        except OSError:
            pass
    m = Machine.from_json(d)
    m.cores = len(os.sched_getaffinity(0))
    return m
