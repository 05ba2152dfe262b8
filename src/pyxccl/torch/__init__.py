"""pyxccl as a torch.distributed backend: ``import pyxccl.torch`` registers "pyxccl" for CPU.

>>> import torch.distributed as dist, pyxccl.torch                    # doctest: +SKIP
>>> dist.init_process_group("pyxccl")                  # under torchrun or pyxccl run
>>> dist.init_process_group("cpu:pyxccl,cuda:nccl")    # per-device mapping

Each torch process group becomes a pyxccl communicator (rendezvous through
torch's own store); every call runs on the communicator's ordered worker and
returns a torch Work built on a torch Future, so ``wait()``, ``is_completed()``
and ``get_future().then(...)`` behave as torch's do, and pyxccl's errors
(PeerLostError, CommTimeoutError, ...) surface from ``wait()``.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import pyxccl
from pyxccl.ops import ReduceOp
from pyxccl.rendezvous.torch_store import TorchStore

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


class _Work(torch._C._distributed_c10d.Work):
    """torch's Work over pyxccl Works: ``wait()`` raises their error (a Work made from a Future
    would only set it on the Future), ``get_future()`` for DDP hooks and ``then`` chains."""

    def __init__(self, works, value, fut):
        super().__init__()
        self._works, self._value, self._fut = works, value, fut
        self._unpacked = threading.Event()   # the pyxccl Works' own callbacks (unpacking outputs) ran
        self._lock, self._settled = threading.Lock(), False

    def _settle(self) -> None:
        """Complete the future once: from wait() or from the completer pool, whichever comes first
        (a waiter need not wait for a pool thread to wake up)."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
        exc = self.exception()
        if exc is not None:
            self._fut.set_exception(exc)
        else:
            self._fut.set_result(self._value)

    def wait(self, timeout=None) -> bool:
        secs = timeout.total_seconds() if timeout else None
        for w in self._works:
            w.wait(secs)          # raises pyxccl's error, naming the peer
        self._unpacked.wait()
        self._settle()
        self._fut.wait()          # then() callbacks of another thread that settled it first are done
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return self.is_completed() and all(w.exception() is None for w in self._works)

    def exception(self):
        return next((w.exception() for w in self._works if w.exception() is not None), None)

    def get_future(self):
        return self._fut

    def result(self):
        self.wait()
        return self._value

    def _source_rank(self) -> int:
        """The sender of a ``recv_anysource`` (torch's dist.recv(src=None) asks this)."""
        return self._works[0].source_rank()


