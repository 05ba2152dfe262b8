"""Message schedules as flat arrays: what the C core of the timed walk (``_simcore.c``) reads.

Per operation, in the order the walker runs a step's operations (``walk.py``: local copies,
then sends, then receives, which complete in the order written): ``kind`` (``COPY``, ``SEND``,
``RECV``), ``red`` (the copy or receive reduces), ``peer`` (0 for copies) and ``count``
(elements). ``step_start`` (one more than the steps of all ranks) cuts the operations into
steps, ``rank_start`` (one more than the schedules) cuts the steps into schedules, and
``ranks`` names the rank of each schedule. With ``inplace``, a ``Copy("in", o, "out", o)``
is left out, as ``Timing.local`` leaves it out (the same buffer: the engine does not copy).

A step may be held once for many alike steps in a row (``rep``: how many times it runs; None: each once):
a ring's n - 1 steps, the same on every step but the chunk's index, are one step where the chunks are of
one size (``rooted.Ops`` makes them so, ``shifted.py``'s rings use it). The walk runs it ``rep`` times, as
it would run that many copies; :meth:`Compact.expanded` makes the copies. An operation may move its peer by
``stride`` each run (mod n: a pairwise exchange's steps, to r + k and from r - k, are one step so), and a copy
may stand for ``times`` alike copies in a row (a hierarchical regrouping's block by block).

Symmetric algorithms (``symmetric.py``: Shift, Xor) need not be built rank by rank:
:func:`all_ranks` derives every host's arrays from host 0's by moving the peers.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import itemgetter

import numpy as np

from ..schedule import Copy, Recv, Schedule, Send
from .cost import CALL_BUFFERS      # the call's buffers (in memory when the call is large)

try:
    from . import _simcore          # _ops in C (optional: the Python one is the reference)
except ImportError:
    _simcore = None

COPY, SEND, RECV = 0, 1, 2
_KIND = {Copy: COPY, Send: SEND, Recv: RECV}
_FIRST, _THIRD, _FOURTH, _FIFTH, _LAST = itemgetter(0), itemgetter(2), itemgetter(3), itemgetter(4), itemgetter(-1)
#: a copy's buffers, numbered; those of the call (``CALL_BUFFERS``) are > 0
_BUF = {b: i + 1 for i, b in enumerate(CALL_BUFFERS)}


def taken(x: np.ndarray | None, idx):
    """An optional column at ``idx`` (None stays None)."""
    return None if x is None else x[idx]


def prefix_sums(x) -> np.ndarray:
    """Sums of ``x`` before each place, and the total: ``len(x) + 1`` of them."""
    out = np.zeros(len(x) + 1, np.int64)
    np.cumsum(x, out=out[1:])
    return out


@dataclass
class Compact:
    kind: np.ndarray         # int8 per op
    red: np.ndarray          # int8 per op
    peer: np.ndarray         # int64 per op (0 for copies)
    count: np.ndarray        # int64 per op (elements)
    step_start: np.ndarray   # int64, steps + 1
    rank_start: np.ndarray   # int64, schedules + 1
    ranks: np.ndarray        # int64 per schedule
    skip: np.ndarray | None = None   # bool per op: a Copy("in", o, "out", o) an in-place call leaves out
    touch: np.ndarray | None = None  # int8 per op, copies: bytes in user buffers per byte (Timing._work's
                                     # touches: the source's, and the destination's twice when it reduces)
    rep: np.ndarray | None = None    # int64 per step: times it runs in a row (None: once each)
    stride: np.ndarray | None = None  # int64 per op: its peer moves by this each run of its step (None: 0)
    nranks: int = 0                  # the ranks the peers are of (what a stride moves them modulo)
    times: np.ndarray | None = None  # int64 per op: a copy made this many times in a row (None: 1; others: 1)

    def reps(self) -> np.ndarray:
        """Each step's repeats (ones where none are held)."""
        return np.ones(len(self.step_start) - 1, np.int64) if self.rep is None else self.rep

    def op_reps(self) -> np.ndarray:
        """Each operation's repeats (its step's)."""
        return np.repeat(self.reps(), np.diff(self.step_start))

    def expanded(self) -> "Compact":
        """These arrays with every repeated step written out as that many steps and every copy as its times
        (themselves where none is)."""
        if self.times is not None:
            return self._ops_written_out().expanded()
        if self.rep is None:
            return self
        lens = np.diff(self.step_start)
        step = np.repeat(np.arange(len(lens), dtype=np.int64), self.rep)     # the steps, each as often as it runs
        nlens = lens[step]
        first = np.repeat(self.step_start[:-1][step], nlens)
        at = prefix_sums(nlens)
        idx = first + np.arange(int(at[-1]), dtype=np.int64) - np.repeat(at[:-1], nlens)
        cum = prefix_sums(self.rep)
        peer = self.peer[idx]
        if self.stride is not None:     # run k of a step: its peers moved k strides
            k = np.repeat(np.arange(len(step), dtype=np.int64) - np.repeat(cum[:-1], self.rep), nlens)
            peer = np.where(self.kind[idx] == COPY, 0, (peer + k * self.stride[idx]) % self.nranks)
        return Compact(self.kind[idx], self.red[idx], peer, self.count[idx], at, cum[self.rank_start],
                       self.ranks, taken(self.skip, idx), taken(self.touch, idx))

    def _ops_written_out(self) -> "Compact":
        """These arrays with each copy written out as its times."""
        idx = np.repeat(np.arange(len(self.kind), dtype=np.int64), self.times)
        return Compact(self.kind[idx], self.red[idx], self.peer[idx], self.count[idx], prefix_sums(self.times)[self.step_start],
                       self.rank_start, self.ranks, taken(self.skip, idx), taken(self.touch, idx), self.rep,
                       taken(self.stride, idx), self.nranks)

    def inplace(self) -> "Compact":
        """These arrays for an in-place call: without the copies of a buffer onto itself."""
        if self.skip is None or not self.skip.any():
            return self
        keep = ~self.skip
        nsteps = len(self.step_start) - 1
        step_of = np.repeat(np.arange(nsteps, dtype=np.int64), np.diff(self.step_start))
        step_start = prefix_sums(np.bincount(step_of[keep], minlength=nsteps))
        return Compact(self.kind[keep], self.red[keep], self.peer[keep], self.count[keep], step_start,
                       self.rank_start, self.ranks, None, self.touch[keep], self.rep, taken(self.stride, keep),
                       self.nranks, taken(self.times, keep))

    def take(self, a: int, b: int) -> "Compact":
        """Schedules ``a`` to ``b`` (indices, not ranks) of these, as arrays of their own (views)."""
        i, j = self.rank_start[a], self.rank_start[b]
        x, y = self.step_start[i], self.step_start[j]
        ops = slice(x, y)
        return Compact(self.kind[ops], self.red[ops], self.peer[ops], self.count[ops], self.step_start[i:j + 1] - x,
                       self.rank_start[a:b + 1] - i, self.ranks[a:b], taken(self.skip, ops), taken(self.touch, ops),
                       taken(self.rep, slice(i, j)), taken(self.stride, ops), self.nranks, taken(self.times, ops))

    @property
    def steps(self) -> int:
        """The most steps of any schedule (a repeated step counted as often as it runs)."""
        if not len(self.ranks):
            return 0
        if self.rep is None:
            return int(np.diff(self.rank_start).max())
        return int(np.diff(prefix_sums(self.rep)[self.rank_start]).max())

    def equal(self, other: "Compact") -> bool:
        """The same arrays (repeats held alike: see :meth:`expanded`)."""
        return all(np.array_equal(getattr(self, f), getattr(other, f)) for f in
                   ("kind", "red", "peer", "count", "step_start", "rank_start", "ranks", "touch")) and (
            np.array_equal(self.reps(), other.reps())) and np.array_equal(self.strides(), other.strides()) and (
            np.array_equal(self.op_times(), other.op_times()))

    def op_times(self) -> np.ndarray:
        """Each operation's times (ones where none are held)."""
        return np.ones(len(self.kind), np.int64) if self.times is None else self.times

    def strides(self) -> np.ndarray:
        """Each operation's stride (zeros where none are held)."""
        return np.zeros(len(self.kind), np.int64) if self.stride is None else self.stride


