"""Run schedules without processes and prove they compute the right thing.

Every element carries, instead of a value, *who contributed to it*: a vector of
multiplicities over ranks plus the index of the input element it came from.
Reducing adds the vectors (and insists on one index); copying copies them.
At the end each rank's output must hold exactly the contributions the
primitive promises, each input counted once. The schedules run through the
same walker as the engine (``walk.py``): messages move FIFO per ordered pair,
as on the real transports, and the windows of segment schedules are published
round by round, as on the shared segment. A schedule that deadlocks, leaves
messages unreceived, sizes a receive wrongly, races (a receive into memory its
own step also reads or writes), reads outside a window or a posted buffer, or
lets a rank return while another may still read its buffer is reported; so is
a ``Put`` into a buffer its owner did not post for writing that round, or past
its end, and any access to a region a ``Put`` writes that may run at the same
time as the write (another ``Put``, a read of it, the owner's own use of it
before it has heard from the writer's next round, or the owner returning).

Causality is tracked with vector clocks (what each rank can know of the
others' progress), so the checks that depend on it (a barrier hears from
everyone; an owner outlives the reads of its buffer) hold in every
interleaving, not just the one walked.

>>> check("allreduce", "ring", nranks=5, count=7)      # raises CheckError if wrong
"""
from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from .algorithms import registry
from .algorithms.segment import Window
from .primitives import PRIMITIVES
from .schedule import Copy, Get, Post, Put, Recv, Schedule, Send, offsets
from .walk import Semantics, walk

MIXED = -1      # an element combining different input indices: always wrong
UNSET = -2      # never written

#: The window segment schedules get unless a test names one: small, so that messages go in pieces.
DEFAULT_WINDOW = Window(elements=64, oneshot=8, single_copy=0)


class CheckError(AssertionError):
    pass


class _Buf:
    def __init__(self, count: int, nranks: int):
        self.c = np.zeros((count, nranks), np.int32)   # contribution multiplicity per source rank
        self.i = np.full(count, UNSET, np.int64)      # input element index

    def input(self, rank: int) -> "_Buf":
        self.c[:, rank] = 1
        self.i[:] = np.arange(len(self.i))
        return self

    def view(self, off: int, count: int) -> "_Buf":
        """Elements [off, off + count) of this buffer as a buffer of their own (the same memory)."""
        v = _Buf.__new__(_Buf)
        v.c, v.i = self.c[off:off + count], self.i[off:off + count]
        return v


def _apply(dst: _Buf, off: int, c, i, reduce: bool) -> None:
    sl = slice(off, off + len(i))
    if reduce:
        cur = dst.i[sl]
        dst.i[sl] = np.where((cur == i) | (cur == UNSET), i, MIXED)
        dst.c[sl] += c
    else:
        dst.c[sl] = c
        dst.i[sl] = i


def _overlap(a, b) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _races(step) -> list[str]:
    recvs = [(o.buf, o.off, o.off + o.count) for o in step if type(o) is Recv]
    others = [(o.buf, o.off, o.off + o.count) for o in step if type(o) is Send]
    out = []
    for i, r in enumerate(recvs):
        for x in others + recvs[i + 1:]:
            if _overlap(r, x):
                out.append(f"receive into {r} overlaps {x} in the same step")
    out += [f"{o} writes its window after publishing it" for o in step
            if type(o) is Get and not o.prev and o.buf == "win"]
    return out