class ProcessGroupPyxccl(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives run on a pyxccl Communicator."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        secs = timeout.total_seconds() if timeout is not None else None
        self.comm = pyxccl.init(rank, size, store=TorchStore(store, secs or 300.0), timeout=secs)
        self.comm.thread_check = False   # torch orders a group's calls itself, across hooks and callbacks
        # torch runs a Future's then() callbacks on the thread that completes it, and a callback
        # may wait for a later collective (PowerSGD's hook does). Completing futures on the
        # communicator's worker, or on one thread, would deadlock that: a small pool does it.
        self._completer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pyxccl-torch-completer")

    def getBackendName(self) -> str:
        return "pyxccl"

    # torch keeps a group's name on its C++ backends, and a Python ProcessGroup has none: keep it here
    # (DeviceMesh, FSDP and the functional collectives look groups up by name).
    def _set_group_name(self, name) -> None:
        self._name = name

    @property
    def group_name(self):
        return self._name

    def _get_backend_name(self) -> str:
        return "pyxccl"

    # --- Work plumbing ----------------------------------------------------------------
    def _work(self, works, value):
        """A torch Work completing when the last pyxccl Work does (they run in order)."""
        fut = torch.futures.Future()
        last = works[-1] if works else None
        if last is None:
            fut.set_result(value)
            return _create_work_from_future(fut)

        work = _Work(works, value, fut)

        def done(_w):
            work._unpacked.set()
            self._completer.submit(work._settle)
        last.add_done_callback(done)
        return work

    def _each(self, fn, tensors, value=None):
        return self._work([fn(t) for t in tensors], tensors if value is None else value)

    def _call(self, op, nbytes: int, value):
        """``op(async_op)`` as a torch Work. A small call runs right here when nothing is queued
        (no thread switch: about 20 us instead of hundreds), a large one on the worker, so that
        it overlaps with whatever the caller does next (DDP's backward pass)."""
        if nbytes > INLINE_BYTES:
            return self._work([op(True)], value)
        fut = torch.futures.Future()
        try:
            op(False)
        except Exception as e:  # noqa: BLE001  (surfaces from wait(), as torch's errors do)
            fut.set_exception(e)
        else:
            fut.set_result(value)
        return _create_work_from_future(fut)

    # --- collectives ---------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op, factor = _op(opts.reduceOp) if opts is not None else (ReduceOp.SUM, None)
        if factor is not None:        # the result replaces the input: scale it in place
            for t in tensors:
                t.mul_(factor)
        if len(tensors) == 1:
            t = tensors[0]
            return self._call(lambda a: self.comm.allreduce(t, op, async_op=a), t.nbytes, tensors)
        return self._each(lambda t: self.comm.allreduce(t, op, async_op=True), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        if len(tensors) == 1:
            t = tensors[0]
            return self._call(lambda a: self.comm.broadcast(t, opts.rootRank, async_op=a), t.nbytes, tensors)
        return self._each(lambda t: self.comm.broadcast(t, opts.rootRank, async_op=True), tensors)

    def reduce(self, tensors, opts):
        op, factor = _op(opts.reduceOp)
        if factor is None:
            return self._each(lambda t: self.comm.reduce(t, opts.rootRank, op, async_op=True), tensors)
        works = []         # the inputs of non-roots stay as they were: reduce scaled copies
        for t in tensors:
            tmp = t * factor
            works.append(self.comm.reduce(tmp, opts.rootRank, op, async_op=True))
            if self.rank() == opts.rootRank:
                works[-1].add_done_callback(lambda _w, t=t, tmp=tmp: t.copy_(tmp))
        return self._work(works, tensors)

    def allgather(self, output_lists, inputs, opts=None):
        works = []
        for outs, t in zip(output_lists, inputs):
            buf = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype)
            w = self.comm.allgather(t.contiguous(), buf, async_op=True)
            works.append(w)
            w.add_done_callback(lambda _w, outs=outs, buf=buf: [o.copy_(b) for o, b in zip(outs, buf)])
        return self._work(works, output_lists)

    def _allgather_base(self, output, input, opts=None):
        return self._call(lambda a: self.comm.allgather(input, output, async_op=a), output.nbytes, [output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._work([self.comm.allgather(i, o, async_op=True) for o, i in zip(outputs, inputs)], outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts):
        (op, factor), works = _op(opts.reduceOp), []
        for out, ins in zip(outputs, input_lists):
            send = _scaled(torch.cat([i.reshape(-1) for i in ins]), factor)
            works.append(self.comm.reduce_scatter(send, out, op, async_op=True))
        return self._work(works, outputs)

    def _reduce_scatter_base(self, output, input, opts):
        op, factor = _op(opts.reduceOp)
        input = _scaled(input, factor)
        return self._call(lambda a: self.comm.reduce_scatter(input, output, op, async_op=a), input.nbytes,
                          [output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op, factor = _op(opts.reduceOp)
        return self._work([self.comm.reduce_scatter(_scaled(i, factor), o, op, async_op=True)
                           for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        if not output_split_sizes and not input_split_sizes:
            return self._call(lambda a: self.comm.alltoall(input, output, async_op=a), input.nbytes, [output])
        row_in = input[0].numel() if input.dim() and input.shape[0] else 0
        row_out = output[0].numel() if output.dim() and output.shape[0] else 0
        ins = [s * row_in for s in input_split_sizes] if input_split_sizes else [input.numel() // n] * n
        outs = [s * row_out for s in output_split_sizes] if output_split_sizes else [output.numel() // n] * n
        return self._work([self.comm.alltoallv(input, output, ins, outs, async_op=True)], [output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        send = torch.cat([i.reshape(-1) for i in inputs])
        recv = torch.empty(sum(o.numel() for o in outputs), dtype=send.dtype)
        w = self.comm.alltoallv(send, recv, [i.numel() for i in inputs], [o.numel() for o in outputs],
                                async_op=True)

        def unpack(_w):
            off = 0
            for o in outputs:
                o.copy_(recv[off:off + o.numel()].view_as(o))
                off += o.numel()
        w.add_done_callback(unpack)
        return self._work([w], outputs)

    def gather(self, output_lists, inputs, opts):
        root, t = opts.rootRank, inputs[0]
        buf = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype) if self.rank() == root else None
        w = self.comm.gather(t.contiguous(), buf, root, async_op=True)
        if self.rank() == root:
            w.add_done_callback(lambda _w: [o.copy_(b) for o, b in zip(output_lists[0], buf)])
        return self._work([w], output_lists)

    def scatter(self, outputs, input_lists, opts):
        root, out = opts.rootRank, outputs[0]
        send = torch.cat([i.reshape(-1) for i in input_lists[0]]) if self.rank() == root else None
        return self._work([self.comm.scatter(send, out, root, async_op=True)], outputs)

    def send(self, tensors, dst: int, tag: int = 0):
        return self._each(lambda t: self.comm.isend(t, dst, tag), tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._each(lambda t: self.comm.irecv(t, src, tag), tensors)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._each(lambda t: self.comm.irecv(t, None, tag), tensors)

    def barrier(self, opts=None):
        return self._call(lambda a: self.comm.barrier(async_op=a), 0, [])

    def shutdown(self) -> None:
        self._completer.shutdown(wait=False)
        self.comm.close()

    abort = shutdown


def _create(store, rank, size, timeout):
    return ProcessGroupPyxccl(store, rank, size, timeout)


dist.Backend.register_backend("pyxccl", _create, devices=["cpu"])