def joined(parts: list[Compact]) -> Compact:
    """The schedules of ``parts`` (arrays of some ranks each, in rank order) as one arrays: what making them
    at once gives (a column that no part holds, None; else every part's, defaults where it holds none)."""
    if len(parts) == 1:
        return parts[0]
    lens = np.concatenate([np.diff(p.step_start) for p in parts])
    per_rank = np.concatenate([np.diff(p.rank_start) for p in parts])

    def column(f, default):
        if all(getattr(p, f) is None for p in parts):
            return None
        return np.concatenate([default(p) if getattr(p, f) is None else getattr(p, f) for p in parts])

    return Compact(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("kind", "red", "peer", "count")),
                   prefix_sums(lens), prefix_sums(per_rank), np.concatenate([p.ranks for p in parts]),
                   column("skip", lambda p: np.zeros(len(p.kind), bool)),
                   column("touch", lambda p: np.zeros(len(p.kind), np.int8)), column("rep", Compact.reps),
                   column("stride", Compact.strides), parts[0].nranks, column("times", Compact.op_times))


def message_schedules(scheds) -> bool:
    return all(type(s) is Schedule and not s.segment for s in scheds)


def convert(scheds: list[Schedule], inplace: bool = False, written: bool = False) -> Compact:
    """The arrays of ``scheds`` (message schedules), in the walker's order (``written``: in the order
    written, what :func:`same_moved` compares). Raises TypeError on an operation a message schedule
    cannot hold. Each schedule's arrays (in the order written) are kept on it, as ``walk.phases``
    keeps its phases: symmetric mode converts host 0's schedules to compare them, then walks them."""
    c = _written(scheds)
    return c if written else walker_order(c, inplace)


