"""Where `pyxccl bench --vs` finds each peer library, and what to run when one is missing.

gloo and mpi (MPICH) come with the pip extra ``pyxccl[peers]`` into the running
Python. The others pin runtimes that must not enter the project's venv (Intel's
libmpi.so.12 would shadow MPICH's, DeepSpeed needs torch's CPU build), so
``scripts/setup_peers.sh`` puts them into ``$PYXCCL_PEERS_DIR``
(default ``~/.cache/pyxccl-peers``):

    impi/        venv holding the impi-rt wheel: lib/libmpi.so.12, bin/mpiexec (hydra)
    ds/          venv with torch 2.13.0+cpu and deepspeed 0.19.8
    torch_ext/   DeepSpeed's JIT-built shm op (TORCH_EXTENSIONS_DIR)
    oneccl/      venv with oneCCL's CPU runtime and headers (and libccl.so.2, see the script)
    oneccl_bench oneCCL's benchmark binary, built against oneccl/lib
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys

#: Every library --vs knows.
PEERS = ("gloo", "mpi", "impi", "deepspeed", "oneccl")
#: The primitives of the libraries that do not have them all (their other rows show "-"): DeepSpeed's shm
#: op is an allreduce, oneCCL has no gather or scatter.
ONLY = {"deepspeed": ("allreduce",),
        "oneccl": ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall")}
#: Libraries timed on float32 only (DeepSpeed's op also does bf16/fp16, oneccl_bench does not).
FLOAT32_ONLY = ("deepspeed", "oneccl")

PIP_EXTRA = "pip install 'pyxccl[peers]'"


def peers_dir() -> str:
    return os.environ.get("PYXCCL_PEERS_DIR") or os.path.expanduser("~/.cache/pyxccl-peers")


#: What a missing library is called in the message that says so.
NAMES = {"impi": "Intel MPI (impi-rt wheel)", "deepspeed": "DeepSpeed (CPU torch + deepspeed venv)",
         "oneccl": "oneCCL (oneccl_bench binary)"}


def setup_command(lib: str) -> str:
    where = f"PYXCCL_PEERS_DIR={peers_dir()} " if os.environ.get("PYXCCL_PEERS_DIR") else ""
    return f"{where}scripts/setup_peers.sh {lib}  (from a pyxccl checkout; installs into {peers_dir()})"


def impi_root() -> str:
    return os.path.join(peers_dir(), "impi")


def ds_python() -> str:
    return os.path.join(peers_dir(), "ds", "bin", "python")


def oneccl_bench() -> str:
    return os.path.join(peers_dir(), "oneccl_bench")


def mpich_mpiexec() -> str | None:
    """The mpiexec beside this Python (the mpich wheel's) or on PATH."""
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def missing(lib: str) -> str | None:
    """None when ``lib`` can run here, else what is missing and the command that installs it."""
    if lib == "gloo":
        return None if _has_module("torch") else f"torch is not installed in {sys.executable}: {PIP_EXTRA}"
    if lib in ("mpi", "impi") and not _has_module("mpi4py"):
        return f"mpi4py is not installed in {sys.executable}: {PIP_EXTRA}"
    if lib == "mpi":
        return None if mpich_mpiexec() else f"no mpiexec beside {sys.executable} or on PATH: {PIP_EXTRA}"
    if lib == "impi":
        need = [os.path.join(impi_root(), "lib", "libmpi.so.12"), os.path.join(impi_root(), "bin", "mpiexec")]
    elif lib == "deepspeed":
        need = [ds_python(), os.path.join(peers_dir(), "ds", "bin", "deepspeed")]   # the package's own script
    elif lib == "oneccl":
        need = [oneccl_bench()]
    else:
        raise ValueError(lib)
    absent = [p for p in need if not os.path.exists(p)]
    if not absent:
        return None
    return f"{NAMES[lib]} is not installed (no {', '.join(absent)}); install it with: {setup_command(lib)}"


def primitives(lib: str, prims) -> list[str]:
    """Those of ``prims`` that ``lib`` is timed on."""
    return [p for p in prims if p in ONLY.get(lib, prims)]


def unfit(lib: str, prims, dtype: str) -> str | None:
    """Why ``lib`` has nothing to time in this sweep, if it has not."""
    if lib in FLOAT32_ONLY and dtype != "float32":
        return "timed on float32 only"
    if not primitives(lib, prims):
        return f"has only {', '.join(ONLY[lib])}"
    return None
