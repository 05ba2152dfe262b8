"""pyxccl as a torch.distributed backend: ``import pyxccl.torch`` registers "pyxccl" for CPU.

>>> import torch.distributed as dist, pyxccl.torch                    # doctest: +SKIP
>>> dist.init_process_group("pyxccl")                  # under torchrun or pyxccl run
>>> dist.init_process_group("cpu:pyxccl,cuda:nccl")    # per-device mapping

Each torch process group becomes a pyxccl communicator (rendezvous through
torch's own store); every call runs on the communicator's ordered worker and
returns a torch Work built on a torch Future, so ``wait()``, ``is_completed()``
and ``get_future().then(...)`` behave as torch's do, and pyxccl's errors
(PeerLostError, CommTimeoutError, ...) surface from ``wait()``.

Where Gloo and this backend could differ, they don't (the tests run both): the group is its own
CPU backend (``group._get_backend(torch.device("cpu"))``), the group's timeout
(``init_process_group(timeout=)``, ``new_group(timeout=)``, ``group.set_timeout()``) and
``dist.barrier(timeout=)`` bound every wait, sparse COO tensors are summed by ``all_reduce``.
"""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import _create_work_from_future

import pyxccl
from pyxccl._errors import NotSupportedError, TensorArgumentError
from pyxccl.ops import ReduceOp
from pyxccl.rendezvous.torch_store import TorchStore

from ._persist import SLOTS, RequestCache
from ._sparse import check_sparse_allreduce, refuse_layouts, sparse_allreduce
from ._work import FailedWork, PyxcclWork

__all__ = ["ProcessGroupPyxccl"]

INLINE_BYTES = 256 << 10

_OPS = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.PRODUCT: ReduceOp.PROD, dist.ReduceOp.MIN: ReduceOp.MIN,
        dist.ReduceOp.MAX: ReduceOp.MAX, dist.ReduceOp.AVG: ReduceOp.AVG, dist.ReduceOp.BAND: ReduceOp.BAND,
        dist.ReduceOp.BOR: ReduceOp.BOR, dist.ReduceOp.BXOR: ReduceOp.BXOR}


def _op(torch_op):
    """pyxccl's op for torch's, and the factor every input is multiplied by first (None but for
    PREMUL_SUM, NCCL's op that torch makes with ``_make_nccl_premul_sum(factor)``: a SUM of scaled
    inputs, which saves DDP/FSDP a division pass)."""
    if getattr(torch_op, "op", None) == dist.ReduceOp.RedOpType.PREMUL_SUM:
        return ReduceOp.SUM, torch_op.factor
    for k, v in _OPS.items():
        if torch_op == k:
            return v, None
    raise pyxccl.UnsupportedOpError(f"pyxccl backend: reduce op {torch_op} is not supported; use SUM, PRODUCT, "
                                    f"MIN, MAX, AVG, BAND, BOR, BXOR or PREMUL_SUM")


def _scaled(t, factor):
    return t if factor is None else t * factor


def _issued(fn):
    """An operation of the group: counted (torch's sequence number for the group, which Gloo counts
    the same way) and refused if a tensor in it is not strided (only all_reduce takes sparse ones)."""
    name = fn.__name__

    @functools.wraps(fn)
    def op(self, *args, **kwargs):
        self._seq += 1
        if name != "allreduce":
            refuse_layouts(self.rank(), name, args)
        return fn(self, *args, **kwargs)
    return op


def _check(ok: bool, rank: int, op: str, what: str) -> None:
    if not ok:
        raise TensorArgumentError(f"rank {rank}: {op}: {what}", rank=rank, op=op)


def _unpack(flat, outputs) -> None:
    """Copy consecutive pieces of the flat tensor ``flat`` into the tensors ``outputs``, in order."""
    off = 0
    for o in outputs:
        o.copy_(flat[off:off + o.numel()].view_as(o))
        off += o.numel()


