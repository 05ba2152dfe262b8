"""One rank of a multi-host test job (tests/test_multihost.py): runs every check, writes the results.

    pyxccl run --nnodes H --node-rank i --nproc-per-node 2,1,2 ... multihost_worker.py OUTDIR [light]

Each check runs functions of rankfns.py (the checks of the one-host suite) on the world
communicator; their failure descriptions start with the primitive's name, so they are filed per
primitive. An exception is filed under the primitive that was running; the primitives of that check
not reached are filed as such. One JSON line per primitive goes to OUTDIR/rank<R>.jsonl, written as
soon as its check ends, so a job that hangs or dies still leaves what it did.

``light`` (the 8 hosts x 8 ranks layout): every check and every primitive still runs, on fewer
sizes, dtype/op pairs and dtypes (one of each kind: float and integer arithmetic, a 2-byte float,
and one message past 1 MiB; the compressed checks on smaller inputs, as every rank makes every
rank's), so that 64 ranks on a small machine finish in minutes and fit in its memory.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback

import numpy as np

import pyxccl
import compressfns as cf
import rankfns as rf
from pyxccl.algorithms.registry import algorithms
from pyxccl.ops import ReduceOp
from pyxccl.transport.topology import local_address

COUNTS = (0, 1, 7, 1000)
PAIRS = rf.valid_pairs()            # every dtype with every op that fits it
BIG = 300_001                       # > 1 MiB of float32: several TCP pieces and shared-memory slots
MOVE_DTYPES = rf.DTYPES
HIER_PAIRS = [(np.float32, ReduceOp.SUM), (np.int64, ReduceOp.PROD), (rf.bfloat16, ReduceOp.MAX)]
HIER_COUNTS = (0, 1, 7, 1000, 20_000)     # 20_000: past hierarchical broadcast's sharding threshold
SPLIT_BIG = BIG // 5                # per-rank block of the split primitives' large case
HOSTS_COUNTS = {}                   # compressfns.check_hosts' defaults
if sys.argv[2:3] == ["light"]:
    SPLIT_BIG = BIG // 64           # still > 1 MiB in all at 64 ranks, not 64 x that
    # the compressed checks: every rank makes every rank's inputs
    HOSTS_COUNTS = dict(count=1 << 14, quantized_counts=(64,), sparse_count=256)
    COUNTS = (1, 1000)
    PAIRS = [(np.float32, ReduceOp.SUM), (np.int64, ReduceOp.PROD), (rf.bfloat16, ReduceOp.MAX),
             (np.int32, ReduceOp.BAND)]
    MOVE_DTYPES = (np.float32, np.int8, rf.bfloat16)
    HIER_COUNTS = (1, 20_000)
HIERARCHICAL = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "gather", "scatter")

P2P = {"irecv": "send_recv", "recv": "send_recv", "irecv(src=None)": "send_recv"}


class Tracked:
    """The communicator, noting which method runs (to file an exception under it)."""

    def __init__(self, comm):
        self._comm, self.current, self.called = comm, None, []

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.current = name
            self.called.append(name)
            return attr(*args, **kwargs)
        return call


class Seen:
    """Every mismatch rankfns' checks report, as they find it: a check that raises later
    loses its list of failures, not these."""
    texts: list[str] = []
    _cmp = staticmethod(rf._cmp)

    @staticmethod
    def cmp(fails, what, got, exp):
        n = len(fails)
        Seen._cmp(fails, what, got, exp)
        Seen.texts.extend(fails[n:])


rf._cmp = Seen.cmp


def check_barrier(comm):
    """Nobody leaves a barrier before the last one entered (the hosts share the machine's clock)."""
    fails = []
    for i in range(4):
        time.sleep(0.03 * ((comm.rank + i) % min(comm.size, 8)))     # staggered (64 ranks: not by 1.9 s)
        enter = time.time()
        comm.barrier()
        leave = time.time()
        times = comm.allgather_object((enter, leave))
        first_out, last_in = min(t[1] for t in times), max(t[0] for t in times)
        if first_out < last_in:
            fails.append(f"barrier {i}: a rank left at {first_out:.6f}, before the last entered at {last_in:.6f}")
    return fails


def check_hierarchical(comm, primitive):
    return rf.check_forced(comm, primitive, ["hierarchical"], HIER_COUNTS, HIER_PAIRS)


def checks():
    """(primitives it covers, function of the communicator) for every check, in the order they run."""
    big = [(np.float32, ReduceOp.SUM)]
    yield ["allreduce"], lambda c: rf.check_allreduce(c, COUNTS, PAIRS) + rf.check_allreduce(c, (BIG,), big)
    yield ["reduce"], lambda c: rf.check_reduce(c, COUNTS, PAIRS) + rf.check_reduce(c, (BIG,), big)
    yield ["reduce_scatter", "reduce_scatterv"], lambda c: (rf.check_reduce_scatter(c, COUNTS, PAIRS)
                                                            + rf.check_reduce_scatter(c, (SPLIT_BIG,), big))
    movement = ["broadcast", "gather", "scatter", "allgather", "allgatherv", "gatherv", "scatterv", "alltoall",
                "alltoallv"]
    yield movement, lambda c: (rf.check_movement(c, COUNTS, MOVE_DTYPES)
                               + rf.check_movement(c, (SPLIT_BIG,), (np.float32,)))
    yield ["send_recv"], lambda c: rf.check_p2p(c, COUNTS + (BIG,))
    yield ["barrier"], check_barrier
    yield ["objects_split"], rf.check_objects_and_split
    for p in HIERARCHICAL:
        if "hierarchical" in algorithms(p):
            yield [f"hierarchical_{p}"], lambda c, p=p: check_hierarchical(c, p)
    yield ["compressed"], lambda c: cf.check_hosts(c, **HOSTS_COUNTS)


def _filed(text: str, primitives: list[str]) -> str:
    """The primitive a failure description is about: its first word, without "[algorithm]"."""
    word = text.split(" ", 1)[0].split("[", 1)[0].rstrip(":")
    word = P2P.get(word, word)
    return word if word in primitives else primitives[0]


def what_i_see(comm) -> dict:
    """What this rank sees of the job: its host, its host's ranks, the transport to every rank,
    the address of every TCP peer, rank 0's store address, the launcher's variables."""
    info = {
        "hostname": socket.gethostname(),
        "host_ranks": comm.host_ranks,
        "kinds": [comm.transport(p) for p in range(comm.size)],
        "link_kinds": [[k if k != "tcp_local" else "tcp" for k in (comm.link_class(a, b) for b in range(comm.size))]
                       for a in range(comm.size)],
        "hosts": len({t["host"] for t in comm.topology()}),
        "peer_addrs": {p: comm.connection(p)["host"].rsplit("(", 1)[1].rstrip(")") for p in range(comm.size)
                       if comm.transport(p) == "tcp"},
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                               "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                               "PYXCCL_SOCKET_IFNAME")},
        "local_address": local_address(os.environ["MASTER_ADDR"], rank=comm.rank),
    }
    if comm.rank == 0:
        info["store_bound"] = _listening(int(os.environ["MASTER_PORT"]))
    return info


def _listening(port: int):
    """[address, port] of the socket listening on ``port`` in this network namespace, as the kernel says."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                return [socket.inet_ntoa(int(addr, 16).to_bytes(4, "little")), port]
    return None


def main() -> int:
    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    path = os.path.join(out_dir, f"rank{rank}.jsonl")
    with open(path, "w") as out:
        def put(**record):
            out.write(json.dumps(dict(record, rank=rank)) + "\n")
            out.flush()

        t = time.monotonic()
        try:
            comm = pyxccl.init()
            put(check="init", fails=[], seconds=time.monotonic() - t, info=what_i_see(comm))
        except BaseException:  # noqa: BLE001  (reported, then the job fails)
            put(check="init", fails=[traceback.format_exc()], seconds=time.monotonic() - t)
            raise
        for primitives, fn in checks():
            tracked, t = Tracked(comm), time.monotonic()
            filed = {p: [] for p in primitives}
            Seen.texts = []
            try:
                for text in fn(tracked):
                    filed[_filed(text, primitives)].append(text)
            except BaseException as e:  # noqa: BLE001  (filed under the primitive that raised)
                for text in Seen.texts:
                    filed[_filed(text, primitives)].append(text)
                where = tracked.current if tracked.current in filed else primitives[0]
                filed[where].append(f"{where} raised: {traceback.format_exc()}")
                reached = {P2P.get(n, n) for n in tracked.called}
                for p in primitives:
                    if p != where and p not in reached:
                        filed[p].append(f"not run: {where} raised {type(e).__name__} before it")
            seconds = time.monotonic() - t
            for p in primitives:
                put(check=p, fails=filed[p][:20], seconds=seconds)
        comm.close()
        put(check="closed", fails=[], seconds=0.0)
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} on {socket.gethostname()}: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
