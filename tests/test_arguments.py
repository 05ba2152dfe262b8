"""Every bad argument is refused up front: an InvalidArgumentError (UnsupportedOpError for an op that
makes no sense for the dtype) naming the rank, the operation, the argument and its value, raised before
anything is allocated or sent, leaving the communicator usable; repeated calls that run prepared
(core/prepared.py) refuse the same. Most cases run in a world of one rank in this process; those that
need peers (counts of other ranks, in-place forms) on 2 ranks of the shared pool."""
import tracemalloc

import numpy as np
import pytest

import pyxccl
import rankfns as rf
from pyxccl import InvalidArgumentError, ReduceOp, UnsupportedOpError

pytestmark = pytest.mark.timeout(60)

F32 = np.float32


@pytest.fixture(scope="module")
def comm():
    c = pyxccl.init()       # no launcher, no arguments: a world of one rank
    assert c.size == 1
    yield c
    c.close()


def _x(n=4, dt=F32):
    return np.ones(n, dt)


def _readonly(n=4):
    a = np.ones(n, F32)
    a.flags.writeable = False
    return a


# Every public method, called well: name -> call(comm, **overrides). Each bad case overrides one argument.
CALLS = {
    "allreduce": lambda c, **k: c.allreduce(k.pop("tensor", _x()), **k),
    "broadcast": lambda c, **k: c.broadcast(k.pop("tensor", _x()), **k),
    "reduce": lambda c, **k: c.reduce(k.pop("tensor", _x()), **k),
    "allgather": lambda c, **k: c.allgather(k.pop("sendbuf", _x()), k.pop("recvbuf", _x()), **k),
    "allgatherv": lambda c, **k: c.allgatherv(k.pop("sendbuf", _x()), k.pop("recvbuf", None),
                                              k.pop("counts", [4]), **k),
    "gather": lambda c, **k: c.gather(k.pop("sendbuf", _x()), k.pop("recvbuf", None), **k),
    "gatherv": lambda c, **k: c.gatherv(k.pop("sendbuf", _x()), k.pop("recvbuf", None), k.pop("counts", [4]), **k),
    "scatter": lambda c, **k: c.scatter(k.pop("sendbuf", _x()), k.pop("recvbuf", _x()), **k),
    "scatterv": lambda c, **k: c.scatterv(k.pop("sendbuf", _x()), k.pop("recvbuf", _x()), k.pop("counts", [4]), **k),
    "reduce_scatter": lambda c, **k: c.reduce_scatter(k.pop("sendbuf", _x()), k.pop("recvbuf", _x()), **k),
    "reduce_scatterv": lambda c, **k: c.reduce_scatterv(k.pop("sendbuf", _x()), k.pop("recvbuf", _x()),
                                                        k.pop("counts", [4]), **k),
    "alltoall": lambda c, **k: c.alltoall(k.pop("sendbuf", _x()), k.pop("recvbuf", _x()), **k),
    "alltoallv": lambda c, **k: c.alltoallv(k.pop("sendbuf", _x()), k.pop("recvbuf", _x()), k.pop("send_counts", [4]),
                                            k.pop("recv_counts", [4]), **k),
    "barrier": lambda c, **k: c.barrier(**k),
    "send": lambda c, **k: c.send(k.pop("tensor", _x()), k.pop("dst", 0), **k),
    "isend": lambda c, **k: c.isend(k.pop("tensor", _x()), k.pop("dst", 0), **k).wait(),
    "recv": lambda c, **k: c.recv(k.pop("tensor", _x()), k.pop("src", 0), **k),
    "irecv": lambda c, **k: c.irecv(k.pop("tensor", _x()), k.pop("src", 0), **k).wait(),
    "broadcast_object": lambda c, **k: c.broadcast_object(k.pop("obj", {"a": 1}), **k),
    "allgather_object": lambda c, **k: c.allgather_object(k.pop("obj", {"a": 1}), **k),
    "split": lambda c, **k: c.split(k.pop("color", 0), **k).close(),
}
COLLECTIVES = [n for n in CALLS if n not in ("send", "isend", "recv", "irecv", "broadcast_object",
                                              "allgather_object", "split")]
