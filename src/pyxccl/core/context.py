"""The context of a communicator: everything below the public API.

A ``Communicator`` (comm.py) checks a call's arguments and describes it; its
``Context`` runs it: the ranks in the mesh and the links between them, the
sequence numbers, the failure state, the ordered engine, the one-host
segment, the tuner and the plans. The mesh reaches a context through two
methods, ``peer_lost`` and ``failed``; nothing here reads the Communicator.

Failure: a collective that fails (timeout, lost peer, mismatch) leaves the
ranks out of step, so it aborts the communicator: what is in flight fails,
later calls are refused, and the other ranks are told (an ``ABORT`` message
with the reason) so that they fail within milliseconds instead of at their
deadlines. A lost peer needs no telling: every rank sees its connection end.
"""
from __future__ import annotations

import hashlib
import re
import threading
import time
import zlib

import numpy as np

from .._errors import (CollectiveMismatchError, CommAbortedError, CommClosedError, CommError, CommTimeoutError,
                       InvalidArgumentError, PeerLostError, ProtocolError)
from ..algorithms import registry
from ..dtypes import DTYPE_CODE
from ..primitives import describe_words, differences
from ..ranks import ranges
from ..transport.mailbox import (ABORT, ABORT_CALLED, ABORT_MISMATCH, ABORT_TIMEOUT, PROGRESS, PROGRESS_REPLY,
                                 RecvRequest, newer)
from .engine import Engine, InlineCall, Work, annotate
from .dispatch import Planner
from . import recorder
from .onehost import _native
from .prepared import RECENT_CALLS, Prepared, PreparedCalls
from .recorder import Recorder, ended, started
from .counters import Traffic

_BLAME_SECONDS = 2.0     # a timed-out rank's wait for the others' progress (oversubscribed ranks answer late)


class _Here(threading.local):
    """A context's per-thread state: ``me`` None until the thread's first call (a class default:
    reading it is an attribute load, not a getattr() call; this is on every call)."""
    me = None