def walker_order(c: Compact, inplace: bool = False) -> Compact:
    """``c`` (in the order written) in the walker's order: in each step the copies, then the sends, then
    the receives, each kind in the order written; with ``inplace``, without the skipped copies."""
    nsteps = len(c.step_start) - 1
    lens = np.diff(c.step_start)
    kind, red, peer, count, touch, stride, times = c.kind, c.red, c.peer, c.count, c.touch, c.stride, c.times
    keep = None if c.skip is None else ~c.skip
    step_of = None
    if len(kind) > 1:
        step_of = np.repeat(np.arange(nsteps, dtype=np.int64), lens)
        key = step_of * 3 + kind
        if not (key[1:] >= key[:-1]).all():          # a step's ops are not yet in the walker's order
            order = np.argsort(key, kind="stable")
            kind, red, peer, count, step_of = kind[order], red[order], peer[order], count[order], step_of[order]
            touch, stride, times, keep = touch[order], taken(stride, order), taken(times, order), taken(keep, order)
    step_start = c.step_start
    if keep is not None and inplace:
        if step_of is None:
            step_of = np.repeat(np.arange(nsteps, dtype=np.int64), lens)
        kind, red, peer, count, step_of = kind[keep], red[keep], peer[keep], count[keep], step_of[keep]
        touch, stride, times = touch[keep], taken(stride, keep), taken(times, keep)
        step_start = prefix_sums(np.bincount(step_of, minlength=nsteps))
        keep = None
    return Compact(kind, red, peer, count, step_start, c.rank_start, c.ranks, None if keep is None else ~keep,
                   touch, c.rep, stride, c.nranks, times)


_KEPT = "_compact"


def _part(s: Schedule) -> Compact | None:
    """The arrays kept on ``s`` (None if none): made from (the batch converted with it, its index) the
    first time they are asked for, then kept."""
    got = s.__dict__.get(_KEPT)
    if type(got) is tuple:
        c, i = got
        got = s.__dict__[_KEPT] = c.take(i, i + 1)
    return got


