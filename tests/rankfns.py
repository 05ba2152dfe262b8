"""Functions that run on every rank of a test pool: ``fn(comm, ...)``.

Inputs are small integers so that every reduction is exact in every dtype,
and every rank can compute every other rank's input, hence the numpy
reference, locally. Each check returns a list of failure descriptions
(empty when all is well) so one pool call covers many cases.
"""
from __future__ import annotations

import numpy as np


from pyxccl.dtypes import DTYPES, bfloat16, dtype_name  # noqa: F401  (bfloat16: used by the tests through rankfns)
from pyxccl.ops import ReduceOp, op_error

UFUNC = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
         ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
         ReduceOp.BXOR: np.bitwise_xor, ReduceOp.LAND: np.logical_and, ReduceOp.LOR: np.logical_or}
BIG = (4 << 20) // 4 + 3          # > 4 MiB of float32, not a multiple of anything nice


PERIOD = 30     # data() is one period of this many values, repeated


def data(rank: int, count: int, dt, op=ReduceOp.SUM, salt: int = 0) -> np.ndarray:
    # one period of the values, repeated (np.resize): computing every element was most of the time of the
    # tests that call this for every rank, dtype and size
    i = np.arange(min(count, PERIOD), dtype=np.int64)
    if dt == np.bool_:
        return np.resize((i + rank + salt) % 3 == 0, count)
    if op is ReduceOp.PROD:
        vals = (i * 5 + rank + salt) % 2 + 1          # 1s and 2s: exact products
    else:
        vals = (i * 7 + rank * 3 + salt) % 5 + 1      # 1..5: exact sums up to 8 ranks in float16
    return np.resize(vals.astype(dt), count)


def reference(op, n: int, count: int, dt, salt: int = 0) -> np.ndarray:
    # data() repeats one period, so their reduction does too: reduce a period, then repeat it (reducing
    # whole inputs made a 64-rank reduce_scatter check reduce 64 x 64 blocks on every rank)
    period = min(count, PERIOD)
    acc = data(0, period, dt, op, salt).copy()
    for r in range(1, n):
        UFUNC[op](acc, data(r, period, dt, op, salt), out=acc)
    if op is ReduceOp.AVG:
        np.divide(acc, n, out=acc)
    return np.resize(acc, count)


def valid_pairs(dtypes=DTYPES, ops=tuple(ReduceOp)):
    return [(dt, op) for dt in dtypes for op in ops if op_error(op, np.dtype(dt)) is None]


def covering(pairs):
    """The first pairs that together hold every dtype and every op of ``pairs``: for the large sizes,
    where what is new is the chunking, not the kernel (which every pair meets at the small sizes)."""
    dts, ops, kept = set(), set(), []
    for dt, op in pairs:
        if np.dtype(dt) not in dts or op not in ops:
            kept.append((dt, op))
            dts.add(np.dtype(dt))
            ops.add(op)
    return kept


def _cmp(fails, what, got, exp):
    if got.shape != exp.shape or got.dtype != exp.dtype or not np.array_equal(got, exp):
        bad = np.flatnonzero(got != exp) if got.shape == exp.shape else []
        fails.append(f"{what}: {len(bad)} wrong, first at {bad[:3]}: got {got[bad[:3]]} want {exp[bad[:3]]}"
                     if len(bad) else f"{what}: got {got.dtype}{got.shape}, want {exp.dtype}{exp.shape}")


def check_allreduce(comm, counts, pairs, algorithm=None):
    fails = []
    for count in counts:
        for dt, op in pairs:
            exp = reference(op, comm.size, count, dt)
            x = data(comm.rank, count, dt, op)
            comm.allreduce(x, op=op, algorithm=algorithm)
            _cmp(fails, f"allreduce {op.name} {np.dtype(dt)} n={count} in-place", x, exp)
            x = data(comm.rank, count, dt, op)
            out = np.empty_like(x)
            comm.allreduce(x, op=op, out=out)
            _cmp(fails, f"allreduce {op.name} {np.dtype(dt)} n={count} out", out, exp)
            _cmp(fails, "allreduce input untouched", x, data(comm.rank, count, dt, op))
    return fails


def check_reduce(comm, counts, pairs):
    fails = []
    for root in sorted({0, comm.size - 1}):
        for count in counts:
            for dt, op in pairs:
                x = data(comm.rank, count, dt, op)
                comm.reduce(x, root=root, op=op)
                exp = reference(op, comm.size, count, dt) if comm.rank == root else data(comm.rank, count, dt, op)
                _cmp(fails, f"reduce root={root} {op.name} {np.dtype(dt)} n={count}", x, exp)
    return fails


def check_reduce_scatter(comm, counts, pairs):
    fails, n, r = [], comm.size, comm.rank
    for count in counts:
        for dt, op in pairs:
            exp = reference(op, n, count * n, dt)
            out = np.empty(count, dt)
            comm.reduce_scatter(data(r, count * n, dt, op), out, op=op)
            _cmp(fails, f"reduce_scatter {op.name} {np.dtype(dt)} n={count}", out, exp[r * count:(r + 1) * count])
            vc = [(count + 3 * p) % 11 for p in range(n)]      # uneven, some zero
            off = np.concatenate([[0], np.cumsum(vc)])
            exp = reference(op, n, int(off[-1]), dt)
            out = np.empty(vc[r], dt)
            comm.reduce_scatterv(data(r, int(off[-1]), dt, op), out, vc, op=op)
            _cmp(fails, f"reduce_scatterv {op.name} {np.dtype(dt)} {vc}", out, exp[off[r]:off[r + 1]])
    return fails


def check_movement(comm, counts, dtypes):
    """broadcast, allgather(v), gather(v), scatter(v), alltoall(v): no arithmetic, every dtype."""
    fails, n, r = [], comm.size, comm.rank
    for count in counts:
        for dt in dtypes:
            tag = f"{np.dtype(dt)} n={count}"
            everyone = [data(p, count, dt) for p in range(n)]
            for root in sorted({0, n - 1}):
                x = data(r, count, dt)
                comm.broadcast(x, root=root)
                _cmp(fails, f"broadcast root={root} {tag}", x, everyone[root])
                g = comm.gather(everyone[r], np.empty(count * n, dt) if r == root else None, root=root)
                if r == root:
                    _cmp(fails, f"gather root={root} {tag}", g, np.concatenate(everyone))
                out = np.empty(count, dt)
                comm.scatter(np.concatenate(everyone) if r == root else None, out, root=root)
                _cmp(fails, f"scatter root={root} {tag}", out, everyone[r])
            got = comm.allgather(everyone[r], np.empty(count * n, dt))
            _cmp(fails, f"allgather {tag}", got, np.concatenate(everyone))
            vc = [(count + p) % 5 for p in range(n)]
            parts = [data(p, vc[p], dt, salt=1) for p in range(n)]
            _cmp(fails, f"allgatherv {tag}", comm.allgatherv(parts[r], None, vc), np.concatenate(parts))
            g = comm.gatherv(parts[r], None, vc if r == 0 else None, root=0)
            if r == 0:
                _cmp(fails, f"gatherv {tag}", g, np.concatenate(parts))
            out = np.empty(vc[r], dt)
            comm.scatterv(np.concatenate(parts) if r == 0 else None, out, vc if r == 0 else None, root=0)
            _cmp(fails, f"scatterv {tag}", out, parts[r])
            send = np.concatenate([data(r * n + p, count, dt) for p in range(n)])
            out = np.empty(count * n, dt)
            comm.alltoall(send, out)
            _cmp(fails, f"alltoall {tag}", out, np.concatenate([data(p * n + r, count, dt) for p in range(n)]))
            sc = [(r + p + count) % 4 for p in range(n)]       # rank r sends (r+p+count)%4 to p
            rc = [(p + r + count) % 4 for p in range(n)]
            send = np.concatenate([data(1000 * r + p, sc[p], dt) for p in range(n)])
            out = np.empty(sum(rc), dt)
            comm.alltoallv(send, out, sc, rc)
            _cmp(fails, f"alltoallv {tag}", out, np.concatenate([data(1000 * p + r, rc[p], dt) for p in range(n)]))
    return fails