class _Symbolic(Semantics):
    """Symbolic contributions move through messages and windows; vector clocks track causality."""

    def __init__(self, name: str, scheds, bufs, count: int):
        self.name, self.scheds, self.bufs, self.count = name, scheds, bufs, count
        n = self.n = len(scheds)
        self.chan: dict[tuple[int, int], deque] = {}
        self.published = [-1] * n
        self.vc = np.eye(n, dtype=np.int64)          # vc[r][q]: events of q that r knows of
        self.pub_vc: dict[tuple[int, int], np.ndarray] = {}
        self.windows: dict[tuple[int, int], tuple] = {}     # (rank, round) -> (buf, first, elements)
        self.posts: dict[tuple[int, int], Post] = {}
        self.readers: dict[tuple[int, int], set] = {}        # (owner, round) -> ranks that read that window
        # owner -> [(buffer name, first, end, writer, round)]: the regions of its posted buffers that Puts write,
        # known from every schedule before the walk (an access races a Put the walk has not reached yet too)
        self.written: dict[int, list] = {}
        for s in scheds:
            for k, step in enumerate(s.steps):
                for o in step:
                    if type(o) is Get:
                        self.readers.setdefault((o.peer, k - o.prev), set()).add(s.rank)
                    elif type(o) is Put:
                        self._declare(s.rank, k, o)

    def _declare(self, w, k, o: Put) -> None:
        """Writer ``w``'s Put ``o`` of round ``k``: into what its owner posted for writing in that round."""
        p = o.peer
        if not 0 <= p < self.n:
            self.fail(f"rank {w} round {k} puts into rank {p}")
        step = self.scheds[p].steps[k] if k < len(self.scheds[p].steps) else ()
        post = next((x for x in step if type(x) is Post), None)
        if post is None or not post.writes:
            self.fail(f"rank {w} round {k} puts into rank {p}, which posted no buffer "
                      f"{'for writing ' if post else ''}in round {k}")
        if o.dst_off < 0 or o.dst_off + o.count > post.count:
            self.fail(f"rank {w} round {k} puts [{o.dst_off}:{o.dst_off + o.count}] into rank {p}'s posted "
                      f"buffer of {post.count} elements")
        at = post.off + o.dst_off
        self.written.setdefault(p, []).append((post.buf, at, at + o.count, w, k))

    def guard(self, a, k, late: bool, owner, buf: _Buf, lo: int, hi: int, what: str) -> None:
        """Rank ``a`` in round ``k`` (``late``: after publishing it) touches ``[lo:hi)`` of ``buf``, a buffer of
        rank ``owner``: fail unless every Put of another rank into that region ran before (``a`` knows the
        writer's next round) or runs after (the owner posts it later; another rank's access is over
        before the round before the Put's ends)."""
        stage = 2 * k + late
        for name, plo, phi, w, kw in self.written.get(owner, ()):
            if w == a or plo >= hi or lo >= phi or self.bufs[owner].get(name) is not buf:
                continue
            if stage <= (2 * kw if a == owner else 2 * kw - 2) or self.vc[a][w] >= kw + 3:
                continue
            self.fail(f"rank {a} round {k} {what} {name}[{max(lo, plo)}:{min(hi, phi)}] of rank {owner} while rank "
                      f"{w} may still put into it (round {kw}): it must wait for rank {w}'s next round")

    def reuse(self, r, k) -> None:
        """Rank ``r`` writes its window in round ``k``: the memory of its window of round ``k - 2`` (a window
        per parity), so every rank that read that one must be done with it: ``r`` must know its round
        ``k - 1``. (Beginning a round after everyone's round before makes it so; a free round does not
        wait, walk.py.)"""
        for q in self.readers.get((r, k - 2), ()):
            if q != r and (r, k - 2) not in self.posts and self.vc[r][q] < k + 1:
                self.fail(f"rank {r} round {k} writes its window while rank {q} may still read it from round "
                          f"{k - 2}: it must wait for rank {q}'s round {k - 1}")

    def fail(self, msg: str):
        raise CheckError(f"{self.name} n={self.n} count={self.count}: {msg}")

    def region(self, r, buf, off, cnt) -> _Buf:
        b = self.bufs[r][buf]
        if off < 0 or off + cnt > len(b.i):
            self.fail(f"rank {r} touches {buf}[{off}:{off + cnt}] outside its {len(b.i)} elements")
        return b

    def merge(self, r, clock) -> None:
        np.maximum(self.vc[r], clock, out=self.vc[r])

    def read_window(self, r, k, o: Get, at: int) -> None:
        """Get ``o`` of rank ``r``'s round ``at`` reads the window (or posted buffer) of round ``k``."""
        if not 0 <= o.peer < self.n or k < 0:
            self.fail(f"rank {r} reads the window of rank {o.peer} of round {k}")
        if (o.peer, k) not in self.windows:
            self.fail(f"rank {r} round {at} reads rank {o.peer}'s window of round {k} before rank {o.peer} "
                      f"published it")
        buf, first, size = self.windows[(o.peer, k)]
        if o.src_off < 0 or o.src_off + o.count > size:
            what = "the buffer it posted" if (o.peer, k) in self.posts else "its window"
            self.fail(f"rank {r} round {k} reads [{o.src_off}:{o.src_off + o.count}] of rank {o.peer}'s "
                      f"{what} of {size} elements")
        src = slice(first + o.src_off, first + o.src_off + o.count)
        dst = self.region(r, o.buf, o.off, o.count)
        if o.buf == "win":
            self.reuse(r, at)
        late = not o.prev
        self.guard(r, at, late, o.peer, buf, src.start, src.stop, "reads")
        self.guard(r, at, late, r, dst, o.off, o.off + o.count, "writes")
        _apply(dst, o.off, buf.c[src].copy(), buf.i[src].copy(), o.reduce)

    # --- the walker's hooks ------------------------------------------------------
    def begin(self, r, k, free):
        if k and not free and any(p < k - 1 for p in self.published):
            return False
        if k and not free:
            for p in range(self.n):
                self.merge(r, self.pub_vc[(p, k - 1)])
        self.bufs[r]["win"] = _Buf(self.scheds[r].window, self.n)
        return True

    def local(self, r, k, o):
        if type(o) is Copy:
            src = self.region(r, o.src, o.src_off, o.count)
            dst = self.region(r, o.dst, o.dst_off, o.count)
            self.guard(r, k, False, r, src, o.src_off, o.src_off + o.count, "reads")
            self.guard(r, k, False, r, dst, o.dst_off, o.dst_off + o.count, "writes")
            if o.dst == "win":
                self.reuse(r, k)
            sl = slice(o.src_off, o.src_off + o.count)
            _apply(dst, o.dst_off, src.c[sl].copy(), src.i[sl].copy(), o.reduce)
        elif type(o) is Post:
            self.region(r, o.buf, o.off, o.count)
            self.posts[(r, k)] = o
        else:                                      # Get(prev=True): the peer's window of the round before
            self.read_window(r, k - 1, o, k)

    def send(self, r, k, o):
        if not 0 <= o.peer < self.n or o.peer == r:
            self.fail(f"rank {r} sends to {o.peer}")
        self.vc[r][r] = max(self.vc[r][r], k + 2)
        src = self.region(r, o.buf, o.off, o.count)
        sl = slice(o.off, o.off + o.count)
        self.chan.setdefault((r, o.peer), deque()).append((src.c[sl].copy(), src.i[sl].copy(), self.vc[r].copy()))

    def publish(self, r, k):
        self.published[r] = k
        self.vc[r][r] = k + 2
        self.pub_vc[(r, k)] = self.vc[r].copy()
        post = self.posts.get((r, k))
        self.windows[(r, k)] = ((self.bufs[r][post.buf], post.off, post.count) if post else
                                (self.bufs[r]["win"], 0, self.scheds[r].window))

    def take(self, r, k, o):
        if type(o) is Recv:
            if not 0 <= o.peer < self.n or o.peer == r:
                self.fail(f"rank {r} receives from {o.peer}")
            q = self.chan.get((o.peer, r))
            if not q:
                return False
            c, i, clock = q.popleft()
            if len(i) != o.count:
                self.fail(f"rank {r} step {k} expects {o.count} elements from rank {o.peer}, which sent {len(i)}")
            _apply(self.region(r, o.buf, o.off, o.count), o.off, c, i, o.reduce)
            self.merge(r, clock)
            return True
        if not 0 <= o.peer < self.n:
            self.fail(f"rank {r} waits for rank {o.peer}")
        if self.published[o.peer] < k:
            return False
        if type(o) is Get:
            self.read_window(r, k, o, k)
        elif type(o) is Put:
            self.put(r, k, o)
        self.merge(r, self.pub_vc[(o.peer, k)])
        return True

    def put(self, r, k, o: Put) -> None:
        post = self.posts[(o.peer, k)]          # (its owner posted it for writing: _declare)
        src = self.region(r, o.buf, o.off, o.count)
        dst = self.region(o.peer, post.buf, post.off + o.dst_off, o.count)
        at = post.off + o.dst_off
        self.guard(r, k, True, r, src, o.off, o.off + o.count, "reads")
        self.guard(r, k, True, o.peer, dst, at, at + o.count, "writes")
        sl = slice(o.off, o.off + o.count)
        _apply(dst, at, src.c[sl].copy(), src.i[sl].copy(), False)

    def end(self, r, k):
        if k != len(self.scheds[r].steps) - 1:
            return
        for (owner, j), post in self.posts.items():     # nobody may still read a buffer I return to my caller
            if owner != r:
                continue
            for q in self.readers.get((r, j), ()):
                if q != r and self.vc[r][q] < j + 3:
                    self.fail(f"rank {r} may return while rank {q} still reads the {post.buf} buffer it "
                              f"posted in round {j}: it must wait for rank {q}'s next round")
        for name, _, _, w, kw in self.written.get(r, ()):
            if w != r and self.vc[r][w] < kw + 3:
                self.fail(f"rank {r} may return while rank {w} still puts into the {name} buffer it posted in "
                          f"round {kw}: it must wait for rank {w}'s next round")