ROOTED = ("broadcast", "reduce", "gather", "gatherv", "scatter", "scatterv", "broadcast_object")
REDUCING = ("allreduce", "reduce", "reduce_scatter", "reduce_scatterv")
VCOUNTS = {"allgatherv": ("counts",), "gatherv": ("counts",), "scatterv": ("counts",), "reduce_scatterv": ("counts",),
           "alltoallv": ("send_counts", "recv_counts")}
BAD_TIMEOUTS = (-1, 0, 0.0, float("nan"), float("inf"), -float("inf"), 1e12, "1", True, np.True_, [1])


def _cases():
    """(call, argument the message must name, bad value (or None: not shown), overrides)."""
    for name in CALLS:
        for t in BAD_TIMEOUTS:
            yield name, "timeout", t, dict(timeout=t)
    for name in COLLECTIVES:
        for a in ("nope", 3, ["ring"], b"ring"):
            yield name, "algorithm", a, dict(algorithm=a)
        for a in ("yes", 1, 0, None):
            yield name, "async_op", a, dict(async_op=a)
    for name in ROOTED:
        for root in (1, -1, True, 0.0, "0", None):
            yield name, "root", root, dict(root=root)
    for name in REDUCING:
        for op in ("foo", None, 3, "sum "):
            yield name, "op", op, dict(op=op)
    for name, args in VCOUNTS.items():
        for arg in args:
            for counts in ([4.0], [np.float64(4)], [True], [-4], [1 << 60], [(1 << 64) + 4], [4, 4], [], "4", 4,
                           {0: 4}, {4}, np.array([4.0]), np.array([[4]]), None if name == "alltoallv" else [3]):
                yield name, arg, None, {arg: counts}
    for name in ("send", "isend", "recv", "irecv"):
        peer = "dst" if "send" in name else "src"
        for p in (1, -1, True, 0.0, "0"):
            yield name, peer, p, {peer: p}
        for tag in (-1, 1 << 31, True, 1.5, "0", None):
            yield name, "tag", tag, dict(tag=tag)
    for color in (-1, 1.5, 1 << 31, "a", True):
        yield "split", "color", color, dict(color=color)
    for key in (1.5, 1 << 31, -(1 << 31) - 1, True, "k", None):
        yield "split", "key", key, dict(key=key)
    for name in ("broadcast_object", "allgather_object"):
        yield name, "obj", None, dict(obj=lambda: 0)      # cannot be pickled


