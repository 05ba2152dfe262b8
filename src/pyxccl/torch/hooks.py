"""DDP communication hooks: averaging with a ``pyxccl.compression`` compressor, and torch's
divide-then-sum averaging with a persistent allreduce per bucket (:func:`allreduce_hook`).

>>> from pyxccl.compression import INT8, TopK                               # doctest: +SKIP
>>> from pyxccl.torch.hooks import CompressionState, compression_hook
>>> ddp = DistributedDataParallel(model)                  # on a "pyxccl" (or "gloo") group
>>> ddp.register_comm_hook(CompressionState(INT8()), compression_hook)
>>> ddp.register_comm_hook(CompressionState("topk:0.01"), compression_hook)   # error feedback per bucket

One hook for every compressor: ``CompressionState(FP16())``, ``BF16()``, ``INT8(block=256)``,
``TopK(ratio, error_feedback=True, momentum=None)``, ``Threshold(tau, ...)`` or a spec string
(``"fp16"``, ``"int8:block=128"``, ``"topk:0.01,momentum=0.9"``). The hook's future holds the
bucket's gradients averaged over the group (what DDP expects), the same on every rank.

- On a pyxccl group the compressed collective runs: ``comm.allreduce(bucket, op="avg",
  compression=..., key="bucket<i>")`` (a quantizer encodes every message of the algorithm, a
  sparsifier all-gathers the (index, value) pairs; see ``pyxccl/compression/collectives.py``).
- On any other group (Gloo) the hook does the same compression itself: each rank encodes its
  bucket once, the encoded bytes are all-gathered (``all_gather_single`` of uint8; Threshold's
  pair counts first, padded to the largest) and decoded and summed in rank order on every rank.
  A quantizer's error is then one round trip per rank's contribution; the pyxccl ring re-quantizes
  partial sums (up to about ``n - 1`` round trips), so the two agree within the compressor's bound.
  Sparsifiers give the same bits on both (pairs summed in rank order, then divided by n).

Error feedback (and DGC momentum) is kept per bucket in the compressor; when DDP rebuilds its
buckets after the first iteration, what each parameter had not sent moves with it to its new
bucket. With ``momentum=`` use plain SGD (the sent values carry the momentum).
"""

import weakref

import numpy as np  # (no "from __future__ import annotations": DDP compares the hook's annotations as objects)
import torch
import torch.distributed as dist

from .._errors import InvalidArgumentError
from ..compression import Quantizer, Sparsifier, parse
from ..compression.collectives import dense_wins

__all__ = ["CompressionState", "compression_hook", "PersistentState", "allreduce_hook"]

# torch 2.13 names all_gather_into_tensor all_gather_single (the old name warns)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CompressionState:
    """The state of :func:`compression_hook`: the compressor (an object or a spec string; it keeps
    the sparsifiers' residuals) and the process group (None: the default group)."""

    def __init__(self, compressor, process_group=None):
        codec = parse(compressor)
        if codec is None or isinstance(codec, str):
            raise InvalidArgumentError(f"CompressionState needs a compressor (fp16, bf16, int8, topk:R, "
                                       f"threshold:T), got {compressor!r}; for no compression use DDP without a hook",
                                       op="CompressionState")
        self.compressor = codec
        self.process_group = process_group
        self._layouts: dict[str, tuple] = {}     # key -> ((id(param), numel), ...) of the bucket
        self._owner: dict[int, str] = {}         # id(param) -> the key whose residual holds its part
        self._pieces: dict[int, tuple] = {}      # id(param) -> (residual, momentum) parts in transit

    def __repr__(self) -> str:
        return f"CompressionState({self.compressor!r})"

    # --- error feedback across DDP's bucket rebuild ---------------------------------------
    def key(self, bucket) -> str:
        """The compressor key of ``bucket`` (``"bucket<i>"``). With error feedback, a bucket whose
        parameters changed since the last call (DDP rebuilds buckets after the first iteration) gets
        its parameters' residuals from wherever they were."""
        key = f"bucket{bucket.index()}"
        codec = self.compressor
        if not (isinstance(codec, Sparsifier) and codec.error_feedback):
            return key
        layout = tuple((id(p), p.numel()) for p in bucket.parameters())
        old = self._layouts.get(key)
        if old == layout:
            return key
        if old is not None:
            self._split(key)
        for pid, _ in layout:                   # the keys holding these parameters' residuals
            k = self._owner.get(pid)
            if k is not None and self._layouts.get(k) != layout:
                self._split(k)
        self._join(key, layout)
        return key

    def _split(self, key) -> None:
        """Cut ``key``'s residual (and momentum) into per-parameter pieces and drop the key."""
        codec = self.compressor
        res, mom = codec._res.pop(key, None), codec._mom.pop(key, None)
        off = 0
        for pid, n in self._layouts.pop(key):
            self._owner.pop(pid, None)
            if res is not None:
                self._pieces[pid] = (res[off:off + n].copy(), None if mom is None else mom[off:off + n].copy())
            off += n

    def _join(self, key, layout) -> None:
        codec = self.compressor
        parts = [self._pieces.pop(pid, None) for pid, _ in layout]
        if any(p is not None for p in parts):
            total = sum(n for _, n in layout)
            res = np.zeros(total, np.float32)
            mom = np.zeros(total, np.float32) if codec.momentum is not None else None
            off = 0
            for (_, n), p in zip(layout, parts):
                if p is not None:
                    res[off:off + n] = p[0]
                    if mom is not None and p[1] is not None:
                        mom[off:off + n] = p[1]
                off += n
            codec._res[key] = res
            if mom is not None:
                codec._mom[key] = mom
        self._layouts[key] = layout
        for pid, _ in layout:
            self._owner[pid] = key


