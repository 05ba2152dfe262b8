"""The layers hold: the API above, the framework below it reaching it only through its context,
the one-host path priced by the same walk of schedules as every other algorithm."""
import ast
import pathlib

import numpy as np
import pytest

import pyxccl
from pyxccl.algorithms import registry
from pyxccl.algorithms.segment import Window
from pyxccl.primitives import PRIMITIVES
from pyxccl.tuning import Machine, Tuner, estimate

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "pyxccl"
BELOW = ("core", "transport", "algorithms", "tuning", "rendezvous", "schedule.py", "walk.py", "checker.py",
         "primitives.py")


def _python_files():
    for d in (SRC, ROOT / "tests", ROOT / "benchmarks"):
        yield from sorted(d.rglob("*.py"))


# --- the import graph ---------------------------------------------------------------------------
# What each part of src/pyxccl may import of pyxccl (module-level and function-level imports alike),
# bottom up. A part is a top-level module, a package (everything under it), or for compression/ one of
# its modules: the package spans layers (codecs below the framework, policy in it, collectives in the API).
# docs/design.md ("Layers and allowed imports") says the same in words.
BASE = {"_errors", "_env", "_version", "dtypes", "ranks"}
ALLOWED = {
    "_errors": set(), "_version": set(), "dtypes": set(), "ranks": set(), "schedule": set(),
    "_env": {"_errors"},            # the environment variables, each parsed in one place
    "ops": {"_errors", "dtypes"},
    "primitives": {"_errors", "dtypes", "ops"},
    "walk": {"schedule"},
    # platform
    "transport": {"_env", "_errors", "_native", "dtypes"},      # _native: the fence of weakly ordered CPUs
    "rendezvous": {"_env", "_errors", "transport"},
    # algorithms: schedules only
    "algorithms": BASE | {"ops", "primitives", "schedule"},
    "compression.codecs": BASE | {"_kernels"},
    "compression": {"compression.codecs"},
    # framework
    "checker": BASE | {"algorithms", "ops", "primitives", "schedule", "walk"},
    "tuning": BASE | {"algorithms", "ops", "primitives", "schedule", "transport", "walk"},
    "compression.policy": BASE | {"algorithms", "compression.codecs"},
    "core": BASE | {"_native", "algorithms", "compression.policy", "ops", "primitives", "rendezvous", "schedule",
                    "transport", "tuning", "walk"},
    # the API layer: the Communicator and what it hands calls to
    "_checks": BASE | {"algorithms", "ops", "primitives"},
    "_describe": BASE,
    "_objects": BASE | {"_checks"},
    "_persistent": BASE | {"ops"},
    "calls": BASE | {"_checks"},
    "compression.collectives": BASE | {"_checks", "calls", "compression.codecs", "ops"},
    "comm": BASE | {"_checks", "_describe", "_objects", "_persistent", "calls", "compression.collectives", "core", "ops",
                    "primitives", "probe"},
    "pyxccl": BASE | {"_checks", "comm", "core", "launch_env", "ops", "rendezvous", "trace", "transport"},
    # tools above the API (they drive a Communicator, read dumps, or make worlds)
    "probe": BASE | {"transport", "tuning"},
    "doctor": BASE | {"core"},
    "trace": BASE | {"core", "launch_env"},
    "launch_env": BASE,
    "launcher": BASE | {"launch_env", "transport"},
    "info": BASE | {"algorithms", "pyxccl", "tuning"},
    "sim": BASE | {"_native", "algorithms", "bench", "plan", "primitives", "schedule", "transport", "tuning",
                   "walk"},
    "plan": BASE | {"sim", "transport", "tuning"},
    "bench": BASE | {"launcher", "primitives", "pyxccl"},
    "parallel": BASE,
    "torch": BASE | {"compression", "compression.collectives", "ops", "pyxccl", "rendezvous"},
    "testing": BASE | {"pyxccl", "rendezvous"},
    "cli": None, "__main__": None,                       # the command line: anything
}
PRIVATE_MODULES = {"_native", "_kernels", "_simcore"}      # extension modules: not .py files, still modules


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _is_module(name: str) -> bool:
    return name in MODULES or name.rpartition(".")[2] in PRIVATE_MODULES


def _imports(mod: str):
    """(line, the module ``mod`` imports, the name it takes of it or None, the local name it binds to a
    module or None) for every pyxccl import in ``mod``."""
    path = MODULES[mod]
    here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pyxccl":
                    yield node.lineno, a.name, None, (a.asname, a.name) if a.asname else ("pyxccl", "pyxccl")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "pyxccl":
                base = node.module
            else:
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                if _is_module(full):
                    yield node.lineno, full, None, (a.asname or a.name, full)
                else:
                    yield node.lineno, base, a.name, None


def _part(mod: str) -> str:
    parts = mod.split(".")[1:]
    if not parts:
        return "pyxccl"
    if parts[0] == "compression" and len(parts) > 1:
        return f"compression.{parts[1]}"
    return parts[0]


def _graph() -> dict[str, set[str]]:
    return {m: {d for _, d, _, _ in _imports(m) if d != m} for m in MODULES}


