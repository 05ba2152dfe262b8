"""Launcher environments, `pyxccl run`, and pyxccl.init() from a launcher."""
import subprocess
import sys
import textwrap
import time

import pytest

import pyxccl
from pyxccl.launch_env import read_launch_env

pytestmark = pytest.mark.timeout(60)
PYXCCL = [sys.executable, "-m", "pyxccl"]


@pytest.mark.parametrize("env, want", [
    (dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="29500"),
     (1, 4, 1, 2, "h", 29500, "torchrun")),
    (dict(RANK="0", WORLD_SIZE="2", PYXCCL_LAUNCHER="pyxccl"), (0, 2, 0, 2, None, None, "pyxccl")),
    (dict(OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="6", OMPI_COMM_WORLD_LOCAL_RANK="0",
          OMPI_COMM_WORLD_LOCAL_SIZE="3"), (3, 6, 0, 3, None, None, "openmpi")),
    (dict(PMI_RANK="2", PMI_SIZE="3", MPI_LOCALRANKID="2", MPI_LOCALNRANKS="3", MASTER_ADDR="a",
          MASTER_PORT="1"), (2, 3, 2, 3, "a", 1, "mpich")),
    (dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_NTASKS_PER_NODE="4(x2)",
          SLURM_LAUNCH_NODE_IPADDR="10.0.0.1"), (5, 8, 1, 4, "10.0.0.1", None, "slurm")),
    # torchrun's names win over the MPI ones a wrapper may also leave behind
    (dict(RANK="0", WORLD_SIZE="1", PMI_RANK="7", PMI_SIZE="9"), (0, 1, 0, 1, None, None, "torchrun")),
])
def test_read_launch_env(env, want):
    i = read_launch_env(env)
    assert (i.rank, i.world_size, i.local_rank, i.local_world_size, i.master_addr, i.master_port,
            i.launcher) == want


def test_no_launcher_and_bad_values():
    assert read_launch_env({}) is None
    with pytest.raises(pyxccl.InvalidArgumentError, match="RANK"):
        read_launch_env(dict(RANK="4", WORLD_SIZE="4"))
    with pytest.raises(pyxccl.InvalidArgumentError, match="PMI_SIZE"):
        read_launch_env(dict(PMI_RANK="0", PMI_SIZE="lots"))


def test_init_without_launcher_is_a_world_of_one(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    import numpy as np
    with pyxccl.init() as comm:
        x = np.arange(3.0)
        comm.allreduce(x)
        assert comm.size == 1 and list(x) == [0, 1, 2]


def _script(tmp_path, body: str):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_run_prefixes_output_and_runs_collectives(tmp_path):
    script = _script(tmp_path, """
        import numpy as np, pyxccl
        comm = pyxccl.init()
        x = np.ones(5, np.float32)
        comm.allreduce(x)
        print("sum", int(x[0]), "size", comm.size, "transport", comm.transport((comm.rank + 1) % comm.size))
        comm.close()
    """)
    p = subprocess.run([*PYXCCL, "run", "-n", "3", script], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    lines = sorted(p.stdout.splitlines())
    assert lines == [f"[{r}] sum 3 size 3 transport shm" for r in range(3)]


def test_run_tcp_and_file_store_init_methods(tmp_path):
    script = _script(tmp_path, f"""
        import os, numpy as np, pyxccl
        r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        comm = pyxccl.init(r, n, init_method="file://{tmp_path}/store", transport="tcp")
        print(comm.allgather_object(r), comm.transport((r + 1) % n))
    """)
    p = subprocess.run([*PYXCCL, "run", "-n", "2", "--", script], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] [0, 1] tcp", "[1] [0, 1] tcp"]


def test_run_stops_others_when_one_fails(tmp_path):
    script = _script(tmp_path, """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """)
    t = time.monotonic()
    p = subprocess.run([*PYXCCL, "run", "-n", "3", script], capture_output=True, text=True, timeout=50)
    assert p.returncode == 3
    assert time.monotonic() - t < 10
    assert "rank 1 exited with code 3" in p.stderr


def test_run_module_form(tmp_path):
    (tmp_path / "hello_mod.py").write_text("import os\nprint('hi', os.environ['LOCAL_RANK'])\n")
    p = subprocess.run([*PYXCCL, "run", "-n", "2", "-m", "hello_mod"], capture_output=True, text=True,
                       timeout=50, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] hi 0", "[1] hi 1"]