class ProcessGroupPyxccl(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives run on a pyxccl Communicator.

    It is also its own CPU backend: torch registers C++ backends on the groups it makes, and a
    Python group has none, so ``_get_backend(torch.device("cpu"))`` returns the group itself, with
    the attributes torch reads on a backend (``options``, ``supports_*``, sequence numbers).
    """

    # what torch asks a backend before using a feature; Gloo's answers on the CPU, but splitting
    # (torch's split_group wants an accelerator backend that splits communicators)
    supports_splitting = supports_coalescing = supports_time_estimate = supports_shrinking = False

    def __init__(self, store, rank: int, size: int, timeout, *, group_name: str = "", global_ranks=()):
        super().__init__(rank, size)
        secs = timeout.total_seconds() if timeout is not None else None
        secs = secs if secs and secs > 0 else None      # torch's timedelta(0) (kNoTimeout): the default
        self.comm = pyxccl.init(rank, size, store=TorchStore(store, secs or 300.0), timeout=secs)
        self.comm.thread_check = False   # torch orders a group's calls itself, across hooks and callbacks
        # what torch keeps on a C++ backend: the group's timeout, name and global ranks
        self.options = _C10dBackend.Options("pyxccl", timeout) if timeout is not None else \
            _C10dBackend.Options("pyxccl")
        self.options.group_name, self.options.global_ranks_in_group = group_name, list(global_ranks)
        self._name = group_name
        self._timeout = None             # seconds set by set_timeout(); None: the communicator's (the group's)
        self._seq = 0
        # torch runs a Future's then() callbacks on the thread that completes it, and a callback
        # may wait for a later collective (PowerSGD's hook does). Completing futures on the
        # communicator's worker, or on one thread, would deadlock that: a small pool does it.
        self._completer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pyxccl-torch-completer")
        # calls that repeat on one tensor (DDP's buckets, a pipeline's buffers) run as persistent
        # requests from their second sighting (_persist.py has the rules; slots=0 turns it off)
        self.persistent = RequestCache(SLOTS)

    def getBackendName(self) -> str:
        return "pyxccl"

    def _get_backend_name(self) -> str:
        return "pyxccl"

    # torch keeps a group's name on its C++ backends, and a Python ProcessGroup has none: keep it here
    # (DeviceMesh, FSDP and the functional collectives look groups up by name).
    def _set_group_name(self, name) -> None:
        self._name = name
        self.options.group_name = name

    @property
    def group_name(self):
        return self._name

    # --- the group as its own backend ----------------------------------------------------
    @property
    def _device_types(self):
        """The devices with a backend (torch's object collectives, barrier and DCP read this)."""
        return [torch.device("cpu")]

    def _get_backend(self, device):
        """The backend of ``device``: this group for the CPU, as Gloo's group returns its ProcessGroupGloo."""
        device = torch.device(device)
        if device.type != "cpu":
            raise NotSupportedError(f"rank {self.rank()}: No backend type associated with device type {device.type} "
                                    f"in group {self._name!r}: pyxccl runs on the CPU; map {device.type} to "
                                    f"another backend (init_process_group('cpu:pyxccl,{device.type}:nccl'))",
                                    rank=self.rank(), op="_get_backend")
        return self

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def set_timeout(self, timeout) -> None:
        """The deadline of every later call of this group (Gloo's ``ProcessGroup.set_timeout``)."""
        self._timeout = timeout.total_seconds() or None      # timedelta(0): the default, as torch's
        self.options._timeout = timeout

    def _set_sequence_number_for_group(self) -> None:
        self._seq = 0

    def _get_sequence_number_for_group(self) -> int:
        """Operations issued on this group so far (collectives and point to point, as Gloo counts)."""
        return self._seq

    def _secs(self, opts):
        """The call's deadline: its options' timeout if set (dist.barrier(timeout=) sets it), else
        set_timeout's, else None (the communicator's: the group's timeout)."""
        t = getattr(opts, "timeout", None)
        if t is not None:
            secs = t.total_seconds()
            if secs > 0:        # torch's unset timeout is -1 ms
                return secs
        return self._timeout

    # --- Work plumbing ----------------------------------------------------------------
    def _work(self, works, value):
        """A torch Work completing when the last pyxccl Work does (they run in order)."""
        fut = torch.futures.Future()
        last = works[-1] if works else None
        if last is None:
            fut.set_result(value)
            return _create_work_from_future(fut)

        work = PyxcclWork(works, value, fut)

        def done(_w):
            work.unpacked.set()
            self._complete(work.settle)
        last.add_done_callback(done)
        return work

    def _complete(self, fn, *args) -> None:
        """``fn(*args)`` (settling a torch Future) on the completer pool; after shutdown (a call that
        finishes once its group was destroyed: one that timed out at rank 0, its peer never entering)
        here, so its Future is still set rather than the callback raising "cannot schedule"."""
        try:
            self._completer.submit(fn, *args)
        except RuntimeError:
            fn(*args)

    def _each(self, fn, tensors, value=None):
        return self._work([fn(t) for t in tensors], tensors if value is None else value)

    def _call(self, op, nbytes: int, value):
        """``op(async_op)`` as a torch Work. A small call runs right here when nothing is queued
        (no thread switch: about 20 us instead of hundreds), a large one on the worker, so that
        it overlaps with whatever the caller does next (DDP's backward pass). Bad arguments raise
        here, as they do on the worker's path; a call that failed after it started (timeout, lost
        peer) raises from ``wait()``, as Gloo's do."""
        if nbytes > INLINE_BYTES:
            return self._work([op(True)], value)
        try:
            op(False)
        except pyxccl.CommError as e:
            return FailedWork(e)
        fut = torch.futures.Future()
        fut.set_result(value)
        return _create_work_from_future(fut)

    def _request(self, key, t, make):
        """The persistent request for a call ``key`` on the CPU tensor ``t`` (``make(alias)``: its
        ``*_init`` on a detached alias of ``t``, so the request holds the storage, not the user's
        tensor object), or None for a plain call."""
        if type(t) is not torch.Tensor or not t.is_cpu or not t.is_contiguous() or self.persistent.slots <= 0:
            return None            # a subclass, another device, strided: the plain call says what it does
        return self.persistent.get((key, t.data_ptr(), t.numel(), t.dtype), t, lambda: make(t.detach()))

    @staticmethod
    def _started(req, plain):
        """``op(async_op)`` for ``_call`` that starts ``req`` (``run()`` inline), or makes the plain call
        ``plain(async_op)`` if ``req`` cannot start now (started by another thread since the cache
        gave it out, or freed by the group's shutdown)."""
        def op(a):
            if req.active or req.freed:
                return plain(a)
            return req.start() if a else req.run()
        return op

    def _gathered(self, op, outs, like, what):
        """Gloo's checks of a list of outputs (or inputs) of one shape per rank."""
        r = self.rank()
        _check(len(outs) == self.size(), r, op, f"{what} has {len(outs)} tensors, expected {self.size()} "
                                                f"(one per rank of the group)")
        for i, o in enumerate(outs):
            _check(o.shape == like.shape and o.dtype == like.dtype, r, op,
                   f"{what}[{i}] is {o.dtype} {tuple(o.shape)}, expected {like.dtype} {tuple(like.shape)}")

    # --- collectives ---------------------------------------------------------------------
    @_issued
    def allreduce(self, tensors, opts=None):
        op, factor = _op(opts.reduceOp) if opts is not None else (ReduceOp.SUM, None)
        secs = self._secs(opts)
        if check_sparse_allreduce(self.rank(), tensors, op is ReduceOp.SUM and factor is None):
            return self._sparse_allreduce(tensors, secs)
        if factor is not None:        # the result replaces the input: scale it in place
            for t in tensors:
                t.mul_(factor)
        if len(tensors) == 1:
            t = tensors[0]

            def plain(a):
                return self.comm.allreduce(t, op, async_op=a, timeout=secs)
            req = self._request(("allreduce", op, secs), t, lambda x: self.comm.allreduce_init(x, op, timeout=secs))
            return self._call(plain if req is None else self._started(req, plain), t.nbytes, tensors)
        return self._each(lambda t: self.comm.allreduce(t, op, async_op=True, timeout=secs), tensors)

    def _sparse_allreduce(self, tensors, secs):
        """Gloo's sparse all_reduce, here (three small allgathers); an error after the call started
        (shapes that differ between ranks, a timeout) raises from ``wait()``, as Gloo's does."""
        try:
            out = sparse_allreduce(self.comm, tensors, secs)
            for t in tensors:
                t.copy_(out)
        except Exception as e:  # noqa: BLE001
            return FailedWork(e)
        fut = torch.futures.Future()
        fut.set_result(tensors)
        return _create_work_from_future(fut)

    def allreduce_coalesced(self, tensors, opts=None):
        refuse_layouts(self.rank(), "allreduce_coalesced", tensors)    # sparse: Gloo refuses it here too
        return self.allreduce(tensors, opts)

    @_issued
    def broadcast(self, tensors, opts):
        secs = self._secs(opts)
        if len(tensors) == 1:
            t, root = tensors[0], opts.rootRank

            def plain(a):
                return self.comm.broadcast(t, root, async_op=a, timeout=secs)
            req = self._request(("broadcast", root, secs), t, lambda x: self.comm.broadcast_init(x, root, timeout=secs))
            return self._call(plain if req is None else self._started(req, plain), t.nbytes, tensors)
        return self._each(lambda t: self.comm.broadcast(t, opts.rootRank, async_op=True, timeout=secs), tensors)

    @_issued
    def reduce(self, tensors, opts):
        (op, factor), secs = _op(opts.reduceOp), self._secs(opts)
        if factor is None:
            return self._each(lambda t: self.comm.reduce(t, opts.rootRank, op, async_op=True, timeout=secs), tensors)
        works = []         # the inputs of non-roots stay as they were: reduce scaled copies
        for t in tensors:
            tmp = t * factor
            works.append(self.comm.reduce(tmp, opts.rootRank, op, async_op=True, timeout=secs))
            if self.rank() == opts.rootRank:
                works[-1].add_done_callback(lambda _w, t=t, tmp=tmp: t.copy_(tmp))
        return self._work(works, tensors)

    @_issued
    def allgather(self, output_lists, inputs, opts=None):
        works, secs = [], self._secs(opts)
        for outs, t in zip(output_lists, inputs):
            self._gathered("allgather", outs, t, "output list")
            buf = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype)
            w = self.comm.allgather(t.contiguous(), buf, async_op=True, timeout=secs)
            works.append(w)
            w.add_done_callback(lambda _w, outs=outs, buf=buf: [o.copy_(b) for o, b in zip(outs, buf)])
        return self._work(works, output_lists)

    @_issued
    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """``dist.all_gather_coalesced``: every rank's ``inputs``, flattened into one allgather;
        ``output_lists[r]`` gets rank r's tensors."""
        r, n = self.rank(), self.size()
        _check(len(output_lists) == n, r, "allgather_coalesced",
               f"{len(output_lists)} output lists, expected {n} (one per rank of the group)")
        for outs in output_lists:
            _check(len(outs) == len(inputs), r, "allgather_coalesced",
                   f"an output list has {len(outs)} tensors, expected {len(inputs)} (one per input)")
            for o, t in zip(outs, inputs):
                _check(o.shape == t.shape and o.dtype == t.dtype, r, "allgather_coalesced",
                       f"output {o.dtype} {tuple(o.shape)} for input {t.dtype} {tuple(t.shape)}")
        send = torch.cat([t.reshape(-1) for t in inputs])
        buf = torch.empty((n, send.numel()), dtype=send.dtype)
        w = self.comm.allgather(send, buf, async_op=True, timeout=self._secs(opts))

        def unpack(_w):
            for row, outs in zip(buf, output_lists):
                _unpack(row, outs)
        w.add_done_callback(unpack)
        return self._work([w], output_lists)

    def _one_per_rank(self, op, big, small, what):
        """Gloo's check of a tensor holding one ``small`` per rank."""
        _check(big.numel() == small.numel() * self.size() and big.dtype == small.dtype, self.rank(), op,
               f"{what} is {big.dtype} of {big.numel()} elements, expected {small.dtype} of {self.size()} x "
               f"{small.numel()} (one part per rank of the group)")

    @_issued
    def _allgather_base(self, output, input, opts=None):
        self._one_per_rank("allgather_into_tensor", output, input, "the output")
        secs = self._secs(opts)
        return self._call(lambda a: self.comm.allgather(input, output, async_op=a, timeout=secs), output.nbytes,
                          [output])

    all_gather_single = _allgather_base

    @_issued
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        secs = self._secs(opts)
        return self._work([self.comm.allgather(i, o, async_op=True, timeout=secs) for o, i in zip(outputs, inputs)],
                          outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @_issued
    def reduce_scatter(self, outputs, input_lists, opts):
        (op, factor), works, secs = _op(opts.reduceOp), [], self._secs(opts)
        for out, ins in zip(outputs, input_lists):
            self._gathered("reduce_scatter", ins, out, "input list")
            send = _scaled(torch.cat([i.reshape(-1) for i in ins]), factor)
            works.append(self.comm.reduce_scatter(send, out, op, async_op=True, timeout=secs))
        return self._work(works, outputs)

    @_issued
    def _reduce_scatter_base(self, output, input, opts):
        self._one_per_rank("reduce_scatter_tensor", input, output, "the input")
        (op, factor), secs = _op(opts.reduceOp), self._secs(opts)
        input = _scaled(input, factor)
        return self._call(lambda a: self.comm.reduce_scatter(input, output, op, async_op=a, timeout=secs),
                          input.nbytes, [output])

    reduce_scatter_single = _reduce_scatter_base

    @_issued
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        (op, factor), secs = _op(opts.reduceOp), self._secs(opts)
        return self._work([self.comm.reduce_scatter(_scaled(i, factor), o, op, async_op=True, timeout=secs)
                           for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @_issued
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n, secs = self.size(), self._secs(opts)
        if not output_split_sizes and not input_split_sizes:
            _check(input.numel() == output.numel() and input.numel() % n == 0 and input.dtype == output.dtype,
                   self.rank(), "all_to_all_single", f"input {input.dtype} of {input.numel()} elements and output "
                   f"{output.dtype} of {output.numel()}: expected one dtype and equal sizes, divisible by {n}")
            return self._call(lambda a: self.comm.alltoall(input, output, async_op=a, timeout=secs), input.nbytes,
                              [output])
        row_in = input[0].numel() if input.dim() and input.shape[0] else 0
        row_out = output[0].numel() if output.dim() and output.shape[0] else 0
        ins = [s * row_in for s in input_split_sizes] if input_split_sizes else [input.numel() // n] * n
        outs = [s * row_out for s in output_split_sizes] if output_split_sizes else [output.numel() // n] * n
        return self._work([self.comm.alltoallv(input, output, ins, outs, async_op=True, timeout=secs)], [output])

    all_to_all_single = alltoall_base

    @_issued
    def alltoall(self, outputs, inputs, opts=None):
        r, n = self.rank(), self.size()
        _check(len(outputs) == n and len(inputs) == n, r, "alltoall",
               f"{len(inputs)} inputs and {len(outputs)} outputs, expected {n} of each (one per rank)")
        send = torch.cat([i.reshape(-1) for i in inputs])
        recv = torch.empty(sum(o.numel() for o in outputs), dtype=send.dtype)
        w = self.comm.alltoallv(send, recv, [i.numel() for i in inputs], [o.numel() for o in outputs],
                                async_op=True, timeout=self._secs(opts))

        w.add_done_callback(lambda _w: _unpack(recv, outputs))
        return self._work([w], outputs)

    @_issued
    def gather(self, output_lists, inputs, opts):
        root, t = opts.rootRank, inputs[0]
        is_root = self.rank() == root
        if is_root:
            self._gathered("gather", output_lists[0], t, "output list")
        buf = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype) if is_root else None
        w = self.comm.gather(t.contiguous(), buf, root, async_op=True, timeout=self._secs(opts))
        if is_root:
            w.add_done_callback(lambda _w: [o.copy_(b) for o, b in zip(output_lists[0], buf)])
        return self._work([w], output_lists)

    @_issued
    def scatter(self, outputs, input_lists, opts):
        root, out = opts.rootRank, outputs[0]
        send = None
        if self.rank() == root:
            self._gathered("scatter", input_lists[0], out, "input list")
            send = torch.cat([i.reshape(-1) for i in input_lists[0]])
        return self._work([self.comm.scatter(send, out, root, async_op=True, timeout=self._secs(opts))], outputs)

    def _point(self, name, t, peer, tag):
        """One isend or irecv of ``t``: a persistent request's start when the same tensor, peer and tag
        repeat (a pipeline's buffers), else the plain call."""
        secs, comm = self._timeout, self.comm

        def plain(_a):
            return (comm.isend if name == "send" else comm.irecv)(t, peer, tag, timeout=secs)
        init = comm.send_init if name == "send" else comm.recv_init
        req = self._request((name, peer, tag, secs), t, lambda x: init(x, peer, tag, timeout=secs))
        return plain(True) if req is None else self._started(req, plain)(True)

    @_issued
    def send(self, tensors, dst: int, tag: int = 0):
        return self._each(lambda t: self._point("send", t, dst, tag), tensors)

    @_issued
    def recv(self, tensors, src: int, tag: int = 0):
        return self._each(lambda t: self._point("recv", t, src, tag), tensors)

    @_issued
    def recv_anysource(self, tensors, tag: int = 0):
        return self._each(lambda t: self.comm.irecv(t, None, tag, timeout=self._timeout), tensors)

    @_issued
    def barrier(self, opts=None):
        """Returns once every rank entered it; raises CommTimeoutError (a RuntimeError, as Gloo's
        timeout is) naming a missing rank after ``dist.barrier(timeout=)``, else the group's timeout."""
        secs = self._secs(opts)
        return self._call(lambda a: self.comm.barrier(async_op=a, timeout=secs), 0, [])

    def shutdown(self) -> None:
        self.persistent.slots = 0
        self.persistent.close()
        self._completer.shutdown(wait=False)
        self.comm.close()

    abort = shutdown


def _create(backend_opts, pg_options):
    """torch's extended creator: the group's name and global ranks come with the store and timeout."""
    return ProcessGroupPyxccl(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                              backend_opts.timeout, group_name=backend_opts.group_id,
                              global_ranks=backend_opts.global_ranks_in_group)


dist.Backend.register_backend("pyxccl", _create, extended_api=True, devices=["cpu"])
