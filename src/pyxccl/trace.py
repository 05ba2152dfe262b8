"""The timeline: ``PYXCCL_TRACE=DIR`` writes a Chrome/Perfetto trace per rank.

Each process writes ``DIR/trace-rank<world rank>.json`` (Chrome trace event
format, open it in https://ui.perfetto.dev or chrome://tracing) when its world
communicator closes, and at exit for communicators still open. One lane per
thread that marked compute regions with :func:`compute`, one lane per
communicator (world, split and dup children) with every call the flight
recorder (``core/recorder.py``) saw: its primitive, bytes, dtype, count,
algorithm, peers, numbers, state, error and the time it waited in line.

``pyxccl trace merge DIR`` puts every rank's file into one (one process row per
rank, on one wall clock); ``pyxccl trace summary DIR`` prints per rank the
communication time, the part of it not overlapped with compute regions and
that part's share of the step, and flags a share above 30% (:func:`summary`).

>>> import pyxccl                                   # doctest: +SKIP
>>> comm = pyxccl.init()                            # under PYXCCL_TRACE=/tmp/tl pyxccl run -n 2 ...
>>> work = comm.allreduce(grad, async_op=True)
>>> with pyxccl.compute("backward"):                # a compute region on this thread's lane
...     backward()
>>> work.wait()
"""
from __future__ import annotations

import atexit
import functools
import glob
import json
import logging
import os
import socket
import threading
import time
import weakref

from .core import recorder as _rec

__all__ = ["compute", "write", "merge", "summary", "advice", "format_summary", "THRESHOLD"]

THRESHOLD = 0.30          # the brief's rule (seeds/000): communication above 30% of the step is the bottleneck
STEP = "step"             # compute regions of this name delimit steps instead of being compute
_COMM_TID, _FILE = 1000, "trace-rank{}.json"

# --- compute regions -----------------------------------------------------------------------

_on: bool | None = None   # PYXCCL_TRACE, read at the first compute() (a pool worker sets it after import)
_regions: list = []       # (name, thread ident, start, end), time.time() seconds
_threads: dict = {}       # thread ident -> its name at its first region


class _Off:
    """What compute() returns when tracing is off: does nothing, as a context manager or a decorator."""
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, fn):
        return fn


_OFF = _Off()


class _Region:
    __slots__ = ("name", "t0")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        ident = threading.get_ident()
        if ident not in _threads:
            _threads[ident] = threading.current_thread().name
        self.t0 = time.time()
        return self

    def __exit__(self, *exc):
        _regions.append((self.name, threading.get_ident(), self.t0, time.time()))
        return False

    def __call__(self, fn):
        name = self.name

        @functools.wraps(fn)
        def marked(*args, **kwargs):
            with _Region(name):
                return fn(*args, **kwargs)
        return marked


def compute(name: str = "compute"):
    """Mark a compute region on the calling thread's lane of the timeline.

    A context manager, or a decorator when called with parentheses. When
    ``PYXCCL_TRACE`` is unset (read once, at the first call) it returns a
    shared object that does nothing: a global lookup and a comparison.
    Regions named ``"step"`` are not compute: they delimit the steps that
    ``pyxccl trace summary`` measures shares of.

    >>> with pyxccl.compute("forward"):             # doctest: +SKIP
    ...     loss = model(x)
    >>> @pyxccl.compute("optimizer")                # doctest: +SKIP
    ... def update(): ...
    """
    if _on is False:
        return _OFF
    if _on is None and not _enable():
        return _OFF
    return _Region(name)


def _enable() -> bool:
    global _on
    _on = bool(os.environ.get("PYXCCL_TRACE"))
    return _on


# --- the writer ----------------------------------------------------------------------------

_lanes: list = []                         # one dict per communicator, taken when it closes (or at exit)
_taken: "weakref.WeakSet" = weakref.WeakSet()
_worlds: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()    # world context -> its number here
_nworlds = 0                              # worlds numbered so far
_rank: int | None = None
_written = (0, 0)                         # (lanes, regions) in the file written last
_write_lock = threading.Lock()
_log = logging.getLogger("pyxccl")


def communicator_closed(ctx) -> None:
    """A context closes (a hook of the flight recorder's ``on_close``; PYXCCL_TRACE only): keep the
    communicator's calls; a world's close writes this process's file."""
    if ctx.recorder.trace is None:
        return
    _take(ctx)
    if ctx.parent is None:
        write()


_rec.on_close.append(communicator_closed)