def _buffer_cases():
    """Buffers: (call, argument named, overrides)."""
    wide = np.zeros(16, F32)
    # (call, its buffers; the last of a pair is the one checked against the first: sizes and dtypes)
    for name, args in (("allreduce", ("tensor", "out")), ("reduce", ("tensor", "out")), ("broadcast", ("tensor",)),
                       ("allgather", ("sendbuf", "recvbuf")), ("gather", ("sendbuf", "recvbuf")),
                       ("scatter", ("recvbuf", "sendbuf")), ("reduce_scatter", ("recvbuf", "sendbuf")),
                       ("alltoall", ("sendbuf", "recvbuf")), ("allgatherv", ("sendbuf",)),
                       ("send", ("tensor",)), ("recv", ("tensor",))):
        for arg in args:
            for what, buf in (("complex", np.ones(4, np.complex64)), ("object", np.array([1, 2, 3, 4], object)),
                              ("strings", np.array(["abcd"] * 4)), ("a list", [1.0] * 4), ("a number", 4.0),
                              ("non-contiguous", np.ones(8, F32)[::2]),
                              ("2-d Fortran", np.ones((2, 2), F32, order="F"))):
                yield name, arg, what, {arg: buf}
        if len(args) == 2:
            yield name, args[1], "too long", {args[1]: _x(5)}
            yield name, args[1], "float64", {args[1]: _x(dt=np.float64)}
    for name, arg in (("allreduce", "tensor"), ("reduce", "tensor"), ("allreduce", "out"), ("reduce", "out"),
                      ("allgather", "recvbuf"), ("recv", "tensor"), ("scatter", "recvbuf"), ("alltoall", "recvbuf")):
        yield name, arg, "read-only", {arg: _readonly()}
    yield "allreduce", "overlap", "partly shared", dict(tensor=wide[:4], out=wide[2:6])
    yield "reduce", "overlap", "partly shared", dict(tensor=wide[2:6], out=wide[:4])
    yield "allgather", "overlap", "shifted", dict(sendbuf=wide[1:5], recvbuf=wide[:4])
    yield "gather", "overlap", "shifted", dict(sendbuf=wide[1:5], recvbuf=wide[:4])
    yield "scatter", "overlap", "shifted", dict(sendbuf=wide[:4], recvbuf=wide[1:5])
    yield "reduce_scatter", "overlap", "shifted", dict(sendbuf=wide[:4], recvbuf=wide[3:7])
    yield "alltoall", "overlap", "one buffer", dict(sendbuf=wide[:4], recvbuf=wide[:4])
    yield "alltoallv", "overlap", "shifted", dict(sendbuf=wide[:4], recvbuf=wide[2:6])
    yield "allgatherv", "recvbuf", "too short", dict(recvbuf=_x(3))
    yield "reduce_scatterv", "counts", "sum not the buffer's", dict(sendbuf=_x(5))
    yield "scatter", "sendbuf", "None at the root", dict(sendbuf=None)
    yield "gatherv", "counts", "None at the root", dict(counts=None)
    yield "allreduce", "op", "BXOR on float", dict(op=ReduceOp.BXOR)
    yield "reduce_scatter", "op", "AVG on int", dict(sendbuf=_x(dt=np.int32), recvbuf=_x(dt=np.int32), op="avg")


def _works(comm):
    """The communicator still runs collectives right (nothing was left half done)."""
    y = np.arange(5, dtype=np.int64)
    comm.allreduce(y)
    assert (y == np.arange(5)).all()
    assert comm.allgather_object("ok") == ["ok"]


def _refused(comm, name, overrides):
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgumentError) as ei:
            CALLS[name](comm, **overrides)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    e = ei.value
    assert e.rank == 0 and e.op == name, (e.rank, e.op)
    assert str(e).startswith(f"rank 0: {name}: "), str(e)
    assert peak < 1 << 20, f"{peak} bytes allocated before refusing"
    _works(comm)
    return e


@pytest.mark.parametrize("name,arg,value,overrides", list(_cases()),
                         ids=lambda v: v if isinstance(v, str) else repr(v)[:20])
def test_a_bad_argument_is_refused_naming_it(comm, name, arg, value, overrides):
    msg = str(_refused(comm, name, overrides))
    assert arg in msg, msg
    if value is not None:
        assert repr(value) in msg, msg


