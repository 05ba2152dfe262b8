"""Tuner choices shared by the processes of a host: one prices, the others read its answer.

Every rank of a communicator prices the same (primitive, size) from the same inputs and reaches the
same choice. Where a host runs more ranks than it has cores that is the same work once per rank on
the same cores: 64 ranks on 2 cores spent a second on their first 8-byte allreduce. So the first
process to lock a host's table file prices and writes its choice; the others wait on the lock
(``flock``: a killed holder releases it) and read. The file is named by a digest of everything a
choice depends on (the tuner's inputs, pyxccl's version, the code of the cost model and of every
registered algorithm's builder): a table is only read for the inputs that wrote it, and a job
started later with the same layout and figures finds its choices made. Tables untouched for longer
than the link figures may live (``PYXCCL_LINKS_MAX_AGE``) are removed. ``PYXCCL_TUNER_SHARE=0``: every
process prices for itself.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import time

from .. import _env
from .._version import __version__
from ..algorithms import registry
from ..primitives import PRIMITIVES

_CODE: str | None = None


def _code_digest() -> str:
    """What the choices are computed with: the source of the cost model, the schedules and the
    algorithms, and the code of builders registered from outside pyxccl."""
    global _CODE
    if _CODE is None:
        h = hashlib.sha256(__version__.encode())
        top = os.path.dirname(os.path.dirname(__file__))
        files = [os.path.join(top, f) for f in ("schedule.py", "walk.py", "primitives.py")]
        for d in ("tuning", "algorithms"):
            files += sorted(os.path.join(top, d, f) for f in os.listdir(os.path.join(top, d))
                            if f.endswith((".py", ".so")))
        for f in files:
            with open(f, "rb") as fh:
                h.update(fh.read())
        for primitive in sorted(PRIMITIVES):
            for algo in registry.records(primitive):
                code = getattr(algo.build, "__code__", None)
                h.update(f"{primitive}/{algo.name}".encode())
                if code is not None and not algo.build.__module__.startswith("pyxccl."):
                    h.update(code.co_code + repr(code.co_consts).encode())
        _CODE = h.hexdigest()
    return _CODE


class SharedTable:
    """The choices of one tuner's inputs (``inputs``: anything with a stable repr), in a file under
    ``directory``; None from :meth:`open` where sharing is off or the directory cannot be written."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def open(cls, directory: str, inputs, max_age: float) -> "SharedTable | None":
        if not _env.get("PYXCCL_TUNER_SHARE"):
            return None
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError:
            return None
        if not os.access(directory, os.W_OK):
            return None
        digest = hashlib.sha256(f"{_code_digest()}\n{inputs!r}".encode()).hexdigest()[:32]
        _prune(directory, max_age)
        return cls(os.path.join(directory, f"tuner-{digest}.json"))

    def choice(self, key: str, compute) -> str:
        """The choice under ``key``: read from the table, else ``compute()``d here and written.

        The first process takes the table's lock alone and prices; the others wait sharing the lock,
        so that when it is written they all read at once. Taking it alone one after another, 63
        readers of a 64-rank job on 2 cores took 90-110 ms after the pricer's 60 ms."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return compute()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:          # being priced (or read) by another process: wait, read
                fcntl.flock(fd, fcntl.LOCK_SH)
                name = _read(fd).get(key)
                if isinstance(name, str):
                    return name
                fcntl.flock(fd, fcntl.LOCK_EX)       # another key was priced: price this one (read anew)
            table = _read(fd)
            name = table.get(key)
            if not isinstance(name, str):
                name = compute()
                table[key] = name
                data = json.dumps(table).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
            return name
        finally:
            os.close(fd)            # releases the lock


def _read(fd: int) -> dict:
    """The table in ``fd`` from its start; empty where torn or foreign (priced anew and rewritten)."""
    raw, at = b"", 0
    while chunk := os.pread(fd, 1 << 16, at):
        raw += chunk
        at += len(chunk)
    try:
        table = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return table if isinstance(table, dict) else {}


def _prune(directory: str, max_age: float) -> None:
    now = time.time()
    for f in glob.glob(os.path.join(directory, "tuner-*.json")):
        try:
            if now - os.path.getmtime(f) > max_age:
                os.remove(f)
        except OSError:
            pass
