"""What the parallel modules moved, per rank and per step: calls and bytes per group and primitive.

Every collective and send/recv of ``pyxccl.parallel`` goes through :mod:`pyxccl.parallel.ops`,
which records the call here: ``calls`` and ``bytes`` (the call's whole buffer, as the brief's
formulas and the planner count it: B*S*H*itemsize per TP allreduce, G per DP allreduce, the
gathered tensor of an allgather). Where the group runs on pyxccl, ``sent`` and ``received`` come from the
communicator's own counters (``Communicator.traffic()``): what the schedules that ran moved,
e.g. 2G(N-1)/N per rank for a ring allreduce. On another backend (Gloo) they are unknown (None).

>>> from pyxccl.parallel import traffic                # doctest: +SKIP
>>> loss = step(batch)
>>> rows = traffic.step()          # this step's rows, then the counts start again
>>> print(traffic.table(rows))
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

# pyxccl's operation names -> the torch.distributed names the parallel modules use
_TORCH_NAME = {"allreduce": "all_reduce", "allgather": "all_gather", "allgatherv": "all_gather",
               "reduce_scatter": "reduce_scatter", "reduce_scatterv": "reduce_scatter", "alltoall": "all_to_all",
               "alltoallv": "all_to_all", "broadcast": "broadcast", "send": "send", "recv": "recv",
               "isend": "send", "irecv": "recv"}


@dataclass
class Row:
    group: str
    op: str
    calls: int
    bytes: int
    sent: int | None       # None: the group's backend does not count it
    received: int | None


def communicator(pg):
    """The pyxccl Communicator behind torch process group ``pg``, or None (another backend)."""
    if pg is None:
        return None
    try:
        import torch
        backend = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError, ValueError):
        return None
    return getattr(backend, "comm", None) if type(backend).__name__ == "ProcessGroupPyxccl" else None


def _wire(comm) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for op, c in comm.traffic().items():
        name = _TORCH_NAME.get(op)
        if name is not None:
            v = out.setdefault(name, [0, 0])
            v[0] += c["sent"]
            v[1] += c["received"]
    return out


class Traffic:
    """The counts of one process (``pyxccl.parallel.traffic.TRAFFIC``)."""

    def __init__(self):
        self._lock = threading.Lock()      # autograd hooks may call from torch's threads
        self._calls: dict[tuple[str, str], list[int]] = {}
        self._used: dict[str, set[int]] = {}       # group name -> ids of the process groups used under it
        self._pgs: dict[int, object] = {}          # id -> a watched torch process group
        self._base: dict[int, dict | None] = {}    # id -> its pyxccl counters at the step's start

    def watch(self, pg) -> None:
        """Read the counters of torch process group ``pg`` from now on (its pyxccl communicator's)."""
        with self._lock:
            comm = communicator(pg)
            self._pgs[id(pg)] = pg
            self._base[id(pg)] = _wire(comm) if comm is not None else None

    def record(self, group, op: str, nbytes: int) -> None:
        """One call of ``op`` on ``group`` (a :class:`~pyxccl.parallel.groups.Group`) of ``nbytes``."""
        with self._lock:
            c = self._calls.get((group.name, op))
            if c is None:
                c = self._calls[(group.name, op)] = [0, 0]
            c[0] += 1
            c[1] += nbytes
            self._used.setdefault(group.name, set()).add(id(group.pg))

    def step(self) -> list[Row]:
        """The rows since the last step (or since the groups were made), and start again. Call it when
        the step's communication is done (after the optimizer step, or after waiting for it)."""
        with self._lock:
            now = {}
            for k, pg in self._pgs.items():
                comm = communicator(pg)
                now[k] = _wire(comm) if comm is not None else None
            rows = []
            for (group, op), (calls, nbytes) in sorted(self._calls.items()):
                sent = received = 0
                for k in self._used.get(group, ()):
                    a, b = now.get(k), self._base.get(k)
                    if a is None or b is None:      # not pyxccl, or never watched
                        sent = received = None
                        break
                    x, y = a.get(op, [0, 0]), b.get(op, [0, 0])
                    sent, received = sent + x[0] - y[0], received + x[1] - y[1]
                rows.append(Row(group, op, calls, nbytes, sent, received))
            self._calls.clear()
            self._used.clear()
            self._base = now
            return rows

    def reset(self) -> None:
        """Forget what was counted (a step's start)."""
        self.step()


TRAFFIC = Traffic()
step = TRAFFIC.step
reset = TRAFFIC.reset


def _size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def table(rows: list[Row], title: str = "") -> str:
    """The rows as a text table (one line per group and primitive)."""
    lines = [title] if title else []
    lines.append(f"{'group':<6} {'primitive':<15} {'calls':>6} {'bytes':>12} {'sent':>12} {'received':>12}")
    for r in rows:
        lines.append(f"{r.group:<6} {r.op:<15} {r.calls:>6} {_size(r.bytes):>12} {_size(r.sent):>12} "
                     f"{_size(r.received):>12}")
    return "\n".join(lines)
