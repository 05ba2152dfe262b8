"""Emulated hosts for tests: network namespaces made by tests/emuhosts (mkhosts.sh, inhost.sh, rmhosts.sh).

>>> with EmulatedHosts(3) as hosts:                                  # doctest: +SKIP
...     p = hosts.popen(0, ["hostname"], stdout=subprocess.PIPE)     # runs "on" host 0

Each host is a namespace with its own hostname, IPv4 address (``subnet.1``, ``.2``, ...), abstract
Unix sockets and /dev/shm, joined to the others by a bridge; /tmp and the rest of the file system
are shared. Every set gets a prefix of its own (``px`` + letters from this process's id and a
serial number, so two sets of one session, two test sessions at once, and the benchmarks' ``h0``..
hosts never meet; the subnet only exists inside the namespaces, so sets may share it). Tear-down kills every process left in the namespaces, runs rmhosts.sh and
checks that ``ip netns list`` no longer shows any of them. Sets left by a test session that died
(its owner process is gone) are removed on the next start.

Needs root, ``ip`` and ``unshare``: :func:`unavailable` says why not, for a skip.
"""
from __future__ import annotations

import os
import shutil
import signal
import string
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NETNS_DIR = Path(os.environ.get("PYXCCL_NETNS_DIR", HERE / "emuhosts"))
OWNERS = Path("/run/pyxccl-test-netns")        # one file per live set: its prefix, holding "pid start-time"


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"emulated hosts need the {tool!r} command"
    missing = [s for s in ("mkhosts.sh", "inhost.sh", "rmhosts.sh") if not (NETNS_DIR / s).exists()]
    if missing:
        return f"emulated hosts need {', '.join(missing)} in {NETNS_DIR} (set PYXCCL_NETNS_DIR)"
    return None


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


_made = 0          # sets made by this process so far


def _prefix_for(pid: int, serial: int) -> str:
    # mkhosts.sh wants ^[a-z][a-z0-9-]{0,7}$; "px" and six letters (26**6 > 26 * pid_max: one
    # prefix per process and serial) -- letters only, so that no prefix is another one followed
    # by digits (rmhosts.sh of "pxb" takes "pxb1"'s hosts for its own).
    letters, n = "", pid * 26 + serial % 26
    for _ in range(6):
        n, d = divmod(n, 26)
        letters += string.ascii_lowercase[d]
    return "px" + letters


class EmulatedHosts:
    """``n`` emulated hosts ``prefix0..`` on ``subnet``.0/24 (host i at ``subnet.(i+1)``)."""

    def __init__(self, n: int, *, subnet: str = "10.78.0", rate: str | None = None, prefix: str | None = None):
        global _made
        self.n, self.subnet, self.rate = n, subnet, rate
        if prefix is None:
            prefix, _made = _prefix_for(os.getpid(), _made), _made + 1
        self.prefix = prefix
        self.names = [f"{self.prefix}{i}" for i in range(n)]
        self.addrs = [f"{subnet}.{i + 1}" for i in range(n)]
        self._procs: list[subprocess.Popen] = []
        self.made = False

    # --- life cycle ------------------------------------------------------------------------------
    def create(self) -> "EmulatedHosts":
        _remove_orphans()
        for _ in range(5):            # (another session may remove the empty directory meanwhile)
            try:
                OWNERS.mkdir(parents=True, exist_ok=True)
                (OWNERS / self.prefix).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
                break
            except FileNotFoundError:
                continue
        self.made = True       # from here on, destroy() has something to do (mkhosts may half-fail)
        args = [str(NETNS_DIR / "mkhosts.sh"), "-n", str(self.n), "-p", self.prefix, "-s", self.subnet]
        if self.rate:
            args += ["-r", self.rate]
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            self.destroy()
            raise RuntimeError(f"mkhosts.sh failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
        return self

    def destroy(self) -> None:
        """Kill what runs in the hosts, remove them, and check that they are gone (RuntimeError if not)."""
        if not self.made:
            return
        self.made = False
        for p in self._procs:
            _killpg(p)
        _kill_in(self._mine())
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _rmhosts(self.prefix)
        left = self._mine()
        if left:
            raise RuntimeError(f"namespaces {left} are still there after rmhosts.sh")
        (OWNERS / self.prefix).unlink(missing_ok=True)
        try:
            OWNERS.rmdir()            # the last set of any session: leave nothing behind
        except OSError:
            pass

    def _mine(self) -> list[str]:
        return [ns for ns in namespaces() if _owned_by(ns, self.prefix)]

    def __enter__(self) -> "EmulatedHosts":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()

    # --- running things on a host ----------------------------------------------------------------
    def popen(self, host: int, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` on host ``host`` (through inhost.sh), in a process group of its own."""
        p = subprocess.Popen([str(NETNS_DIR / "inhost.sh"), self.names[host], *argv], start_new_session=True,
                             stdin=subprocess.DEVNULL, **kw)
        self._procs.append(p)
        return p

    def pids(self) -> dict[str, list[int]]:
        """Processes running in each of this set's namespaces."""
        return {ns: _pids_in(ns) for ns in self._mine()}

    def kill_all(self) -> None:
        for p in self._procs:
            _killpg(p)
        _kill_in(self._mine())


def _owned_by(ns: str, prefix: str) -> bool:
    rest = ns[len(prefix):]
    return ns.startswith(prefix) and (rest == "sw" or rest.isdigit())


def _pids_in(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10).stdout
    return [int(x) for x in out.split() if x.isdigit()]


def _killpg(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_in(names: list[str], wait: float = 10.0) -> None:
    """SIGKILL every process in the namespaces ``names``, and wait until none is left."""
    deadline = time.monotonic() + wait
    while True:
        pids = [pid for ns in names for pid in _pids_in(ns)]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _rmhosts(prefix: str) -> None:
    subprocess.run([str(NETNS_DIR / "rmhosts.sh")], env=dict(os.environ, PREFIX=prefix), capture_output=True,
                   timeout=60)


def _remove_orphans() -> None:
    """Remove the sets of earlier test sessions that died without tearing theirs down."""
    if not OWNERS.is_dir():
        return
    for f in OWNERS.iterdir():
        try:
            pid, start = f.read_text().split()
        except (OSError, ValueError):
            continue
        if _start_time(int(pid)) == start:
            continue                   # its session is still running
        _kill_in([ns for ns in namespaces() if _owned_by(ns, f.name)])
        _rmhosts(f.name)
        f.unlink(missing_ok=True)
