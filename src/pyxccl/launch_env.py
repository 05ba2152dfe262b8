"""What launchers tell a process about its place in the job.

Checked in this order; the first launcher whose rank and size variables are
set wins (a wrapper may leave another launcher's names behind):

=============  ==================  ==================  ==================  ========================
launcher       rank                world size          local rank          local size
=============  ==================  ==================  ==================  ========================
pyxccl run,    RANK                WORLD_SIZE          LOCAL_RANK          LOCAL_WORLD_SIZE
torchrun
Open MPI       OMPI_COMM_WORLD_    OMPI_COMM_WORLD_    OMPI_COMM_WORLD_    OMPI_COMM_WORLD_
               RANK                SIZE                LOCAL_RANK          LOCAL_SIZE
MPICH, Intel   PMI_RANK            PMI_SIZE            MPI_LOCALRANKID     MPI_LOCALNRANKS
MPI (Hydra)
Slurm (srun)   SLURM_PROCID        SLURM_NTASKS        SLURM_LOCALID       SLURM_NTASKS_PER_NODE,
                                                                           else this node's entry of
                                                                           SLURM_TASKS_PER_NODE
                                                                           ("4(x2)" = 4 on 2 nodes)
=============  ==================  ==================  ==================  ========================

``pyxccl run`` also sets ``PYXCCL_LAUNCHER=pyxccl``. MASTER_ADDR and
MASTER_PORT name rank 0's store under every launcher; under Slurm,
MASTER_ADDR defaults to SLURM_LAUNCH_NODE_IPADDR. MPI launchers and Slurm set
no port: ``pyxccl.init`` then asks for MASTER_PORT. A missing local rank/size
means one host (local = global).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from ._errors import InvalidArgumentError

__all__ = ["LaunchInfo", "read_launch_env"]

# (launcher, rank, world size, local rank, local size)
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


@dataclass(frozen=True)
class LaunchInfo:
    """A process's place in the job, as its launcher described it.

    ``launcher`` is ``"pyxccl"``, ``"torchrun"``, ``"openmpi"``, ``"mpich"`` or
    ``"slurm"``; ``master_addr``/``master_port`` are None when not given.
    """
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    launcher: str


def _bad(name: str, raw: str, want: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"environment variable {name}={raw!r} is not {want}; fix the launch command "
                                f"or unset it", op="init")


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    if not raw.strip().isdecimal():
        raise _bad(name, raw, "a non-negative integer")
    return int(raw)


def _slurm_tasks_per_node(env: Mapping[str, str]) -> int | None:
    """This node's task count, from SLURM_NTASKS_PER_NODE or else SLURM_TASKS_PER_NODE ("2(x3),1")."""
    name = next((n for n in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if env.get(n, "").strip()), None)
    if name is None:
        return None
    counts = []
    for field in env[name].split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", field.strip())
        if not m:
            raise _bad(name, env[name], 'a count per node like "4" or "4(x2),3"')
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = _int(env, "SLURM_NODEID")
    # Uneven lists ("2(x3),1") differ per node: take this node's entry when Slurm says which node we are.
    return counts[node] if node is not None and node < len(counts) else counts[0]


def read_launch_env(environ: Mapping[str, str] = os.environ) -> LaunchInfo | None:
    """This process's :class:`LaunchInfo` from the launcher's variables, or None if no launcher set any.

    Raises InvalidArgumentError, naming the variable, for a non-integer or
    inconsistent value (rank >= world size, a rank without a size, ...).
    """
    env = os.environ if environ is None else environ
    for name, rk, ws, lr, lws in _LAUNCHERS:
        if rk not in env and ws not in env:
            continue
        if rk not in env or ws not in env:
            if name == "slurm":
                continue      # an sbatch script sets SLURM_PROCID without SLURM_NTASKS: not a multi-rank step
            have, lack = (rk, ws) if rk in env else (ws, rk)
            raise InvalidArgumentError(f"{have} is set but {lack} is not; the launcher sets both: set {lack} "
                                       f"too, or unset {have}", op="init")
        rank, size = _int(env, rk), _int(env, ws)
        if rank is None or size is None or size < 1 or rank >= size:
            raise InvalidArgumentError(f"{rk}={env[rk]!r} and {ws}={env[ws]!r} do not fit: need integers with "
                                       f"0 <= {rk} < {ws}", op="init")
        local_size = _slurm_tasks_per_node(env) if name == "slurm" else _int(env, lws)
        local_size = size if local_size is None else local_size
        local_rank = _int(env, lr)
        local_rank = rank % max(local_size, 1) if local_rank is None else local_rank
        if not 0 <= local_rank < local_size <= size:
            raise InvalidArgumentError(f"{lr}={local_rank} and local size {local_size} (from {lws}) do not fit "
                                       f"world size {size}: need 0 <= local rank < local size <= world size",
                                       op="init")
        if name == "torchrun" and env.get("PYXCCL_LAUNCHER") == "pyxccl":
            name = "pyxccl"
        addr = env.get("MASTER_ADDR") or (env.get("SLURM_LAUNCH_NODE_IPADDR") if name == "slurm" else None)
        port = _int(env, "MASTER_PORT")
        if port is not None and not 0 < port < 65536:
            raise _bad("MASTER_PORT", env["MASTER_PORT"], "a port number (1-65535)")
        return LaunchInfo(rank, size, local_rank, local_size, addr or None, port, name)
    return None