def _take(ctx) -> None:
    if ctx in _taken or ctx.recorder.trace is None:
        return
    _taken.add(ctx)
    root = ctx
    while root.parent is not None:
        root = root.parent
    global _rank, _nworlds
    if _rank is None:
        _rank = _launcher_rank(root.mesh.rank)
    nth = _worlds.get(root)
    if nth is None:
        _nworlds += 1
        nth = _worlds[root] = _nworlds
    kind = "world" if ctx.parent is None else f"split of {ctx.parent.id:08x}"
    label = f" {ctx.label}" if ctx.label else ""
    _lanes.append({"name": f"comm {ctx.id:08x}{label} ({kind}{f' #{nth}' if nth > 1 else ''}, {ctx.size} ranks)",
                   "order": (nth, ctx.parent is not None, len(_lanes)),          # worlds before their children
                   "world_ranks": list(ctx.world_ranks), "rank": ctx.rank,
                   "entries": [_rec.expand(e) for e in ctx.recorder.trace]})


def _launcher_rank(default: int) -> int:
    """The launcher's rank (a torch sub-group is a world of its own, numbered from 0), else the world's."""
    try:
        from .launch_env import read_launch_env
        info = read_launch_env()
    except Exception:  # noqa: BLE001  (a malformed environment: init() already said so)
        info = None
    return default if info is None else info.rank


@atexit.register
def _at_exit() -> None:
    """Communicators still open at exit (pyxccl's own exit handler, registered after this one, runs
    first and closes those init() made), and regions marked after the last write."""
    live = [c for c in _rec.live() if c not in _taken and c.recorder.trace is not None]
    for c in sorted(live, key=lambda c: c.parent is not None):
        _take(c)
    if _written != (len(_lanes), len(_regions)):
        write()


def write(where: str | None = None) -> str | None:
    """Write this process's timeline to ``where`` (default ``$PYXCCL_TRACE``); returns the path, or
    None when there is nothing to write or it cannot be written (logged)."""
    where = where or os.environ.get("PYXCCL_TRACE")
    if not where or _rank is None:
        return None
    global _written
    with _write_lock:
        _written = (len(_lanes), len(_regions))
        doc = _document(_rank, time.time())
        path = os.path.join(where, _FILE.format(_rank))
        try:
            _rec.write_json(path, doc)
        except OSError as e:
            _log.warning("PYXCCL_TRACE: cannot write %s: %s", path, e)
            return None
    return path


def _document(rank: int, now: float) -> dict:
    """The Chrome trace of this process: ts and dur in microseconds from ``origin`` (kept in
    otherData, for merging on the wall clock)."""
    S, ST, EN = _rec.ISSUED, _rec.STARTED, _rec.ENDED
    lanes = sorted(_lanes, key=lambda lane: lane["order"])
    regions = list(_regions)
    starts = [r[2] for r in regions] + [e[S] for lane in _lanes for e in lane["entries"]]
    origin = min(starts, default=now)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)
    host = socket.gethostname()
    ev = [_meta("process_name", rank, 0, name=f"rank {rank} ({host})"),
          _meta("process_sort_index", rank, 0, sort_index=rank)]
    tids = {}
    for name, ident, t0, t1 in regions:
        tid = tids.get(ident)
        if tid is None:
            tid = tids[ident] = len(tids) + 1
            ev += [_meta("thread_name", rank, tid, name=_threads.get(ident, f"thread {ident}")),
                   _meta("thread_sort_index", rank, tid, sort_index=tid)]
        ev.append({"ph": "X", "cat": "compute", "name": name, "pid": rank, "tid": tid, "ts": us(t0),
                   "dur": round((t1 - t0) * 1e6, 3)})
    for i, lane in enumerate(lanes):
        tid, ranks = _COMM_TID + i, lane["world_ranks"]
        ev += [_meta("thread_name", rank, tid, name=lane["name"]),
               _meta("thread_sort_index", rank, tid, sort_index=tid)]
        others = [w for j, w in enumerate(ranks) if j != lane["rank"]]
        for e in lane["entries"]:
            args = _args(e, ranks, others)
            if not e[EN]:           # no end recorded (queued, or running when written): a mark, not a slice
                ev.append({"ph": "i", "s": "t", "cat": "comm", "name": e[_rec.OP], "pid": rank, "tid": tid,
                           "ts": us(e[ST] or e[S]), "args": dict(args, unfinished=True)})
                continue
            ev.append({"ph": "X", "cat": "comm", "name": e[_rec.OP], "pid": rank, "tid": tid, "ts": us(e[ST]),
                       "dur": round(max(0.0, e[EN] - e[ST]) * 1e6, 3), "args": args})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"origin_us": round(origin * 1e6, 3), "rank": rank, "host": host, "pid": os.getpid(),
                          "written": now}}


