"""The one-host fast path (algorithm "segment"; "shm" is its old name, still accepted): segment schedules on the ranks' shared segment.

Every rank of a one-host communicator owns a window (its area of the shared
segment). A round: write my window, publish it, read the windows I need;
numpy reduces straight on the shared windows, in rank order, so every rank
gets bit-identical results. A message larger than a window goes in pieces,
a round each (two for large reductions). From ``Window.single_copy``
elements on (where ranks share cores: an alltoall's and a scatter's from
larger blocks, an allgather's never; see _dealing and _gathering), blocks
move by single-copy reads of their owner's own buffer
(``Post``, then ``Get``s through process_vm_readv; a rank's own block is a
``Get`` of its own posted buffer, so it is copied after publishing, while the
others read), and a last round keeps every owner from returning while others
still read its buffer. A gather goes the other way: the root posts its output
and every rank writes its block into it (``Put``, through process_vm_writev),
but for a tail the root reads itself, so that the ranks copy at once instead
of the root copying every block; a last round keeps the root from returning
before the writers are done, and a writer before the root read its tail. An
allgather where every rank has a core of its own goes
that way too: every rank writes its block into every output, a piece at a
time, so that a piece is read from memory once for all of them.

Every rank runs the same number of rounds (the round counters pair them), so
a rank with nothing to do in a round still takes part (``Sync`` on itself).
These schedules are what runs, what the checker proves and what the cost
model prices.
"""
from __future__ import annotations

from typing import NamedTuple

from ..schedule import Copy, Get, Post, Put, Schedule, Sync, offsets, split_counts
from .registry import register

ONESHOT_BYTES = 64 << 10   # up to this, every rank reduces everything: one round, least latency
CMA_BYTES = 256 << 10      # blocks from this size move by single-copy reads, when the kernel allows them ...
SHARED_ROUNDS = 2          # ... but where ranks share cores, an alltoall's and a scatter's only where the windows
                           # would take more rounds than this (see _dealing), and an allgather's never (_gathering)
BROADCAST_CMA_BYTES = 4 << 20   # a broadcast from this size: by single-copy reads (see broadcast) ...
BROADCAST_CMA_OWN_BYTES = 512 << 10     # ... or from this size where every rank has a core of its own
ROOT_REDUCES = 2           # a reduce on this many ranks or fewer, each with a core: the root reduces it all
                           # (measured at 2; see _root_reduces) ...
SHARES_BYTES = 1 << 20     # ... above this size; up to it, each reduces its share as in an allreduce
TEE_PIECE_BYTES = 1 << 20  # an allgather's block goes to every output a piece at a time (see _gathering)
PIECE_BYTES = 32 << 10     # where every rank has a core: a broadcast's pieces through the windows (see broadcast)
RS_PIECES = 8              # ... and a reduce-scatter's, per rank: this many of those (see reduce_scatter)


