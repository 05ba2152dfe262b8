"""An elastic loop: a job that loses a rank finishes its work with the others.

    pyxccl run --keep-going -n 4 examples/elastic.py

Work items are shared out round by round; each round's results are combined
with an allreduce. Rank ELASTIC_VICTIM (default 2) is killed (SIGKILL) in
round 3: the survivors' allreduce raises PeerLostError naming it, they build
a new communicator of themselves with ``comm.shrink()``, agree on where to
resume (the least progress any of them committed) and finish. Every
survivor checks the total against the one computed alone.
"""
import os
import signal

import numpy as np

import pyxccl

ITEMS, PER_RANK = 48, 2          # work items; items per rank and round


def work(i: int) -> float:
    x = np.arange(i * 1000, (i + 1) * 1000, dtype=np.float64)
    return float((x * x).sum())


comm = pyxccl.init(timeout=30)
victim = int(os.environ.get("ELASTIC_VICTIM", "2"))
first_rank = comm.rank
results = np.zeros(ITEMS)            # committed: what every member agreed on after a round
start, rounds = 0, 0
while start < ITEMS:
    rounds += 1
    batch = slice(start, min(ITEMS, start + comm.size * PER_RANK))
    part = np.zeros(ITEMS)
    for i in range(batch.start, batch.stop)[comm.rank::comm.size]:
        part[i] = work(i)
    if first_rank == victim and rounds == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.allreduce(part)
    except pyxccl.PeerLostError as e:
        print(f"round {rounds}: lost rank {e.peer}; shrinking", flush=True)
        old, comm = comm, comm.shrink()
        old.close()
        resume = np.array([start], np.int64)
        comm.allreduce(resume, op="min")            # resume where the least advanced survivor stands
        start = int(resume[0])
        print(f"now rank {comm.rank} of {comm.size}, resuming at item {start}", flush=True)
        continue
    results[batch] = part[batch]
    start = batch.stop

expected = sum(work(i) for i in range(ITEMS))
ok = np.isclose(results.sum(), expected, rtol=1e-12)
print(f"{'OK' if ok else 'WRONG'}: total {results.sum():.6e} (alone: {expected:.6e}) in {rounds} rounds, "
      f"{comm.size} ranks at the end", flush=True)
comm.close()