def _written(scheds: list[Schedule]) -> Compact:
    kept = [s.__dict__.get(_KEPT) for s in scheds]
    first = kept[0] if kept else None
    # converted together before, in this order: that batch (every rank's schedules walked again)
    if (type(first) is tuple and first[1] == 0 and len(first[0].ranks) == len(scheds)
            and all(type(k) is tuple and k[0] is first[0] and k[1] == i for i, k in enumerate(kept))):
        return first[0]
    todo = [s for s, k in zip(scheds, kept) if k is None]
    if 2 * len(todo) > len(scheds):         # mostly new: converted again together, one batch (not views joined)
        todo = scheds
    if todo:
        c = _convert(todo)
        for i, s in enumerate(todo):         # each schedule's part: (the batch, its index), a view when asked
            s.__dict__[_KEPT] = (c, i)
        if len(todo) == len(scheds):
            return c
    parts = [_part(s) for s in scheds]
    if len(parts) == 1:
        return parts[0]
    # every part's step_start begins at 0: one diff of them all, without the differences across parts
    # (a diff per part cost more than the rest at thousands of ranks)
    nsteps = np.fromiter((len(p.step_start) - 1 for p in parts), np.int64, len(parts))
    lens = np.delete(np.diff(np.concatenate([p.step_start for p in parts])), np.cumsum(nsteps + 1)[:-1] - 1)
    step_start, rank_start = prefix_sums(lens), prefix_sums(nsteps)
    skip = None
    if any(p.skip is not None for p in parts):
        skip = np.concatenate([np.zeros(len(p.kind), bool) if p.skip is None else p.skip for p in parts])
    kind, red, peer, count, touch = (np.concatenate([getattr(p, f) for p in parts])
                                     for f in ("kind", "red", "peer", "count", "touch"))
    return Compact(kind, red, peer, count, step_start, rank_start, np.concatenate([p.ranks for p in parts]), skip,
                   touch)


#: a step of at least this many operations is converted on its own and kept (``_STEPS``), by identity:
#: many schedules hold the same large step object (the hierarchical layouts' regroupings of n blocks,
#: ``hierarchical._move_equal``: on 4,096 ranks, 8,192 copies a rank, the same on every rank)
BIG_STEP = 256
_STEPS: dict[int, tuple] = {}
_STEPS_OPS, _held = 1 << 18, [0]        # at most this many operations kept (a few tens of MB)


def forget() -> None:
    """Drop the large steps kept (``_STEPS``): what one pricing shared between its ranks; another size's
    steps are other objects, and the ones kept would only be scanned by the next garbage collection."""
    _STEPS.clear()
    _held[0] = 0


def _convert(scheds: list[Schedule]) -> Compact:
    """The arrays of ``scheds`` in the order written, with the in-place copies marked (``skip``)."""
    steps = [st for s in scheds for st in s.steps]
    nsteps = np.fromiter(map(len, (s.steps for s in scheds)), np.int64, len(scheds))
    lens = np.fromiter(map(len, steps), np.int64, len(steps))
    step_start, rank_start = prefix_sums(lens), prefix_sums(nsteps)
    ranks = np.fromiter((s.rank for s in scheds), np.int64, len(scheds))
    big = np.flatnonzero(lens >= BIG_STEP).tolist()
    if not big:
        kind, red, peer, count, skip, touch = _ops(list(chain.from_iterable(steps)))
        return Compact(kind, red, peer, count, step_start, rank_start, ranks, skip, touch)
    is_big = lens >= BIG_STEP
    small = _ops(list(chain.from_iterable(st for st, b in zip(steps, is_big.tolist()) if not b)))
    in_small = ~np.repeat(is_big, lens)
    m = int(step_start[-1])
    kind, red, peer, count, touch = (np.empty(m, a.dtype) for a in small[:4] + small[5:])
    skip = None
    parts = []
    for i in big:
        got = _STEPS.get(id(steps[i]))
        if got is None or got[0] is not steps[i]:
            if len(_STEPS) >= 64 or _held[0] + len(steps[i]) > _STEPS_OPS:
                _STEPS.clear()
                _held[0] = 0
            got = _STEPS[id(steps[i])] = (steps[i], _ops(list(steps[i])))
            _held[0] += len(steps[i])
        parts.append((int(step_start[i]), int(step_start[i + 1]), got[1]))
    for out, k in ((kind, 0), (red, 1), (peer, 2), (count, 3), (touch, 5)):
        out[in_small] = small[k]
        for a, b, arrays in parts:
            out[a:b] = arrays[k]
    if small[4] is not None or any(arrays[4] is not None for _, _, arrays in parts):
        skip = np.zeros(m, bool)
        if small[4] is not None:
            skip[in_small] = small[4]
        for a, b, arrays in parts:
            if arrays[4] is not None:
                skip[a:b] = arrays[4]
    return Compact(kind, red, peer, count, step_start, rank_start, ranks, skip, touch)