class Context(_native.Books if _native is not None else object):
    """One communicator's state below the API (comm.py's Communicator holds one). Its base, where the C
    executor is built, is ``_native.Books``: the fields every call reads and writes (``seq``, ``coll_seq``,
    ``closed``, ``error``, ``segment``, ``recent``, ``recent_calls``) as C members that a prepared call's C
    part reads and writes directly; elsewhere they are ordinary attributes."""

    def __init__(self, mesh, world_ranks: list[int], comm_id: int, timeout: float, parent: "Context | None" = None):
        self.mesh, self.mailbox = mesh, mesh.mailbox
        self.world_ranks = list(world_ranks)
        self._to_comm = {w: i for i, w in enumerate(self.world_ranks)}
        self.id = comm_id
        self.rank, self.size = self._to_comm[mesh.rank], len(self.world_ranks)
        self.timeout = timeout
        host_index = {h: i for i, h in enumerate(dict.fromkeys(mesh.hosts[w] for w in self.world_ranks))}
        self.hosts = [host_index[mesh.hosts[w]] for w in self.world_ranks]    # host index of every rank
        from ..tuning.cost import HostLinks
        # the mesh's rule (kind_between): shared memory inside a host unless the job runs over TCP
        self.links = HostLinks(self.hosts, "shm" if mesh.transport != "tcp" else "tcp_local")
        self.seq = 0              # every call
        self.coll_seq = 0         # collectives (their messages' key)
        self.closed = False
        self.error: BaseException | None = None
        self.splits = 0           # split() calls made (each child's id depends on it)
        self.prepared = PreparedCalls()   # calls made before, by key (core/prepared.py)
        self.thread_check = True  # fingerprints name the issuing thread
        self.setting_up = False   # comm._ready runs the set-up's calls (dispatch.SETUP's algorithms)
        self._here = _Here()      # .me: (this thread, its name, its name in fingerprints, digest)
        self.segment = None       # the one-host fast path's HostSegment (onehost.attach_segment)
        self.tuner = None
        self.parent, self.children = parent, []
        self.plans = Planner(self)
        self.plans.forced = {p: registry.canonical(n) for p, n in self.plans.forced.items()}   # PYXCCL_ALGO=...=shm
        self.engine = Engine(f"pyxccl-comm{comm_id:08x}-r{self.rank}")
        self._lock = threading.Lock()
        self._inflight: set[RecvRequest] = set()
        # the last few collectives, for naming them in mismatch errors: at cseq % RECENT_CALLS, cseq and (plan,
        # call, size, thread, words)); a prepared call writes its slot (one store: this is on every call)
        self.recent: list = [None] * RECENT_CALLS
        self.recent_calls: list = [None] * RECENT_CALLS
        self._scratch = np.empty(0, np.uint8)
        self._telling: threading.Thread | None = None
        self.recorder = Recorder()  # the flight recorder: the last operations, dumped on failure
        self.traffic = Traffic()    # what moved, per operation (comm.traffic())
        self.label = None           # what the user calls it (pyxccl.parallel: "tp", "dp", ...), for the timeline
        self._links: dict[int, str] = {}    # rank -> link class, for the wire counters
        self.compressors: dict = {}         # spec string -> the compressor it names here (compression/collectives.py)
        recorder.register(self)
        mesh.attach(comm_id, self)
        self.mailbox.calls(comm_id, lambda peer, seq, words: self.mismatch(self.to_comm(peer), seq, words))
        if parent is not None:
            parent.children.append(self)

    # --- ranks and links -------------------------------------------------------------
    def peer(self, r: int):
        return self.mesh.peer(self.world_ranks[r])

    def to_comm(self, world_rank: int) -> int:
        return self._to_comm.get(world_rank, world_rank)

    def link_class(self, a: int, b: int) -> str:
        """Link class between ranks ``a`` and ``b``: "self", "shm", "tcp_local" (one host) or "tcp"."""
        return self.links(a, b)

    def link_to(self, r: int) -> str:
        """:meth:`link_class` from this rank to ``r`` (kept: every send asks)."""
        c = self._links.get(r)
        if c is None:
            c = self._links[r] = self.link_class(self.rank, r)
        return c

    def use_segment(self, seg) -> None:
        """The one-host fast path from now on: its algorithms become candidates."""
        self.segment = seg
        self.replan()

    def replan(self) -> None:
        """Choose anew (the segment, the tuner or the link figures changed): new plans, and no prepared
        call keeps running an old one."""
        self.plans = Planner(self, self.plans.forced)
        self.prepared.clear()

    def make_tuner(self) -> None:
        """The tuner, where there are link figures and peers; either way the set-up's plans, and
        choices made before the tuner, are dropped."""
        from ..tuning import Tuner
        if self.mesh.machine is not None and self.size >= 2:
            seg = self.segment
            self.tuner = Tuner(self.size, self.hosts, self.links, self.mesh.machine,
                               [self.mesh.cores[w] for w in self.world_ranks],
                               segment=(seg.area, seg.cma, seg.pipelined) if seg is not None else None,
                               links=self.mesh.transport)
        self.replan()

    def scratch(self, count: int, dt: np.dtype) -> np.ndarray:
        nbytes = count * dt.itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes].view(dt)

    # --- failure ------------------------------------------------------------------------
    def track(self, req: RecvRequest) -> None:
        with self._lock:
            self._inflight.add(req)
            failed = self.error
        if failed is not None:
            req.fail(failed)

    def untrack(self, req: RecvRequest) -> None:
        with self._lock:
            self._inflight.discard(req)

    def abort(self, err: BaseException, tell: bool = True, dump: bool = True) -> None:
        """Fail what is in flight and refuse later calls; with ``tell``, the first failure is sent to
        the other ranks (a lost peer is not: every rank sees its connection end); with ``dump``, the
        flight recorder is written (``PYXCCL_DUMP_DIR``)."""
        with self._lock:
            first = self.error is None and not self.closed
            if first:
                self.error = err
            reqs = list(self._inflight)
        for r in reqs:
            r.fail(err)
        if first:
            self.mailbox.fail_posted(self.id, err)      # point-to-point receives too
        for c in list(self.children):
            c.abort(err, tell=False, dump=False)
        if first and dump:
            recorder.dump(f"rank {self.rank} of communicator {self.id:08x}: {err}")
        if first and tell and not isinstance(err, PeerLostError) and self.size > 1:
            t = threading.Thread(target=self._tell, args=(err,), daemon=True, name=f"pyxccl-abort-{self.rank}")
            t.start()
            self._telling = t

    def _tell(self, err: BaseException) -> None:
        payload = np.frombuffer(str(err).encode()[:60000], np.uint8)
        code = ABORT_MISMATCH if isinstance(err, CollectiveMismatchError) else \
            ABORT_CALLED if isinstance(err, CommAbortedError) and err.cause is None else \
            ABORT_TIMEOUT if isinstance(err, CommTimeoutError) else 0
        # a timeout's blamed rank (a world rank, plus one) rides in the key: the others blame it too
        blamed = self.world_ranks[err.peer] + 1 if code == ABORT_TIMEOUT and err.peer is not None else 0
        for p in range(self.size):
            if p != self.rank:
                try:
                    self.peer(p).send((self.id, ABORT, blamed), code, payload, time.monotonic() + 2.0)
                except (CommError, OSError):
                    pass          # that peer is gone or stuck: it learns otherwise

    def blame(self, err: CommTimeoutError, cseq: int, op: str) -> CommTimeoutError:
        """The timeout of collective ``cseq`` naming the ranks that never entered it, not the neighbour
        this rank waited for (which may itself wait for them): every peer is asked how far it got."""
        asked = {}
        for p in range(self.size):
            if p != self.rank:
                got = np.zeros(2, np.int64)
                req = RecvRequest(self.world_ranks[p], (self.id, PROGRESS_REPLY, cseq), got, None, op)
                self.mailbox.post(req)
                asked[p] = (req, got)
        end = time.monotonic() + _BLAME_SECONDS
        for p in asked:
            self._quiet_send(p, (self.id, PROGRESS, cseq), np.empty(0, np.uint8), end)
        behind = []
        for p, (req, got) in asked.items():
            if req.event.wait(max(0.0, end - time.monotonic())) and req.error is None:
                if newer(cseq, int(got[0])):
                    behind.append((p, int(got[0]), int(got[1])))
            else:
                self.mailbox.cancel(req)
        if not behind:
            return err
        first, issued, done = behind[0]
        them = ranges(p for p, _, _ in behind)
        via = "" if err.peer == first else f" (it waited for rank {err.peer}, which waits in turn)"
        return CommTimeoutError(
            f"rank {self.rank}: {op} #{cseq} timed out: {them} never entered it (rank {first}: last call "
            f"#{issued}, last completed #{done}){via}; check what {them} is doing (its output; SIGUSR1 with "
            f"PYXCCL_DUMP_DIR set dumps its calls), or raise the deadline with timeout= or PYXCCL_TIMEOUT",
            rank=self.rank, peer=first, op=op, seq=cseq)

    def progress_asked(self, world_peer: int, cseq: int) -> None:
        """A peer's collective ``cseq`` timed out: tell it how far this rank got (from another thread:
        this is the receiver's)."""
        got = np.array([self.coll_seq, self.recorder.last_done()], np.int64).view(np.uint8)
        threading.Thread(target=self._quiet_send, daemon=True, name=f"pyxccl-progress-{self.rank}",
                         args=(self.to_comm(world_peer), (self.id, PROGRESS_REPLY, cseq), got,
                               time.monotonic() + _BLAME_SECONDS)).start()

    def _quiet_send(self, p: int, key, payload, deadline: float) -> None:
        try:
            self.peer(p).send(key, 0, payload, deadline)
        except (CommError, OSError):
            pass          # that peer is gone or stuck: it is named otherwise

    def peer_lost(self, world_rank: int, err: BaseException) -> None:
        """The mesh's news: a process this communicator may contain is gone."""
        if world_rank in self._to_comm:
            self.abort(err, tell=False)

    def failed(self, err: BaseException, remote: bool) -> None:
        """The mesh's news: an error in one of this communicator's calls, found by this rank's
        progress thread (then the others are told) or by another rank (``remote``)."""
        if remote and isinstance(err, CommTimeoutError) and err.peer is not None:
            err.peer = self.to_comm(err.peer)       # the mailbox names world ranks
        self.abort(err, tell=not remote)

    def failure(self, err: CommError, op: str, seq: int, cseq: int, entry: list) -> CommError:
        """The error call ``seq`` (collective ``cseq``, 0 for point to point) raises after failing with
        ``err``, recorded in its flight-recorder ``entry``: after a lost peer, the first rank lost
        (not one that left after it); a collective's timeout names the rank another rank blamed
        first (its ABORT came), else the ones this rank finds (``blame``)."""
        if getattr(err, "abandoned", False):
            # a rank freed a buffer others still read: it left the call, most likely because a peer
            # was lost, which this rank learns within moments; that loss is the error to report
            end = time.monotonic() + _BLAME_SECONDS
            while not isinstance(self.error, PeerLostError) and time.monotonic() < end:
                time.sleep(0.005)
        if isinstance(self.error, PeerLostError) and (isinstance(err, (PeerLostError, CommAbortedError))
                                                      or getattr(err, "abandoned", False)):
            err = self.error
        err = annotate(err, op, cseq or seq, self.rank)
        if cseq and isinstance(err, CommTimeoutError):
            err = self.error if isinstance(self.error, CommTimeoutError) else self.blame(err, cseq, op)
        ended(entry, err)
        return err

    def check_alive(self, p: int, seq: int) -> None:
        """Raise if this communicator failed or rank ``p`` is lost, or if a peer sent a message for
        collective ``seq``, which this rank runs on the segment (the peer runs another algorithm):
        the segment's waits ask."""
        if self.error is not None:
            raise self.error
        lost = self.mailbox.lost(self.world_ranks[p])
        if lost is not None:
            raise lost
        stray = self.mailbox.stray(self.id, seq)
        if stray is not None:
            raise self.mismatch(self.to_comm(stray[0]), seq, stray[1])

    def usable(self, op: str) -> None:
        if self.closed:
            raise CommClosedError(f"rank {self.rank}: {op} called on a closed communicator; "
                                  f"make a new one with pyxccl.init()", rank=self.rank, op=op)
        cause = self.error
        if cause is not None:
            msg = (f"rank {self.rank}: {op} refused: this communicator failed earlier ({cause}); "
                   f"close it and make a new one")
            if isinstance(cause, (PeerLostError, ProtocolError)):   # keep the root cause's type: callers catch it
                raise type(cause)(msg, rank=self.rank, peer=cause.peer, op=op)
            raise CommAbortedError(msg, cause=cause, rank=self.rank, peer=cause.peer, op=op)

    def mismatch(self, peer: int, seq: int, theirs, their_seq: int | None = None) -> CollectiveMismatchError:
        """The error for this rank's collective ``seq`` against ``peer``'s fingerprint words ``theirs``."""
        their_seq = seq if their_seq is None else their_seq
        i = seq % RECENT_CALLS
        at, record = self.recent[i], self.recent_calls[i]
        plan, name, size, thread, words = record if at == seq else (None,) * 5
        call = plan.call(name, size, thread) if plan else None
        mine = call.describe(seq) if call else f"collective #{seq}"
        if theirs is None:
            other, why = "message, which carries no collective's fingerprint", ""
        else:
            other = describe_words(their_seq, *theirs, registry.algorithm_name)
            diff = differences((seq, *words), (their_seq, *theirs)) if words else []
            why = f" (they differ in {', '.join(diff)})" if diff else ""
            if diff == ["thread"]:
                why += (": the ranks paired calls that threads of different names issued; issue one "
                        "communicator's calls from one thread at a time, or give each thread its own "
                        "communicator (comm.dup()); threads that are ranks of one process need one name "
                        "(or comm.thread_check = False)")
        return CollectiveMismatchError(
            f"rank {self.rank}: {mine} does not match rank {peer}'s {other}{why}; every rank must make the same "
            f"collective calls in the same order: this communicator is aborted",
            rank=self.rank, peer=peer, op=call.name if call else None, seq=seq)

    # --- running calls ----------------------------------------------------------------
    def submit(self, op: str, fn, *, async_op: bool, timeout, what: tuple, peer=None):
        """Run point-to-point operation ``fn(work, seq, deadline)`` in issue order, inline or on the
        worker; return its result, or a Work with ``async_op`` (collectives: core/prepared.py).
        ``what`` = (op, dtype, count, bytes, algorithm) and ``peer`` go to the flight recorder."""
        eng = self.engine
        algorithm = what[4]
        with eng.lock:
            self.usable(op)
            self.seq += 1
            seq = self.seq
            deadline = time.monotonic() + (self.timeout if timeout is None else float(timeout))
            entry = self.recorder.issue(seq, 0, what, peer)

            def guarded(w):
                started(entry)
                try:
                    self.usable(op)
                    out = fn(w, seq, deadline)
                except CommError as e:
                    e = self.failure(e, op, seq, 0, entry)
                    if isinstance(e, (ProtocolError, CommAbortedError)) \
                            or (isinstance(e, PeerLostError) and not self.mesh.graceful(e.peer)):
                        self.abort(e)   # the stream is out of step
                    raise e from None
                except BaseException as e:
                    ended(entry, e)
                    raise
                if not w._recvs:
                    ended(entry)
                return out
            inline = not async_op and eng.claim()
            if not inline:
                work = Work(op, seq, self.rank, deadline, algorithm)
                work._from_world, work._entry = self.to_comm, entry
                eng.enqueue(guarded, work)
        if inline:
            call = InlineCall(seq)
            try:
                out = guarded(call)
            finally:
                eng.release()
            if call._recvs:             # a recv posted its request: wait for it as a Work would
                work = Work(op, seq, self.rank, deadline)
                work._recvs, work._cancel, work._from_world = call._recvs, call._cancel, self.to_comm
                work._ran.set()
                try:
                    work.wait()
                except BaseException as e:
                    ended(entry, e)
                    raise
                ended(entry)
            return out
        if async_op:
            return work
        return work.result()

    def prepare(self, name: str, plan, args: dict, size, inp, out, *, timeout, writes: bool = True,
                allocates: int | None = None, keep=None) -> Prepared:
        """Call ``name`` of ``plan`` decided (builder arguments ``args``; ``size``: what its fingerprint
        says of the counts; ``inp``, ``out``: its arrays, None where it has none; ``writes``: it writes
        ``out``; ``allocates``: the elements of an output a repeat allocates), kept under ``keep`` (the
        call's key, core/prepared.py) when it can run again."""
        skey = tuple(args.values())         # hashable: counts lists become tuples
        if "count" not in args:
            skey = tuple(v if type(v) is int else tuple(v) for v in skey)
        try:
            s = plan.schedule(skey, args)
        except ValueError as e:
            raise InvalidArgumentError(f"rank {self.rank}: {name}: algorithm {plan.algo.name!r} cannot run this "
                                       f"call: {e}", rank=self.rank, op=name) from None
        thread, number = self.thread() if self.thread_check else ("", 0)
        nbytes = max((b.nbytes for b in (inp, out) if b is not None), default=0)
        what = (name, plan.dtype.name, nbytes // plan.dtype.itemsize, nbytes, plan.algo.name)
        p = Prepared(self, plan, name, s, size, thread, number, plan.words(name, skey, size, number), timeout, what,
                     args=args, writes=writes, allocates=allocates)
        if keep is not None and self.error is None and not self.closed:
            self.prepared.keep(keep, p)
        return p

    def thread_word(self) -> int:
        """The calling thread's digest in fingerprints (0 when they do not name threads)."""
        if not self.thread_check:
            return 0
        me = self._here.me          # a thread-local: on every call, so no current_thread()
        # Thread._name, what the .name property returns, without the property's Python call
        return me[3] if me is not None and me[0]._name == me[1] else self.thread()[1]

    def thread(self) -> tuple[str, int]:
        """The calling thread as fingerprints name it, and its 16-bit digest: its name, the workers of
        one thread pool counted as one ("pool_3" -> "pool"). The name is the one identity a thread has
        on every rank: threads numbered by first use would be numbered by whichever won a race."""
        me = self._here.me
        if me is None or me[0].name != me[1]:       # first call of this thread, or it was renamed
            t = threading.current_thread()
            tag = re.sub(r"_\d+$", "", t.name)
            me = self._here.me = (t, t.name, repr(tag), zlib.crc32(tag.encode()) & 0xFFFF or 1)
        return me[2], me[3]

    def send(self, name: str, buf: np.ndarray, dst: int, tag: int, *, async_op: bool, timeout):
        key, dcode = (self.id, tag, 0), DTYPE_CODE[buf.dtype]

        def fn(work, seq, deadline):
            self.traffic.add(name, buf.nbytes, buf.nbytes, 0)
            self.traffic.wire(name, self.link_to(dst), buf.nbytes)
            self.peer(dst).send(key, dcode, buf.view(np.uint8), deadline)
        return self.submit(name, fn, async_op=async_op, timeout=timeout,
                           what=(name, buf.dtype.name, buf.size, buf.nbytes, None), peer=dst)

    def recv(self, name: str, buf: np.ndarray, src: int | None, tag: int, result, *, async_op: bool, timeout):
        def fn(work, seq, deadline):
            peer = None if src is None else self.world_ranks[src]
            self.traffic.add(name, buf.nbytes, 0, buf.nbytes)
            req = RecvRequest(peer, (self.id, tag, 0), buf, None, name)
            work._recvs.append(req)
            work._cancel = self.mailbox.cancel
            self.mailbox.post(req)
            return result
        return self.submit(name, fn, async_op=async_op, timeout=timeout,
                           what=(name, buf.dtype.name, buf.size, buf.nbytes, None), peer=src)

    # --- sub-communicators and teardown ----------------------------------------------------
    def split(self, color: int | None, members: list[tuple[int, int]]) -> "Context | None":
        """The context of this rank's part of a split (``members``: (key, rank) of the part, in order),
        or None for ``color`` None. Every rank of this communicator calls it, after agreeing on parts."""
        self.splits += 1
        if color is None:
            return None
        digest = hashlib.blake2b(f"{self.id}/{self.splits}/{color}".encode(), digest_size=4).digest()
        return Context(self.mesh, [self.world_ranks[r] for _, r in members], int.from_bytes(digest, "little"),
                       self.timeout, parent=self)

    def close(self) -> None:
        """Release this context and those split from it; the world's also closes the mesh and the store."""
        if self.closed:
            return
        for child in list(self.children):
            child.close()
        self.closed = True
        self.compressors.clear()                # their residuals can be large
        recorder.unregister(self)
        self.engine.stop()
        recorder.closed(self)                   # the tools' hooks (PYXCCL_TRACE's timeline keeps its calls)
        if self._telling is not None:
            self._telling.join(timeout=3)
        if self.segment is not None:
            self.segment.close()
            self.segment = None     # unmapped once no call in flight, nor a prepared call's C path, holds it
        self.mesh.detach(self.id)
        if self.parent is not None and self in self.parent.children:
            self.parent.children.remove(self)
        if self.parent is None:
            self.mesh.close()       # the store stays: it is the process's, for later inits (pyxccl.init)