def _compact_windows(name: str, scheds: list[Schedule]) -> list[Schedule]:
    """The segment schedules with their windows squeezed to the regions used (a window of the runtime
    holds megabytes, of which a call may touch a few elements per rank), after checking that every
    access stays inside the declared window. Reads of posted buffers are left alone."""
    posted = {(s.rank, k) for s in scheds for k, step in enumerate(s.steps) if any(type(o) is Post for o in step)}
    regions = []
    for s in scheds:
        for k, step in enumerate(s.steps):
            for o in step:
                if type(o) is Copy:
                    regions += [(s, k, x, o.count) for b, x in ((o.src, o.src_off), (o.dst, o.dst_off)) if b == "win"]
                elif type(o) is Get:
                    if o.buf == "win":
                        regions.append((s, k, o.off, o.count))
                    if (o.peer, k - o.prev) not in posted:
                        regions.append((s, k, o.src_off, o.count))
                elif type(o) is Put and o.buf == "win":
                    regions.append((s, k, o.off, o.count))
    for s, k, off, count in regions:
        if off < 0 or off + count > s.window:
            raise CheckError(f"{name}: rank {s.rank} round {k} touches a window at [{off}:{off + count}], "
                             f"outside its {s.window} elements")
    starts, ends = [], []
    for _, _, off, count in sorted(regions, key=lambda x: x[2]):
        if starts and off <= ends[-1]:
            ends[-1] = max(ends[-1], off + count)
        else:
            starts.append(off)
            ends.append(off + count)
    base = offsets([e - b for b, e in zip(starts, ends)])

    def at(off):
        i = bisect.bisect_right(starts, off) - 1
        return base[i] + off - starts[i]
    out = []
    for s in scheds:
        steps = []
        for k, step in enumerate(s.steps):
            ops = []
            for o in step:
                if type(o) is Copy:
                    o = o._replace(dst_off=at(o.dst_off)) if o.dst == "win" else o
                    o = o._replace(src_off=at(o.src_off)) if o.src == "win" else o
                elif type(o) is Get:
                    o = o._replace(off=at(o.off)) if o.buf == "win" else o
                    o = o._replace(src_off=at(o.src_off)) if (o.peer, k - o.prev) not in posted else o
                elif type(o) is Put and o.buf == "win":
                    o = o._replace(off=at(o.off))
                ops.append(o)
            steps.append(tuple(ops))
        out.append(Schedule(s.rank, s.nranks, steps, s.scratch, True, base[-1]))
    return out


