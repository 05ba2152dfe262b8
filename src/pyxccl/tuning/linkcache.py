"""The file of measured link figures (``links.json``): where it is, what makes an entry ours,
and reading and writing it safely.

A figure measured once is trusted only while it can still describe this machine: every entry
carries a fingerprint of the machine and of the software that measured it, and its age. An entry
of another machine (a home directory shared by hosts), of another pyxccl, Python, numpy or kernel,
or older than ``PYXCCL_LINKS_MAX_AGE`` seconds is not used (and is measured again). The file holds
one entry per fingerprint, so hosts sharing a home directory don't overwrite each other's.

A file that is not what pyxccl writes (not JSON, wrong types, strings or lists where numbers
belong, negative, NaN or infinite figures, missing keys) is ignored with one warning and rewritten:
a hand-edited or truncated file must not make collectives fail or slow, silently or not.

Writes go to a temporary file renamed over the old one (readers never see half a file), under an
advisory lock (jobs on one host finishing their probes at once don't lose each other's entries).

File layout (format 2)::

    {"format": 2, "entries": {"<digest of fingerprint>": {"fingerprint": {...}, "measured": <unix time>,
        "links": {"shm": [alpha, beta], "tcp_local": [...], "seg:2": [...]}, "gamma": g, "copy": c,
        "mem": m}}}

(``mem`` came later: an entry without it is completed at the next init.)

``seg:N`` is the round of the one-host segment with N ranks taking part (it depends on N).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import socket
import time
import warnings
from dataclasses import dataclass, field

from .. import _env
from ..transport.topology import job_cpus
from .cost import Link

FORMAT = 2
DEFAULT_MAX_AGE = 7 * 24 * 3600      # a week: hardware settings, firmware, load patterns drift
_MAX_ENTRIES = 32                    # hosts sharing one file (oldest dropped beyond)
_CLASSES = ("shm", "tcp_local")      # what one host's file may hold besides seg:N ("tcp" is per job)
# Bounds of what a figure can be: beyond them it is not a measurement of a link.
_MAX_ALPHA, _MAX_PER_BYTE = 1.0, 1e-6       # 1 s per message; 1 MB/s


class LinkCacheWarning(UserWarning):
    """The file of link figures could not be used or written (the figures are measured instead)."""


def cache_path() -> str:
    """``PYXCCL_LINKS``, else ``$XDG_CACHE_HOME/pyxccl/links.json``, else ``~/.cache/pyxccl/links.json``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache")    # XDG: ignore relative paths
    return os.environ.get("PYXCCL_LINKS") or os.path.join(base, "pyxccl", "links.json")


def max_age() -> float:
    """Seconds an entry stays valid (``PYXCCL_LINKS_MAX_AGE``, default a week)."""
    return _env.get("PYXCCL_LINKS_MAX_AGE", DEFAULT_MAX_AGE)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint() -> dict:
    """What the figures depend on besides load: the machine, its cores for us, and the software."""
    import numpy
    from .._version import __version__
    return {"format": FORMAT, "pyxccl": __version__, "host": socket.gethostname(), "cpu": _cpu_model(),
            "cpus": os.cpu_count() or 0, "affinity": job_cpus(), "kernel": platform.release(),
            "python": platform.python_version(), "numpy": numpy.__version__}


