"""`pyxccl run` / launcher.run: environment, prefixed output, failure handling, signals."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pyxccl import InvalidArgumentError
from pyxccl.launcher import run

pytestmark = pytest.mark.timeout(60)
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
ENV = dict(os.environ, PYTHONPATH=SRC)
PYXCCL = [sys.executable, "-m", "pyxccl"]


def _script(tmp_path, body: str, name="job.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _pyxccl(*args, timeout=30, **kw):
    return subprocess.run([*PYXCCL, *args], capture_output=True, text=True, timeout=timeout, env=ENV, **kw)


def test_output_is_prefixed_and_env_is_set(tmp_path, capfd):
    script = _script(tmp_path, """
        import os, sys
        e = os.environ
        print("rank", e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"],
              e["MASTER_ADDR"], e["MASTER_PORT"], e["PYXCCL_LAUNCHER"], e["PYTHONUNBUFFERED"], sys.argv[1:])
        print("err", e["RANK"], file=sys.stderr)
        sys.stdout.write("no newline at the end")
    """)
    assert run(3, [script, "a", "b"], master_port=29999) == 0
    out, err = capfd.readouterr()
    assert sorted(line for line in out.splitlines() if " rank " in line) == [
        f"[{r}] rank {r} 3 {r} 3 0 127.0.0.1 29999 pyxccl 1 ['a', 'b']" for r in range(3)]
    assert sorted(line for line in out.splitlines() if "no newline" in line) == [
        f"[{r}] no newline at the end" for r in range(3)]
    assert sorted(err.splitlines()) == [f"[{r}] err {r}" for r in range(3)]


def test_free_port_is_picked_and_shared(capfd):
    assert run(2, [sys.executable, "-c", "import os; print(os.environ['MASTER_PORT'])"]) == 0
    ports = {line.split()[1] for line in capfd.readouterr().out.splitlines()}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536


def test_free_port_is_below_the_ephemeral_range_and_free():
    """A port the kernel hands to connections' local ends meanwhile could be taken before the store
    binds it (EADDRINUSE): free_port picks below that range, a port that binds."""
    import socket

    from pyxccl.launcher import _ephemeral_low, free_port
    low = _ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1
    for port in ports:
        assert (low // 2 <= port < low) if low > 2048 else 0 < port < 65536
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_cli_runs_a_script_with_prefixed_output(tmp_path):
    script = _script(tmp_path, "import os\nprint('hello from', os.environ['RANK'])\n")
    p = _pyxccl("run", "-n", "3", script)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [f"[{r}] hello from {r}" for r in range(3)]


def test_cli_options_and_double_dash(tmp_path):
    p = _pyxccl("run", "-n", "2", "--master-port", "29877", "--", sys.executable, "-c",
                "import os; print(os.environ['MASTER_PORT'], os.environ['RANK'])")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] 29877 0", "[1] 29877 1"]


def test_cli_module_form(tmp_path):
    (tmp_path / "hello_mod.py").write_text("import os, sys\nprint('hi', os.environ['LOCAL_RANK'], sys.argv[1:])\n")
    p = _pyxccl("run", "-n", "2", "-m", "hello_mod", "-x", "--flag", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] hi 0 ['-x', '--flag']", "[1] hi 1 ['-x', '--flag']"]


def test_one_failure_stops_the_others_quickly(tmp_path):
    script = _script(tmp_path, """
        import os, sys, time
        if os.environ["RANK"] == "1":
            time.sleep(0.2)
            sys.exit(3)
        time.sleep(60)
    """)
    t = time.monotonic()
    p = _pyxccl("run", "-n", "3", script)
    assert p.returncode == 3
    assert time.monotonic() - t < 10
    assert "rank 1 exited with code 3" in p.stderr


def test_grace_then_sigkill_and_signal_exit_code(tmp_path, capfd):
    script = _script(tmp_path, """
        import os, signal, sys, time
        if os.environ["RANK"] == "0":
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # must be killed after the grace period
        time.sleep(60)
    """)
    t = time.monotonic()
    assert run(2, [script], grace=0.5) == 128 + signal.SIGKILL
    assert time.monotonic() - t < 10
    assert "rank 0 was killed by SIGKILL" in capfd.readouterr().err


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_kill_reaches_the_childrens_subprocesses(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    script = _script(tmp_path, f"""
        import os, subprocess, sys, time
        if os.environ["RANK"] == "0":
            g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            open({str(pidfile)!r}, "w").write(str(g.pid))
            time.sleep(60)
        time.sleep(1)
        sys.exit(5)
    """)
    assert run(2, [script], grace=2) == 5
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the grandchild outlived the job")


def test_sigterm_to_the_launcher_is_forwarded(tmp_path):
    script = _script(tmp_path, """
        import os, time
        print("up", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([*PYXCCL, "run", "-n", "2", script], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(2):
            assert p.stdout.readline().endswith("up\n")
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 128 + signal.SIGTERM
        assert time.monotonic() - t < 10
    finally:
        p.kill()
        p.communicate(timeout=10)


def test_missing_command_and_bad_arguments(tmp_path, capfd):
    assert run(2, ["/no/such/program"]) == 127
    assert "cannot start rank 0" in capfd.readouterr().err
    with pytest.raises(InvalidArgumentError, match="-n"):
        run(0, ["true"])
    with pytest.raises(InvalidArgumentError, match="script or command"):
        run(1, [])
    p = _pyxccl("run", "-n", "2")
    assert p.returncode == 2 and "give a script or command" in p.stderr


# --- several hosts: torchrun's --nnodes / --node-rank / --nproc-per-node -----------------------------

_ENV_SCRIPT = """
import os
e = os.environ
print(*(e[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                       "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")))
"""


@pytest.mark.parametrize("node_rank", [0, 1, 2])
def test_multi_node_env_is_torchruns(tmp_path, capfd, node_rank):
    script = _script(tmp_path, _ENV_SCRIPT)
    assert run(2, [script], nnodes=3, node_rank=node_rank, master_addr="10.1.2.3", master_port=29411) == 0
    lines = sorted(capfd.readouterr().out.splitlines())
    # the prefix is the global rank; RANK = node_rank * nproc_per_node + local rank
    assert lines == [f"[{2 * node_rank + l}] {2 * node_rank + l} 6 {l} 2 {node_rank} 3 {2 * node_rank + l} 6 "
                     f"10.1.2.3 29411" for l in range(2)]


def test_uneven_nodes_from_a_list_of_counts(tmp_path, capfd):
    script = _script(tmp_path, _ENV_SCRIPT)
    for node_rank, (first, local_n) in enumerate([(0, 2), (2, 1), (3, 2)]):
        assert run([2, 1, 2], [script], nnodes=3, node_rank=node_rank, master_port=29412) == 0
        lines = sorted(capfd.readouterr().out.splitlines())
        assert [line.split()[:7] for line in lines] == [
            [f"[{first + l}]", str(first + l), "5", str(l), str(local_n), str(node_rank), "3"] for l in range(local_n)]


def test_single_node_defaults_are_unchanged(tmp_path, capfd):
    script = _script(tmp_path, _ENV_SCRIPT)
    assert run(2, [script]) == 0
    lines = sorted(capfd.readouterr().out.splitlines())
    assert [line.split()[1:9] for line in lines] == [[str(r), "2", str(r), "2", "0", "1", str(r), "2"]
                                                     for r in range(2)]
    assert lines[0].split()[9] == "127.0.0.1"


def test_multi_node_needs_an_explicit_port_and_valid_node_rank():
    with pytest.raises(InvalidArgumentError, match="--nnodes 2, give --master-port"):
        run(2, ["true"], nnodes=2, node_rank=0, master_addr="10.0.0.1")
    with pytest.raises(InvalidArgumentError, match=r"--node-rank 2 must be in 0\.\.1"):
        run(2, ["true"], nnodes=2, node_rank=2, master_port=29413)
    with pytest.raises(InvalidArgumentError, match=r"--node-rank -1"):
        run(2, ["true"], nnodes=2, node_rank=-1, master_port=29413)
    with pytest.raises(InvalidArgumentError, match="--nnodes must be a positive integer"):
        run(2, ["true"], nnodes=0, master_port=29413)
    with pytest.raises(InvalidArgumentError, match="lists 2 node"):
        run([1, 2], ["true"], nnodes=3, master_port=29413)
    with pytest.raises(InvalidArgumentError, match="--nproc-per-node"):
        run([1, 0], ["true"], nnodes=2, master_port=29413)
    with pytest.raises(InvalidArgumentError, match="1-65535"):
        run(1, ["true"], master_port=70000)


def test_a_failing_rank_is_named_by_its_global_rank(tmp_path):
    script = _script(tmp_path, """
        import os, sys, time
        if os.environ["LOCAL_RANK"] == "1":
            sys.exit(4)
        time.sleep(60)
    """)
    p = _pyxccl("run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", "29414",
                script)
    assert p.returncode == 4
    assert "rank 3 exited with code 4" in p.stderr


def test_cli_multi_node_flags_and_spellings(tmp_path):
    script = _script(tmp_path, _ENV_SCRIPT)
    p = _pyxccl("run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "10.9.8.7",
                "--master-port", "29415", script)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [f"[{r}] {r} 4 {r - 2} 2 1 2 {r} 4 10.9.8.7 29415" for r in (2, 3)]
    # torchrun's underscore spellings, --opt=value, MIN:MAX with MIN == MAX, -n as alias, a per-node list
    p = _pyxccl("run", "--nnodes=3:3", "--node_rank=2", "-n", "2,1,2", "--master_addr=10.9.8.7",
                "--master_port", "29416", script)
    assert p.returncode == 0, p.stderr
    assert sorted(line.split()[0] for line in p.stdout.splitlines()) == ["[3]", "[4]"]
    p = _pyxccl("run", "--standalone", "--nproc_per_node", "2", script)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 2


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "2", "-n", "2"], "--nnodes 2, give --master-port"),
    (["--nnodes", "2", "--node-rank", "5", "-n", "2", "--master-port", "29417"], "--node-rank 5 must be in 0..1"),
    (["--nnodes", "1:4", "-n", "2"], "elastic ranges"),
    (["-n", "0"], "positive number of ranks"),
    (["-n", "2,x"], "one per node"),
    (["--nnodes", "2", "-n", "1,1,1", "--master-port", "29417"], "lists 3 node(s)"),
    (["--standalone", "--nnodes", "2", "-n", "1", "--master-port", "29417"], "--standalone is one host"),
])
def test_cli_multi_node_errors(tmp_path, args, message):
    p = _pyxccl("run", *args, "true")
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr


def test_two_launchers_make_one_job(tmp_path):
    """Two `pyxccl run --nnodes 2` on this machine, each an emulated host (PYXCCL_HOST_ID): one world of 4."""
    from pyxccl.launcher import free_port
    script = _script(tmp_path, """
        import numpy as np, pyxccl
        comm = pyxccl.init()
        x = np.full(3, comm.rank, np.int64)
        comm.allreduce(x)
        print(comm.size, int(x[0]), comm.host_ranks, [comm.transport(p) for p in range(comm.size)])
        comm.close()
    """)
    port = free_port()
    procs = [subprocess.Popen([*PYXCCL, "run", "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "2",
                               "--master-port", str(port), script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(ENV, PYXCCL_HOST_ID=f"node{i}", PYXCCL_TUNE="0"))
             for i in range(2)]
    try:
        outs = [p.communicate(timeout=45) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    lines = sorted(outs[0][0].splitlines() + outs[1][0].splitlines())
    kinds = {0: "'self', 'shm', 'tcp', 'tcp'", 1: "'shm', 'self', 'tcp', 'tcp'",
             2: "'tcp', 'tcp', 'self', 'shm'", 3: "'tcp', 'tcp', 'shm', 'self'"}
    assert lines == [f"[{r}] 4 6 {[0, 1] if r < 2 else [2, 3]} [{kinds[r]}]" for r in range(4)]


def test_a_rank_may_exit_right_after_its_last_send(tmp_path):
    """The receiver returns shared-memory slots after the sender closed (and exited): not a lost peer.
    (Found by test_multihost.py: a scatter root finished and closed while a busy rank still read.)"""
    script = _script(tmp_path, """
        import time, numpy as np, pyxccl
        comm = pyxccl.init(transport="shm")
        n = 1 << 18                              # one 1 MiB slot each: all four in flight at close
        if comm.rank == 1:
            for i in range(4):
                comm.send(np.full(n, i, np.float32), 0, tag=1)
            comm.close()
        else:
            t = time.monotonic()
            while time.monotonic() - t < 0.5:    # busy, holding the GIL: the receiver thread lags
                pass
            for i in range(4):
                assert (comm.recv(np.empty(n, np.float32), 1, tag=1) == i).all()
            print("got all")
            comm.close()
    """)
    p = subprocess.run([*PYXCCL, "run", "-n", "2", script], capture_output=True, text=True, timeout=50,
                       env=dict(ENV, PYXCCL_TUNE="0"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[0] got all"]


def test_local_ranks_are_bound_to_their_own_cpus(tmp_path, capfd, monkeypatch):
    """As many ranks as CPUs (or fewer): each rank gets its own share, the shares cover the CPUs once,
    the children learn the node's count, and the launcher's own mask is left as it was; more ranks than
    CPUs: one CPU each, in turn; PYXCCL_BIND=none and bind=False leave the ranks unbound."""
    from pyxccl.launcher import shares
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to bind")
    script = _script(tmp_path, """
        import os
        print("cpus", os.environ["RANK"], sorted(os.sched_getaffinity(0)), os.environ.get("PYXCCL_JOB_CPUS"))
    """)
    n = len(cpus)
    assert run(n, [script]) == 0
    got = {int(line.split()[2]): line.split(" ", 3)[3] for line in capfd.readouterr().out.splitlines()
           if " cpus " in line}
    want = shares(n)
    assert [set(c) for c in want] == [{c} for c in cpus]
    assert got == {r: f"{sorted(want[r])} {n}" for r in range(n)}
    assert sorted(os.sched_getaffinity(0)) == cpus
    for kw, envvar in ((dict(bind=False), None), ({}, "none")):
        if envvar:
            monkeypatch.setenv("PYXCCL_BIND", envvar)
        assert run(n, [script], **kw) == 0
        lines = [line for line in capfd.readouterr().out.splitlines() if " cpus " in line]
        assert all(line.endswith(f"{cpus} None") for line in lines), lines
    assert shares(n + 1) is None and shares(1) is None         # none asked, or one rank
    monkeypatch.delenv("PYXCCL_BIND")
    assert shares(1) is None
    assert [len(s) for s in shares(2)] == [len(cpus) // 2 + len(cpus) % 2, len(cpus) // 2]
    # more ranks than CPUs: one CPU each, in turn, and the children still learn the node's count
    assert run(2 * n + 1, [script]) == 0
    got = {int(line.split()[2]): line.split(" ", 3)[3] for line in capfd.readouterr().out.splitlines()
           if " cpus " in line}
    assert got == {r: f"{[cpus[r % n]]} {n}" for r in range(2 * n + 1)}


def test_each_rank_gets_one_thread_for_its_math_libraries(tmp_path, capfd, monkeypatch):
    """More than one rank on the node: OMP_NUM_THREADS=1 unless set (torchrun's default), so numpy's
    OpenBLAS starts no pool of threads in each rank, even with more ranks than CPUs (unbound); a value
    the user set is kept."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    script = _script(tmp_path, """
        import os
        before = len(os.listdir("/proc/self/task"))
        import numpy
        numpy.ones((64, 64)) @ numpy.ones((64, 64))
        print("threads", os.environ["RANK"], os.environ.get("OMP_NUM_THREADS"),
              len(os.listdir("/proc/self/task")) - before)
    """)
    n = len(os.sched_getaffinity(0)) + 1            # more ranks than CPUs: not bound
    assert run(n, [script]) == 0
    got = [line.split()[3:] for line in capfd.readouterr().out.splitlines() if " threads " in line]
    assert got == [["1", "0"]] * n, got
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert run(2, [script]) == 0
    got = [line.split()[3] for line in capfd.readouterr().out.splitlines() if " threads " in line]
    assert got == ["2", "2"], got