@pytest.mark.parametrize("name,arg,what,overrides", list(_buffer_cases()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_bad_buffer_is_refused_naming_it(comm, name, arg, what, overrides):
    e = _refused(comm, name, overrides)
    assert arg in str(e), str(e)
    if what in ("BXOR on float", "AVG on int"):
        assert isinstance(e, UnsupportedOpError)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_call_made_well_works(comm, name):
    """The baseline of the cases above: each call with good arguments runs (so the refusals come from
    the one bad argument), with numpy integer counts and roots too."""
    if name in ("recv", "irecv"):
        comm.send(_x(), 0)
    CALLS[name](comm)
    if name in VCOUNTS:
        CALLS[name](comm, **{a: np.array([4], np.int64) for a in VCOUNTS[name]})
    if name in ROOTED:
        CALLS[name](comm, root=np.int64(0))
    _works(comm)


def test_timeout_zero_is_not_no_timeout(comm):
    """torch and Gloo read a 0 ms timeout as kNoTimeout (the default); pyxccl spells the default None and
    refuses 0, which would otherwise be a deadline already past."""
    with pytest.raises(InvalidArgumentError, match="0 does not mean"):
        comm.allreduce(_x(), timeout=0)
    comm.allreduce(_x(), timeout=None)
    comm.allreduce(_x(), timeout=np.float32(5))
    comm.allreduce(_x(), timeout=1e9)      # the longest: 31 years


def test_the_prepared_path_refuses_what_the_full_path_refuses(comm):
    """A call shape made prepared, then called with a bad argument its key cannot tell apart."""
    assert rf.prepared_still_refuse(comm) == []


@pytest.mark.parametrize("kw,arg", [
    (dict(timeout=-1), "timeout"), (dict(timeout=float("nan")), "timeout"), (dict(timeout=float("inf")), "timeout"),
    (dict(timeout=0), "timeout"), (dict(timeout="5"), "timeout"), (dict(timeout=True), "timeout"),
    (dict(timeout=1e10), "timeout"),
    (dict(rank=True, size=2), "rank"), (dict(rank=0, size=2.0), "size"), (dict(rank=2, size=2), "rank"),
    (dict(rank=0, size=0), "size"), (dict(rank=-1, size=1), "rank"), (dict(transport="udp"), "transport"),
    (dict(transport=1), "transport"), (dict(init_method=5), "init_method"),
    (dict(rank=0, size=2, init_method="env://", store=object()), "store"),
    (dict(rank=0, size=2, store=object()), "store"),
])
def test_init_refuses_bad_arguments_before_anything_is_made(kw, arg):
    with pytest.raises(InvalidArgumentError) as ei:
        pyxccl.init(**kw).close()
    assert arg in str(ei.value) and str(ei.value).startswith("pyxccl.init: "), str(ei.value)


def test_init_refuses_a_bad_timeout_from_the_environment(monkeypatch):
    for bad in ("-1", "nan", "inf", "0", "1e12", "soon"):
        monkeypatch.setenv("PYXCCL_TIMEOUT", bad)
        with pytest.raises(InvalidArgumentError, match="PYXCCL_TIMEOUT"):
            pyxccl.init()
    monkeypatch.setenv("PYXCCL_TIMEOUT", "30")
    pyxccl.init(timeout=np.float64(20), transport="tcp").close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", rf.bad_with_peers_names())
def test_with_peers_every_rank_refuses_before_allocating(pools, name):
    for r, (kind, msg, what, peak, works) in enumerate(pools(2).run(rf.refuse_with_peers, name, transport="tcp")):
        assert kind == "InvalidArgumentError", (r, kind, msg)
        assert msg.startswith(f"rank {r}: ") and what in msg, msg
        assert peak < 1 << 20, f"rank {r}: {peak} bytes allocated before refusing"
        assert works, f"rank {r}: the collective after the refusal went wrong"


@pytest.mark.timeout(90)
def test_in_place_forms_give_right_results(pools, transport):
    fails = pools(2).run(rf.in_place_forms, transport=transport)
    assert fails == [[], []], fails


@pytest.mark.timeout(90)
def test_with_peers_the_prepared_path_refuses_too(pools, transport):
    fails = pools(2).run(rf.prepared_still_refuse, transport=transport)
    assert fails == [[], []], fails


@pytest.mark.timeout(90)
def test_in_place_forms_run_prepared(pools, transport):
    """The overlap rule costs the in-place forms nothing: repeated, they run prepared (core/prepared.py)."""
    assert pools(2).run(rf.in_place_full_path_calls, transport=transport) == [0, 0]


@pytest.mark.timeout(90)
def test_the_longest_timeout_runs(pools, transport):
    assert pools(2).run(rf.longest_timeout, transport=transport) == [[], []]