def digest(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Entry:
    """One machine's figures: links by class name (``seg:N`` for the segment's round), the per-byte
    rates of a reduction and of a copy, and when the oldest of them was measured."""
    links: dict[str, Link] = field(default_factory=dict)
    gamma: float = 0.0
    copy: float = 0.0
    measured: float = 0.0
    mem: float = 0.0            # seconds per byte read or written in memory (0: not measured yet)

    def to_json(self, fp: dict) -> dict:
        return {"fingerprint": fp, "measured": self.measured, "gamma": self.gamma, "copy": self.copy,
                "mem": self.mem, "links": {k: [v.alpha, v.beta] for k, v in sorted(self.links.items())}}


# --- validation ---------------------------------------------------------------------------------

def _number(v, what: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if type(v) not in (int, float):          # bool is an int: refused too
        raise ValueError(f"{what} is {type(v).__name__} {v!r}, not a number")
    if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
        raise ValueError(f"{what} = {v!r} is out of range ({'(' if lo_open else '['}{lo}, {hi}])")
    return float(v)


def _link_name(k) -> bool:
    if k in _CLASSES:
        return True
    return isinstance(k, str) and k.startswith("seg:") and k[4:].isascii() and k[4:].isdigit() and int(k[4:]) >= 2


def parse_entry(e, where: str) -> tuple[dict, Entry]:
    """(fingerprint, Entry) of a decoded entry; ValueError naming what is wrong."""
    if not isinstance(e, dict):
        raise ValueError(f"{where} is {type(e).__name__}, not an object")
    missing = [k for k in ("fingerprint", "measured", "links", "gamma", "copy") if k not in e]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    fp = e["fingerprint"]
    if not isinstance(fp, dict) or not all(isinstance(k, str) and type(v) in (str, int) for k, v in fp.items()):
        raise ValueError(f"{where}.fingerprint is not an object of strings and integers")
    links = e["links"]
    if not isinstance(links, dict):
        raise ValueError(f"{where}.links is {type(links).__name__}, not an object")
    out = {}
    for k, v in links.items():
        if not _link_name(k):
            raise ValueError(f"{where}.links has an unknown link class {k!r}")
        if not isinstance(v, list) or len(v) != 2:
            raise ValueError(f"{where}.links[{k!r}] is {v!r}, not [alpha, beta]")
        out[k] = Link(_number(v[0], f"{where}.links[{k!r}] alpha", 0.0, _MAX_ALPHA, lo_open=True),
                      _number(v[1], f"{where}.links[{k!r}] beta", 0.0, _MAX_PER_BYTE))
    return fp, Entry(out, _number(e["gamma"], f"{where}.gamma", 0.0, _MAX_PER_BYTE, lo_open=True),
                     _number(e["copy"], f"{where}.copy", 0.0, _MAX_PER_BYTE, lo_open=True),
                     _number(e["measured"], f"{where}.measured", 0.0, 1e12),
                     _number(e.get("mem", 0.0), f"{where}.mem", 0.0, _MAX_PER_BYTE))


def parse(doc) -> tuple[dict, list[str], bool]:
    """(valid entries by digest as (fingerprint, Entry), problems found, whether the format is ours).

    A file of another format is not a problem (an older pyxccl wrote it): it is replaced quietly.
    """
    if not isinstance(doc, dict):
        return {}, [f"the file holds a {type(doc).__name__}, not an object"], True
    if doc.get("format") != FORMAT:
        if type(doc.get("format")) is int or ("format" not in doc and "links" in doc):
            return {}, [], False
        return {}, [f"'format' is {doc.get('format')!r}, not {FORMAT}"], True
    entries = doc.get("entries")
    if not isinstance(entries, dict):
        return {}, [f"'entries' is {type(entries).__name__}, not an object"], True
    good, problems = {}, []
    for key, e in entries.items():
        try:
            good[key] = parse_entry(e, f"entries[{key!r}]")
        except ValueError as err:
            problems.append(str(err))
    return good, problems, True


def _read(path: str) -> tuple[dict, list[str], bool]:
    """parse() of the file; a missing file is empty, an unreadable or undecodable one a problem."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):     # not there (a bad directory: store() says so)
        return {}, [], True
    except OSError as e:
        return {}, [f"it cannot be read ({e.strerror or e})"], True
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:         # UnicodeDecodeError is a ValueError
        return {}, [f"it is not JSON ({str(e)[:80]})"], True
    return parse(doc)


# --- the two operations ---------------------------------------------------------------------------

def load(path: str, fp: dict, now: float | None = None) -> tuple[Entry | None, str]:
    """This machine's entry in ``path`` if it is valid, ours and fresh, else None; and why not
    (for the log). A malformed file warns once (LinkCacheWarning) naming the file and the problem."""
    now = time.time() if now is None else now
    entries, problems, ours = _read(path)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        warnings.warn(f"pyxccl: ignoring link figures in {path}: {problems[0]}{more}. pyxccl measures the links "
                      f"again and rewrites the file; nothing to do unless this repeats (then delete the file, or "
                      f"set PYXCCL_LINKS to another path).", LinkCacheWarning, stacklevel=2)
    if not ours:
        return None, "written by another pyxccl version"
    got = entries.get(digest(fp))
    if got is None or got[0] != fp:
        return None, "no entry for this machine" if not entries else "no entry with this machine's fingerprint"
    entry, limit = got[1], max_age()
    if not -60.0 <= now - entry.measured <= limit:     # a minute of clock steps; a future time is not trusted
        return None, f"measured {(now - entry.measured) / 3600:.1f} h ago (PYXCCL_LINKS_MAX_AGE={limit:.0f} s)"
    return entry, "cached"


@contextlib.contextmanager
def _locked(path: str):
    """An advisory lock beside ``path`` (none where the file system refuses: the rename keeps the
    file whole anyway, only a concurrent entry could be lost)."""
    fd = None
    try:
        import fcntl
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (OSError, ImportError):
        pass
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)          # releases the lock


def store(path: str, fp: dict, entry: Entry) -> bool:
    """Put this machine's ``entry`` into ``path`` (keeping other machines' valid entries); atomic.
    False, with a warning naming the file and what to do, when it cannot be written."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with _locked(path):
            entries, _, _ = _read(path)           # under the lock: nobody writes between read and rename
            entries[digest(fp)] = (fp, entry)
            keep = sorted(entries.items(), key=lambda kv: -kv[1][1].measured)[:_MAX_ENTRIES]
            doc = {"format": FORMAT, "entries": {k: e.to_json(f) for k, (f, e) in keep}}
            tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
        return True
    except OSError as e:
        warnings.warn(f"pyxccl: cannot write link figures to {path} ({e.strerror or e}); they will be measured "
                      f"at every init. Set PYXCCL_LINKS to a writable file.", LinkCacheWarning, stacklevel=2)
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