def _args(e: list, ranks: list, others: list) -> dict:
    a = {"bytes": e[_rec.BYTES], "dtype": e[_rec.DTYPE], "count": e[_rec.COUNT], "algorithm": e[_rec.ALGO],
         "seq": e[_rec.SEQ], "coll_seq": e[_rec.CSEQ], "state": e[_rec.STATE],
         "queued_us": round(max(0.0, e[_rec.STARTED] - e[_rec.ISSUED]) * 1e6, 3) if e[_rec.STARTED] else None}
    if e[_rec.CSEQ]:
        a["peers"] = others                              # world ranks; the algorithm picks whom it talks to
    else:
        p = e[_rec.PEER]
        a["peer"] = "any" if p is None else ranks[p]     # world rank
    if e[_rec.ERROR] is not None:
        a["error"] = e[_rec.ERROR]
    return a


def _meta(what: str, pid: int, tid: int, **args) -> dict:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "ts": 0, "args": args}


# --- reading: merge and summary ------------------------------------------------------------

def _files(path: str) -> list[str]:
    """The per-rank files in directory ``path`` (or ``[path]`` when it is a file), by rank."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory")
    files = glob.glob(os.path.join(path, _FILE.format("*")))
    if not files:
        raise FileNotFoundError(f"{path}: no {_FILE.format('*')} files in it (does the job run with "
                                f"PYXCCL_TRACE={path}?)")

    def rank(f):
        n = os.path.basename(f)[len("trace-rank"):-len(".json")]
        return (0, int(n)) if n.isdigit() else (1, n)
    return sorted(files, key=rank)


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable trace ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return doc


def merge(path: str, out: str | None = None) -> str:
    """Merge the per-rank files of directory ``path`` into ``out`` (default ``path/trace.json``), one
    process row per rank, each file moved onto the earliest file's clock origin (the files keep wall
    clock origins: ranks on one host share the clock, ranks on different hosts need synchronized
    clocks, e.g. NTP). Returns ``out``.

    >>> merge("/tmp/tl")                            # doctest: +SKIP
    '/tmp/tl/trace.json'
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory")
    docs = [_load(f) for f in _files(path)]
    origins = [d.get("otherData", {}).get("origin_us", 0.0) for d in docs]
    first = min(origins)
    events = []
    for d, o in zip(docs, origins):
        shift = o - first
        events += [e if e.get("ph") == "M" else dict(e, ts=round(e["ts"] + shift, 3)) for e in d["traceEvents"]]
    out = out or os.path.join(path, "trace.json")
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": {"origin_us": first, "ranks": [d.get("otherData", {}).get("rank") for d in docs]}},
                  f)
    os.replace(tmp, out)
    return out


def _union(intervals) -> list[tuple[float, float]]:
    out: list = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return out