def _expected(primitive: str, nranks: int, rank: int, args: dict):
    """(contribution matrix, index vector) the output of ``rank`` must hold, or None if unconstrained."""
    ones, eye = np.ones(nranks, np.int32), np.eye(nranks, dtype=np.int32)
    root = args.get("root")
    if "count" in args:
        ar = np.arange(args["count"])
        if primitive == "allreduce" or (primitive == "reduce" and rank == root):
            return np.tile(ones, (len(ar), 1)), ar
        return (np.tile(eye[root], (len(ar), 1)), ar) if primitive == "broadcast" else None
    counts = args.get("counts") or args.get("recv_counts")
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    mine = np.arange(off[rank], off[rank + 1])
    if primitive == "reduce_scatter":
        return np.tile(ones, (counts[rank], 1)), mine
    if primitive == "scatter":
        return np.tile(eye[root], (counts[rank], 1)), mine
    blocks = np.repeat(eye, counts, axis=0)
    if primitive == "allgather" or (primitive == "gather" and rank == root):
        return blocks, np.concatenate([np.arange(c) for c in counts])
    if primitive == "alltoall":      # rank p's block for me sits at my index among its equal blocks
        return blocks, np.concatenate([np.arange(c) + rank * c for c in counts])
    return None


def _arguments(primitive: str, nranks: int, count: int, root: int, counts) -> dict:
    args = PRIMITIVES[primitive].args(nranks, count, root)
    if counts is not None:
        args["counts"] = list(counts)
    return args


