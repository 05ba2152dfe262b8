"""The peers' side of `pyxccl bench --vs`: the same sweep, buffers and timing
with Gloo (torch.distributed), MPI (mpi4py on MPICH or Intel MPI) and
DeepSpeed's shared-memory allreduce, each started the way its users start it,
writing its rows as JSON for the comparison table (compare.py starts them).

    python -m pyxccl.bench.peers gloo OUT.json PRIMS SIZES DTYPE        (under pyxccl run)
    mpiexec -n N python -m pyxccl.bench.peers mpi OUT.json PRIMS SIZES DTYPE
    mpiexec -n N python -m pyxccl.bench.peers impi ...                  (Intel's mpiexec and libmpi)
    DS-VENV/python -m pyxccl.bench.peers deepspeed ...                  (under pyxccl run)
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

import numpy as np

from . import methodology as M
from .runner import Case, time_case


class _GlooComm:
    """Just what time_case needs, on torch.distributed."""

    def __init__(self):
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        self.init()
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def init(self):
        self.dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))

    def barrier(self):
        self.dist.barrier()

    def allreduce(self, arr, op="sum"):
        t = self.torch.from_numpy(arr)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX if op == "max" else self.dist.ReduceOp.SUM)

    def call(self, c: Case):
        d, T = self.dist, self.torch.from_numpy
        p = c.prim
        if p == "allreduce":
            d.all_reduce(T(c.send))
            if c.recv is not c.send:
                np.copyto(c.recv, c.send)
        elif p == "broadcast":
            d.broadcast(T(c.send), src=0)
        elif p == "reduce":
            d.reduce(T(c.send), dst=0)
            if self.rank == 0 and c.recv is not c.send:
                np.copyto(c.recv, c.send)
        elif p == "allgather":     # torch 2.13 renamed *_into_tensor / *_tensor to *_single
            (getattr(d, "all_gather_single", None) or d.all_gather_into_tensor)(T(c.recv), T(c.send))
        elif p == "reduce_scatter":
            (getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor)(T(c.recv), T(c.send))
        elif p == "alltoall":
            d.all_to_all_single(T(c.recv), T(c.send))
        elif p == "gather":
            out = list(T(c.recv).chunk(self.size)) if self.rank == 0 else None
            d.gather(T(c.send), out, dst=0)
        elif p == "scatter":
            src = list(T(c.send).chunk(self.size)) if self.rank == 0 else None
            d.scatter(T(c.recv), src, src=0)

    def close(self):
        self.dist.destroy_process_group()


class _DeepSpeedComm(_GlooComm):
    """deepspeed.comm.inference_all_reduce: DeepSpeed's CPU shared-memory allreduce (in place, float32).

    deepspeed.comm runs on a gloo process group, which keeps the bookkeeping
    (max of the times, #wrong). The barrier before each timed call is a 4-byte
    shm allreduce: gloo's barrier leaves the ranks hundreds of us apart, which
    would be timed as DeepSpeed's, as MPI's own barrier is used for MPI.
    """

    def init(self):
        # The C++ op maps its shm segments only when LOCAL_SIZE == WORLD_SIZE (one host); without it
        # every rank dies in the op (SIGSEGV) rather than falling back. torchrun does not set it.
        os.environ["LOCAL_SIZE"] = os.environ["WORLD_SIZE"]
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed.comm as ds
        from deepspeed.comm import comm as ds_state
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):    # a "built successfully" banner
            ds.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        self.ds, self.backend = ds, ds_state.cdb
        self._flag = self.torch.zeros(1)
        self.dist.barrier()         # every rank has mapped its segment before the first shm call
        self._check_shm_path()

    def _check_shm_path(self):
        """Fail unless the shm kernel itself runs: deepspeed silently falls back to gloo's all_reduce
        (no op built, no avx2), and that is not the library this column claims to time."""
        fallbacks, real = [], self.dist.all_reduce
        self.dist.all_reduce = lambda *a, **k: fallbacks.append(1) or real(*a, **k)
        try:
            probe = self.torch.ones(1024)
            self.ds.inference_all_reduce(probe)
        finally:
            self.dist.all_reduce = real
        wrong = not bool((probe == int(os.environ["WORLD_SIZE"])).all())
        bad = self.torch.tensor([int(bool(fallbacks) or wrong or getattr(self.backend, "shm_comm_op", None) is None)])
        real(bad)
        if bad.item():
            raise SystemExit("deepspeed: its shm allreduce is not in use here (it fell back to torch.distributed); "
                             "rebuild it with scripts/setup_peers.sh deepspeed")

    def barrier(self):
        self.ds.inference_all_reduce(self._flag)

    def call(self, c: Case):
        if c.prim != "allreduce":
            raise ValueError(f"deepspeed times allreduce only, not {c.prim}")
        self.ds.inference_all_reduce(self.torch.from_numpy(c.send))

    def close(self):
        self.dist.barrier()
        # deepspeed never unlinks its /dev/shm segments (tens of MiB per rank): remove ours.
        with contextlib.suppress(OSError):
            os.unlink("/dev/shm/deepspeed_allreduce_buffer_%d_%s_%s_%d" % (
                os.getuid(), os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], self.rank))
        super().close()


class _MpiComm:
    def __init__(self, intel=False):
        from mpi4py import MPI
        self.MPI, self.c = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.c.Get_rank(), self.c.Get_size()
        if intel and "Intel" not in MPI.Get_library_version():
            # an mpi4py that ignores MPI4PY_LIBMPI would time MPICH in Intel MPI's column
            raise SystemExit(f"impi: mpi4py loaded {MPI.Get_library_version().splitlines()[0]!r}, not Intel MPI")

    def barrier(self):
        self.c.Barrier()

    def allreduce(self, arr, op="sum"):
        self.c.Allreduce(self.MPI.IN_PLACE, arr, op=self.MPI.MAX if op == "max" else self.MPI.SUM)

    def call(self, c: Case):
        MPI, comm, p = self.MPI, self.c, c.prim
        if p == "allreduce":
            comm.Allreduce(MPI.IN_PLACE if c.recv is c.send else c.send, c.recv, op=MPI.SUM)
        elif p == "broadcast":
            comm.Bcast(c.send, root=0)
        elif p == "reduce":
            if self.rank == 0:
                comm.Reduce(MPI.IN_PLACE if c.recv is c.send else c.send, c.recv, op=MPI.SUM, root=0)
            else:
                comm.Reduce(c.send, None, op=MPI.SUM, root=0)
        elif p == "allgather":
            comm.Allgather(c.send, c.recv)
        elif p == "reduce_scatter":
            comm.Reduce_scatter_block(c.send, c.recv, op=MPI.SUM)
        elif p == "alltoall":
            comm.Alltoall(c.send, c.recv)
        elif p == "gather":
            comm.Gather(c.send, c.recv if self.rank == 0 else None, root=0)
        elif p == "scatter":
            comm.Scatter(c.send if self.rank == 0 else None, c.recv, root=0)

    def close(self):
        pass


COMMS = {"gloo": _GlooComm, "deepspeed": _DeepSpeedComm, "mpi": _MpiComm, "impi": lambda: _MpiComm(intel=True)}


def run(lib: str, out: str, prims: list[str], sizes: list[int], dtype: str) -> None:
    comm = COMMS[lib]()
    rows = []
    for prim in prims:
        for nbytes in sizes:
            # torch reduces in place: measure it that way, with no copy of ours in its time
            inplace = lib in ("gloo", "deepspeed") and prim in ("allreduce", "reduce")
            case = Case(prim, nbytes, dtype, comm.rank, comm.size, inplace=inplace)
            times, wrong = time_case(comm, case, comm.call)
            rows.append(dict(lib=lib, op=prim, n=comm.size, size=case.nbytes, count=case.total, type=dtype,
                             out_of_place=dict(M.summarize(times, case.nbytes, prim, comm.size), wrong=wrong)))
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    comm.close()


if __name__ == "__main__":
    lib, out, prims, sizes, dtype = sys.argv[1:6]
    run(lib, out, prims.split(","), [int(s) for s in sizes.split(",")], dtype)