def _pyxccl_backend(group):
    from . import ProcessGroupPyxccl
    try:
        b = group._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001  (no CPU backend: not ours)
        return None
    return b if isinstance(b, ProcessGroupPyxccl) else None


def _flat(buf: torch.Tensor) -> np.ndarray:
    if buf.dtype != torch.float32 or not buf.is_contiguous() or buf.device.type != "cpu":
        raise InvalidArgumentError(f"compression_hook compresses contiguous float32 CPU gradients, got a "
                                   f"{buf.dtype} bucket on {buf.device}: train in float32 on the CPU, or register "
                                   f"no hook", op="compression_hook")
    return buf.detach().view(-1).numpy()


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``bucket.buffer()`` averaged over ``state.process_group`` with
    ``state.compressor``, in place; a future of that tensor (errors are set on it)."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    buf = bucket.buffer()
    key = state.key(bucket)
    backend = _pyxccl_backend(group)
    if backend is not None:
        return _on_pyxccl(backend, state.compressor, buf, key)
    return _on_any(group, state.compressor, buf, key)


def _on_pyxccl(backend, codec, buf, key):
    fut = torch.futures.Future()
    try:
        work = backend.comm.allreduce(_flat(buf), "avg", compression=codec, key=key, async_op=True)
    except Exception as e:  # noqa: BLE001
        fut.set_exception(e)
        return fut

    def settle(exc):
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(buf)

    # complete off the communicator's worker: DDP's then() callbacks run on the completing thread
    work.add_done_callback(lambda w: backend._complete(settle, w.exception()))
    return fut


def _on_any(group, codec, buf, key):
    """The compression in the hook, over the group's own all-gather (Gloo or any backend)."""
    n = dist.get_world_size(group)
    x = _flat(buf)
    if isinstance(codec, Quantizer):
        send = np.empty(codec.nbytes(x.size), np.uint8)
        codec.encode(x, send)

        def add(out, rows):
            out[:] = 0
            for row in rows:
                codec.decode(row, out, accumulate=True)
        return _gather_sum(group, n, buf, torch.from_numpy(send), add)
    idx, val = codec.compress(x, key if codec.error_feedback else None)
    if codec.k(x.size) is not None:
        counts = [idx.size] * n
    else:                                   # Threshold: every rank's pair count first
        c = torch.empty(n, dtype=torch.int64)
        _all_gather(c, torch.tensor([idx.size], dtype=torch.int64), group=group)
        counts = c.tolist()
    if dense_wins(counts, x.size):          # the pairs would outweigh the dense tensor (pyxccl's own rule)
        x[:] = 0
        codec.accumulate(x, idx, val)
        work = dist.all_reduce(buf, group=group, async_op=True)
        return work.get_future().then(lambda f: f.value()[0].div_(n))
    if max(counts) == 0:                    # Threshold: nothing above tau anywhere
        buf.zero_()
        done = torch.futures.Future()
        done.set_result(buf)
        return done
    width = codec.nbytes(max(counts), x.size)
    send = np.zeros(width, np.uint8)
    codec.pack(idx, val, x.size, send[:codec.nbytes(idx.size, x.size)])

    def add_pairs(out, rows):
        codec.sum_packed(out, [row[:codec.nbytes(m, x.size)] for row, m in zip(rows, counts)])
    return _gather_sum(group, n, buf, torch.from_numpy(send), add_pairs)