def test_every_part_imports_only_what_its_layer_allows():
    wrong = []
    for mod in sorted(MODULES):
        part = _part(mod)
        assert part in ALLOWED, f"{mod}: a new part of pyxccl; give it its row in ALLOWED (and docs/design.md)"
        allowed = ALLOWED[part]
        if allowed is None:
            continue
        for line, dep, _, _ in _imports(mod):
            other = _part(dep)
            if other != part and other not in allowed:
                wrong.append(f"{MODULES[mod].relative_to(ROOT)}:{line}: {part} imports {dep}")
    assert not wrong, "\n".join(wrong)


def test_only_the_api_layer_imports_the_communicator():
    users = sorted(m for m, deps in _graph().items() if "pyxccl.comm" in deps)
    assert users == ["pyxccl"], users


def test_there_is_no_import_cycle():
    """Tarjan's strongly connected components of the module graph (function-level imports included):
    every one must be a single module."""
    graph = _graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in graph:
                continue            # an extension module
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    """The check above can fail: a planted cycle between two real modules is found."""
    graph = {m: set(d) for m, d in _graph().items()}
    graph["pyxccl.schedule"].add("pyxccl.walk")         # walk imports schedule
    monkeypatch.setitem(globals(), "_graph", lambda: graph)
    with pytest.raises(AssertionError, match="pyxccl.schedule"):
        test_there_is_no_import_cycle()


