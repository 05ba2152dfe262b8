"""read_launch_env: each launcher's variables, their precedence, and bad values."""
import pytest

from pyxccl import InvalidArgumentError
from pyxccl.launch_env import LaunchInfo, read_launch_env

pytestmark = pytest.mark.timeout(30)


def _tuple(i: LaunchInfo):
    return (i.rank, i.world_size, i.local_rank, i.local_world_size, i.master_addr, i.master_port, i.launcher)


@pytest.mark.parametrize("env, want", [
    pytest.param(dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h",
                      MASTER_PORT="29500"), (1, 4, 1, 2, "h", 29500, "torchrun"), id="torchrun"),
    pytest.param(dict(RANK="2", WORLD_SIZE="3", LOCAL_RANK="2", LOCAL_WORLD_SIZE="3", PYXCCL_LAUNCHER="pyxccl",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="1234"), (2, 3, 2, 3, "127.0.0.1", 1234, "pyxccl"),
                 id="pyxccl"),
    pytest.param(dict(RANK="3", WORLD_SIZE="4"), (3, 4, 3, 4, None, None, "torchrun"), id="no-local-means-one-host"),
    pytest.param(dict(OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="6", OMPI_COMM_WORLD_LOCAL_RANK="0",
                      OMPI_COMM_WORLD_LOCAL_SIZE="3"), (3, 6, 0, 3, None, None, "openmpi"), id="openmpi"),
    pytest.param(dict(PMI_RANK="2", PMI_SIZE="3", MPI_LOCALRANKID="2", MPI_LOCALNRANKS="3", MASTER_ADDR="a",
                      MASTER_PORT="1"), (2, 3, 2, 3, "a", 1, "mpich"), id="mpich"),
    pytest.param(dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_TASKS_PER_NODE="4(x2)",
                      SLURM_LAUNCH_NODE_IPADDR="10.0.0.1"), (5, 8, 1, 4, "10.0.0.1", None, "slurm"), id="slurm"),
    pytest.param(dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_NTASKS_PER_NODE="4",
                      SLURM_TASKS_PER_NODE="5,3", SLURM_LAUNCH_NODE_IPADDR="10.0.0.1", MASTER_ADDR="m",
                      MASTER_PORT="29400"), (5, 8, 1, 4, "m", 29400, "slurm"), id="slurm-ntasks-per-node-wins"),
    pytest.param(dict(SLURM_PROCID="6", SLURM_NTASKS="7", SLURM_LOCALID="0", SLURM_TASKS_PER_NODE="2(x3),1",
                      SLURM_NODEID="3"), (6, 7, 0, 1, None, None, "slurm"), id="slurm-uneven-uses-node-id"),
    # precedence: torchrun/pyxccl names, then Open MPI, then MPICH, then Slurm
    pytest.param(dict(RANK="0", WORLD_SIZE="1", PMI_RANK="7", PMI_SIZE="9", SLURM_PROCID="1", SLURM_NTASKS="2"),
                 (0, 1, 0, 1, None, None, "torchrun"), id="torchrun-over-all"),
    pytest.param(dict(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", PMI_RANK="0", PMI_SIZE="1"),
                 (1, 2, 1, 2, None, None, "openmpi"), id="openmpi-over-mpich"),
    pytest.param(dict(PMI_RANK="1", PMI_SIZE="2", SLURM_PROCID="0", SLURM_NTASKS="1"),
                 (1, 2, 1, 2, None, None, "mpich"), id="mpich-over-slurm"),
    # an sbatch script sets SLURM_PROCID without SLURM_NTASKS: no launcher of ranks
    pytest.param(dict(SLURM_PROCID="0", SLURM_JOB_ID="1"), None, id="slurm-batch-step"),
    pytest.param({}, None, id="nothing"),
    pytest.param(dict(MASTER_ADDR="h", MASTER_PORT="1"), None, id="only-master"),
])
def test_read_launch_env(env, want):
    info = read_launch_env(env)
    assert (info if info is None else _tuple(info)) == want


def test_reads_os_environ_by_default(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
              "SLURM_PROCID", "SLURM_NTASKS", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert read_launch_env() is None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert read_launch_env().rank == 1


def test_launch_info_is_frozen():
    info = read_launch_env(dict(RANK="0", WORLD_SIZE="1"))
    with pytest.raises(AttributeError):
        info.rank = 3


@pytest.mark.parametrize("env, var", [
    (dict(RANK="4", WORLD_SIZE="4"), "RANK"),
    (dict(RANK="0", WORLD_SIZE="0"), "WORLD_SIZE"),
    (dict(RANK="-1", WORLD_SIZE="2"), "RANK"),
    (dict(RANK="1", WORLD_SIZE="2.0"), "WORLD_SIZE"),
    (dict(RANK="1"), "WORLD_SIZE"),                    # half a pair
    (dict(WORLD_SIZE="2"), "RANK"),
    (dict(PMI_RANK="0", PMI_SIZE="lots"), "PMI_SIZE"),
    (dict(OMPI_COMM_WORLD_RANK="x", OMPI_COMM_WORLD_SIZE="2"), "OMPI_COMM_WORLD_RANK"),
    (dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="2", LOCAL_WORLD_SIZE="2"), "LOCAL_RANK"),
    (dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="3"), "LOCAL_WORLD_SIZE"),
    (dict(RANK="1", WORLD_SIZE="2", MASTER_PORT="http"), "MASTER_PORT"),
    (dict(RANK="1", WORLD_SIZE="2", MASTER_PORT="70000"), "MASTER_PORT"),
    (dict(SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="two"), "SLURM_TASKS_PER_NODE"),
])
def test_bad_values_name_the_variable(env, var):
    with pytest.raises(InvalidArgumentError, match=var):
        read_launch_env(env)
