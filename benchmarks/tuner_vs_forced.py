"""Is the tuner's choice as fast as the best algorithm? (algorithms issue: within 20%)

    .venv/bin/pyxccl run -n 2 benchmarks/tuner_vs_forced.py [--max 64M] [--prims allreduce,allgather]

For each primitive and size, times every registered algorithm forced and the
tuner's pick (pyxccl bench methodology: median of per-iteration max over ranks)
and prints time per algorithm, the tuner's pick and its ratio to the best.
"""
import argparse
import statistics

import pyxccl
from pyxccl.bench import methodology as M
from pyxccl.bench.runner import Case, call_pyxccl, time_case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min", default="1K")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--prims", default="allreduce,allgather,reduce_scatter,broadcast,alltoall,reduce")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every measurement, interleaved; median")
    a = ap.parse_args()
    comm = pyxccl.init()
    sizes = M.sweep(M.parse_size(a.min), M.parse_size(a.max), a.factor)
    worst = 0.0
    for prim in a.prims.split(","):
        names = comm.algorithms(prim)
        if comm.rank == 0:
            print(f"\n## {prim}, {comm.size} ranks (median us; * = best forced)")
            print(f"{'size':>9} " + "".join(f"{n[:16]:>17}" for n in names) + f"{'tuner pick':>22}{'ratio':>7}")
        for nbytes in sizes:
            runs = {name: [] for name in names + [None]}
            for _ in range(a.rounds):          # interleaved, so that machine noise hits all alike
                for name in names + [None]:
                    case = Case(prim, nbytes, "float32", comm.rank, comm.size, inplace=False)
                    times, wrong = time_case(comm, case, lambda c, name=name: call_pyxccl(comm, c, "sum", name))
                    assert wrong == 0, (prim, name, nbytes, wrong)
                    runs[name].append(M.summarize(times, case.nbytes, prim, comm.size)["time_us"])
            pick = comm.algorithm_for(prim, case.nbytes)
            med = {name: statistics.median(v) for name, v in runs.items()}
            best = min(names, key=lambda n: med[n])
            ratio = med[None] / med[best]
            worst = max(worst, ratio)
            if comm.rank == 0:
                cells = "".join(f"{med[n]:>16.1f}{'*' if n == best else ' '}" for n in names)
                print(f"{nbytes:>9} {cells}{pick:>16} {med[None]:>5.0f}{ratio:>7.2f}")
    if comm.rank == 0:
        print(f"\nworst tuner/best ratio: {worst:.2f}")
    comm.close()


if __name__ == "__main__":
    main()