class Window(NamedTuple):
    """What the segment offers one call, in elements of its dtype."""
    elements: int           # one rank's window
    oneshot: int            # allreduce/reduce up to this count: one round, every rank reduces it all
    single_copy: int = 0    # blocks of at least this many elements move by single-copy reads (0: never)
    # a broadcast through the windows moves pieces of at most this many elements; set (not 0) only where
    # every rank has a core of its own, which the reduce-scatter's and the reduce's two-round forms need too
    piece: int = 0
    shares: int = 0         # (where piece is set) a reduce up to this count goes in shares (see _root_reduces)

    @classmethod
    def of(cls, area_bytes: int, itemsize: int, cma: bool, pipelined: bool = False) -> "Window":
        """``pipelined``: every rank has a core of its own (then a broadcast goes in small pieces, and a
        reduce-scatter and a 2-rank reduce in their two-round forms)."""
        return cls(area_bytes // itemsize, ONESHOT_BYTES // itemsize, CMA_BYTES // itemsize if cma else 0,
                   max(1, PIECE_BYTES // itemsize) if pipelined else 0, SHARES_BYTES // itemsize if pipelined else 0)

    def copies_once(self, block: int, from_bytes: int = CMA_BYTES) -> bool:
        """Do blocks of ``block`` elements move by single copies? Where the kernel allows them, from
        ``from_bytes`` (``single_copy`` elements stand for CMA_BYTES: tests give tiny windows)."""
        return 0 < self.single_copy <= block * CMA_BYTES // from_bytes

    def reads_once(self, block: int, per_round: int) -> bool:
        """Do blocks of ``block`` elements move by single-copy reads, not through the windows ``per_round``
        elements of a block a round? Where every rank has a core, from CMA_BYTES; elsewhere also only where
        the windows would take more than SHARED_ROUNDS rounds."""
        return self.copies_once(block) and (self.piece > 0 or block > SHARED_ROUNDS * per_round)


def _new(rank: int, nranks: int, window: Window, per_rank_slots: int = 1) -> Schedule:
    if window.elements < per_rank_slots:
        raise ValueError(f"a window of {window.elements} elements holds no slot for each of {nranks} ranks")
    return Schedule(rank, nranks, segment=True, window=window.elements)


def _round(s: Schedule, *ops) -> None:
    """One round; a rank with nothing to move in it still takes part."""
    ops = [o for o in ops if o.count > 0]
    s.steps.append(tuple(ops) or (Sync(s.rank),))


def _clip(count: int, a: int, per: int) -> int:
    """Elements of a ``count``-element block in the piece [a, a+per)."""
    return max(0, min(count, a + per) - a)


def _equal(counts: list[int]) -> int:
    if len(set(counts)) > 1:
        raise ValueError("the fast path needs blocks of one size on every rank")
    return counts[0] if counts else 0


def _reduction(rank, n, count, window, root):
    s = _new(rank, n, window)
    W, reads = window.elements, root is None or rank == root
    if root is not None and n <= ROOT_REDUCES and window.piece and count > max(window.oneshot, window.shares):
        return _root_reduces(s, rank, n, count, window, root)
    for a in range(0, count, W):
        c = min(W, count - a)
        if c <= window.oneshot or n == 1:
            _round(s, Copy("in", a, "win", 0, c),
                   *(Get(p, 0, "out", a, c, reduce=p > 0) for p in range(n) if reads))
            continue
        shares = split_counts(c, n)                 # large: every rank reduces its share at once
        off = offsets(shares)
        # the others' shares through my window; my own share straight from my input (a copy less)
        _round(s, *(Copy("in", a + off[q], "win", off[q], shares[q]) for q in range(n) if q != rank))
        # my reduced share goes to my output too before publishing (a copy of what the last reduce just
        # wrote: the C executor writes both in that reduce's pass, a read of the window less), the
        # others' result shares from their windows
        _round(s, *(Copy("in", a + off[rank], "win", 0, shares[rank], reduce=p > 0) if p == rank else
                    Get(p, off[rank], "win", 0, shares[rank], reduce=p > 0, prev=True) for p in range(n)),
               *((Copy("win", 0, "out", a + off[rank], shares[rank]),) if reads else ()),
               *(Get(p, 0, "out", a + off[p], shares[p]) for p in range(n) if reads and p != rank))
    if not s.steps:
        _round(s)
    return s


def _root_reduces(s, rank, n, count, window, root):
    """A reduce on ROOT_REDUCES ranks or fewer, each with a core of its own (``Window.piece``), larger than
    SHARES_BYTES (``Window.shares``): the others
    copy piece k + 1 into their windows while the root reduces piece k (reading the round before: ``prev``)
    from their windows and its input, in rank order: root 0 straight into its output (its input is the
    first operand, so in place it is read before it is written; one pass in the C executor where not in
    place), another root into its own window and then out (the output last, so that in place its input
    is read first). Root 0 writing no window: 2 ranks, alternating runs, 1 MiB 104-125 us against
    138-150 (in place 90-111 against 132-136), 4 MiB 355-420 against 497-617. At 2 ranks the root then
    reads two inputs and writes one output an element while the other copies; reducing shares (as
    allreduce does) has the root also copy the other's share in and the result share out. Pieces of a
    sixteenth of the call from 32 to 128 KiB, which stay in the cache between the two cores (256 KiB
    pieces: 256 KiB and 1 MiB calls slower). 2 ranks, alternating runs against reducing shares: 256 KiB
    32 us against 44, 1 MiB 156 against 193, 4 MiB 1.01-1.08 ms against 1.52-1.57, 64 MiB 18.7-19.2
    against 22.6-23.0. Since the ranks write their windows one way together (_native.c, nt_windows,
    session 25) shares win from 512 KiB to 1.5 MiB in the machine's fast state and lose in its slow one:
    2 ranks, jobs alternating, 1 MiB 60-65 us against 88-121 fast, 93-98 against 78-81 slow; 768 KiB 57
    against 71-88 fast, 77 slow; 256 KiB 31-35 against 29-33 either way; 4 MiB 245-430 against 292-375 fast,
    398-418 against 283-303 slow; 16 MiB 2.2-3.4 ms against 1.5-2.0 either way. Shares up to 1 MiB, where
    they win on the two states' sum (and Intel MPI's own 1 MiB reduce takes 57-66 us fast, 240-250 slow)."""
    piece = min(window.elements, max(window.piece, min(4 * window.piece, -(-count // 16))))
    done = ()               # (the root) the piece before's reduction, from the round before's windows
    for a in range(0, count, piece):
        c = min(piece, count - a)
        _round(s, *done, *((Copy("in", a, "win", 0, c),) if rank != root else ()))
        if rank == root == 0:       # straight into the output: in place its input is the first operand
            done = tuple(Copy("in", a, "out", a, c) if p == rank else
                         Get(p, 0, "out", a, c, reduce=True, prev=True) for p in range(n))
        elif rank == root:          # through its window, the output last (in place the input is read first)
            done = (*(Copy("in", a, "win", 0, c, reduce=p > 0) if p == rank else
                      Get(p, 0, "win", 0, c, reduce=p > 0, prev=True) for p in range(n)),
                    Copy("win", 0, "out", a, c))
    _round(s, *done)
    return s


@register("allreduce", "segment", segment=True, alike=True)
def allreduce(rank: int, nranks: int, count: int, window: Window) -> Schedule:
    return _reduction(rank, nranks, count, window, None)


@register("reduce", "segment", segment=True, alike=True)
def reduce(rank: int, nranks: int, count: int, root: int, window: Window) -> Schedule:
    return _reduction(rank, nranks, count, window, root)


@register("reduce_scatter", "segment", segment=True, alike=True)
def reduce_scatter(rank: int, nranks: int, counts: list[int], window: Window) -> Schedule:
    """Each window holds, per piece, the piece of block q at q * per, and rank q reduces its block's
    piece from every window in rank order.

    Where every rank has a core of its own (``Window.piece``), a rank does not write its own block's
    piece to its window: in the round after (reading that one's windows: ``prev``) it reduces the piece
    from the others' windows and its own straight from its input, into its own slot, then copies it out
    (the C executor does both in one pass; the output last, so that in place its input is read first);
    that round also writes the next piece's slots. Its pieces are 256 KiB a rank (RS_PIECES of
    ``Window.piece``): 2 ranks, jobs alternating in both states of the machine, with windows written the
    cheaper way (PYXCCL_NT_WINDOWS), medians: 1 MiB 88-92 us against 108-110 in 32 KiB pieces, 4 MiB
    281-286 against 357-368, 16 MiB 1.44-1.67 ms against 1.94-2.04, 64 MiB 5.7 against 6.8-7.0; 512 KiB and
    1 MiB pieces as fast as 256 KiB (32 KiB pieces had been the faster before windows were written by
    non-temporal stores: a window's share, 1 MiB 148-152 us against 137-139). 2 ranks, alternating runs
    against the one-round form: 1 MiB 137-139 us against 193-221, 4 MiB 0.69 ms against 1.00, 64 MiB
    15.4-15.6 against 20.0-22.2 (32 KiB pieces, a slow phase). With more ranks than
    cores every rank waits there for all the others' rounds instead of reading each as it comes (4 ranks on
    2 cores, 2 MiB: 1.75-1.85 ms against 1.49-1.57), so there a rank writes every piece and reads them in the
    same round."""
    s = _new(rank, nranks, window, nranks)
    per, off = window.elements // nranks, offsets(counts)
    per = min(per, RS_PIECES * window.piece or per)     # (two-round form) its pieces
    mine = rank * per
    done = ()               # (two-round form) the piece before's reduction, from the round before's windows
    for a in range(0, max(counts, default=0), per):
        k = _clip(counts[rank], a, per)
        if not window.piece:
            _round(s, *(Copy("in", off[q] + a, "win", q * per, _clip(counts[q], a, per)) for q in range(nranks)),
                   *(Get(p, mine, "out", a, k, reduce=p > 0) for p in range(nranks)))
            continue
        _round(s, *done, *(Copy("in", off[q] + a, "win", q * per, _clip(counts[q], a, per))
                           for q in range(nranks) if q != rank))
        done = (*(Copy("in", off[rank] + a, "win", mine, k, reduce=p > 0) if p == rank else
                  Get(p, mine, "win", mine, k, reduce=p > 0, prev=True) for p in range(nranks)),
                Copy("win", mine, "out", a, k))
    if done or not s.steps:
        _round(s, *done)
    return s


def _root_reads(count: int, n: int) -> int:
    """Elements at the end of a writer's ``count``-element block that a gather's root reads itself while the
    writers write the rest, so that it copies about as long as each of them: its own block by a plain
    copy, and (n - 1) tails by single-copy reads, which run at about 1/1.4 the speed of a copy here; an
    even share is then 2/7 of a block over n ranks. At 2 ranks, 64 MiB: 3.2-3.9 ms against 4.0-4.8 with
    the writers writing it all, and 2.6-2.9 against 3.1-4.5 in place (six runs of each, interleaved)."""
    return count * 2 // (7 * n)


def _gathering(rank, n, counts, window, root):
    """allgather, or gather to ``root``: every rank's block to every rank (the root)."""
    s, off = _new(rank, n, window), offsets(counts)
    reads = root is None or rank == root
    most, mine_first = max(counts, default=0), [rank] + [q for q in range(n) if q != rank]
    if root is not None and window.copies_once(most):
        # every rank writes its block into the root's output at once (the root its own, after publishing),
        # but for the tail that the root reads (_root_reads); then the root waits for each writer's next
        # round (its write is done), and a writer whose tail the root reads for the root's
        tail = [_root_reads(c, n) if p != root else 0 for p, c in enumerate(counts)]
        if rank == root:
            _round(s, Post("out", 0, off[-1], writes=True), Put(root, off[rank], "in", 0, counts[rank]),
                   *(Get(p, counts[p] - tail[p], "out", off[p + 1] - tail[p], tail[p]) for p in range(n)))
            _round(s, *(Sync(p) for p in range(n) if p != rank and counts[p]))
        else:
            _round(s, *((Post("in", 0, counts[rank]),) if tail[rank] else ()),
                   Put(root, off[rank], "in", 0, counts[rank] - tail[rank]))
            _round(s, *((Sync(root),) if tail[rank] else ()))
        return s
    if root is None and window.piece and window.copies_once(most):
        # every rank writes its block into every output (its own first), a piece at a time, so that the
        # piece is read from memory once and written from the cache (Puts run in the order written).
        # 2 ranks, alternating runs against every rank reading every block, in a fast phase of the machine:
        # 4 MiB 0.44-0.47 ms against 0.52-0.58, 16 MiB 3.3-3.6 against 3.7-3.8; in a slow one: 1 MiB 0.145
        # against 0.158, 4 MiB 1.00-1.04 against 1.12-1.20, 16 MiB 4.1-4.6 against 4.5-5.0 (256 KiB pieces:
        # 4 MiB 0.48-0.65). Larger blocks too since the C executor streams into outputs past the cache
        # (medians of batches in one job, output size: 32 MiB 4.1-4.2 ms against 4.6, 64 MiB 7.9 against
        # 9.1-9.2, 256 MiB 32.3 against 35.9; streaming off, 64 MiB 9.3 against 10.3)
        piece = TEE_PIECE_BYTES * window.single_copy // CMA_BYTES
        _round(s, Post("out", 0, off[-1], writes=True),
               *(Put(q, off[rank] + a, "in", a, min(piece, counts[rank] - a))
                 for a in range(0, counts[rank], piece) for q in mine_first))
        _round(s, *(Sync(p) for p in range(n) if p != rank))
        return s
    # Where ranks share cores, an allgather goes through the windows at every size: that way each rank copies
    # as much as by single-copy reads (its block in, the others' out, against the others' read and its own
    # copied) and the reads are the slower copy. 4 ranks on 2 cores, 2026-11-29, medians of 60 calls, output
    # size: 1 MiB 161-177 us against 258-264 by reads, 4 MiB 0.90 ms against 1.20, 16 MiB 3.5 against 5.4,
    # 32 MiB 7.0-8.6 against 9.6-9.7, 64 MiB 15.5 against 16.6.
    W = window.elements
    for a in range(0, most, W):
        _round(s, Copy("in", a, "win", 0, _clip(counts[rank], a, W)),
               *(Get(p, 0, "out", off[p] + a, _clip(counts[p], a, W)) for p in range(n) if reads))
    if not s.steps:
        _round(s)
    return s


@register("allgather", "segment", segment=True, alike=True)
def allgather(rank: int, nranks: int, counts: list[int], window: Window) -> Schedule:
    return _gathering(rank, nranks, counts, window, None)


@register("gather", "segment", segment=True, alike=True)
def gather(rank: int, nranks: int, counts: list[int], root: int, window: Window) -> Schedule:
    _equal(counts)
    return _gathering(rank, nranks, counts, window, root)


def _dealing(rank, n, send_counts, recv_counts, window, root):
    """alltoall, or scatter from ``root``: block q of a sender's input to rank q. Blocks have one size,
    ``most``, on every rank, so a reader finds its block at ``rank * most`` (or ``rank * per`` in a
    window) knowing only its own counts, and every rank runs the same rounds.

    Blocks move by single-copy reads of the senders' inputs from CMA_BYTES, but where ranks share cores only
    where the windows would take more than SHARED_ROUNDS rounds (a window holds a 1/n-th of a block a round):
    up to that, the windows' extra copy (every block in and out, or for a scatter every block by the root)
    costs less than the reads and their last round. 4 ranks on 2 cores (2 MiB windows: 512 KiB a block a
    round), 2026-11-29, medians of 60 calls, by reads against the windows: alltoall 1 MiB a rank 190-507 us
    against 203-231 (one round), 4 MiB 1.8 ms against 1.0 (two), 8 MiB 3.0-3.8 against 3.1-4.0 (four), 16 MiB
    4.1 against 4.2, 64 MiB 17.4 against 22.4; scatter 1 MiB 245 us against 88, 2 MiB 345-361 against 160-164,
    4 MiB 477-500 against 380-387 (two rounds), 8 MiB 635-836 against 1,218-1,279 (four), 16 MiB 1.25 ms
    against 2.64. 8 ranks: scatter 8 MiB (four rounds) 1.44 ms against 1.84, alltoall 4 MiB a rank (two)
    4.4 against 3.1."""
    s = _new(rank, n, window, n)
    most = _equal([c for c in send_counts + recv_counts if root is None or c])
    senders = range(n) if root is None else [root]
    soff, roff = offsets(send_counts), offsets(recv_counts)
    sends = root is None or rank == root
    per = window.elements // n
    if window.reads_once(most, per):     # my own block too is read after publishing: others read meanwhile
        _round(s, *((Post("in", 0, soff[-1]),) if sends else ()),
               *(Get(p, rank * most, "out", roff[p], recv_counts[p])
                 for p in sorted(senders, key=lambda p: p != rank)))
        readers = [p for p in range(n) if p != rank] if sends else []
        _round(s, *(Sync(p) for p in readers))
        return s
    for a in range(0, most, per):
        _round(s, *(Copy("in", soff[q] + a, "win", q * per, _clip(send_counts[q], a, per))
                    for q in range(n) if sends),
               *(Get(p, rank * per, "out", roff[p] + a, _clip(recv_counts[p], a, per)) for p in senders))
    if not s.steps:
        _round(s)
    return s


@register("alltoall", "segment", segment=True, equal_blocks=True, alike=True)
def alltoall(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int], window: Window) -> Schedule:
    return _dealing(rank, nranks, send_counts, recv_counts, window, None)


@register("scatter", "segment", segment=True, alike=True)
def scatter(rank: int, nranks: int, counts: list[int], root: int, window: Window) -> Schedule:
    most = _equal(counts)
    send = counts if rank == root else [0] * nranks
    recv = [0] * nranks
    recv[root] = most
    return _dealing(rank, nranks, send, recv, window, root)


@register("broadcast", "segment", segment=True, alike=True)
def broadcast(rank: int, nranks: int, count: int, root: int, window: Window) -> Schedule:
    """Through the windows up to BROADCAST_CMA_BYTES (BROADCAST_CMA_OWN_BYTES where every rank has a core
    of its own): the root copies piece k+1 in while the others copy piece k out, so two cores copy at
    once. Where every rank has a core of its own (``Window.piece``), a piece is PIECE_BYTES, not a window,
    so that this happens from 64 KiB on: at 2 ranks 1 MiB took 113-120 us against 190-209 as one window's
    piece, 256 KiB 30-32 against 41-47 (32 KiB pieces were a little faster than 64 or 128 KiB below
    1 MiB); with more ranks than cores a hand-off may cost a time slice (4 ranks on 2 cores: 256-512 KiB
    15-20% slower in 32 KiB pieces), so pieces stay whole windows there. Above, the root writes the head
    of its buffer into the others' and they read the rest, by single copies, and a last round keeps the
    root from returning before they are done: two hand-offs instead of two per piece. 2 ranks, batches
    of the two forms alternating in one job (2026-11-28, median of 10 batches): 512 KiB 36.6 us against
    39.4 through the windows, 1 MiB 61.4 against 72.2, 2 MiB 107 against 166, 256 KiB 21.8 against 17.9;
    4 ranks on 2 cores the windows win (1 MiB 98 us against 190, 2 MiB 231 against 355), and there a
    hand-off costs a time slice when the cores are shared with other work: measured on this 2-core
    machine under load, 64 MiB took 17-20 ms by single-copy reads and 66-75 ms through the windows, 8 MiB
    3.0 ms and 6.4-6.6 ms."""
    s = _new(rank, nranks, window)
    if window.copies_once(count, BROADCAST_CMA_OWN_BYTES if window.piece else BROADCAST_CMA_BYTES):
        # the root writes the head of its buffer into every other rank's (Put) while each reads the rest:
        # both sides copy at once (1/n of it the root's to each, so that it copies about as long as each)
        head = count // nranks
        if rank == root:
            _round(s, Post("out", 0, count), *(Put(p, 0, "out", 0, head) for p in range(nranks) if p != rank))
            _round(s, *(Sync(p) for p in range(nranks) if p != rank))
        else:
            _round(s, Post("out", 0, count, writes=True), Get(root, head, "out", head, count - head))
            _round(s, Sync(root))
        return s
    W = min(window.elements, window.piece or window.elements)
    for a in range(0, count, W):
        c = min(W, count - a)
        _round(s, Copy("out", a, "win", 0, c) if rank == root else Get(root, 0, "out", a, c))
    if not s.steps:
        _round(s)
    return s


@register("barrier", "segment", segment=True, alike=True)
def barrier(rank: int, nranks: int, window: Window) -> Schedule:
    """Every rank waits for every other in one round; but where ranks share cores, rank 0 waits for the
    others and then releases them (a free second round: walk.py), so that it leaves first: of two ranks
    taking turns on a core, the one running when the barrier ends is the one to leave, and an 8-byte
    broadcast or scatter from rank 0 after it waited for rank 0 to be switched in (4 ranks on 2 cores,
    `pyxccl bench`, 2026-11-29, three runs each: broadcast 11.1-12.4 us -> 1.4-1.6, scatter 12.4-13.4 ->
    1.5-2.0; and with the native executor's yield to an earlier core-mate, reduce 11.6 -> 2.7-3.6, gather
    11.3 -> 2.9-3.3).
    Where every rank has a core, one round: there the release is only a hop more."""
    s = _new(rank, nranks, window)
    if window.piece or nranks == 1:
        _round(s, *(Sync(p) for p in range(nranks)))
        return s
    _round(s, *(Sync(p) for p in range(1, nranks) if rank == 0))
    _round(s, *((Sync(0),) if rank else ()))
    return s
