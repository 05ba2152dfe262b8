"""`pyxccl run`: start N local ranks, like torchrun's standalone mode.

Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK=0,
MASTER_ADDR, MASTER_PORT, PYXCCL_LAUNCHER=pyxccl and PYTHONUNBUFFERED=1; its
stdout and stderr lines come out on ours, prefixed with ``[rank] ``. When a
child fails, the others are stopped (SIGTERM to their process groups, SIGKILL
after ``grace`` seconds) and the launcher returns the failing child's exit
code (128 + signal number for a signal death).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from ._errors import InvalidArgumentError

__all__ = ["run", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the store binds it soon after)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, 0))
        except OSError:       # a name this host cannot bind: any local port will do
            s.bind(("", 0))
        return s.getsockname()[1]


def _command(cmd: list[str]) -> list[str]:
    if not cmd:
        raise InvalidArgumentError("pyxccl run: give a script or command to run", op="run")
    if cmd[0] == "-m" or cmd[0].endswith(".py"):
        return [sys.executable, *cmd]
    return list(cmd)


def _exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def _describe(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} (exit code {128 - returncode})"


class _Out:
    """Whole lines to one of our streams, from several threads (bytes, so any encoding passes through)."""

    def __init__(self, stream, lock: threading.Lock):
        self.stream, self.lock = stream, lock

    def write(self, data: bytes) -> None:
        with self.lock:
            buf = getattr(self.stream, "buffer", None)
            if buf is not None:
                self.stream.flush()           # keep order with text written to the stream itself
                buf.write(data)
                buf.flush()
            else:
                self.stream.write(data.decode(errors="replace"))
                self.stream.flush()


def _pump(stream, out: _Out, prefix: bytes) -> None:
    try:
        for line in iter(stream.readline, b""):
            out.write(prefix + (line if line.endswith(b"\n") else line + b"\n"))
    except (OSError, ValueError):
        pass                                  # our stream went away; the child goes on
    finally:
        stream.close()


def run(nproc: int, cmd: list[str], *, master_addr: str = "127.0.0.1", master_port: int | None = None,
        env: dict | None = None, grace: float = 5.0) -> int:
    """Run ``cmd`` as ``nproc`` local ranks; return 0, or the first failing rank's exit code.

    ``cmd``: ``["script.py", args...]`` and ``["-m", "module", args...]`` run
    with this Python; anything else runs as is. ``env`` replaces
    ``os.environ`` as the children's base environment (as with subprocess).
    ``master_port`` defaults to a free port. SIGINT/SIGTERM sent to the
    launcher are forwarded to the children (a second one kills them).
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise InvalidArgumentError(f"pyxccl run: -n must be a positive number of ranks, not {nproc!r}", op="run")
    if master_port is not None and not 0 < master_port < 65536:
        raise InvalidArgumentError(f"pyxccl run: --master-port {master_port} is not a port (1-65535)", op="run")
    argv = _command(cmd)
    port = master_port or free_port(master_addr)
    lock = threading.Lock()
    out, err = _Out(sys.stdout, lock), _Out(sys.stderr, lock)
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    signals_seen = []

    def stop(sig: int) -> None:
        # Every child leads its own process group: signal the group, so the child's own
        # subprocesses go too (even when the child itself already exited).
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def on_signal(signum, _frame) -> None:
        signals_seen.append(signum)
        stop(signum if len(signals_seen) == 1 else signal.SIGKILL)

    previous = {}
    if threading.current_thread() is threading.main_thread():    # signal.signal works only there
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        for r in range(nproc):
            if signals_seen:
                break
            child_env = dict(os.environ if env is None else env)
            child_env.update(RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc),
                             GROUP_RANK="0", MASTER_ADDR=master_addr, MASTER_PORT=str(port),
                             PYXCCL_LAUNCHER="pyxccl", PYTHONUNBUFFERED="1")
            try:
                p = subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                err.write(f"pyxccl run: cannot start rank {r}: {argv[0]}: {e.strerror or e}; check the command "
                          f"name and that it is executable\n".encode())
                code = 127 if isinstance(e, FileNotFoundError) else 126
                break
            procs.append(p)
            for stream, sink in ((p.stdout, out), (p.stderr, err)):
                t = threading.Thread(target=_pump, args=(stream, sink, f"[{r}] ".encode()), daemon=True)
                t.start()
                pumps.append(t)
        while code == 0 and None in [p.poll() for p in procs]:     # a list: poll every child, no short-circuit
            failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                r, rc = failed[0]
                code = _exit_code(rc)
                err.write(f"pyxccl run: rank {r} {_describe(rc)}; stopping the other ranks\n".encode())
                break
            time.sleep(0.02)
        if code == 0:                       # all exited: one may still have failed at the very end
            for r, p in enumerate(procs):
                if p.returncode:
                    code = _exit_code(p.returncode)
                    err.write(f"pyxccl run: rank {r} {_describe(p.returncode)}\n".encode())
                    break
        if code != 0:
            stop(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while None in [p.poll() for p in procs] and time.monotonic() < deadline:
                time.sleep(0.02)
            stop(signal.SIGKILL)
        for p in procs:
            p.wait()
    finally:
        if any(p.poll() is None for p in procs):     # we are leaving on an exception: leave no orphans
            stop(signal.SIGKILL)
        for s, h in previous.items():
            signal.signal(s, h)
        for t in pumps:
            t.join(timeout=2)   # a grandchild that kept the pipe open must not hold us up
    return code
