"""2D-torus allreduce (seeds: Ring / Tree / HD / 2D-Torus, the routing algorithms beside the topology).

The n ranks stand on a grid of R rows and C columns (R C = n); rank (i, j) is in row i, column j.
The data is cut into C parts; part j is cut again into R sub-chunks.

1. reduce-scatter along the row: a ring among the row's C ranks, after which rank (i, j) holds
   row i's sum of part j;
2. allreduce of part j along column j: a ring among the column's R ranks (reduce-scatter of the
   R sub-chunks, then allgather), after which every rank of column j holds the full sum of part j;
3. allgather along the row: a ring that spreads the parts back, every rank ends with all of them.

Per rank, the rows move 2 (C-1)/C of the data and the column 2 (R-1)/(R C) in 2 (C-1) + 2 (R-1)
steps, where one ring of n ranks moves 2 (n-1)/n in 2 (n-1) steps: about the ring's bytes in far
fewer steps (1024 ranks as 128 x 8: 268 steps instead of 2046). Each phase is one of ring.py's.

The grid: when the hosts are alike (H > 1 hosts of L > 1 ranks each, a host's ranks in any order)
the rows are the hosts (R = H, C = L), so phases 1 and 3 stay inside a host and only phase 2, the
smallest, crosses hosts (as hierarchical does); on hosts of consecutive ranks, host h runs host 0's
schedules moved by h L, so the tuner and ``pyxccl sim`` fold it (tuning/symmetric.py). Otherwise
the most square R x C with 2 <= R <= C, rows of consecutive ranks. With no such grid (n < 4, or n
prime) the builder raises ValueError; the record says so (``runs_on``): ``comm.algorithms``, the
tuner and ``pyxccl sim`` leave it out there, a forced call is refused.

Compression does not settle by construction (``settles`` is False): phase 3 sends part j whole,
phase 2 sent it in sub-chunks, so a block code would quantize its values again in other blocks.
"""
from __future__ import annotations

from math import isqrt

from ..schedule import Copy, Schedule, embed, offsets, split_counts
from .hierarchical import host_groups
from .ring import allgather_phase, reduce_scatter_phase
from .registry import SHIFT_XOR, register


def _square(nranks: int) -> tuple[int, int] | None:
    """(R, C): the most square factorization of ``nranks`` with 2 <= R <= C, or None."""
    r = next((d for d in range(isqrt(nranks), 1, -1) if nranks % d == 0), None)
    return None if r is None else (r, nranks // r)


def grid(nranks: int, hosts=None) -> list[list[int]] | None:
    """The grid's rows (each a list of ranks, its columns in order) for ``nranks`` ranks on ``hosts``
    (the host of every rank, or None), or None when there is none (see the module docstring)."""
    got = placed(nranks, hosts)
    return None if got is None else got[0]


def placed(nranks: int, hosts):
    """(``grid``'s rows, rank -> (row, column)), or None: without a search through the rows (every
    rank's schedule of a call reads the same rows)."""
    if hosts is not None:
        by_host, even, where = host_groups(nranks, hosts)
        if 1 < len(by_host) < nranks and even:
            return by_host, where.__getitem__
    rc = _square(nranks)
    if rc is None:
        return None
    c = rc[1]
    return [list(range(i * c, (i + 1) * c)) for i in range(rc[0])], lambda r: divmod(r, c)


def _ring(s: Schedule, phase, group: list[int], me: int, counts: list[int], base: int, chunk: int):
    """Append ring.py's ``phase`` run among ``group`` (this rank is ``group[me]``) on ``counts`` of
    "out" from ``base``; ``chunk``: the part this rank ends with (reduce-scatter) or holds (allgather)."""
    sub = Schedule(me, len(group))
    phase(sub, counts, "out", chunk)
    embed(s, sub, group, {"out": ("out", base)})


@register("allreduce", "torus2d", runs_on=lambda nranks: _square(nranks) is not None, symmetry=SHIFT_XOR)
def allreduce(rank: int, nranks: int, count: int, hosts=None) -> Schedule:
    """Row reduce-scatter, column allreduce of the part this rank owns, row allgather."""
    got = placed(nranks, hosts)
    if got is None:
        raise ValueError(f"torus2d allreduce cannot run on {nranks} ranks: it needs a grid of R x C ranks with "
                         f"R and C at least 2 (4 or more ranks, not a prime number); use ring")
    rows, where = got
    i, j = where(rank)
    row = rows[i]
    column = [r[j] for r in rows]
    parts = split_counts(count, len(row))
    s = Schedule(rank, nranks)
    s.step(Copy("in", 0, "out", 0, count))          # a no-op when in-place
    _ring(s, reduce_scatter_phase, row, j, parts, 0, j)
    if parts[j]:        # every rank of column j owns the same part: all of them skip it, or none
        subs, base = split_counts(parts[j], len(column)), offsets(parts)[j]
        _ring(s, reduce_scatter_phase, column, i, subs, base, i)
        _ring(s, allgather_phase, column, i, subs, base, i)
    _ring(s, allgather_phase, row, j, parts, 0, j)
    return s
