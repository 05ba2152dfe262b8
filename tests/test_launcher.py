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