def _ops(flat: list) -> tuple:
    """(kind, red, peer, count, skip, touch) of the operations ``flat`` (``skip`` None where no copy is
    left out): in the C core, one pass over the operations, where it is built (``_ops_py`` otherwise,
    the reference it equals)."""
    if _simcore is None:
        return _ops_py(flat)
    m = len(flat)
    kind, red, touch, skip = np.empty(m, np.int8), np.empty(m, np.int8), np.empty(m, np.int8), np.empty(m, bool)
    peer, count = np.empty(m, np.int64), np.empty(m, np.int64)
    skips = _simcore.ops(flat, kind, red, peer, count, skip, touch, Copy, Send, Recv, CALL_BUFFERS)
    return kind, red, peer, count, skip if skips else None, touch


def _ops_py(flat: list) -> tuple:
    """``_ops`` in numpy and Python."""
    m = len(flat)
    try:
        kind = np.fromiter(map(_KIND.__getitem__, map(type, flat)), np.int8, m)
    except KeyError:
        raise TypeError("not a message schedule (Get, Put, Post or Sync)") from None
    # Send(peer, buf, off, count); Recv(peer, buf, off, count, reduce); Copy(src, so, dst, do, count, reduce)
    count = np.fromiter(map(_FOURTH, flat), np.int64, m)      # Copy: dst_off, fixed below
    red = np.fromiter(map(_LAST, flat), np.int64, m)          # Send: count, fixed below
    is_copy = kind == COPY
    copies = np.flatnonzero(is_copy)
    k = len(copies)
    skip = None
    touch = np.zeros(m, np.int8)
    if 2 * k > m:
        # mostly copies (a Bruck alltoall's or a hierarchical regrouping's thousands a rank): field by
        # field over the copies, in numpy, rather than op by op
        cp = list(compress(flat, is_copy.tolist()))
        count[copies] = np.fromiter(map(_FIFTH, cp), np.int64, k)
        src = np.fromiter(map(_BUF.get, map(_FIRST, cp), repeat(0)), np.int8, k)
        dst = np.fromiter(map(_BUF.get, map(_THIRD, cp), repeat(0)), np.int8, k)
        touch[copies] = (src > 0) + (dst > 0) * (1 + red[copies])
        onto = np.flatnonzero((src == _BUF["in"]) & (dst == _BUF["out"]))
        same = np.fromiter((cp[j][1] == cp[j][3] for j in onto.tolist()), bool, len(onto))
        if same.any():
            skip = np.zeros(m, bool)
            skip[copies[onto[same]]] = True
        peer = np.zeros(m, np.int64)
        if k < m:
            peer[~is_copy] = np.fromiter(map(_FIRST, compress(flat, (~is_copy).tolist())), np.int64, m - k)
    elif k:
        peers = list(map(_FIRST, flat))
        for j in copies.tolist():
            o = flat[j]
            peers[j] = 0
            count[j] = o.count
            touch[j] = (o.src in CALL_BUFFERS) + (o.dst in CALL_BUFFERS) * (2 if o.reduce else 1)
            if o.src == "in" and o.dst == "out" and o.src_off == o.dst_off:
                if skip is None:
                    skip = np.zeros(m, bool)
                skip[j] = True
        peer = np.fromiter(peers, np.int64, m)
    else:
        peer = np.fromiter(map(_FIRST, flat), np.int64, m)
    red[kind == SEND] = 0
    return kind, red.astype(np.int8), peer, count, skip, touch


def _moved(peer: np.ndarray, kind: np.ndarray, sym_name: str, d, n: int) -> np.ndarray:
    """Peers moved by ``d`` (a scalar or one value per op) under Shift or Xor; copies keep 0."""
    out = (peer + d) % n if sym_name == "shift" else peer ^ d
    return np.where(kind == COPY, 0, out)


