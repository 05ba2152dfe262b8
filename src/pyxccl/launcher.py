"""`pyxccl run`: start this node's ranks of a job, like torchrun (static rendezvous).

One host (torchrun --standalone)::

    pyxccl run -n 4 script.py

Several hosts: the same command on every host, each with its own
``--node-rank`` (torchrun's flags and meaning)::

    pyxccl run --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr A --master-port P script.py
    pyxccl run --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr A --master-port P script.py

Local rank ``l`` of node ``g`` gets RANK = g * nproc_per_node + l,
WORLD_SIZE = nnodes * nproc_per_node, LOCAL_RANK = l, LOCAL_WORLD_SIZE =
nproc_per_node, GROUP_RANK = g, GROUP_WORLD_SIZE = nnodes (and torchrun's
ROLE_RANK / ROLE_WORLD_SIZE, equal to RANK / WORLD_SIZE), MASTER_ADDR,
MASTER_PORT, PYXCCL_LAUNCHER=pyxccl and PYTHONUNBUFFERED=1; on one node also
PYXCCL_SECRET, a fresh random one per job unless the environment has one
(nodes cannot agree on a fresh one: with several, export the same
PYXCCL_SECRET on every node, else the job runs unauthenticated and rank 0
warns). Rank 0 (on node 0)
serves the store at MASTER_ADDR:MASTER_PORT, so MASTER_ADDR must be node 0's
address as the other nodes reach it; with more than one node the port must be
given (each node would pick a different free one). Nodes with different
numbers of ranks (a pyxccl extension; torchrun gets there through its elastic
rendezvous): ``--nproc-per-node 2,1,2`` gives every node's count, the same
list on every node, and ranks are numbered node after node.

With more than one rank on the node, each gets OMP_NUM_THREADS=1 unless the
environment sets it (as torchrun does): otherwise every rank's numpy (OpenBLAS)
and torch start a pool of threads as large as the CPUs it sees, so a host's
threads would grow with its ranks times its cores.

When a node runs no more ranks than it has CPUs for us, each local rank is
bound to its own share of them (as MPI launchers bind by default): two ranks
that wait on each other are then never queued on one core while another core
runs something else. With more ranks than CPUs, local rank i is bound to CPU
i mod the CPUs (as Intel MPI pins by default): left to the scheduler, the
ranks that share a core changed from call to call, and a wait for one queued
behind another cost a time slice (4 ranks on 2 cores, 8 B allreduce: 20-25 us
bound, 27-150 us not; 16 ranks 320-380 us against 450-570; issue 26's job at
64 ranks 9.1 s against 9.4). ``PYXCCL_BIND=none`` turns it off; the children
learn the node's count from PYXCCL_JOB_CPUS.

Each child's stdout and stderr lines come out on ours, prefixed with its
global rank as ``[rank] ``. When a child fails, this node's other children are
stopped (SIGTERM to their process groups, SIGKILL after ``grace`` seconds) and
the launcher returns the failing child's exit code (128 + signal number for
a signal death); the other nodes' ranks see the lost peer
(:class:`pyxccl.PeerLostError`) and fail in turn.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

from . import _env
from ._errors import InvalidArgumentError

__all__ = ["run", "free_port", "node_ranks", "shares"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the store binds it soon after), below the
    kernel's ephemeral range where it has one: a port the kernel picks (a bind to port 0) is in that
    range, where any connection made meanwhile may be given it as its local end (a store that then
    fails with EADDRINUSE); below it only an explicit bind takes a port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    pick = secrets.SystemRandom()
    for _ in range(32 if low > 2048 else 0):
        port = pick.randrange(low // 2, low)
        with socket.socket(family) as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    with socket.socket(family) as s:
        try:
            s.bind((host, 0))
        except OSError:       # a name this host cannot bind: any local port will do
            s.bind(("", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (0 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


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


def _positive(value, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"pyxccl run: {flag} must be a positive integer, not {value!r}", op="run")
    return value


def node_ranks(nproc, nnodes: int = 1, node_rank: int = 0) -> tuple[int, int, int]:
    """(first global rank, ranks on this node, world size) of node ``node_rank``.

    ``nproc``: ranks per node, an int (every node the same, torchrun's
    ``--nproc-per-node``) or a sequence of ``nnodes`` ints (one per node, in
    node order). Raises InvalidArgumentError for values that do not fit.
    """
    nnodes = _positive(nnodes, "--nnodes")
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
        raise InvalidArgumentError(f"pyxccl run: --node-rank {node_rank!r} must be in 0..{nnodes - 1} "
                                   f"(--nnodes {nnodes})", op="run")
    if isinstance(nproc, (list, tuple)):
        counts = [_positive(c, "--nproc-per-node") for c in nproc]
        if len(counts) != nnodes:
            raise InvalidArgumentError(f"pyxccl run: --nproc-per-node lists {len(counts)} node(s) "
                                       f"({','.join(map(str, counts))}) but --nnodes is {nnodes}; give one "
                                       f"count per node, or one count for all", op="run")
    else:
        counts = [_positive(nproc, "--nproc-per-node (-n)")] * nnodes
    return sum(counts[:node_rank]), counts[node_rank], sum(counts)


def shares(local_n: int) -> list[set[int]] | None:
    """The CPUs each of ``local_n`` local ranks is bound to (consecutive, as even as can be; with more
    ranks than CPUs, one each, in turn), or None when they are not bound (PYXCCL_BIND=none, one rank)."""
    cpus = sorted(os.sched_getaffinity(0))
    if _env.get("PYXCCL_BIND") == "none" or local_n < 2:
        return None
    if local_n > len(cpus):
        return [{cpus[i % len(cpus)]} for i in range(local_n)]
    q, extra = divmod(len(cpus), local_n)
    bounds = [i * q + min(i, extra) for i in range(local_n + 1)]
    return [set(cpus[bounds[i]:bounds[i + 1]]) for i in range(local_n)]


def run(nproc, cmd: list[str], *, nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
        master_port: int | None = None, env: dict | None = None, grace: float = 5.0, bind: bool = True,
        keep_going: bool = False) -> int:
    """Run ``cmd`` as this node's ranks; return 0, or the first failing rank's exit code.

    ``nproc``: ranks per node (an int), or a list of every node's count.
    ``nnodes``/``node_rank``: the number of nodes and this one's place (see
    the module docstring for the ranks each child gets). ``cmd``:
    ``["script.py", args...]`` and ``["-m", "module", args...]`` run with this
    Python; anything else runs as is. ``env`` replaces ``os.environ`` as the
    children's base environment (as with subprocess). ``master_port``
    defaults to a free port on one node and must be given with several.
    SIGINT/SIGTERM sent to the launcher are forwarded to the children (a
    second one kills them). ``bind``: bind each local rank to its share of
    the CPUs (see :func:`shares`). ``keep_going``: a failed rank does not stop
    the others (a job that recovers with ``comm.shrink()``); the exit code is
    still the first failure's, once every rank has exited.
    """
    first, local_n, world = node_ranks(nproc, nnodes, node_rank)
    if master_port is not None and (isinstance(master_port, bool) or not isinstance(master_port, int)
                                    or not 0 < master_port < 65536):
        raise InvalidArgumentError(f"pyxccl run: --master-port {master_port!r} is not a port (1-65535)", op="run")
    if nnodes > 1 and master_port is None:
        raise InvalidArgumentError(f"pyxccl run: with --nnodes {nnodes}, give --master-port: the same free port "
                                   f"of the master's host (--master-addr {master_addr}) on every node", op="run")
    if not master_addr:
        raise InvalidArgumentError("pyxccl run: --master-addr is empty; give the address of node 0", op="run")
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
    cpus = os.sched_getaffinity(0)
    bound = shares(local_n) if bind else None
    base_env = dict(os.environ if env is None else env)
    if local_n > 1 and not base_env.get("OMP_NUM_THREADS"):
        base_env["OMP_NUM_THREADS"] = "1"       # (torchrun's default: thread pools sized to one rank's work)
    if nnodes == 1 and not base_env.get("PYXCCL_SECRET"):
        # The ranks and their store prove this to each other; it travels only in the children's
        # environment (readable by this user and root, as the processes themselves are).
        base_env["PYXCCL_SECRET"] = secrets.token_hex(32)
    try:
        for local in range(local_n):
            if signals_seen:
                break
            r = first + local
            child_env = dict(base_env)
            child_env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                             LOCAL_WORLD_SIZE=str(local_n), GROUP_RANK=str(node_rank), GROUP_WORLD_SIZE=str(nnodes),
                             ROLE_RANK=str(r), ROLE_WORLD_SIZE=str(world), MASTER_ADDR=master_addr,
                             MASTER_PORT=str(port), PYXCCL_LAUNCHER="pyxccl", PYTHONUNBUFFERED="1")
            if bound:
                child_env["PYXCCL_JOB_CPUS"] = str(len(cpus))
                os.sched_setaffinity(0, bound[local])       # this thread's mask is what the child inherits
            try:
                p = subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                err.write(f"pyxccl run: cannot start rank {r}: {argv[0]}: {e.strerror or e}; check the command "
                          f"name and that it is executable\n".encode())
                code = 127 if isinstance(e, FileNotFoundError) else 126
                break
            finally:
                if bound:
                    os.sched_setaffinity(0, cpus)
            procs.append(p)
            for stream, sink in ((p.stdout, out), (p.stderr, err)):
                t = threading.Thread(target=_pump, args=(stream, sink, f"[{r}] ".encode()), daemon=True)
                t.start()
                pumps.append(t)
        while code == 0 and None in [p.poll() for p in procs]:     # a list: poll every child, no short-circuit
            failed = [(first + i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed and not keep_going:
                r, rc = failed[0]
                code = _exit_code(rc)
                err.write(f"pyxccl run: rank {r} {_describe(rc)}; stopping the other ranks\n".encode())
                break
            time.sleep(0.02)
        if code == 0:                       # all exited: one may still have failed at the very end
            for i, p in enumerate(procs):
                if p.returncode:
                    r = first + i
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