def simulate(primitive: str, name: str, nranks: int, count: int = 0, root: int = 0, inplace: bool = False,
             hosts=None, window: Window | None = None, counts: list[int] | None = None):
    """Run ``name``'s schedules for every rank; return the final buffers, what each rank knows of
    the others (vector clocks) and the schedules. ``count``: elements per rank's block (the count
    for allreduce, broadcast, reduce); ``counts``: a block size per rank instead (allgather,
    reduce_scatter, gather, scatter). ``inplace``: "in" and "out" are one buffer, as in
    ``allreduce(x)``, or the smaller is the rank's block of the larger (``Primitive.in_place_at``: the
    in-place allgather, reduce_scatter, gather and scatter). ``window``: what segment schedules get
    (default: ``DEFAULT_WINDOW``)."""
    algo, prim = registry.lookup(primitive, name), PRIMITIVES[primitive]
    args = _arguments(primitive, nranks, count, root, counts)
    scheds, bufs = [], []
    for r in range(nranks):
        s = algo.schedule(r, nranks, hosts=hosts, window=window or DEFAULT_WINDOW, **args)
        if s.rank != r or s.nranks != nranks or s.segment != algo.segment:
            raise CheckError(f"{name}: the schedule of rank {r} says rank {s.rank} of {s.nranks}"
                             f"{', segment' if s.segment else ''}")
        n_in, n_out = prim.buffers(r, args)
        b = {"in": _Buf(n_in, nranks).input(r), "out": _Buf(n_out, nranks), "tmp": _Buf(s.scratch, nranks)}
        if primitive == "broadcast" and r == root:
            b["out"].input(r)
        if inplace and prim.shape == "count":
            b["out"] = b["in"]
        elif inplace and n_in and n_out:
            at = prim.in_place_at(r, args, 1)
            if prim.gathers:        # the input is this rank's block of the output
                b["in"] = b["out"].view(at, n_in).input(r)
            else:
                b["out"] = b["in"].view(at, n_out)
        for k, step in enumerate(s.steps):
            races = _races(step)
            if races:
                raise CheckError(f"{name} n={nranks}: rank {r} step {k}: {races[0]}")
        scheds.append(s)
        bufs.append(b)
    rounds = {len(s.steps) for s in scheds if s.segment}
    if len(rounds) > 1:
        raise CheckError(f"{name} n={nranks} count={count}: ranks run different numbers of rounds "
                         f"{[len(s.steps) for s in scheds]}; the segment's round counters would part them")
    sem = _Symbolic(name, _compact_windows(name, scheds) if algo.segment else scheds, bufs, count)
    stuck = walk(sem.scheds, sem)
    if stuck:
        raise CheckError(f"{name} n={nranks} count={count}: deadlock; ranks {stuck} cannot go on")
    left = [k for k, q in sem.chan.items() if q]
    if left:
        raise CheckError(f"{name} n={nranks} count={count}: messages never received on {left[:4]}")
    return bufs, sem.vc, scheds


def check(primitive: str, name: str, nranks: int, count: int = 0, root: int = 0, hosts=None,
          window: Window | None = None, counts: list[int] | None = None):
    """Raise CheckError unless every rank ends with exactly the promised contributions
    (arguments as for ``simulate``), in place (where the primitive has that form) and not.

    Returns the schedules (for tests that also look at steps and bytes)."""
    if PRIMITIVES[primitive].shape in ("count", "blocks") and primitive != "broadcast":
        _check(primitive, name, nranks, count, root, True, hosts, window, counts)
    return _check(primitive, name, nranks, count, root, False, hosts, window, counts)


def _check(primitive, name, nranks, count, root, inplace, hosts, window, counts):
    bufs, vc, scheds = simulate(primitive, name, nranks, count, root, inplace, hosts, window, counts)
    args = _arguments(primitive, nranks, count, root, counts)
    if primitive == "barrier":
        for r in range(nranks):
            unheard = [q for q in range(nranks) if vc[r][q] < 1]
            if unheard:
                raise CheckError(f"barrier {name} n={nranks}: rank {r} may leave before hearing from {unheard}")
        return scheds
    for r in range(nranks):
        exp = _expected(primitive, nranks, r, args)
        if exp is None:
            continue
        out = bufs[r]["out"]
        ec, ei = exp
        bad = np.flatnonzero((out.c != ec).any(axis=1) | (out.i != ei))
        if len(bad):
            e = bad[0]
            raise CheckError(f"{primitive} {name}{' in place' if inplace else ''} n={nranks} count={count} "
                             f"root={root}: rank {r} out[{e}] holds "
                             f"contributions {out.c[e].tolist()} of input element {out.i[e]}; expected "
                             f"{ec[e].tolist()} of element {ei[e]} ({len(bad)} wrong elements)")
        if not inplace and primitive != "broadcast":
            inp = bufs[r]["in"]
            if (inp.c != np.eye(nranks, dtype=np.int32)[r]).any() and len(inp.i):
                raise CheckError(f"{primitive} {name} n={nranks}: rank {r}'s input was modified")
    return scheds


__all__ = ["check", "simulate", "CheckError", "DEFAULT_WINDOW"]