def check_p2p(comm, counts):
    fails, n, r = [], comm.size, comm.rank
    for count in counts:
        # a ring of isend/irecv in both directions with two tags, then blocking send/recv pairs
        right, left = (r + 1) % n, (r - 1) % n
        a, b = np.empty(count, np.float32), np.empty(count, np.float32)
        wr = [comm.irecv(a, left, tag=1), comm.irecv(b, right, tag=2)]
        ws = [comm.isend(data(r, count, np.float32), right, tag=1), comm.isend(data(r + 50, count, np.float32), left, tag=2)]
        for w in ws + wr:
            w.wait()
        _cmp(fails, f"irecv from left n={count}", a, data(left, count, np.float32))
        _cmp(fails, f"irecv from right n={count}", b, data(right + 50, count, np.float32))
        if n > 1:
            if r == 0:
                for p in range(1, n):
                    got = comm.recv(np.empty(count, np.int64), p, tag=7)
                    _cmp(fails, f"recv from {p}", got, data(p, count, np.int64))
            else:
                comm.send(data(r, count, np.int64), 0, tag=7)
            # any source: half the receives posted before the messages come, half after (buffered).
            # A tag per count: a rank may already send the next count's message meanwhile, which an
            # any-source receive of this count would rightly take.
            tag = 100 + counts.index(count)
            if r == 0:
                bufs = [np.empty(count, np.int64) for _ in range(n - 1)]
                early = [comm.irecv(b, None, tag=tag) for b in bufs[:(n - 1) // 2]]
                comm.barrier()
                works = early + [comm.irecv(b, None, tag=tag) for b in bufs[(n - 1) // 2:]]
                senders = [w.source_rank() for w in works]
                if sorted(senders) != list(range(1, n)):
                    fails.append(f"irecv(src=None) n={count}: senders {senders}")
                for p, b in zip(senders, bufs):
                    _cmp(fails, f"irecv(src=None) from {p} n={count}", b, data(p + 7, count, np.int64))
            else:
                comm.send(data(r + 7, count, np.int64), 0, tag=tag)
                comm.barrier()
    comm.barrier()
    return fails


def check_objects_and_split(comm):
    fails, n, r = [], comm.size, comm.rank
    if comm.allgather_object({"rank": r, "s": "x" * r}) != [{"rank": p, "s": "x" * p} for p in range(n)]:
        fails.append("allgather_object")
    if comm.broadcast_object(("hello", r) if r == n - 1 else None, root=n - 1) != ("hello", n - 1):
        fails.append("broadcast_object")
    sub = comm.split(r % 2, key=-r)
    members = [p for p in range(n) if p % 2 == r % 2][::-1]
    if sub.size != len(members) or sub.rank != members.index(r):
        fails.append(f"split: rank {sub.rank} of {sub.size}, want {members.index(r)} of {len(members)}")
    # parent and child at the same time: async on both, then wait
    x, y = np.full(5, r, np.int64), np.ones(3, np.int64)
    w1 = comm.allreduce(x, async_op=True)
    w2 = sub.allreduce(y, async_op=True)
    w1.wait()
    w2.wait()
    _cmp(fails, "parent allreduce next to child", x, np.full(5, n * (n - 1) // 2, np.int64))
    _cmp(fails, "child allreduce", y, np.full(3, len(members), np.int64))
    none = comm.split(None if r == 0 else 1)
    if (none is None) != (r == 0):
        fails.append("split with color None")
    if none is not None:
        none.close()
    sub.close()
    return fails


def check_bad_inputs(comm):
    """Each bad call raises on this rank before anything is sent; the communicator stays usable."""
    import pyxccl as px
    n, r = comm.size, comm.rank
    f32 = np.zeros(4, np.float32)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    shared = np.zeros(2 * n, np.float32)
    cases = [
        ("allreduce", "dtype", lambda: comm.allreduce(np.zeros(4, np.complex64))),
        ("allreduce", "out has dtype", lambda: comm.allreduce(f32, out=np.zeros(4, np.float64))),
        ("allreduce", "not C-contiguous", lambda: comm.allreduce(np.zeros((4, 4), np.float32)[:, 1])),
        ("allreduce", "read-only", lambda: comm.allreduce(ro)),
        ("allreduce", "read-only", lambda: comm.allreduce(bytes(16))),
        ("allreduce", "BXOR", lambda: comm.allreduce(f32, op=px.ReduceOp.BXOR)),
        ("allreduce", "AVG needs a floating", lambda: comm.allreduce(np.zeros(4, np.int32), op="avg")),
        ("allreduce", "unknown reduce op", lambda: comm.allreduce(f32, op="median")),
        ("allreduce", "out has 3 elements", lambda: comm.allreduce(f32, out=np.zeros(3, np.float32))),
        ("allreduce", "no algorithm", lambda: comm.allreduce(f32, algorithm="nonsense")),
        ("broadcast", "root=", lambda: comm.broadcast(f32, root=n)),
        ("broadcast", "root=", lambda: comm.broadcast(f32, root=-1)),
        ("reduce", "root=", lambda: comm.reduce(f32, root=n + 3)),
        ("allgather", "recvbuf has", lambda: comm.allgather(f32, np.zeros(4 * n + 1, np.float32))),
        ("allgather", "recvbuf has dtype", lambda: comm.allgather(f32, np.zeros(4 * n, np.int32))),
        ("allgatherv", "entries", lambda: comm.allgatherv(f32, None, [4] * (n + 1))),
        ("allgatherv", "negative", lambda: comm.allgatherv(f32, None, [4] * (n - 1) + [-1]) if n > 1
         else comm.allgatherv(f32, None, [-1])),
        ("allgatherv", f"counts[{r}]", lambda: comm.allgatherv(f32, None, [5] * n)),
        ("reduce_scatterv", "adds up", lambda: comm.reduce_scatterv(np.zeros(4 * n, np.float32),
                                                                    np.zeros(4, np.float32), [4] * (n - 1) + [5])),
        ("reduce_scatterv", "adds up", lambda: comm.reduce_scatterv(np.zeros(4 * n + 1, np.float32),
                                                                    np.zeros(4, np.float32), [4] * n)),
        ("alltoall", "recvbuf has dtype", lambda: comm.alltoall(np.zeros(4 * n, np.float32),
                                                                np.zeros(4 * n, np.float64))),
        ("alltoall", "overlap", lambda: comm.alltoall(shared, shared)),
        ("alltoallv", "adds up", lambda: comm.alltoallv(f32, np.zeros(4, np.float32), [1] * n, [4] * n)),
        ("alltoallv", "equal blocks", lambda: comm.alltoallv(np.zeros(n, np.float32), np.zeros(n, np.float32),
                                                             [1] * n, [1] * n, algorithm="bruck")),
        ("scatter", "must pass sendbuf", lambda: comm.scatter(None, f32, root=r)),
        ("gatherv", "needs counts", lambda: comm.gatherv(f32, None, None, root=r)),
        ("gatherv", "only the root", lambda: comm.gatherv(f32, None, [4] * n, algorithm="binomial")),
        ("scatterv", "only the root", lambda: comm.scatterv(None, f32, [4] * n, algorithm="hierarchical")),
        ("alltoallv", "equal blocks", lambda: comm.alltoallv(np.zeros(n, np.float32), np.zeros(n, np.float32),
                                                             [1] * n, [1] * n, algorithm="hierarchical")),
        ("send", "dst=", lambda: comm.send(f32, n)),
        ("recv", "src=", lambda: comm.recv(f32, -2)),
        ("send", "tag=", lambda: comm.send(f32, 0, tag=-5)),
        ("allreduce", "not a numpy array", lambda: comm.allreduce([1.0, 2.0])),
        ("split", "color", lambda: comm.split(-3)),
    ]
    if n > 1:
        cases.append(("alltoall", "not a multiple", lambda: comm.alltoall(np.zeros(4 * n + 1, np.float32),
                                                                        np.zeros(4 * n + 1, np.float32))))
    fails = []
    for op, phrase, call in cases:
        try:
            call()
        except px.InvalidArgumentError as e:
            msg = str(e)
            if f"rank {r}" not in msg or op not in msg or phrase not in msg:
                fails.append(f"{op}/{phrase}: message lacks rank, op or phrase: {msg}")
        except Exception as e:  # noqa: BLE001
            fails.append(f"{op}/{phrase}: raised {type(e).__name__}: {e}")
        else:
            fails.append(f"{op}/{phrase}: no error")
        x = np.full(3, r, np.int64)                 # the communicator still works
        comm.allreduce(x)
        if not (x == n * (n - 1) // 2).all():
            fails.append(f"allreduce after {op}/{phrase} gave {x}")
    return fails


def check_recv_timeout(comm):
    """A receive nobody answers times out naming the peer; a p2p timeout leaves the communicator usable."""
    import time

    import pyxccl as px
    fails, n, r = [], comm.size, comm.rank
    if n > 1 and r == 0:
        t = time.monotonic()
        try:
            comm.recv(np.empty(2, np.float32), 1, tag=99, timeout=0.5)
            fails.append("recv returned")
        except px.CommTimeoutError as e:
            if e.peer != 1 or "rank 1" not in str(e) or "recv" not in str(e) or e.seq is None:
                fails.append(f"timeout message: {e}")
            if not 0.4 < time.monotonic() - t < 5:
                fails.append(f"timeout after {time.monotonic() - t:.2f} s")
    comm.barrier()
    x = np.ones(2, np.float32)
    comm.allreduce(x)
    if not (x == n).all():
        fails.append("allreduce after recv timeout")
    return fails


def idle_cpu(comm, sleep_s: float):
    """Rank 0 waits for rank 1, which sleeps first: the CPU seconds rank 0's process burns meanwhile."""
    import time
    if comm.rank == 1:
        time.sleep(sleep_s)
        comm.send(np.ones(1, np.float32), 0)
    cpu = time.process_time()
    if comm.rank == 0:
        comm.recv(np.empty(1, np.float32), 1)
    cpu = time.process_time() - cpu
    comm.barrier()
    return cpu


def timeout_in_collective(comm):
    """Rank 0 enters an allreduce that rank 1 never calls: CommTimeoutError, then the comm refuses calls."""
    import pyxccl as px
    if comm.rank != 0:
        return None
    out = {}
    try:
        comm.allreduce(np.ones(10, np.float32), timeout=1.0)
    except px.CommTimeoutError as e:
        out["err"] = (type(e).__name__, e.peer, e.op, e.seq, str(e))
    try:
        comm.allreduce(np.ones(10, np.float32))
    except px.CommAbortedError as e:
        out["after"] = str(e)
    return out


def killed_mid_allreduce(comm, victim: int, kill_at: float):
    """``victim`` SIGKILLs itself at wall time ``kill_at`` inside a loop of allreduces; the others report
    what they raised and how long after ``kill_at``."""
    import os
    import signal
    import threading
    import time

    import pyxccl as px
    if comm.rank == victim:
        threading.Timer(max(0.0, kill_at - time.time()), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    x = np.ones(1 << 20, np.float32)
    try:
        while True:
            comm.allreduce(x)
            x[:] = 1
    except px.PyxcclError as e:
        return type(e).__name__, e.peer, time.time() - kill_at, str(e)


def divide_by_zero_on(comm, rank):
    if comm.rank == rank:
        return 1 // 0
    return None


def rank_of(comm):
    return comm.rank


def threads_after_close(comm):
    """Threads a fresh world communicator leaves behind after close() (should be none)."""
    import os
    import threading
    import time

    import pyxccl
    from pyxccl.rendezvous import PrefixStore, TCPStore

    def ours():
        return {t for t in threading.enumerate() if t.name.startswith("pyxccl")}
    before = ours()
    store = TCPStore("127.0.0.1", int(os.environ["PYXCCL_POOL_STORE_PORT"]), is_server=False)
    fresh = pyxccl.init(comm.rank, comm.size, store=PrefixStore("fresh", store),
                        transport=comm.transport((comm.rank + 1) % comm.size))
    fresh.allreduce(np.ones(4, np.float32))
    fresh.allreduce(np.ones(4, np.float32))         # the shape is prepared now
    fresh.close()
    store.close()
    for what, call in (("a prepared allreduce", lambda: fresh.allreduce(np.ones(4, np.float32))),
                       ("an allgather of a new shape", lambda: fresh.allgather(np.ones(3, np.int64)))):
        try:
            call()
            return f"{what} after close did not raise"
        except pyxccl.CommClosedError as e:
            if f"rank {comm.rank}" not in str(e) or "closed" not in str(e):
                return f"bad message: {e}"
    time.sleep(0.3)
    return len(ours() - before)


def check_buffer_kinds(comm):
    """bytearray, array.array and memoryview work in place, like numpy arrays."""
    import array
    fails, n, r = [], comm.size, comm.rank
    ba = bytearray([r + 1] * 8)
    comm.allreduce(ba, op="max")
    if list(ba) != [n] * 8:
        fails.append(f"bytearray allreduce: {list(ba)}")
    arr = array.array("d", [float(r)] * 5)
    comm.allreduce(arr)
    if list(arr) != [n * (n - 1) / 2] * 5:
        fails.append(f"array.array allreduce: {list(arr)}")
    mv = memoryview(bytearray(4 * n)).cast("i")
    comm.allgather(np.array([r * 10], np.int32), mv)
    if list(mv) != [p * 10 for p in range(n)]:
        fails.append(f"memoryview allgather: {list(mv)}")
    return fails


def check_torch_tensors(comm):
    """torch CPU tensors (float32, bfloat16, int64): zero-copy, in place."""
    import torch
    fails, n, r = [], comm.size, comm.rank
    for dt in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        t = torch.full((3, 4), r + 1, dtype=dt) if dt != torch.bool else torch.tensor([r == 0] * 4)
        ptr = t.data_ptr()
        out = comm.allreduce(t, op="max")
        want = torch.full((3, 4), n, dtype=dt) if dt != torch.bool else torch.tensor([True] * 4)
        if out is not t or t.data_ptr() != ptr or not torch.equal(t, want):
            fails.append(f"torch {dt} allreduce: {t}")
    g = torch.empty(2 * n, dtype=torch.float32)
    comm.allgather(torch.tensor([r, -r], dtype=torch.float32), g)
    if g.tolist() != [v for p in range(n) for v in (p, -p)]:
        fails.append(f"torch allgather: {g}")
    w = torch.ones(4, requires_grad=True)
    comm.allreduce(w.detach())
    if w.detach().tolist() != [n] * 4:
        fails.append("allreduce through .detach() of a leaf tensor")
    try:
        comm.allreduce(torch.ones(4, 4).t())
        fails.append("non-contiguous tensor accepted")
    except Exception as e:  # noqa: BLE001
        if "non-contiguous" not in str(e):
            fails.append(f"non-contiguous tensor: {e}")
    return fails


def check_forced(comm, primitive, names, counts, pairs):
    """Run ``primitive`` with each algorithm in ``names`` forced ("usable": every one this communicator
    can run; the one-host fast path included whenever it has a segment); compare with numpy."""
    fails, n, r = [], comm.size, comm.rank
    if names == "usable":
        names = comm.algorithms(primitive)
        # (one rank has it unless PYXCCL_TRANSPORT=tcp, which its transport() does not show: test_floor and
        # test_layers check those)
        if n > 1 and ("segment" in names) != all(comm.transport(p) in ("shm", "self") for p in range(n)):
            fails.append(f"{primitive}: usable algorithms {names} (the fast path is missing or out of place)")
    movement_dtypes = sorted({np.dtype(dt) for dt, _ in pairs}, key=str)
    for name in names:
        for count in counts:
            if primitive == "allreduce":
                for dt, op in pairs:
                    x = data(r, count, dt, op)
                    comm.allreduce(x, op=op, algorithm=name)
                    _cmp(fails, f"allreduce[{name}] {op.name} {np.dtype(dt)} n={count}", x,
                         reference(op, n, count, dt))
            elif primitive == "reduce":
                for dt, op in pairs:
                    x = data(r, count, dt, op)
                    root = count % n
                    comm.reduce(x, root=root, op=op, algorithm=name)
                    exp = reference(op, n, count, dt) if r == root else data(r, count, dt, op)
                    _cmp(fails, f"reduce[{name}] root={root} {op.name} {np.dtype(dt)} n={count}", x, exp)
            elif primitive == "reduce_scatter":
                for dt, op in pairs:
                    out = np.empty(count, dt)
                    comm.reduce_scatter(data(r, count * n, dt, op), out, op=op, algorithm=name)
                    _cmp(fails, f"reduce_scatter[{name}] {op.name} {np.dtype(dt)} n={count}", out,
                         reference(op, n, count * n, dt)[r * count:(r + 1) * count])
            elif primitive == "barrier":
                comm.barrier()
            else:
                for dt in movement_dtypes:
                    _movement_forced(comm, primitive, name, count, dt, fails)
    return fails


def forced_allreduce_refused(comm, name):
    """(whether ``comm.algorithms("allreduce")`` lists ``name``, the message of the InvalidArgumentError a
    forced allreduce with ``name`` raises, or None if it ran); the communicator must stay usable."""
    from pyxccl import InvalidArgumentError
    listed = name in comm.algorithms("allreduce")
    try:
        comm.allreduce(np.ones(8, np.float32), algorithm=name)
        why = None
    except InvalidArgumentError as e:
        why = str(e)
    x = np.ones(8, np.float32)
    comm.allreduce(x)
    assert (x == comm.size).all(), x
    return listed, why


def _movement_forced(comm, primitive, name, count, dt, fails):
    n, r = comm.size, comm.rank
    everyone = [data(p, count, dt) for p in range(n)]
    root = (count + 1) % n
    tag = f"{primitive}[{name}] {dt} n={count}"
    if primitive == "broadcast":
        x = data(r, count, dt)
        comm.broadcast(x, root=root, algorithm=name)
        _cmp(fails, tag, x, everyone[root])
    elif primitive == "allgather":
        _cmp(fails, tag, comm.allgather(everyone[r], algorithm=name), np.concatenate(everyone))
        vc = [(count + p) % 5 for p in range(n)]
        parts = [data(p, vc[p], dt, salt=1) for p in range(n)]
        _cmp(fails, tag + " v", comm.allgatherv(parts[r], None, vc, algorithm=name), np.concatenate(parts))
    elif primitive == "gather":
        g = comm.gather(everyone[r], None, root=root, algorithm=name)
        if r == root:
            _cmp(fails, tag, g, np.concatenate(everyone))
    elif primitive == "scatter":
        out = np.empty(count, dt)
        comm.scatter(np.concatenate(everyone) if r == root else None, out, root=root, algorithm=name)
        _cmp(fails, tag, out, everyone[r])
    elif primitive == "alltoall":
        send = np.concatenate([data(r * n + p, count, dt) for p in range(n)])
        out = np.empty(count * n, dt)
        comm.alltoall(send, out, algorithm=name)
        _cmp(fails, tag, out, np.concatenate([data(p * n + r, count, dt) for p in range(n)]))


def link_classes(comm):
    return [comm.link_class(comm.rank, p) for p in range(comm.size)]


def link_rule_mismatches(comm):
    """This rank's pairs whose class (``HostLinks``, the rule the tuner trusts without asking) is not the
    transport its connection to the peer uses: shared memory where it is, else TCP on one host or between."""
    host = [t["host"] for t in comm.topology()]
    out = []
    for p in range(comm.size):
        kind = comm.connection(p)["transport"]
        want = kind if kind in ("self", "shm") else "tcp_local" if host[p] == host[comm.rank] else "tcp"
        if comm.link_class(comm.rank, p) != want:
            out.append((comm.rank, p, comm.link_class(comm.rank, p), want))
    return out


def idle_cpu_in_collective(comm, sleep_s: float):
    """Every rank but the last enters an allreduce; the last sleeps first. CPU seconds of rank 0, in a
    call made once before: what a first call prepares (its plan, its buffers) is not waiting."""
    import time
    comm.allreduce(np.ones(4, np.float32))
    comm.barrier()
    if comm.rank == comm.size - 1:
        time.sleep(sleep_s)
    cpu = time.process_time()
    comm.allreduce(np.ones(4, np.float32))
    return time.process_time() - cpu, comm.algorithm_for("allreduce", 16)


def fresh_port(comm) -> int:
    """A port free a moment ago on rank 0, told to every rank: picked just before a second job's store
    binds it (a port picked by the test's process, long before, may be taken by then)."""
    from pyxccl.launcher import free_port
    return comm.broadcast_object(free_port() if comm.rank == 0 else None, 0)


def init_with_secrets(comm, secrets: list[str]):
    """A second job on this pool, each rank with its own PYXCCL_SECRET: what does init raise?"""
    import os

    import pyxccl
    port = fresh_port(comm)
    os.environ["PYXCCL_SECRET"] = secrets[comm.rank]
    try:
        pyxccl.init(comm.rank, comm.size, init_method=f"tcp://127.0.0.1:{port}", timeout=8).close()
        return "no error"
    except pyxccl.PyxcclError as e:
        return f"{type(e).__name__}: {e}"
    finally:
        del os.environ["PYXCCL_SECRET"]


def on_new_comm(comm, env: dict, checks: list):
    """Make a second world communicator with ``env`` set (e.g. PYXCCL_NSOCKS), run
    ``[(check_fn, args), ...]`` on it, close it; return the failures."""
    import os

    import pyxccl
    port = fresh_port(comm)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        c = pyxccl.init(comm.rank, comm.size, init_method=f"tcp://127.0.0.1:{port}", timeout=60)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    try:
        links = {(c.connection(p)["transport"], c.connection(p)["connections"]) for p in range(c.size)
                 if p != c.rank}
        fails = [] if c.size == 1 or links == {("tcp", int(env["PYXCCL_NSOCKS"]))} else [f"connections {links}"]
        for fn, args in checks:
            fails += globals()[fn](c, *args)
        return fails
    finally:
        c.close()


# --- ranks that disagree about a call ----------------------------------------------------------

MISMATCHES = ("dtype", "count", "op", "primitive", "root", "extra_call", "algorithm", "single_copy_counts")
FOREIGN = 1 << 20        # the disagreeing rank's values: a bit no agreeing rank's data has


def _mismatched_call(comm, kind: str, odd: bool, timeout: float, path: str):
    """Make call ``kind`` of the mismatch matrix: ``odd`` is the one rank that disagrees; ``path``:
    "segment" (the one-host fast path), "prepared" (the same, after every rank made both forms of the
    call twice, so that each form runs prepared) or "messages" (each primitive's default message
    algorithm). Returns the buffer the call writes into (to be looked at afterwards)."""
    from pyxccl.algorithms import registry
    r, n = comm.rank, comm.size
    if path == "prepared":
        forms = (False,) if kind == "single_copy_counts" else (False, True)   # its odd form disagrees by itself
        for form in forms * 2:
            _mismatched_call(comm, kind, form, timeout, "segment")
        path = "segment"

    def algo(prim):
        return "segment" if path == "segment" else registry.default(prim)
    mine = np.int32(FOREIGN if odd else 1 << r)
    x = np.full(1000, mine, np.int32)
    if kind == "dtype":
        x = x.astype(np.int64) if odd else x
        comm.allreduce(x, timeout=timeout, algorithm=algo("allreduce"))
    elif kind == "count":
        x = np.full(1001, mine, np.int32) if odd else x
        comm.allreduce(x, timeout=timeout, algorithm=algo("allreduce"))
    elif kind == "op":
        comm.allreduce(x, op="max" if odd else "sum", timeout=timeout, algorithm=algo("allreduce"))
    elif kind == "algorithm":
        other = "ring" if path == "segment" else "direct"
        comm.allreduce(x, algorithm=other if odd else algo("allreduce"), timeout=timeout)
    elif kind == "primitive":
        if odd:
            x = np.zeros(1000 * n, np.int32)
            comm.allgather(np.full(1000, mine, np.int32), x, timeout=timeout, algorithm=algo("allgather"))
        else:
            comm.allreduce(x, timeout=timeout, algorithm=algo("allreduce"))
    elif kind == "root":
        comm.broadcast(x, root=1 if odd else 0, timeout=timeout, algorithm=algo("broadcast"))
    elif kind == "extra_call":
        if odd:
            comm.allreduce(x, timeout=timeout, algorithm=algo("allreduce"))
        comm.barrier(timeout=timeout, algorithm=algo("barrier"))
    elif kind == "single_copy_counts":
        # a scatter large enough for single-copy reads; the root's buffer is followed by a planted
        # value that must never reach the others, who expect more elements than the root has
        count = (1 << 20) // 4
        send = None
        if r == 0:
            whole = np.full(n * count + 4096, -7, np.int32)
            send = whole[:n * count]
            send[:] = 1
        x = np.zeros(count + (4096 if odd else 0), np.int32)
        comm.scatter(send, x, root=0, timeout=timeout, algorithm=algo("scatter"))
    return x


_SPARE = []


def make_spare(comm):
    """A communicator for the next check_mismatch, made in a call of its own: a rank that raced ahead
    into the mismatch could otherwise abort it while another rank is still setting it up."""
    _SPARE.append(comm.dup())


def check_mismatch(comm, kind: str, path: str, timeout: float = 5.0):
    """The last rank disagrees with the others about one call (``kind``, see MISMATCHES; ``path``,
    see _mismatched_call). Every rank must raise ProtocolError (in that call, or in the next one at
    the latest), soon; no rank may hold a byte of a disagreeing call; the communicator stays aborted.
    Returns what this rank saw."""
    import time

    import pyxccl
    c = _SPARE.pop()
    odd = c.rank == c.size - 1
    t0 = time.monotonic()
    errors, x = [], None
    try:
        x = _mismatched_call(c, kind, odd, timeout, path)
    except pyxccl.ProtocolError as e:
        errors.append(("call", type(e).__name__, str(e)))
    while not errors and time.monotonic() < t0 + 2:   # a rank that only sent may hear of it a moment later
        try:
            c.barrier(timeout=timeout)
        except pyxccl.ProtocolError as e:
            errors.append(("next", type(e).__name__, str(e)))
    seconds = time.monotonic() - t0
    try:
        c.barrier(timeout=timeout)
        still = "a later call ran"
    except pyxccl.ProtocolError:
        still = None
    except Exception as e:  # noqa: BLE001
        still = f"a later call raised {type(e).__name__}: {e}"
    c.close()
    foreign = _foreign(kind, comm, odd, x)
    return dict(errors=errors, seconds=seconds, still=still, foreign=foreign)


def _foreign(kind, comm, odd, x):
    """Bytes in this rank's buffer that came from a call it did not make (None: none)."""
    if x is None or kind == "extra_call":
        return None
    r, n = comm.rank, comm.size
    if kind == "single_copy_counts":
        return "the root's planted value" if (x == -7).any() else None
    if kind == "root":
        vals = set(np.unique(x).tolist())
        return None if vals <= ({FOREIGN} if odd else {1 << r, 1}) else f"values {sorted(vals)}"
    agreeing = sum(1 << p for p in range(n - 1))
    vals = np.unique(x.astype(np.int64))
    if odd:          # the odd rank's own data, untouched (or its allgather's own block next to zeros)
        bad = [v for v in vals.tolist() if v not in (FOREIGN, 0)]
    else:            # sums of agreeing ranks' values only
        bad = [v for v in vals.tolist() if v <= 0 or v & ~agreeing]
    return f"values {bad[:5]}" if bad else None


def issue_from_two_threads(comm, calls: int = 150, timeout: float = 5.0):
    """Two threads issue allreduces on one communicator, each with its own data. Returns, per thread,
    the wrong results seen and the error that stopped it (if any)."""
    import threading

    import pyxccl
    c = comm.dup()
    n = c.size
    out = {}

    def hammer(k):
        wrong, err = 0, None
        try:
            for i in range(calls):
                x = np.full(4, (k + 1) * 1000 + i + c.rank, np.int64)
                c.allreduce(x, timeout=timeout)
                if not (x == n * ((k + 1) * 1000 + i) + n * (n - 1) // 2).all():
                    wrong += 1
        except pyxccl.PyxcclError as e:
            err = (type(e).__name__, str(e))
        out[k] = dict(wrong=wrong, error=err)
    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.close()
    return out


def memory_growth(comm, calls: int = 1500) -> int:
    """Bytes of Python memory still held after ``calls`` pairs of small collectives, once warm: traced
    from the first pair on, read after ``calls`` pairs and again after as many more (the flight
    recorder, full by then, replaces its entries: what it holds does not grow)."""
    import gc
    import tracemalloc
    x = np.ones(2, np.float32)
    for _ in range(200):
        comm.allreduce(x)
        comm.broadcast(x, root=comm.size - 1)
    from pyxccl.core.recorder import capacity
    assert 2 * calls >= capacity()
    tracemalloc.start()
    held = []
    for _ in range(2):
        for _ in range(calls):
            comm.allreduce(x)
            comm.broadcast(x, root=comm.size - 1)     # the root only sends: nothing may pile up at it
        comm.barrier()
        gc.collect()
        held.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    return held[1] - held[0]


# --- prepared calls (core/prepared.py) -------------------------------------------------------------

def check_prepared(comm, counts, pairs, reps: int = 3):
    """Every primitive made ``reps`` times with the same shape and new data each time (from the second
    call on it runs prepared): every result right, in place and out of place, every root."""
    fails, n, r = [], comm.size, comm.rank
    for count in counts:
        for dt, op in pairs:
            tag = f"{op.name} {np.dtype(dt)} n={count}"
            out = np.empty(count, dt)
            for k in range(reps):
                x = data(r, count, dt, op, salt=k)
                comm.allreduce(x, op)
                _cmp(fails, f"allreduce #{k} {tag}", x, reference(op, n, count, dt, k))
                comm.allreduce(data(r, count, dt, op, salt=k), op, out=out)
                _cmp(fails, f"allreduce out= #{k} {tag}", out, reference(op, n, count, dt, k))
                for root in sorted({0, n - 1}):
                    x = data(r, count, dt, op, salt=k)
                    comm.reduce(x, root, op)
                    _cmp(fails, f"reduce root={root} #{k} {tag}", x,
                         reference(op, n, count, dt, k) if r == root else data(r, count, dt, op, salt=k))
                rs = np.empty(count, dt)
                whole = [data(p, count * n, dt, op, salt=k) for p in range(n)]
                comm.reduce_scatter(whole[r], rs, op)
                exp = whole[0].copy()
                for p in range(1, n):
                    UFUNC[op](exp, whole[p], out=exp)
                if op is ReduceOp.AVG:
                    np.divide(exp, n, out=exp)
                _cmp(fails, f"reduce_scatter #{k} {tag}", rs, exp[r * count:(r + 1) * count])
        for dt in sorted({np.dtype(d) for d, _ in pairs}, key=str):
            for k in range(reps):
                tag = f"{dt} n={count} #{k}"
                everyone = [data(p, count, dt, salt=k) for p in range(n)]
                for root in sorted({0, n - 1}):
                    x = data(r, count, dt, salt=k + 7)
                    comm.broadcast(x, root)
                    _cmp(fails, f"broadcast root={root} {tag}", x, data(root, count, dt, salt=k + 7))
                    g = comm.gather(everyone[r], np.empty(count * n, dt) if r == root else None, root)
                    if r == root:
                        _cmp(fails, f"gather root={root} {tag}", g, np.concatenate(everyone))
                    got = np.empty(count, dt)
                    comm.scatter(np.concatenate(everyone) if r == root else None, got, root)
                    _cmp(fails, f"scatter root={root} {tag}", got, everyone[r])
                got = np.empty(count * n, dt)
                comm.allgather(everyone[r], got)
                _cmp(fails, f"allgather {tag}", got, np.concatenate(everyone))
                send = np.concatenate([data(r * n + p, count, dt, salt=k) for p in range(n)])
                comm.alltoall(send, got)
                _cmp(fails, f"alltoall {tag}", got, np.concatenate([data(p * n + r, count, dt, salt=k)
                                                                    for p in range(n)]))
            comm.barrier()
    return fails


def check_prepared_refusals(comm):
    """After a call shape is prepared, a call of the same dtypes and sizes that the full path refuses
    (non-contiguous, read-only output, overlapping alltoall buffers) is still refused, on the calling
    rank, before any byte moves; the communicator stays usable. Returns the failures."""
    import pyxccl
    fails, n, r = [], comm.size, comm.rank
    x, out = np.ones(8, np.float32), np.empty(8 * n, np.float32)
    for _ in range(3):
        comm.allreduce(x)
        comm.allgather(x, out)
        comm.alltoall(out, np.empty(8 * n, np.float32))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    wide = np.ones(16, np.float32)
    both = np.zeros(16 * n, np.float32)
    for what, call in (("non-contiguous allreduce", lambda: comm.allreduce(wide[::2])),
                       ("read-only allreduce", lambda: comm.allreduce(ro)),
                       ("non-contiguous allgather", lambda: comm.allgather(wide[::2], out)),
                       ("read-only allgather output", lambda: comm.allgather(x, _readonly(8 * n))),
                       ("overlapping alltoall", lambda: comm.alltoall(both[:8 * n], both[4:8 * n + 4]))):
        try:
            call()
            fails.append(f"{what}: ran")
        except pyxccl.InvalidArgumentError:
            pass
    y = np.full(8, r + 1, np.float32)
    comm.allreduce(y)
    if not (y == n * (n + 1) / 2).all():
        fails.append(f"allreduce after the refusals: {y}")
    return fails


def _readonly(count: int) -> np.ndarray:
    a = np.empty(count, np.float32)
    a.flags.writeable = False
    return a


def _checks_made(calls, reps: int) -> int:
    """Argument checks (pyxccl.comm.Check objects) made by ``reps`` runs of ``calls()`` after one."""
    import pyxccl.comm as api
    calls()
    made, real = [], api.Check
    api.Check = lambda *a: made.append(a) or real(*a)
    try:
        for _ in range(reps):
            calls()
    finally:
        api.Check = real
    return len(made)


def _repeated_forms(comm, x, out, other) -> list:
    """The call forms full_path_calls repeats, in its order, each as a function of no arguments."""
    n, r = comm.size, comm.rank
    return [lambda: comm.allreduce(x),
            lambda: comm.allreduce(x, out=out[:4]),
            lambda: comm.broadcast(x, 0),
            lambda: comm.reduce(x, n - 1),
            lambda: comm.allgather(x, out),
            lambda: comm.reduce_scatter(out, x),
            lambda: comm.alltoall(out, other),
            lambda: comm.gather(x, out if r == 0 else None, 0),
            lambda: comm.gather(x, None, 0),                # the root allocates
            lambda: comm.allgather(x),                      # allocates
            lambda: comm.scatter(out if r == 0 else None, x, 0),
            lambda: comm.allreduce(x, async_op=True).wait(),
            lambda: comm.barrier()]


def full_path_calls(comm, reps: int = 5) -> int:
    """Argument checks run by ``reps`` repeated blocking calls of each primitive after a warm-up:
    0 when every repeat ran prepared (core/prepared.py): allocating forms and async calls too."""
    n = comm.size
    forms = _repeated_forms(comm, np.ones(4, np.float32), np.empty(4 * n, np.float32), np.empty(4 * n, np.float32))

    def calls():
        for call in forms:
            call()
    return _checks_made(calls, reps)


def full_path_calls_in_a_full_cache(comm) -> int:
    """``full_path_calls`` on a new communicator that already kept _KEPT calls, its own root-allocating
    gather the oldest of them (as in a rank pool that ran other tests first): the loop's first run hits
    the gather's key, then keeps the allocating allgather, a form first seen after it; evicting by age
    alone, the gather went and its next repeat took the full path (core/prepared.py, PreparedCalls)."""
    from floorfns import context
    from pyxccl.core.prepared import _KEPT
    sub = comm.dup()                        # (its kept calls: none yet)
    try:
        n = sub.size
        forms = _repeated_forms(sub, np.ones(4, np.float32), np.empty(4 * n, np.float32),
                                np.empty(4 * n, np.float32))
        gather_allocating = 8               # (its place in the loop)
        forms[gather_allocating]()          # kept first: the oldest
        for call in forms[:gather_allocating]:
            call()                          # the forms the loop calls before that gather, kept next
        fill = np.array([_KEPT - len(context(sub).prepared)], np.int64)
        sub.broadcast(fill, 0)              # (rank 0's count: every rank makes the same calls)
        for k in range(int(fill[0])):
            sub.allreduce(np.ones(k + 10, np.float32))
        return full_path_calls(sub)
    finally:
        sub.close()


def torch_full_path_calls(comm, reps: int = 5) -> int:
    """As full_path_calls, with torch CPU tensors (what DDP passes): their repeats run prepared too."""
    import torch
    n = comm.size
    x, out = torch.ones(4), torch.empty(4 * n)

    def calls():
        comm.allreduce(x)
        comm.allreduce(x, async_op=True).wait()
        comm.broadcast(x, 0)
        comm.allgather(x, out)
        comm.reduce_scatter(out, x)
    return _checks_made(calls, reps)


def check_nan_and_overflow(comm, algorithm=None):
    """MIN and MAX propagate NaN as numpy's minimum/maximum do; integer sums wrap; float sums
    saturate to inf: the same bits on every rank, prepared or not."""
    fails, n, r = [], comm.size, comm.rank
    for dt in (np.float32, np.float64):
        for op, uf in ((ReduceOp.MIN, np.minimum), (ReduceOp.MAX, np.maximum)):
            for _ in range(2):
                x = np.arange(6, dtype=dt) + r
                if r == n - 1:
                    x[[1, 4]] = np.nan
                exp = np.arange(6, dtype=dt)
                for p in range(1, n):
                    y = np.arange(6, dtype=dt) + p
                    if p == n - 1:
                        y[[1, 4]] = np.nan
                    exp = uf(exp, y)
                comm.allreduce(x, op, algorithm=algorithm)
                if not np.array_equal(x, exp, equal_nan=True):
                    fails.append(f"{op.name} {np.dtype(dt)} with NaN: got {x}, want {exp}")
        big = np.full(3, np.finfo(dt).max, dt)
        comm.allreduce(big, algorithm=algorithm)
        if not np.isinf(big).all():
            fails.append(f"SUM {np.dtype(dt)} of max values: got {big}")
    for dt in (np.int8, np.uint16, np.int64):
        x = np.full(5, np.iinfo(dt).max, dt)
        comm.allreduce(x, algorithm=algorithm)
        want = np.full(5, np.iinfo(dt).max, dt)
        for _ in range(n - 1):
            want = np.add(want, np.iinfo(dt).max, dtype=dt, casting="unsafe")
        if not np.array_equal(x, want):
            fails.append(f"SUM {np.dtype(dt)} overflow: got {x}, want {want}")
    return fails


# --- reliability: faults, blame, abort (test_faults.py) ----------------------------------------

FAULT_PRIMS = ("allreduce", "allgather", "alltoall", "broadcast")


def _fault_call(comm, prim: str, count: int):
    n = comm.size
    x = np.ones(count, np.float32)
    if prim == "allreduce":
        comm.allreduce(x)
    elif prim == "allgather":
        comm.allgather(x, np.empty(count * n, np.float32))
    elif prim == "alltoall":
        comm.alltoall(np.ones(count * n, np.float32), np.empty(count * n, np.float32))
    else:
        comm.broadcast(x, root=0)


def killed_in(comm, victim: int, prim: str, when: str):
    """``victim`` SIGKILLs itself ``when`` = "before" the others call ``prim``, "during" a loop of large
    ``prim`` calls, or "after" every rank completed one; the others report (error type, its peer, the
    seconds from their last call's start to the error, the message)."""
    import os
    import signal
    import threading
    import time

    import pyxccl as px
    me = comm.rank == victim
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    t0 = time.monotonic()
    try:        # a survivor still finishing the calls before the kill may meet the loss there: as good
        _fault_call(comm, prim, 16)
        comm.barrier()
        if when == "after":
            _fault_call(comm, prim, 16)
            if me:
                die()
        elif when == "before" and me:
            die()
        elif when == "during" and me:
            threading.Timer(0.3, die).start()
        time.sleep(0.1 if when != "during" else 0)
        count = 1 << 18 if when == "during" else 16
        while True:
            t0 = time.monotonic()
            _fault_call(comm, prim, count)
    except px.PyxcclError as e:
        return type(e).__name__, e.peer, time.monotonic() - t0, str(e)


def stops_calling(comm, idle: int, timeout: float):
    """Rank ``idle`` stops making calls (sleeps past the others' deadline, then tries once); the others'
    allreduce times out. Returns (error type, peer, message) of every rank's failing call."""
    import time

    import pyxccl as px
    x = np.ones(1000, np.float32)
    for _ in range(5):
        comm.allreduce(x)
    if comm.rank == idle:
        time.sleep(timeout + 1.5)
    try:
        comm.allreduce(x, timeout=timeout)
        return None
    except px.PyxcclError as e:
        return type(e).__name__, e.peer, str(e)


def aborted_from_a_thread(comm, delay: float):
    """Rank 0 calls comm.abort() from a timer thread while it waits in a recv that nothing answers and
    the others wait in an allreduce rank 0 never joins: (error type, peer, seconds) on every rank."""
    import threading
    import time

    import pyxccl as px
    c = comm.dup()
    x = np.ones(1000, np.float32)
    c.allreduce(x)
    t0 = time.monotonic()
    try:
        if c.rank == 0:
            threading.Timer(delay, c.abort).start()
            c.recv(x, 1, timeout=30)
        else:
            c.allreduce(x, timeout=30)
        out = None
    except px.PyxcclError as e:
        out = type(e).__name__, e.peer, time.monotonic() - t0 - (delay if c.rank == 0 else 0)
    try:
        c.barrier()
        later = "a later call ran"
    except px.PyxcclError as e:
        later = type(e).__name__
    c.close()
    return out, later


def signal_self(comm):
    """An allgather, then SIGUSR1 to this process (the pool's worker runs functions in its main thread,
    where Python runs signal handlers)."""
    import os
    import signal
    comm.allgather(np.ones(4, np.float32), np.empty(4 * comm.size, np.float32))
    comm.barrier()
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGUSR1)
    return None


def callback_raises(comm):
    """A done-callback that raises is logged; the communicator's worker goes on running later calls."""
    x = np.ones(8, np.float32)
    w = comm.allreduce(x, async_op=True)
    w.add_done_callback(lambda w: 1 / 0)
    w.wait()
    ok = [comm.allreduce(np.ones(8, np.float32), async_op=True).wait(timeout=10) for _ in range(3)]
    return ok


# --- argument checks with peers (tests/test_arguments.py) -------------------------------------------------
def _bad_with_peers(comm, x):
    """Calls that every rank of a 2-rank world refuses by itself: name -> (what the message names, call)."""
    r, f32 = comm.rank, np.float32
    both = np.zeros(16, f32)

    def mine_and(other):        # counts: this rank's 4 elements, the peer's ``other``
        return [4 if p == r else other for p in range(comm.size)]
    return {
        "allgatherv counts beyond memory": ("counts", lambda: comm.allgatherv(x, None, mine_and(1 << 42))),
        "allgatherv counts beyond any buffer": ("counts", lambda: comm.allgatherv(x, None, mine_and(1 << 60))),
        "allgatherv counts beyond 2**64": ("counts", lambda: comm.allgatherv(x, None, mine_and((1 << 64) + 4))),
        "allgatherv numpy uint64 counts": ("counts", lambda: comm.allgatherv(
            x, None, np.array(mine_and((1 << 64) - 1), np.uint64))),
        "gatherv counts beyond any buffer": ("counts", lambda: comm.gatherv(x, None, mine_and(1 << 60), root=0)),
        "allgatherv bad algorithm, large counts": ("algorithm", lambda: comm.allgatherv(
            x, None, mine_and(1 << 26), algorithm="nope")),
        "allgatherv bad timeout, large counts": ("timeout", lambda: comm.allgatherv(
            x, None, mine_and(1 << 26), timeout=float("nan"))),
        "allgatherv async_op not a bool, large counts": ("async_op", lambda: comm.allgatherv(
            x, None, mine_and(1 << 26), async_op="yes")),
        "scatterv float count": ("counts", lambda: comm.scatterv(
            np.zeros(8, f32) if r == 0 else None, x, [4.0, 4] if r == 0 else [4, 4.0], root=0)),
        "alltoallv counts not adding up": ("recv_counts", lambda: comm.alltoallv(
            np.zeros(8, f32), np.zeros(8, f32), [4, 4], [4, 5])),
        "allgather input off its block of the output": ("overlap", lambda: comm.allgather(
            both[4 * r + 1:4 * r + 5], both[:8])),
        "reduce_scatter output off its block of the input": ("overlap", lambda: comm.reduce_scatter(
            both[:8], both[4 * r + 1:4 * r + 5])),
        "alltoall in place": ("overlap", lambda: comm.alltoall(both[:8], both[:8])),
    }


def bad_with_peers_names() -> tuple[str, ...]:
    from types import SimpleNamespace
    return tuple(_bad_with_peers(SimpleNamespace(rank=0, size=2), None))


def refuse_with_peers(comm, name):
    """Call bad-argument case ``name`` on every rank: (error type, message, what it must name, bytes
    traced at the peak of the call, whether a collective right after it still gives the right result)."""
    import tracemalloc
    what, call = _bad_with_peers(comm, np.ones(4, np.float32))[name]
    tracemalloc.start()
    try:
        call()
        err = None
    except Exception as e:  # noqa: BLE001  (the test reports the type)
        err = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    y = np.full(5, comm.rank + 1, np.int64)
    comm.allreduce(y)
    return type(err).__name__, str(err), what, peak, bool((y == comm.size * (comm.size + 1) // 2).all())


def in_place_forms(comm):
    """The in-place forms the overlap rule keeps (NCCL's): allgather and gather with the input at this
    rank's block of the output, reduce_scatter and scatter with the output at this rank's block of the
    input, allreduce into a view of its input; each twice (the second runs prepared). The failures."""
    fails, n, r = [], comm.size, comm.rank
    ranks = np.repeat(np.arange(1, n + 1, dtype=np.float32), 3)
    for _ in range(2):
        out = np.zeros(3 * n, np.float32)
        out[3 * r:3 * r + 3] = r + 1
        comm.allgather(out[3 * r:3 * r + 3], out)
        _cmp(fails, "allgather in place", out, ranks)
        out = np.zeros(3 * n, np.float32)
        out[3 * r:3 * r + 3] = r + 1
        comm.gather(out[3 * r:3 * r + 3], out if r == 0 else None, 0)
        if r == 0:
            _cmp(fails, "gather in place", out, ranks)
        send = np.arange(3 * n, dtype=np.float32) + r
        comm.reduce_scatter(send, send[3 * r:3 * r + 3])
        _cmp(fails, "reduce_scatter in place", send[3 * r:3 * r + 3],
             np.arange(3 * r, 3 * r + 3, dtype=np.float32) * n + n * (n - 1) / 2)
        send = np.arange(3 * n, dtype=np.float32)
        mine = send[3 * r:3 * r + 3] if r == 0 else np.zeros(3, np.float32)
        comm.scatter(send if r == 0 else None, mine, 0)
        _cmp(fails, "scatter in place", mine, np.arange(3 * r, 3 * r + 3, dtype=np.float32))
        x = np.full(4, r + 1.0, np.float32)
        comm.allreduce(x, out=x[:])
        _cmp(fails, "allreduce out=a view of the input", x, np.full(4, n * (n + 1) / 2, np.float32))
    return fails


def prepared_still_refuse(comm):
    """Every call shape made prepared by two good calls, then called with one bad argument the prepared
    key cannot tell from the good one (timeout True after 1 s, async_op 0 or None, buffers of the same
    sizes that overlap off the in-place form): each refused with InvalidArgumentError on every rank,
    and a collective right after is right. The failures."""
    import pyxccl
    fails, n, r = [], comm.size, comm.rank
    x, out, other = np.ones(4, np.float32), np.zeros(4 * n, np.float32), np.zeros(4 * n, np.float32)
    wide = np.zeros(8 * n, np.float32)
    good = {
        "allreduce": lambda **k: comm.allreduce(x, **k),
        "allreduce out": lambda **k: comm.allreduce(x, out=other[:4], **k),
        "broadcast": lambda **k: comm.broadcast(x, 0, **k),
        "reduce": lambda **k: comm.reduce(x, 0, **k),
        "allgather": lambda **k: comm.allgather(x, out, **k),
        "gather": lambda **k: comm.gather(x, out if r == 0 else None, 0, **k),
        "scatter": lambda **k: comm.scatter(out if r == 0 else None, x, 0, **k),
        "reduce_scatter": lambda **k: comm.reduce_scatter(out, x, **k),
        "alltoall": lambda **k: comm.alltoall(out, other, **k),
        "barrier": lambda **k: comm.barrier(**k),
    }
    overlapping = {     # the good call's dtypes and sizes, buffers sharing memory off the in-place form
        "allreduce out": lambda **k: comm.allreduce(wide[:4], out=wide[2:6], **k),
        "allgather": lambda **k: comm.allgather(wide[1:5], wide[:4 * n], **k),
        "reduce_scatter": lambda **k: comm.reduce_scatter(wide[:4 * n], wide[4 * r + 1:4 * r + 5], **k),
        "alltoall": lambda **k: comm.alltoall(wide[:4 * n], wide[2:4 * n + 2], **k),
    }
    for name, call in good.items():
        bad = [(1, "timeout=True", lambda: call(timeout=True)),
               (1, "timeout=np.True_", lambda: call(timeout=np.True_)),
               (60, "async_op=0", lambda: call(timeout=60, async_op=0)),
               (60, "async_op=None", lambda: call(timeout=60, async_op=None))]
        if name in overlapping:
            bad.append((60, "overlapping buffers", lambda: overlapping[name](timeout=60)))
        for t, what, b in bad:
            call(timeout=t)
            call(timeout=t)     # prepared from here on
            try:
                b()
                fails.append(f"{name} {what}: accepted after prepared calls")
            except pyxccl.InvalidArgumentError:
                pass
        y = np.full(3, r + 1, np.int32)
        comm.allreduce(y)
        _cmp(fails, f"allreduce after {name}'s refusals", y, np.full(3, n * (n + 1) // 2, np.int32))
    return fails


# --- random sequences of collectives (tests/test_property.py) ----------------------------------------------
DTYPE_BY_NAME = {dtype_name(d): d for d in DTYPES}


def seq_input(seed: int, rank: int, count: int, dtype: str, op=None) -> np.ndarray:
    """Rank ``rank``'s input of ``count`` elements for a step of a random sequence: drawn from ``seed``
    and the rank only, so the test process draws every rank's input too. Values keep every reduction
    exact in every dtype (4 ranks): small integers, 1..2 for products; any bits for bitwise ops."""
    dt = DTYPE_BY_NAME[dtype]
    rng = np.random.default_rng([seed, rank])
    if dt == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_)
    if op in ("BAND", "BOR", "BXOR"):
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)
    signed = dt.kind in "if" or dt == bfloat16
    lo, hi = (1, 3) if op == "PROD" else ((-3, 4) if signed else (0, 7))
    return rng.integers(lo, hi, count).astype(dt)


def _pick(comm, kind: str, index):
    """Algorithm number ``index`` of those usable here for call ``kind`` (None: the tuner's choice); the
    same on every rank. gatherv and scatterv run "direct" only; alltoallv no equal-block algorithm."""
    if index is None or kind in ("gatherv", "scatterv"):
        return None
    names = comm.algorithms(kind[:-1] if kind.endswith("v") else kind)
    if kind == "alltoallv":
        names = [a for a in names if a not in ("bruck", "hierarchical", "segment")]
    return names[index % len(names)]


def run_sequence(comm, steps):
    """Run the steps of a random sequence (tests/test_property.py draws them; every rank gets the same
    list) and return, per step and repeat, this rank's result: the array the call wrote (None where it
    writes nothing here). A step repeated runs prepared the second time (core/prepared.py), with new data."""
    n, r = comm.size, comm.rank
    results = []
    for st in steps:
        kind, dt, op, root, count, counts = (st[k] for k in ("kind", "dtype", "op", "root", "count", "counts"))
        algo, place, got = _pick(comm, kind, st["algorithm"]), st["in_place"], []
        for k in range(st["repeat"]):
            seed = st["seed"] + k

            def inp(c):
                return seq_input(seed, r, c, dt, op)

            def zeros(c):
                return np.zeros(c, DTYPE_BY_NAME[dt])
            if kind == "allreduce":
                x = inp(count)
                out = x if place else zeros(count)
                comm.allreduce(x, op, out=None if place else out, algorithm=algo)
            elif kind == "reduce":
                x = inp(count)
                out = x if place or r != root else zeros(count)
                comm.reduce(x, root, op, out=None if out is x else out, algorithm=algo)
            elif kind == "broadcast":
                out = inp(count)
                comm.broadcast(out, root, algorithm=algo)
            elif kind in ("allgather", "allgatherv", "gather", "gatherv"):
                cs = counts if kind.endswith("v") else [count] * n
                at = sum(cs[:r])
                gets = kind.startswith("all") or r == root
                out = zeros(sum(cs)) if gets else None
                send = inp(cs[r])
                if place and gets:
                    out[at:at + cs[r]] = send
                    send = out[at:at + cs[r]]
                if kind == "allgather":
                    comm.allgather(send, out, algorithm=algo)
                elif kind == "allgatherv":
                    comm.allgatherv(send, out, cs, algorithm=algo)
                elif kind == "gather":
                    comm.gather(send, out, root, algorithm=algo)
                else:
                    comm.gatherv(send, out, cs if gets or st["all_counts"] else None, root)
            elif kind in ("scatter", "scatterv"):
                cs = counts if kind == "scatterv" else [count] * n
                send = inp(sum(cs)) if r == root else None
                at = sum(cs[:r])
                out = send[at:at + cs[r]] if place and r == root else zeros(cs[r])
                if kind == "scatter":
                    comm.scatter(send, out, root, algorithm=algo)
                else:
                    comm.scatterv(send, out, cs if r == root or st["all_counts"] else None, root)
            elif kind in ("reduce_scatter", "reduce_scatterv"):
                cs = counts if kind.endswith("v") else [count] * n
                send, at = inp(sum(cs)), sum(cs[:r])
                out = send[at:at + cs[r]] if place else zeros(cs[r])
                if kind == "reduce_scatter":
                    comm.reduce_scatter(send, out, op, algorithm=algo)
                else:
                    comm.reduce_scatterv(send, out, cs, op, algorithm=algo)
            elif kind in ("alltoall", "alltoallv"):
                sc = counts[r] if kind == "alltoallv" else [count] * n
                rc = [counts[p][r] for p in range(n)] if kind == "alltoallv" else sc
                send, out = inp(sum(sc)), zeros(sum(rc))
                if kind == "alltoall":
                    comm.alltoall(send, out, algorithm=algo)
                else:
                    comm.alltoallv(send, out, sc, rc, algorithm=algo)
            else:
                comm.barrier(algorithm=algo)
                out = None
            got.append(None if out is None else out.copy())
        results.append(got)
    return results


def in_place_full_path_calls(comm, reps: int = 5) -> int:
    """Argument checks run by ``reps`` repeats of each in-place form after a warm-up (0: all prepared)."""
    n, r = comm.size, comm.rank
    whole, x = np.zeros(4 * n, np.float32), np.ones(4, np.float32)
    mine = whole[4 * r:4 * r + 4]

    def calls():
        comm.allreduce(x, out=x[:])
        comm.reduce(x, 0, out=x[:] if r == 0 else None)
        comm.allgather(mine, whole)
        comm.gather(mine, whole if r == 0 else None, 0)
        comm.reduce_scatter(whole, mine)
        comm.scatter(whole if r == 0 else None, mine if r == 0 else x, 0)
    return _checks_made(calls, reps)


def longest_timeout(comm):
    """Calls with the longest timeout accepted (1e9 s) run: no wait or socket timeout overflows."""
    n, r, t = comm.size, comm.rank, 1e9
    x = np.ones(1 << 16, np.float32)
    comm.allreduce(x, timeout=t)
    comm.allreduce(x[:4], timeout=t)
    comm.barrier(timeout=t)
    w = comm.irecv(np.empty(4), (r - 1) % n, timeout=t)
    comm.send(np.full(4, r, np.float64), (r + 1) % n, timeout=t)
    w.wait()
    return [] if (x[:4] == n * n).all() else [f"allreduce gave {x[:4]}"]


def calibrate(comm):
    from pyxccl.sim import calibrate
    return calibrate.measure(comm)


def traffic_of_every_algorithm(comm, count):
    """Per (primitive, algorithm): what comm.traffic() counted for one call of ``count`` float32
    elements per block (each called twice: the second runs prepared, and must be counted too).
    Rooted primitives other than broadcast have the last rank as root."""
    from pyxccl import InvalidArgumentError
    out = {}
    n, last = comm.size, comm.size - 1
    calls = {
        "allreduce": lambda a: comm.allreduce(np.ones(count * n, np.float32), algorithm=a),
        "allgather": lambda a: comm.allgather(np.ones(count, np.float32), np.empty(count * n, np.float32),
                                              algorithm=a),
        "reduce_scatter": lambda a: comm.reduce_scatter(np.ones(count * n, np.float32),
                                                        np.empty(count, np.float32), algorithm=a),
        "alltoall": lambda a: comm.alltoall(np.ones(count * n, np.float32),
                                            np.empty(count * n, np.float32), algorithm=a),
        "broadcast": lambda a: comm.broadcast(np.ones(count * n, np.float32), 0, algorithm=a),
        "reduce": lambda a: comm.reduce(np.ones(count * n, np.float32), last, algorithm=a),
        "gather": lambda a: comm.gather(np.ones(count, np.float32),
                                        np.empty(count * n, np.float32) if comm.rank == last else None, last,
                                        algorithm=a),
        "scatter": lambda a: comm.scatter(np.ones(count * n, np.float32) if comm.rank == last else None,
                                          np.empty(count, np.float32), last, algorithm=a),
        "barrier": lambda a: comm.barrier(algorithm=a),
    }
    for prim, call in calls.items():
        for algo in comm.algorithms(prim):
            before = comm.traffic().get(prim, dict(calls=0, bytes=0, sent=0, received=0))
            try:
                call(algo)
            except InvalidArgumentError:        # an algorithm for other sizes (refused on every rank)
                continue
            call(algo)
            after = comm.traffic()[prim]
            out[(prim, algo)] = tuple(after[k] - before[k] for k in ("calls", "bytes", "sent", "received"))
    y = np.ones(count, np.float32)
    before = comm.traffic()
    if comm.size > 1:
        if comm.rank == 0:
            comm.send(y, 1)
        elif comm.rank == 1:
            comm.recv(y, 0)
    after = comm.traffic()
    for op in ("send", "recv"):
        b, a = before.get(op, dict(calls=0, bytes=0, sent=0, received=0)), after.get(op)
        out[(op, None)] = tuple(a[k] - b[k] for k in ("calls", "bytes", "sent", "received")) if a else (0, 0, 0, 0)
    return out


def segment_allreduce_traffic(comm, nbytes):
    """Two allreduces of ``nbytes`` on the segment: (the algorithm that ran, sent, received) they added."""
    before = comm.traffic().get("allreduce", dict(sent=0, received=0))
    x = np.ones(nbytes // 4, np.float32)
    comm.allreduce(x, algorithm="segment")
    comm.allreduce(x, algorithm="segment")
    after = comm.traffic()["allreduce"]
    return comm.flight_record()[-1]["algorithm"], after["sent"] - before["sent"], after["received"] - before["received"]


def segment_gather_by_puts(comm, counts):
    """Gathers on the segment of ``counts`` elements a rank (single-copy sizes: every rank writes its block
    into the root's output), every root, in place and not, float32 and int8, each twice (the second runs
    prepared). Returns (the failures, the algorithms that ran, per root: (sent, received) bytes the first
    float32 call of the first count added to this rank's counters, whether single-copy moves work)."""
    fails, n, r, algos, moved = [], comm.size, comm.rank, set(), []
    for count in counts:
        for dt in (np.float32, np.int8):
            everyone = [data(p, count, dt) for p in range(n)]
            for root in range(n):
                for rep in range(2):
                    before = comm.traffic().get("gather", dict(sent=0, received=0))
                    g = comm.gather(everyone[r], np.full(count * n, 99, dt) if r == root else None, root,
                                    algorithm="segment")
                    after = comm.traffic()["gather"]
                    algos.add(comm.flight_record()[-1]["algorithm"])
                    if count == counts[0] and dt is np.float32 and rep == 0:
                        moved.append((after["sent"] - before["sent"], after["received"] - before["received"]))
                    if r == root:
                        _cmp(fails, f"gather root={root} {np.dtype(dt)} n={count} #{rep}", g, np.concatenate(everyone))
                    out = np.full(count * n, 99, dt)
                    out[r * count:(r + 1) * count] = everyone[r]
                    comm.gather(out[r * count:(r + 1) * count], out if r == root else None, root, algorithm="segment")
                    if r == root:
                        _cmp(fails, f"gather in place root={root} {np.dtype(dt)} n={count} #{rep}", out,
                             np.concatenate(everyone))
    import os

    from pyxccl.transport.cma import works
    mine = np.ones(1, np.int64)         # single-copy moves work as the communicator found: to the next rank
    where = comm.allgather_object((os.getpid(), mine.ctypes.data))
    cma = works(*where[(r + 1) % n])
    comm.barrier()                      # (mine lives until every rank tried)
    return fails, sorted(algos), moved, cma


def segment_broadcasts(comm, counts):
    """Broadcasts on the segment of ``counts`` elements, every root, float32 and int8, each twice (the second
    runs prepared). Returns (the failures, the algorithms that ran, whether the segment cuts a broadcast
    through the windows in pieces smaller than a window, the CPUs this rank has)."""
    from floorfns import context

    from pyxccl.transport.topology import job_cpus
    fails, n, r, algos = [], comm.size, comm.rank, set()
    for count in counts:
        for dt in (np.float32, np.int8):
            for root in range(n):
                want = data(root + 11, count, dt)
                for rep in range(2):
                    x = want.copy() if r == root else np.full(count, 99, dt)
                    comm.broadcast(x, root, algorithm="segment")
                    algos.add(comm.flight_record()[-1]["algorithm"])
                    _cmp(fails, f"broadcast root={root} {np.dtype(dt)} n={count} #{rep}", x, want)
    return fails, sorted(algos), context(comm).segment.pipelined, job_cpus()


def small_calls_after_a_shrink(comm, victim: int, nbytes: int):
    """``victim`` SIGKILLs itself; the others' allreduce raises PeerLostError, they shrink and make an
    allreduce of ``nbytes``. Returns (the algorithm the world ran that call with, the new size, the
    algorithm the new world chooses for it, the one its flight recorder saw run, whether the new world
    kept the world's link figures)."""
    import os
    import signal

    import pyxccl as px
    x = np.ones(nbytes // 4, np.float32)
    comm.allreduce(x)
    before = comm.flight_record()[-1]["algorithm"]
    comm.barrier()
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        while True:
            comm.allreduce(x)
    except px.PeerLostError:
        pass
    new = comm.shrink()
    try:
        new.allreduce(x)
        figures = new.link_figures()
        return (before, new.size, new.algorithm_for("allreduce", nbytes), new.flight_record()[-1]["algorithm"],
                figures is not None and figures == comm.link_figures())
    finally:
        new.close()
def segment_alias(comm):
    """"shm", the segment algorithm's old name, still runs it (one host, a segment): algorithm= and
    PYXCCL_ALGO take it, and the call, its Work and the planner say "segment"; comm.algorithms lists only
    "segment"; alltoallv refuses the alias as it refuses the name (equal blocks only)."""
    import os

    import pyxccl
    fails, n = [], comm.size
    names = comm.algorithms("allreduce")
    if "segment" not in names or "shm" in names:
        fails.append(f"usable allreduce algorithms {names}: want 'segment' and no alias")
    x = np.full(8, comm.rank + 1, np.float32)
    w = comm.allreduce(x, algorithm="shm", async_op=True)
    w.wait()
    if w.algorithm != "segment" or not (x == n * (n + 1) // 2).all():
        fails.append(f"algorithm='shm' ran {w.algorithm!r} and gave {x[:2]}")
    old = os.environ.get("PYXCCL_ALGO")
    os.environ["PYXCCL_ALGO"] = "allreduce=shm"
    try:
        d = comm.dup()
    finally:
        if old is None:
            del os.environ["PYXCCL_ALGO"]
        else:
            os.environ["PYXCCL_ALGO"] = old
    try:
        big = 64 << 20          # a size the tuner gives to a message algorithm unless forced
        if d.algorithm_for("allreduce", big) != "segment":
            fails.append(f"PYXCCL_ALGO=allreduce=shm: {d.algorithm_for('allreduce', big)!r} for 64 MiB")
    finally:
        d.close()
    buf = np.zeros(n, np.float32)
    try:
        comm.alltoallv(buf, buf.copy(), [1] * n, [1] * n, algorithm="shm")
    except pyxccl.InvalidArgumentError as e:
        if "equal blocks" not in str(e):
            fails.append(f"alltoallv algorithm='shm': {e}")
    else:
        fails.append("alltoallv ran algorithm='shm' (equal blocks only)")
    return fails


def segment_large_reductions(comm, counts):
    """Allreduces, reduces (to the last rank) and reduce-scatters (blocks of about count / n) of ``counts``
    float32 and float64 elements on the segment, in place and not, twice each (the second on new data):
    every result must be the rank-order sum's bits (((x0 + x1) + x2) ...), the inputs of calls not in place
    untouched. Returns what failed."""
    fails, n, r = [], comm.size, comm.rank
    for dt in (np.float32, np.float64):
        for count in counts:
            for prim in ("allreduce", "reduce", "reduce_scatter"):
                block = count // n + 1
                total = block * n if prim == "reduce_scatter" else count
                mine = slice(r * block, (r + 1) * block) if prim == "reduce_scatter" else slice(None)
                for in_place in (True, False):
                    for again in range(2):
                        xs = [np.random.default_rng([total, p, again]).standard_normal(total).astype(dt)
                              for p in range(n)]
                        want = xs[0].copy()
                        for x in xs[1:]:
                            want += x
                        want = want[mine]
                        x = xs[r].copy()
                        out = None if in_place else np.full(want.size, np.nan, dt)
                        if prim == "allreduce":
                            comm.allreduce(x, out=out, algorithm="segment")
                        elif prim == "reduce":
                            comm.reduce(x, root=n - 1, out=out, algorithm="segment")
                        else:
                            comm.reduce_scatter(x, x[mine] if in_place else out, algorithm="segment")
                        got = x[mine] if in_place else out
                        what = f"{prim} {np.dtype(dt)} count={total} in_place={in_place} call {again}"
                        if (prim != "reduce" or r == n - 1) and got.tobytes() != want.tobytes():
                            fails.append(f"{what}: not the rank-order sum's bits "
                                         f"({int((got != want).sum())} elements differ)")
                        if not in_place and x.tobytes() != xs[r].tobytes():
                            fails.append(f"{what}: the input was modified")
    return fails


def sleep_past_the_deadline(comm, seconds: float):
    """Sleeps (a rank stuck in a call, for the pool's deadline)."""
    import time
    time.sleep(seconds)


def die_later(comm, victim: int, how: str):
    """``victim`` dies of SIGKILL: during this call (``how="now"``), or just after returning from it
    (``"after"``: a thread's crash after the call passed)."""
    import os
    import signal
    import threading
    if comm.rank != victim:
        return None
    if how == "now":
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    return None


def _at_page_offset(count: int, dt, offset: int) -> np.ndarray:
    """``count`` elements of ``dt`` starting ``offset`` bytes into a page of their own mapping."""
    import mmap
    nbytes = count * np.dtype(dt).itemsize
    return np.frombuffer(mmap.mmap(-1, nbytes + 8192), np.uint8)[offset:offset + nbytes].view(dt)


def copies_at_short_distances(comm, counts):
    """Every primitive with its input and output at page offsets that put one 16 bytes ahead of the other,
    of the peers' and of the segment's windows (the copies the executor routes past rep movsb: _native.c,
    short_ahead), and at offset 0; int32 sums, every root of the rooted ones. Returns the failures."""
    from floorfns import context
    fails, n, r, dt = [], comm.size, comm.rank, np.int32
    win = context(comm).segment.data[0, 0].ctypes.data % 4096
    offsets = sorted({(i, o) for i in (0, 16, (win - 16) % 4096) for o in (0, 16, (win + 16) % 4096)})
    for count in counts:
        mine = data(r, count, dt)
        everyone = [data(p, count, dt) for p in range(n)]
        for ioff, ooff in offsets:
            tag = f"n={count} in+{ioff} out+{ooff} (window +{win})"

            def buf(c, off, like=None):
                b = _at_page_offset(c, dt, off)
                b[:] = like if like is not None else -1
                return b
            _cmp(fails, f"allreduce {tag}", comm.allreduce(buf(count, ioff, mine), out=buf(count, ooff)),
                 reference(ReduceOp.SUM, n, count, dt))
            _cmp(fails, f"allgather {tag}", comm.allgather(buf(count, ioff, mine), buf(count * n, ooff)),
                 np.concatenate(everyone))
            send = np.concatenate([data(r * n + p, count, dt) for p in range(n)])
            _cmp(fails, f"alltoall {tag}", comm.alltoall(buf(count * n, ioff, send), buf(count * n, ooff)),
                 np.concatenate([data(p * n + r, count, dt) for p in range(n)]))
            whole = np.concatenate([data(r * n + p, count, dt) for p in range(n)])
            want = np.sum([np.concatenate([data(q * n + p, count, dt) for p in range(n)]) for q in range(n)],
                          axis=0, dtype=dt)[r * count:(r + 1) * count]
            out = buf(count, ooff)
            comm.reduce_scatter(buf(count * n, ioff, whole), out)
            _cmp(fails, f"reduce_scatter {tag}", out, want)
            for root in range(n):
                x = buf(count, ioff, everyone[root] if r == root else None)
                comm.broadcast(x, root)
                _cmp(fails, f"broadcast root={root} {tag}", x, everyone[root])
                out = buf(count, ooff)
                comm.reduce(buf(count, ioff, mine), root, out=out)
                if r == root:
                    _cmp(fails, f"reduce root={root} {tag}", out, reference(ReduceOp.SUM, n, count, dt))
                g = comm.gather(buf(count, ioff, mine), buf(count * n, ooff) if r == root else None, root=root)
                if r == root:
                    _cmp(fails, f"gather root={root} {tag}", g, np.concatenate(everyone))
                out = buf(count, ooff)
                comm.scatter(buf(count * n, ioff, np.concatenate(everyone)) if r == root else None, out, root=root)
                _cmp(fails, f"scatter root={root} {tag}", out, everyone[r])
    return fails


def free_rounds_in_a_mix(comm, iters: int = 150):
    """Barriers and small calls in turn on the segment, every root, then a broadcast of several windows
    (the others' rounds free): a free round begins without waiting for the others and writes no header
    (walk.py), so a rank may run ahead of a peer still checking its call of two rounds before; nothing may
    be read wrong or taken for a disagreement. Returns (the failures, whether every rank has a core (else
    the barrier is rank 0's release), the CPUs this rank has)."""
    from floorfns import context

    from pyxccl.transport.topology import job_cpus
    fails, n, r = [], comm.size, comm.rank
    ctx = context(comm)
    big = ctx.segment.area // 4 * 3 + 5              # float32: several windows, a round each
    for i in range(iters):
        comm.barrier()
        root = i % n
        x = np.full(2, root + 1 if r == root else 0, np.float32)
        comm.broadcast(x, root, algorithm="segment")
        _cmp(fails, f"#{i} broadcast root={root}", x, np.full(2, root + 1, np.float32))
        y = np.full(2, r + 1, np.float32)
        comm.reduce(y, (root + 1) % n, algorithm="segment")
        if r == (root + 1) % n:
            _cmp(fails, f"#{i} reduce", y, np.full(2, n * (n + 1) / 2, np.float32))
        got = np.zeros(n, np.int64)
        comm.alltoall(np.arange(n, dtype=np.int64) + 10 * r, got, algorithm="segment")
        _cmp(fails, f"#{i} alltoall", got, np.arange(n, dtype=np.int64) * 10 + r)
        if fails:
            break
    for root in range(n):
        z = data(root, big, np.float32) if r == root else np.zeros(big, np.float32)
        comm.broadcast(z, root, algorithm="segment")
        _cmp(fails, f"broadcast of {big} root={root}", z, data(root, big, np.float32))
    return fails, ctx.segment.pipelined, job_cpus()
