"""What launchers tell a process about its place in the job.

=============  ==================  ==================  ==================  ==================
launcher       rank                world size          local rank          local size
=============  ==================  ==================  ==================  ==================
pyxccl run,    RANK                WORLD_SIZE          LOCAL_RANK          LOCAL_WORLD_SIZE
torchrun
Open MPI       OMPI_COMM_WORLD_    OMPI_COMM_WORLD_    OMPI_COMM_WORLD_    OMPI_COMM_WORLD_
               RANK                SIZE                LOCAL_RANK          LOCAL_SIZE
MPICH (PMI)    PMI_RANK            PMI_SIZE            MPI_LOCALRANKID     MPI_LOCALNRANKS
Slurm (srun)   SLURM_PROCID        SLURM_NTASKS        SLURM_LOCALID       SLURM_NTASKS_PER_NODE
=============  ==================  ==================  ==================  ==================

MASTER_ADDR and MASTER_PORT name rank 0's store for every launcher; under
Slurm MASTER_ADDR defaults to SLURM_LAUNCH_NODE_IPADDR.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from ._errors import InvalidArgumentError

_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    launcher: str


def _int(env: Mapping[str, str], name: str, default=None):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    m = re.match(r"^\s*(\d+)", raw)      # Slurm writes "4(x2)" for tasks per node
    if not m:
        raise InvalidArgumentError(f"environment variable {name}={raw!r} is not an integer; fix the launch "
                                   f"command or unset it", op="init")
    return int(m.group(1))


def read_launch_env(environ: Mapping[str, str] | None = None) -> LaunchInfo | None:
    """The launcher's view of this process, or None when no launcher set anything."""
    env = os.environ if environ is None else environ
    for name, rk, ws, lr, lws in _LAUNCHERS:
        if rk in env and ws in env:
            rank, size = _int(env, rk), _int(env, ws)
            if size < 1 or rank >= size:
                raise InvalidArgumentError(f"{rk}={rank} and {ws}={size} do not fit (need 0 <= rank < size)",
                                           op="init")
            local_rank = _int(env, lr, 0)
            local_size = _int(env, lws, size)
            if name == "torchrun" and env.get("PYXCCL_LAUNCHER") == "pyxccl":
                name = "pyxccl"
            addr = env.get("MASTER_ADDR") or (env.get("SLURM_LAUNCH_NODE_IPADDR") if name == "slurm" else None)
            return LaunchInfo(rank, size, local_rank, local_size, addr, _int(env, "MASTER_PORT"), name)
    return None