def _intersect(x: list, y: list) -> list:
    """Of two unions (sorted, disjoint)."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(x: list, y: list) -> list:
    """``x`` minus ``y``, both unions."""
    out, j = [], 0
    for a, b in x:
        while j < len(y) and y[j][1] <= a:
            j += 1
        k = j
        while k < len(y) and y[k][0] < b:
            if y[k][0] > a:
                out.append((a, y[k][0]))
            a = max(a, y[k][1])
            k += 1
        if a < b:
            out.append((a, b))
    return out


def _length(x: list) -> float:
    return sum(b - a for a, b in x)


def summary(path: str) -> list[dict]:
    """Per rank, from the files of directory ``path`` (or one trace file, a merged one too): times in
    microseconds.

    - ``step_us``: the regions named ``"step"`` (their union, ``basis`` "steps"), if the rank marked
      any; else the span from its first event to its last (``basis`` "span");
    - ``comm_us``: the union of its communication calls (every communicator), within the step;
    - ``exposed_us``: the part of that not overlapped by its compute regions (any thread; those named
      "step" are not compute); ``share`` = exposed_us / step_us, ``flagged`` when above 30%;
    - ``ops``: per primitive and size (bytes a call), the calls and their exposed time, most exposed first;
    - ``unfinished``: calls with no recorded end (queued or running when the file was written), not
      counted above.

    >>> [r["share"] for r in summary("/tmp/tl")]    # doctest: +SKIP
    [0.12, 0.41]
    """
    by_rank: dict = {}
    unfinished: dict = {}
    for f in _files(path):
        for e in _load(f)["traceEvents"]:
            if e.get("ph") == "X":
                by_rank.setdefault(e["pid"], []).append(e)
            elif e.get("ph") == "i" and e.get("args", {}).get("unfinished"):
                unfinished[e["pid"]] = unfinished.get(e["pid"], 0) + 1
    return [dict(_rank_summary(r, evs), unfinished=unfinished.get(r, 0)) for r, evs in sorted(by_rank.items())]


def _rank_summary(rank: int, evs: list) -> dict:
    def span(e):
        return (e["ts"], e["ts"] + e["dur"])
    regions = [e for e in evs if e.get("cat") == "compute"]
    comm = [e for e in evs if e.get("cat") == "comm"]
    marked = [span(e) for e in regions if e["name"] == STEP]
    steps = _union(marked)
    compute = _union(span(e) for e in regions if e["name"] != STEP)
    window = steps or [(min(e["ts"] for e in evs), max(e["ts"] + e["dur"] for e in evs))]
    step_us = _length(window)
    comm_in = _intersect(_union(map(span, comm)), window)
    exposed = _length(_subtract(comm_in, compute))
    groups: dict = {}
    for e in comm:
        groups.setdefault((e["name"], e.get("args", {}).get("bytes") or 0), []).append(span(e))
    ops = sorted(({"op": name, "bytes": nbytes, "calls": len(iv),
                   "exposed_us": _length(_subtract(_intersect(_union(iv), window), compute))}
                  for (name, nbytes), iv in groups.items()), key=lambda o: (-o["exposed_us"], o["op"], o["bytes"]))
    share = exposed / step_us if step_us > 0 else 0.0
    return {"rank": rank, "basis": "steps" if steps else "span", "steps": len(marked), "step_us": step_us,
            "compute_us": _length(_intersect(compute, window)), "comm_us": _length(comm_in),
            "exposed_us": exposed, "share": share, "flagged": share > THRESHOLD, "ops": ops}


def advice(row: dict, rows: list[dict] = ()) -> list[str]:
    """What to try for a flagged rank (a row of :func:`summary`; ``rows``: every rank's), likely first."""
    tips = []
    slow = max(rows, key=lambda r: r["compute_us"], default=row)
    more = slow["compute_us"] - row["compute_us"]
    if more > 0.1 * row["step_us"]:
        tips.append(f"balance the work: rank {slow['rank']} computes {more / 1e3:.1f} ms more, and part of this "
                    f"rank's exposed time is waiting for it inside the collectives")
    if not row["compute_us"]:
        tips.append("no compute regions are marked, so all communication counts as exposed: mark compute with "
                    "`with pyxccl.compute(): ...` to measure what overlaps")
    if row["comm_us"] and row["exposed_us"] >= 0.5 * row["comm_us"]:
        tips.append("overlap communication with compute: issue collectives with async_op=True and wait() only "
                    "where the result is needed (torch: DDP's bucketed all_reduce during backward)")
    if row["ops"]:
        o = row["ops"][0]
        where = f"{o['op']} of {_size(o['bytes'])}: {o['calls']} calls, {o['exposed_us'] / 1e3:.1f} ms exposed"
        if o["bytes"] < 256 << 10:
            tips.append(f"fewer, larger messages ({where}): bucket small tensors into one buffer, or accumulate "
                        f"gradients over more steps before synchronizing")
        else:
            tips.append(f"send fewer bytes ({where}): compress (float16/bfloat16 gradients, DDP's "
                        f"fp16_compress_hook, PowerSGD), or accumulate gradients over more steps")
    tips.append("check the algorithm and the topology: `pyxccl info` shows the tuner's choices and PYXCCL_ALGO "
                "forces one; across hosts, keep traffic inside hosts (hierarchical algorithms, model "
                "parallelism) or use a faster network")
    return tips


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_summary(rows: list[dict]) -> str:
    """The table ``pyxccl trace summary`` prints, then what to try for each flagged rank."""
    lines = ["step: the regions named \"step\" when the rank marked any (basis steps), else the span from its "
             "first event to its last (basis span)",
             "exposed: communication not overlapped with compute regions; share = exposed / step",
             f"{'rank':>4}  {'basis':<9} {'step ms':>10} {'comm ms':>10} {'exposed ms':>10} {'share':>7}"]
    for r in rows:
        basis = f"{r['steps']} steps" if r["basis"] == "steps" else "span"
        flag = f"  > {THRESHOLD:.0%}" if r["flagged"] else ""
        lines.append(f"{r['rank']:>4}  {basis:<9} {r['step_us'] / 1e3:>10.3f} {r['comm_us'] / 1e3:>10.3f} "
                     f"{r['exposed_us'] / 1e3:>10.3f} {r['share']:>7.1%}{flag}")
    for r in rows:
        if r["unfinished"]:
            lines.append(f"rank {r['rank']}: {r['unfinished']} calls have no recorded end (queued or running "
                         f"when the trace was written): not counted")
    for r in rows:
        if r["flagged"]:
            lines.append(f"rank {r['rank']}: {r['share']:.1%} of the step is communication not hidden behind "
                         f"compute, above {THRESHOLD:.0%}: communication is the bottleneck. Try:")
            lines += [f"  - {t}" for t in advice(r, rows)]
    return "\n".join(lines)