def _gather_sum(group, n, buf, send, add):
    """All-gather ``send`` (the same width on every rank); then, on every rank, ``add(buf, rows)``
    (``buf`` = the sum of the rows in rank order), divided by n."""
    gathered = torch.empty(n * send.numel(), dtype=torch.uint8)
    work = _all_gather(gathered, send, group=group, async_op=True)

    def after(f):
        f.value()                            # raises the collective's error
        out = _flat(buf)
        add(out, gathered.numpy().reshape(n, send.numel()))
        np.divide(out, np.float32(n), out=out)
        return buf
    return work.get_future().then(after)


class PersistentState:
    """The state of :func:`allreduce_hook`: the process group (None: the default group) and what the
    hook's calls did with the group's persistent requests.

    The requests are the backend's own (``pyxccl/torch/_persist.py``, the same that DDP's built-in
    allreduces use): a bucket's is made the second time its buffer is all-reduced, started from then
    on, and a plain call runs while its last start still does; a bucket whose buffer changed (DDP
    rebuilds its buckets after the first iteration) starts over. ``created`` counts the requests the
    hook's calls made, ``reused`` the starts of one made before; ``free()`` releases those of the
    buckets the hook has seen (they live as long as their buckets, i.e. the model, otherwise).
    """

    def __init__(self, process_group=None):
        self.process_group = process_group
        self.created = self.reused = 0
        # id -> weak reference of each bucket buffer seen, for free() (a tensor's == is elementwise: no WeakSet)
        self._buffers: dict[int, weakref.ref] = {}

    def __repr__(self) -> str:
        return f"PersistentState({len(self._buffers)} buckets, {self.created} requests made)"

    def _saw(self, buf: torch.Tensor) -> None:
        ref = self._buffers.get(id(buf))
        if ref is not None and ref() is buf:
            return
        self._buffers = {k: r for k, r in self._buffers.items() if r() is not None}    # rebuilt buckets' old ones
        try:
            self._buffers[id(buf)] = weakref.ref(buf)
        except TypeError:       # not weakly referable: the backend keeps no request for it either
            pass

    def free(self) -> None:
        """Release the requests of every bucket the hook has seen (those still running are dropped once done)."""
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        backend = _pyxccl_backend(group)
        buffers, self._buffers = [r() for r in self._buffers.values()], {}
        if backend is not None:
            for buf in buffers:
                if buf is not None:
                    backend.persistent.discard(buf)


def allreduce_hook(state: PersistentState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``bucket.buffer()`` averaged over ``state.process_group`` by torch's
    ``default_hooks.allreduce_hook`` itself (divided by the group's size, then summed), so the bits
    are torch's. On a pyxccl group the sum is the bucket's persistent allreduce from the second time
    it sees the bucket's buffer (the backend's request cache; DDP rebuilds its buckets after the first
    step, so from the third step): the same prepared schedule as the plain call, so the same bits;
    ``state`` counts the requests made and started again. On another group (Gloo), torch's hook alone.

    >>> ddp.register_comm_hook(PersistentState(), allreduce_hook)         # doctest: +SKIP
    """
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    backend = _pyxccl_backend(group)
    if backend is None:
        return _torch_allreduce_hook(group, bucket)
    cache = backend.persistent
    made, started = cache.created, cache.reused
    fut = _torch_allreduce_hook(group, bucket)
    # the hook issues on its group from one thread (DDP's backward): the cache's counts moved for its call
    state.created += cache.created - made
    state.reused += cache.reused - started
    state._saw(bucket.buffer())
    return fut


def _torch_allreduce_hook(group, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    return allreduce_hook(group, bucket)
