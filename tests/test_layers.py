"""The layers hold: the API above, the framework below it reaching it only through its context,
the one-host path priced by the same walk of schedules as every other algorithm."""
import ast
import pathlib

import numpy as np
import pytest

import pyxccl
from pyxccl.algorithms import registry
from pyxccl.algorithms.shm import Window
from pyxccl.primitives import PRIMITIVES
from pyxccl.tuning import Machine, Tuner, estimate

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "pyxccl"
BELOW = ("core", "transport", "algorithms", "tuning", "rendezvous", "schedule.py", "walk.py", "checker.py",
         "primitives.py")


def _python_files():
    for d in (SRC, ROOT / "tests", ROOT / "benchmarks"):
        yield from sorted(d.rglob("*.py"))


def test_comm_py_keeps_only_the_api():
    assert len((SRC / "comm.py").read_text().splitlines()) <= 400


def test_nothing_outside_comm_py_reads_the_communicators_private_attributes():
    comm = pyxccl.init()
    try:
        assert [a for a in vars(comm) if a.startswith("_")] == ["_ctx"]
    finally:
        comm.close()
    users = []
    for path in _python_files():
        if path in (SRC / "comm.py", SRC / "_describe.py"):     # the API layer: the Communicator and its base
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_ctx":
                users.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not users, users


def _imports_comm(node) -> bool:
    if isinstance(node, ast.ImportFrom):
        mod = node.module or ""
        return mod == "comm" or mod.endswith(".comm") or (mod in ("", "pyxccl") and
                                                           any(a.name in ("comm", "Communicator") for a in node.names))
    return isinstance(node, ast.Import) and any(a.name == "pyxccl.comm" for a in node.names)


def test_the_layers_below_the_api_do_not_import_it():
    importers = []
    for part in BELOW:
        for path in ([SRC / part] if part.endswith(".py") else sorted((SRC / part).rglob("*.py"))):
            importers += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
                          if _imports_comm(node)]
    assert not importers, importers


def _one_host_tuner(n: int, area: int = 2 << 20) -> Tuner:
    hosts = [0] * n
    return Tuner(n, hosts, lambda a, b: "self" if a == b else "shm", Machine(cores=n), [n] * n,
                 segment=(area, True))


def test_the_one_host_path_is_priced_by_the_walk_of_its_schedules():
    """No formula beside the cost model: the tuner's estimate for the fast path is the cost model's
    walk of the very schedules the engine runs."""
    t = _one_host_tuner(4)
    for prim in ("allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall"):
        for nbytes in (8, 1 << 16, 1 << 22):
            algo = registry.lookup(prim, "shm")
            args = PRIMITIVES[prim].sized(4, nbytes, 4)
            scheds = [algo.schedule(r, 4, window=Window.of(2 << 20, 4, True), **args) for r in range(4)]
            want = estimate(scheds, 4, t.machine, t.klass, t.stretch, t.hosts)
            assert t.model(prim, "shm", nbytes) == want, (prim, nbytes)
    # and the model still says what the old formula did: one host, small messages: the fast path
    for prim in ("allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall", "barrier"):
        assert t.choose(prim, 8) == "shm", (prim, t.table(prim, 8))
    assert "shm" not in Tuner(2, [0, 1], lambda a, b: "tcp", Machine(), [1, 1]).table("allreduce", 8)


def test_a_forced_fast_path_without_a_segment_is_a_clear_error():
    comm = pyxccl.init()
    try:
        assert "shm" not in comm.algorithms("allreduce")
        try:
            comm.allreduce(np.ones(4, np.float32), algorithm="shm")
        except pyxccl.InvalidArgumentError as e:
            assert "shared segment" in str(e) and "rank 0" in str(e), e
        else:
            raise AssertionError("algorithm='shm' ran without a segment")
    finally:
        comm.close()


@pytest.fixture
def two_segments():
    """Rank 0's segment and rank 1's view of it, in this process (single-copy reads must work here)."""
    import os

    from pyxccl.transport.cma import works
    from pyxccl.transport.segment import HostSegment
    owner = HostSegment(0, 2, 1 << 16)
    reader = HostSegment.open(1, 2, 1 << 16, os.getpid(), owner.fd)
    try:
        if not works(os.getpid(), int(owner.pids[0, 1])):
            pytest.skip("process_vm_readv is not allowed here (ptrace rules)")
        yield owner, reader
    finally:
        reader.close()
        owner.close()


