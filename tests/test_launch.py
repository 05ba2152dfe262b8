"""pyxccl.init() under `pyxccl run` and without a launcher (the launcher itself: test_launcher.py;
the environment variables: test_launch_env.py)."""
import subprocess
import sys
import textwrap

import pytest

import pyxccl

pytestmark = pytest.mark.timeout(60)
PYXCCL = [sys.executable, "-m", "pyxccl"]


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