def all_ranks(reps: Compact, sym, hosts: int, per_host: int) -> Compact:
    """Every rank's arrays, in rank order, from host 0's (``reps``: ranks 0..per_host-1 in order) and
    the symmetry ``sym`` (``symmetric.Shift`` or ``Xor``): rank ``h * per_host + j`` is rep j with every
    peer moved by ``sym.mover(h)``; steps, counts and reduce flags are the rep's."""
    if not np.array_equal(reps.ranks, np.arange(per_host)):
        raise ValueError("all_ranks needs host 0's schedules, ranks 0..per_host-1 in order")
    if reps.stride is not None or reps.times is not None:
        # written out (a stride moves a peer before the fold moves it: not so under XOR)
        reps = reps.expanded()
    n = hosts * per_host
    m = len(reps.kind)
    kind = np.tile(reps.kind, hosts)
    d = np.repeat(np.arange(hosts, dtype=np.int64) * per_host, m)
    peer = _moved(np.tile(reps.peer, hosts), kind, sym.name, d, n)
    step_start = prefix_sums(np.tile(np.diff(reps.step_start), hosts))
    rank_start = prefix_sums(np.tile(np.diff(reps.rank_start), hosts))
    return Compact(kind, np.tile(reps.red, hosts), peer, np.tile(reps.count, hosts), step_start, rank_start,
                   np.arange(n, dtype=np.int64), None if reps.skip is None else np.tile(reps.skip, hosts),
                   np.tile(reps.touch, hosts), None if reps.rep is None else np.tile(reps.rep, hosts))


@dataclass
class Derived:
    """Every rank of ``hosts`` x ``per_host``, as :func:`all_ranks` gives them, without making the
    arrays: the C core moves host 0's peers as it walks (rank ``h * per_host + j`` runs rep j, every
    peer moved by ``sym.mover(h)``)."""
    reps: Compact
    sym: object
    hosts: int
    per_host: int

    @property
    def steps(self) -> int:
        return self.reps.steps

    def inplace(self) -> "Derived":
        return Derived(self.reps.inplace(), self.sym, self.hosts, self.per_host)

    def full(self) -> Compact:
        return all_ranks(self.reps, self.sym, self.hosts, self.per_host)

    def walked(self) -> tuple:
        """(ranks, template of each rank, move of each rank, move kind) for the C core."""
        n = self.hosts * self.per_host
        d = np.repeat(np.arange(self.hosts, dtype=np.int64) * self.per_host, self.per_host)
        return (np.arange(n, dtype=np.int64), np.tile(np.arange(self.per_host, dtype=np.int64), self.hosts), d,
                1 if self.sym.name == "shift" else 2)


def same_moved(got: Compact, reps: Compact, sym, h: int, per_host: int, exact: bool = False) -> bool:
    """Host ``h``'s arrays (``got``, its ranks in order) are host 0's (``reps``) moved by ``sym.mover(h)``:
    the rules of ``symmetric._same`` (same steps, kinds, peers moved and reduce flags; counts within one
    element or 1%, or equal with ``exact``), vectorized. Steps repeated are compared as written out where
    they are not held alike (a ring's chunks of two sizes cut its steps' runs where the rank says)."""
    if (not np.array_equal(got.reps(), reps.reps()) or not np.array_equal(got.strides(), reps.strides())
            or (got.stride is not None and sym.name != "shift") or not np.array_equal(got.op_times(), reps.op_times())):
        got, reps = got.expanded(), reps.expanded()
    if not (np.array_equal(got.rank_start, reps.rank_start) and np.array_equal(got.step_start, reps.step_start)
            and np.array_equal(got.kind, reps.kind) and np.array_equal(got.red, reps.red)):
        return False
    if not np.array_equal(got.peer, _moved(reps.peer, reps.kind, sym.name, h * per_host, sym.n)):
        return False
    if exact:
        return np.array_equal(got.count, reps.count)
    a, b = got.count, reps.count
    return bool((np.abs(a - b) <= np.maximum(1, 0.01 * np.maximum(a, b))).all())
