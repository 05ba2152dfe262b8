"""`pyxccl run`: start N local ranks, like torchrun's standalone mode.

Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; its output lines come out prefixed with ``[rank]``. When a child
fails, the others are stopped (SIGTERM, then SIGKILL after ``grace`` seconds)
and the launcher returns the failing child's exit code.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _command(cmd: list[str]) -> list[str]:
    if not cmd:
        raise ValueError("pyxccl run: give a script or command to run")
    if cmd[0] == "-m" or cmd[0].endswith(".py"):
        return [sys.executable, *cmd]
    return list(cmd)


def _pump(stream, out, prefix: bytes) -> None:
    for line in iter(stream.readline, b""):
        out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        out.flush()
    stream.close()


def run(nproc: int, cmd: list[str], *, master_addr: str = "127.0.0.1", master_port: int | None = None,
        env: dict | None = None, grace: float = 5.0) -> int:
    """Run ``cmd`` as ``nproc`` ranks; return 0, or the first failing rank's exit code."""
    if nproc < 1:
        raise ValueError(f"pyxccl run: -n must be at least 1, not {nproc}")
    argv = _command(cmd)
    port = master_port or free_port(master_addr)
    procs, pumps = [], []
    out, err = sys.stdout.buffer, sys.stderr.buffer
    for r in range(nproc):
        child_env = dict(os.environ if env is None else env)
        child_env.update(RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc),
                         GROUP_RANK="0", MASTER_ADDR=master_addr, MASTER_PORT=str(port),
                         PYXCCL_LAUNCHER="pyxccl", PYTHONUNBUFFERED="1")
        p = subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        for stream, sink in ((p.stdout, out), (p.stderr, err)):
            t = threading.Thread(target=_pump, args=(stream, sink, f"[{r}] ".encode()), daemon=True)
            t.start()
            pumps.append(t)

    def stop(sig=signal.SIGTERM):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    previous = {s: signal.signal(s, lambda signum, _f: stop(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        while [p.poll() for p in procs].count(None):      # poll every child, no short-circuit
            failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                r, rc = failed[0]
                code = rc if rc > 0 else 128 - rc
                sys.stderr.write(f"pyxccl run: rank {r} exited with code {code}; stopping the other ranks\n")
                stop()
                deadline = time.monotonic() + grace
                while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                    time.sleep(0.05)
                stop(signal.SIGKILL)
                break
            time.sleep(0.05)
        for p in procs:
            p.wait()
        if code == 0:
            for r, p in enumerate(procs):
                if p.returncode != 0:
                    code = p.returncode if p.returncode > 0 else 128 - p.returncode
                    sys.stderr.write(f"pyxccl run: rank {r} exited with code {code}\n")
                    break
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for t in pumps:
            t.join(timeout=2)
    return code