def test_no_module_reads_a_private_name_of_another():
    """``from .x import _y`` and ``x._y`` (x a pyxccl module) only for private modules (``_native``,
    ``_errors``, ...): a name with a leading underscore is its module's own business."""
    wrong = []
    for mod in sorted(MODULES):
        path = MODULES[mod]
        bound = {}          # local name -> the pyxccl module it is
        for line, dep, name, local in _imports(mod):
            if name is not None and name.startswith("_") and not name.startswith("__"):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: from {dep} import {name}")
            if local is not None:
                bound[local[0]] = local[1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and not _is_module(f"{bound[node.value.id]}.{node.attr}"):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not wrong, "\n".join(wrong)


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
            algo = registry.lookup(prim, "segment")
            args = PRIMITIVES[prim].sized(4, nbytes, 4)
            scheds = [algo.schedule(r, 4, window=Window.of(2 << 20, 4, True), **args) for r in range(4)]
            want = estimate(scheds, 4, t.machine, t.klass, t.stretch, t.hosts)
            assert t.model(prim, "segment", nbytes) == want, (prim, nbytes)
    # and the model still says what the old formula did: one host, small messages: the fast path
    for prim in ("allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall", "barrier"):
        assert t.choose(prim, 8) == "segment", (prim, t.table(prim, 8))
    assert "segment" not in Tuner(2, [0, 1], lambda a, b: "tcp", Machine(), [1, 1]).table("allreduce", 8)


def test_a_forced_fast_path_without_a_segment_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PYXCCL_TRANSPORT", "tcp")   # no shared memory, not even one rank's segment
    comm = pyxccl.init()
    try:
        assert "segment" not in comm.algorithms("allreduce")
        try:
            comm.allreduce(np.ones(4, np.float32), algorithm="segment")
        except pyxccl.InvalidArgumentError as e:
            assert "shared segment" in str(e) and "rank 0" in str(e), e
        else:
            raise AssertionError("algorithm='segment' ran without a segment")
    finally:
        comm.close()


def test_shm_is_an_alias_of_the_segment_algorithm(monkeypatch):
    """The segment algorithm's old name, "shm" (also the transport's and a link class's), is still
    accepted: the lookup gives the segment's record, the fingerprint its number; the lists name only
    "segment"; PYXCCL_ALGO=...=shm where there is no segment chooses as usual (as "segment" does)."""
    for prim in PRIMITIVES:
        assert "shm" not in registry.algorithms(prim)
        assert registry.lookup(prim, "shm") is registry.lookup(prim, "segment"), prim
    assert registry.algorithm_id("shm") == registry.algorithm_id("segment") != 0
    monkeypatch.setenv("PYXCCL_ALGO", "allreduce=shm,allgather=segment")
    monkeypatch.setenv("PYXCCL_TRANSPORT", "tcp")   # no segment
    comm = pyxccl.init()
    try:
        assert comm.algorithm_for("allreduce", 8) == comm.algorithm_for("allgather", 8) == registry.default("allreduce")
    finally:
        comm.close()


def test_shm_runs_the_segment_algorithm(pools):
    import rankfns
    fails = [f"rank {r}: {f}" for r, fs in enumerate(pools(3).run(rankfns.segment_alias, transport="shm")) for f in fs]
    assert not fails, "\n".join(fails)


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


#: the native run's settings for a program that moves bytes only: no spin, no yields, the first nap, no dtype or op
_MOVES = (0, 0, 2_000_000, -1, -1)


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
            onehost.native(ctx, onehost.program(s, 4), words, (None, got, None), _MOVES, 1e18, "t")
            assert (got == data).all()
        else:
            with pytest.raises(pyxccl.ProtocolError, match="rank 0 posted"):
                onehost.native(ctx, onehost.program(s, 4), words, (None, got, None), _MOVES, 1e18, "t")
            assert not got.any()


def test_single_copy_writes_stay_inside_what_the_owner_posted(two_segments):
    """The mirror for writes (Put): a write into another rank's posted buffer never goes past the size
    its owner declared, nor anywhere when it posted nothing, and a failing write is a ProtocolError
    naming the owner."""
    from pyxccl.transport.segment import ADDR, NBYTES
    owner, writer = two_segments
    target = np.zeros(16, np.int32)
    with pytest.raises(pyxccl.ProtocolError, match="rank 0 did not post"):
        writer.write(0, 0, np.ones(1, np.int32), 0)
    owner.post(0, target)
    writer.write(0, 0, np.arange(4, dtype=np.int32) + 1, 8)
    assert target.tolist() == [0, 0, 1, 2, 3, 4] + [0] * 10
    for src, offset in ((np.ones(17, np.int32), 0), (np.ones(4, np.int32), 60), (np.ones(1, np.int32), -4)):
        with pytest.raises(pyxccl.ProtocolError, match="writing up to byte .* rank 0 posted"):
            writer.write(0, 0, src, offset)
    assert target.tolist() == [0, 0, 1, 2, 3, 4] + [0] * 10
    owner.hdr[0, 0, ADDR], owner.hdr[0, 0, NBYTES] = 8, 64      # an address nobody can write
    with pytest.raises(pyxccl.ProtocolError, match="writing the buffer rank 0 posted failed"):
        writer.write(0, 0, np.ones(4, np.int32), 0)


def test_a_buffer_revoked_by_its_owner_is_neither_written_nor_read(two_segments):
    """An owner that leaves a call on an error takes back what it posted (revoke): a peer still to write
    into it, or to read it, gets a ProtocolError naming the owner, and the memory is not touched."""
    owner, peer = two_segments
    target = np.zeros(16, np.int32)
    owner.post(0, target)
    owner.revoke()
    with pytest.raises(pyxccl.ProtocolError, match="writing the buffer rank 0 posted failed") as e:
        peer.write(0, 0, np.ones(4, np.int32), 0)
    assert e.value.abandoned and not target.any()
    with pytest.raises(pyxccl.ProtocolError, match="reading the buffer rank 0 posted failed"):
        peer.read(0, 0, np.zeros(4, np.int32), 0)


@pytest.mark.parametrize("native", (False, True))
def test_a_rank_that_leaves_a_call_on_an_error_revokes_what_it_posted(two_segments, native):
    """Both executors: a run that raises (here a Put into a rank that posted nothing) takes back what
    this rank posted in the call before the error leaves it."""
    import types

    from pyxccl.core import onehost
    from pyxccl.schedule import Post, Put, Schedule
    from pyxccl.transport.segment import ADDR
    if native and onehost._native is None:
        pytest.skip("pyxccl._native is not built (PYXCCL_NATIVE=0 runs cover the Python executor)")
    owner, writer = two_segments
    words = (1, 2, 3)
    owner.begin()
    owner.publish(*words)
    ctx = types.SimpleNamespace(segment=writer, rank=1, error=None)
    out, src = np.zeros(8, np.int32), np.ones(4, np.int32)
    s = Schedule(1, 2, [(Post("out", 0, 8, writes=True), Put(0, 0, "in", 0, 4))], segment=True, window=16)
    with pytest.raises(pyxccl.ProtocolError, match="writing up to byte 16 of a buffer rank 0 did not post"):
        onehost.run(ctx, s, {"in": src, "out": out, "tmp": None}, None, words[0], words[1:], "t", 1e18,
                    np.dtype(np.int32), (-1, -1) if native else None)
    assert (writer.hdr[:, 1, ADDR] == 1 << 63).all()


def test_native_single_copy_writes_stay_inside_what_the_owner_posted(two_segments):
    """The same defense in the native executor: a Put past the end of the buffer the owner posted stops
    with a ProtocolError naming the owner, before a byte is written."""
    import types

    from pyxccl.core import onehost
    from pyxccl.schedule import Put, Schedule
    if onehost._native is None:
        pytest.skip("pyxccl._native is not built (PYXCCL_NATIVE=0 runs cover the Python executor)")
    owner, writer = two_segments
    target = np.zeros(16, np.int32)
    words = (1, 2, 3)
    parity = owner.begin()
    owner.post(parity, target)
    owner.publish(*words)
    ctx = types.SimpleNamespace(segment=writer, rank=1)
    for count, fits in ((17, False), (16, True)):
        s = Schedule(1, 2, [(Put(0, 0, "in", 0, count),)], segment=True, window=16)
        src = np.arange(count, dtype=np.int32) + 1
        writer.round = 0
        if fits:
            onehost.native(ctx, onehost.program(s, 4), words, (src, None, None), _MOVES, 1e18, "t")
            assert (target == src).all()
        else:
            with pytest.raises(pyxccl.ProtocolError, match="writing up to byte 68 of the 64-byte buffer rank 0 posted"):
                onehost.native(ctx, onehost.program(s, 4), words, (src, None, None), _MOVES, 1e18, "t")
            assert not target.any()


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
