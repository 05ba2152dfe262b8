"""The flight recorder: every communicator's last operations, dumped when something goes wrong.

Each call on a communicator appends one entry (a list, so that finishing it
is two stores): its numbers, what it moves and when it queued, started and
ended. ``PYXCCL_RECORD`` (default 2000) entries are kept per communicator.
When a communicator fails (a timeout, a lost peer, a mismatch, an abort) or
the process gets SIGTERM or SIGUSR1, and ``PYXCCL_DUMP_DIR`` is set, the
process writes the entries of all its communicators to
``DIR/pyxccl-rank<world rank>.json``; ``pyxccl doctor DIR`` reads every
rank's file and says who is stuck where (``pyxccl.doctor``).

With ``PYXCCL_TRACE=DIR`` every entry is kept, for the timeline
(``pyxccl.trace``). Cost when neither is set: one list and two clock reads
per call (well under a microsecond).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections import deque

from .. import _env

# Fields of an entry as dumps and ``expand`` give them (the indices below are into that form).
FIELDS = ("seq", "coll_seq", "op", "dtype", "count", "bytes", "algorithm", "peer",
          "issued", "started", "ended", "state", "error")
SEQ, CSEQ, OP, DTYPE, COUNT, BYTES, ALGO, PEER, ISSUED, STARTED, ENDED, STATE, ERROR = range(len(FIELDS))
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
# An entry in memory is shorter (the call's description is one shared tuple): made on every call. The
# blocking native call (_native.c's Call) makes and ends entries of this layout in C; tests/test_floor.py
# compares them with Recorder.begin's and ended's.
_WHAT, _PEER, _ISSUED, _STARTED, _ENDED, _STATE, _ERROR = range(2, 9)


def expand(e: list) -> list:
    """An entry in the order of FIELDS."""
    return [e[0], e[1], *e[_WHAT], *e[_PEER:]]


def capacity() -> int:
    """How many operations a communicator's recorder keeps (``PYXCCL_RECORD``, default 2000)."""
    return _env.get("PYXCCL_RECORD")


class Recorder:
    """The last operations of one communicator (see the module docstring)."""
    __slots__ = ("ops", "trace")

    def __init__(self):
        self.ops: deque = deque(maxlen=capacity())
        self.trace: list | None = [] if os.environ.get("PYXCCL_TRACE") else None   # every entry, for the timeline

    def issue(self, seq: int, cseq: int, what: tuple, peer=None) -> list:
        """A new entry for call ``seq`` (collective number ``cseq``, 0 for point to point); ``what`` =
        (op, dtype name, count, bytes, algorithm)."""
        e = [seq, cseq, what, peer, time.time(), 0.0, 0.0, QUEUED, None]
        self.ops.append(e)
        if self.trace is not None:
            self.trace.append(e)
        return e

    def begin(self, seq: int, cseq: int, what: tuple) -> list:
        """A new entry for a call that starts running now (a prepared call)."""
        now = time.time()
        e = [seq, cseq, what, None, now, now, 0.0, RUNNING, None]
        self.ops.append(e)
        if self.trace is not None:
            self.trace.append(e)
        return e

    def last_done(self) -> int:
        """The number of the last collective completed here (0: none kept)."""
        for e in reversed(self.ops):
            if e[1] and e[_STATE] == DONE:
                return e[1]
        return 0

    def entries(self) -> list[dict]:
        return [dict(zip(FIELDS, expand(e))) for e in list(self.ops)]


def started(e: list) -> None:
    e[_STARTED], e[_STATE] = time.time(), RUNNING


def ended(e: list, err: BaseException | None = None) -> None:
    e[_ENDED] = time.time()
    if err is None:
        e[_STATE] = DONE
    else:
        e[_STATE], e[_ERROR] = FAILED, {"type": type(err).__name__, "peer": getattr(err, "peer", None),
                                      "message": str(err)}


# --- dumps ---------------------------------------------------------------------------------

_contexts: "set" = set()          # the live contexts of this process (a WeakSet would cost a lookup per call)
_dump_lock = threading.Lock()


def register(ctx) -> None:
    _contexts.add(ctx)
    if os.environ.get("PYXCCL_DUMP_DIR"):
        _install_signals()


def unregister(ctx) -> None:
    _contexts.discard(ctx)


def live() -> list:
    """The contexts of this process not yet closed."""
    return list(_contexts)


# Called with a context as it closes (after its engine stopped): the tools above the framework (the
# timeline, trace.py) register here, so that the framework never imports them.
on_close: list = []


def closed(ctx) -> None:
    """Context.close() calls this: every hook of ``on_close``, in order."""
    for hook in list(on_close):
        hook(ctx)


def dump(reason: str) -> str | None:
    """Write every live communicator's entries to ``PYXCCL_DUMP_DIR`` (returns the path, or None
    when it is not set or cannot be written)."""
    where = os.environ.get("PYXCCL_DUMP_DIR")
    if not where or not _contexts:
        return None
    ctxs = sorted(_contexts, key=lambda c: (c.parent is not None, c.id))
    world_rank = ctxs[0].mesh.rank
    doc = {"world_rank": world_rank, "pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
           "reason": reason, "fields": FIELDS,
           "communicators": [_describe(c) for c in ctxs]}
    path = os.path.join(where, f"pyxccl-rank{world_rank}.json")
    with _dump_lock:
        try:
            write_json(path, doc)
        except OSError:
            return None
    return path


def write_json(path: str, doc) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a reader never sees half a file); OSError if not."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, default=str)
    os.replace(tmp, path)


def _describe(ctx) -> dict:
    err = ctx.error
    return {"id": f"{ctx.id:08x}", "rank": ctx.rank, "size": ctx.size, "world_ranks": ctx.world_ranks,
            "world": ctx.parent is None, "coll_seq": ctx.coll_seq, "closed": ctx.closed,
            "error": None if err is None else {"type": type(err).__name__, "peer": getattr(err, "peer", None),
                                               "message": str(err)},
            "ops": [expand(e) for e in list(ctx.recorder.ops)]}


_installed = False


def _install_signals() -> None:
    """SIGUSR1 dumps; SIGTERM dumps, then does what it did before (a launcher stopping the job)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True

    def on_usr1(signum, frame):
        dump("SIGUSR1")

    def on_term(signum, frame):
        dump("SIGTERM")
        signal.signal(signum, prev_term if prev_term is not None else signal.SIG_DFL)
        if callable(prev_term):
            prev_term(signum, frame)
        else:
            os.kill(os.getpid(), signum)
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGUSR1, on_usr1)
    prev_term = signal.getsignal(signal.SIGTERM)
    if prev_term in (signal.SIG_DFL, None) or callable(prev_term):
        signal.signal(signal.SIGTERM, on_term)