def test_single_copy_reads_stay_inside_what_the_owner_posted(two_segments):
    """Defense behind the fingerprints: a read of another rank's posted buffer never goes past the
    size its owner declared, and a failing read is a ProtocolError naming the owner (not a raw OSError)."""
    from pyxccl.transport.segment import ADDR, NBYTES
    owner, reader = two_segments
    data = np.arange(16, dtype=np.int32)
    owner.post(0, data)
    got = np.zeros(16, np.int32)
    reader.read(0, 0, got, 0)
    assert (got == data).all()
    for dst, offset in ((np.zeros(17, np.int32), 0), (np.zeros(4, np.int32), 60), (np.zeros(1, np.int32), -4)):
        try:
            reader.read(0, 0, dst, offset)
        except pyxccl.ProtocolError as e:
            assert "rank 0 posted" in str(e), e
        else:
            raise AssertionError(f"read {dst.nbytes} bytes at {offset} of a 64-byte buffer")
    owner.hdr[0, 0, ADDR], owner.hdr[0, 0, NBYTES] = 8, 64      # an address nobody can read
    try:
        reader.read(0, 0, got, 0)
    except pyxccl.ProtocolError as e:
        assert "rank 0" in str(e), e
    else:
        raise AssertionError("a read of an unmapped address succeeded")


def test_native_single_copy_reads_stay_inside_what_the_owner_posted(two_segments):
    """The same defense in the native executor: a Get past the end of the buffer the owner posted
    stops with a ProtocolError naming the owner, before a byte is read."""
    import types

    from pyxccl.core import onehost
    from pyxccl.schedule import Get, Schedule
    if onehost._native is None:
        pytest.skip("pyxccl._native is not built (PYXCCL_NATIVE=0 runs cover the Python executor)")
    owner, reader = two_segments
    data = np.arange(16, dtype=np.int32)
    words = (1, 2, 3)
    parity = owner.begin()
    owner.post(parity, data)
    owner.publish(*words)
    ctx = types.SimpleNamespace(segment=reader, rank=1)
    for count, fits in ((16, True), (17, False)):
        s = Schedule(1, 2, [(Get(0, 0, "out", 0, count),)], segment=True, window=16)
        got = np.zeros(count, np.int32)
        reader.round = 0
        if fits:
            onehost.native(ctx, onehost.program(s, 4), words, (None, got, None), (0, 0, -1, -1), 1e18, "t")
            assert (got == data).all()
        else:
            with pytest.raises(pyxccl.ProtocolError, match="rank 0 posted"):
                onehost.native(ctx, onehost.program(s, 4), words, (None, got, None), (0, 0, -1, -1), 1e18, "t")
            assert not got.any()


def test_every_public_method_of_the_communicator_is_in_the_readme_api_table():
    import re
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## API"):text.index("## Algorithms and how one is chosen")]
    missing = [n for n in dir(pyxccl.Communicator) if not n.startswith("_") and not re.search(rf"\b{n}\b", table)]
    assert not missing, f"add these to README.md's API table: {missing}"


def test_the_readme_s_add_an_algorithm_example_is_proven_by_the_checker():
    """The Contributing section's snippet registers an algorithm the checker proves, and the checker
    finds the bug the text says it finds."""
    import re

    from pyxccl.checker import CheckError, check
    text = (ROOT / "README.md").read_text()
    code = re.search(r"\*\*Add an algorithm\.\*\*.*?```python\n(.*?)```", text, re.S).group(1)
    try:
        exec(compile(code, "README.md", "exec"), {})
        for n in (1, 2, 3, 5, 8):
            check("allreduce", "star", nranks=n, count=7)
        broken = code.replace("for p in range(1, nranks)))\n        s.step(*(Send",
                              "for p in range(2, nranks)))\n        s.step(*(Send")
        assert broken != code
        exec(compile(broken, "README.md", "exec"), {})
        with pytest.raises(CheckError, match=r"rank 0 out\[0\] holds contributions \[1, 0\]"):
            check("allreduce", "star", nranks=2, count=7)
    finally:
        registry._REGISTRY.pop(("allreduce", "star"), None)
        registry._IDS.clear()
