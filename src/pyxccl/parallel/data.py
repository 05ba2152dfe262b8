"""Data parallelism: the gradients' allreduce in buckets, started during backward (DDP's reducer).

Every rank holds the whole model and a different batch; after backward each gradient is averaged
over the DP group. One allreduce of all G gradient bytes after backward leaves the link idle while
backward runs and the cores idle while the allreduce runs. The reducer packs the gradients into
buckets of at most ``bucket_cap_mb`` (25 MiB, DDP's default) in reverse layer order, the order
backward produces them, and starts a bucket's allreduce (asynchronous) as soon as its last gradient
is accumulated (``register_post_accumulate_grad_hook``), so communication overlaps the rest of
backward; ``finish()`` waits for them before the optimizer step. What moves per step and rank: one
allreduce per bucket, G bytes in all, ``2G(N-1)/N`` sent with a ring (seeds/001).

>>> ddp = GradientReducer(model, groups.dp)                 # doctest: +SKIP
>>> for i, (x, y) in enumerate(batches):
...     (loss_fn(model(x), y) / k).backward()               # with accumulate=k
...     if ddp.ready:                                       # the k-th micro-batch: buckets are in flight
...         ddp.finish(); opt.step(); opt.zero_grad()

``accumulate=k``: gradients accumulate locally for k backward passes (micro-batches) and are
reduced only on the k-th, as DDP's ``no_sync()`` does for the first k-1. ``overlap=False`` is the
baseline: one blocking allreduce of every gradient in ``finish()``.
"""
from __future__ import annotations

import torch

from .._errors import InvalidArgumentError
from . import ops


class _Bucket:
    def __init__(self, params):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.empty(self.numel, dtype=params[0].dtype)
        self.pending = len(params)      # gradients still to come this round
        self.work = None

    def pack(self) -> None:
        o = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:          # not used this round (DDP's find_unused_parameters): contributes 0
                self.flat[o:o + n].zero_()
            else:
                self.flat[o:o + n].copy_(p.grad.reshape(-1))
            o += n

    def unpack(self, scale: float) -> None:
        self.flat.mul_(scale)
        o = 0
        for p in self.params:
            n = p.numel()
            g = self.flat[o:o + n].view_as(p)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
            o += n


class GradientReducer:
    """Averages ``module``'s gradients over ``group`` (a DP :class:`~pyxccl.parallel.Group`).

    ``bucket_cap_mb``: bucket size cap (MiB); ``overlap``: start each bucket's allreduce during
    backward (False: one blocking allreduce in :meth:`finish`); ``accumulate``: reduce every k-th
    backward; ``broadcast_params``: start from group rank 0's parameters, as DDP does.
    """

    def __init__(self, module: torch.nn.Module, group, *, bucket_cap_mb: float = 25, overlap: bool = True,
                 accumulate: int = 1, broadcast_params: bool = True):
        if bucket_cap_mb <= 0 or accumulate < 1:
            raise InvalidArgumentError(f"rank {group.rank} of group {group.name}: GradientReducer: bucket_cap_mb "
                                       f"({bucket_cap_mb}) must be > 0 and accumulate ({accumulate}) >= 1",
                                       rank=group.rank, op="GradientReducer")
        self.group, self.overlap, self.accumulate = group, overlap, accumulate
        params = [p for p in module.parameters() if p.requires_grad]
        if broadcast_params:
            with torch.no_grad():
                for p in params:
                    ops.broadcast(p.data, 0, group)
        cap = bucket_cap_mb * (1 << 20) if overlap else float("inf")      # the baseline: one bucket
        self.buckets: list[_Bucket] = []
        run: list = []
        for p in reversed(params):      # backward makes the last layer's gradients first
            if run and (p.dtype != run[0].dtype or sum(q.numel() * q.element_size() for q in run) >= cap):
                self.buckets.append(_Bucket(run))
                run = []
            run.append(p)
        if run:
            self.buckets.append(_Bucket(run))
        self._round = 0                 # backward passes since the last finish()
        self._seen: dict[int, int] = {}
        self._hooks = []
        for b in self.buckets:
            for p in b.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(b)))

    def _hook(self, bucket: _Bucket):
        def ready(p):
            # counts per parameter: backward of micro-batch k reaches p the k-th time
            n = self._seen[id(p)] = self._seen.get(id(p), 0) + 1
            self._round = max(self._round, n)
            if self.overlap and n == self.accumulate:
                bucket.pending -= 1
                if bucket.pending == 0:
                    self._launch(bucket)
        return ready

    def _launch(self, bucket: _Bucket) -> None:
        bucket.pack()
        bucket.work = ops.all_reduce(bucket.flat, self.group, async_op=True)

    @property
    def ready(self) -> bool:
        """True after the ``accumulate``-th backward since the last :meth:`finish`: time to finish and step."""
        return self._round >= self.accumulate

    def finish(self) -> None:
        """Wait for every bucket's allreduce (start those not started: unused parameters, or
        ``overlap=False``) and leave the averaged gradients in ``p.grad``. Call before the optimizer step."""
        for b in self.buckets:
            if b.work is None:
                self._launch(b)
        for b in self.buckets:
            b.work.wait()
        for b in self.buckets:
            b.unpack(1.0 / self.group.size)
            b.work, b.pending = None, len(b.params)
        self._round = 0
        self._seen.clear()

    def remove(self) -> None:
        """Remove the autograd hooks (the module goes back to local gradients)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
