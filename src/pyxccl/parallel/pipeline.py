"""Pipeline parallelism: a model split into stages, a batch into micro-batches (GPipe and 1F1B).

Each rank of the PP group holds one stage (``group.rank``). A micro-batch's activation goes
forward stage to stage with point-to-point sends, its gradient comes back the same way. The
schedule says in which order one stage runs its forwards ``("F", i)`` and backwards ``("B", i)``:

* ``"gpipe"``: all m forwards, then all m backwards (m activations alive per stage);
* ``"1f1b"``: PipeDream-flush / Megatron: ``p - stage - 1`` warm-up forwards, then one forward
  one backward, then the remaining backwards (at most ``p - stage`` activations alive).

Both leave the stages idle for the same fraction of a step, the bubble ``(p-1)/(m+p-1)``
(uniform stages); 1F1B only saves memory.

>>> pipe = Pipeline(stage_module, groups.pp, microbatches=4, act_shape=(8, 64),      # doctest: +SKIP
...                 loss_fn=torch.nn.functional.mse_loss)
>>> loss = pipe.step(x if groups.first_stage else None, y if groups.last_stage else None)  # doctest: +SKIP
>>> opt.step(); opt.zero_grad()    # the grads: those of the mean loss over the batch  # doctest: +SKIP
"""
from __future__ import annotations

import time

import torch

from .._errors import InvalidArgumentError
from . import ops

KINDS = ("gpipe", "1f1b")


def _check(kind: str, stages: int, microbatches: int, stage: int, op: str, rank=None) -> None:
    if kind not in KINDS or stages < 1 or microbatches < 1 or not 0 <= stage < stages:
        who = "" if rank is None else f"rank {rank}: "
        raise InvalidArgumentError(f"{who}{op}: kind={kind!r} stages={stages} microbatches={microbatches} stage={stage}: "
                                   f"kind must be one of {KINDS}, stages and microbatches >= 1 and "
                                   f"0 <= stage < stages", rank=rank, op=op)


def schedule(kind: str, stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """The actions of ``stage`` in order: ``("F", i)`` forward, ``("B", i)`` backward of micro-batch i.

    >>> schedule("1f1b", 2, 3, 0)
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    """
    _check(kind, stages, microbatches, stage, "schedule")
    m = microbatches
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(stages - stage - 1, m)          # the later stages need that many in flight to start
    acts = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):                  # steady state: one forward, then the oldest backward
        acts += [("F", warmup + i), ("B", i)]
    acts += [("B", i) for i in range(m - warmup, m)]   # cool-down
    return acts


_schedule = schedule      # Pipeline's keyword argument has the same name


def simulate(kind: str, stages: int, microbatches: int, fwd: float = 1.0, bwd: float = 2.0):
    """Start and end times of every action: ``{(stage, "F"|"B", i): (start, end)}``, each stage
    running its :func:`schedule` in order as soon as its inputs exist (sends take no time)."""
    p = stages
    lists = [schedule(kind, p, microbatches, s) for s in range(p)]
    done: dict[tuple, tuple[float, float]] = {}
    nxt, free = [0] * p, [0.0] * p
    while any(nxt[s] < len(lists[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if nxt[s] == len(lists[s]):
                continue
            k, i = lists[s][nxt[s]]
            # F i needs F i of the stage before; B i needs B i of the stage after and its own F i
            deps = [(s - 1, "F", i)] if k == "F" and s > 0 else []
            if k == "B":
                deps = [(s, "F", i)] + ([(s + 1, "B", i)] if s < p - 1 else [])
            if all(d in done for d in deps):
                start = max([free[s]] + [done[d][1] for d in deps])
                free[s] = start + (fwd if k == "F" else bwd)
                done[(s, k, i)] = (start, free[s])
                nxt[s] += 1
                moved = True
        if not moved:      # cannot happen for these schedules; guards against an endless loop
            raise RuntimeError(f"simulate: {kind} deadlocks at {nxt}")
    return done


def bubble(kind: str, stages: int, microbatches: int, fwd: float = 1.0, bwd: float = 2.0) -> float:
    """The idle fraction of the step: max over stages of 1 - busy / step time, the step lasting
    from the first action's start to the last one's end on any stage (theory: (p-1)/(m+p-1)).

    >>> bubble("gpipe", 4, 8)
    0.2727272727272727
    """
    done = simulate(kind, stages, microbatches, fwd, bwd)
    total = max(e for _, e in done.values()) - min(b for b, _ in done.values())
    busy = [0.0] * stages
    for (s, _, _), (b, e) in done.items():
        busy[s] += e - b
    return max(1 - x / total for x in busy)


class Pipeline:
    """This rank's stage of a pipeline over ``group`` (the PP :class:`~pyxccl.parallel.groups.Group`).

    ``module``: this stage's layers. ``act_shape``/``act_dtype``: one micro-batch's activation
    at the stage boundaries (what is sent and received). ``loss_fn(out, target)`` (last stage):
    the loss of a micro-batch, averaged over micro-batches. ``step`` leaves the grads of the mean
    loss in the module's parameters (accumulated: zero them between steps).

    ``fixed_buffers`` (default True): every micro-batch's activation and gradient is sent from and
    received into a buffer of its own kept across steps (an activation is copied in before its send),
    so each step's sends and receives repeat on the same tensors, peers and sizes: on a pyxccl
    group the backend makes them persistent requests (pyxccl/torch/_persist.py). False: fresh
    tensors every step (what moves, and the results, are the same).

    ``timeline``: the last step's compute actions ``(kind, i, start, end)`` (``time.perf_counter``,
    waiting for a receive not included), ``wall``: its ``(start, end)``.
    """

    def __init__(self, module, group, *, microbatches: int, schedule: str = "1f1b", act_shape,
                 act_dtype=torch.float32, loss_fn=None, fixed_buffers: bool = True):
        self.module, self.group, self.m, self.kind = module, group, microbatches, schedule
        self.stage, self.stages = group.rank, group.size
        self.rank = group.ranks[self.stage]
        _check(schedule, self.stages, microbatches, self.stage, "Pipeline", self.rank)
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        if self.last and loss_fn is None:
            raise InvalidArgumentError(f"rank {self.rank} (stage {self.stage}): Pipeline: the last stage needs "
                                       f"loss_fn(out, target); pass one", rank=self.rank, op="Pipeline")
        self.act_shape, self.act_dtype, self.loss_fn = tuple(act_shape), act_dtype, loss_fn
        self.actions = _schedule(schedule, self.stages, microbatches, self.stage)
        self.timeline: list[tuple[str, int, float, float]] = []
        self.wall = (0.0, 0.0)
        self.fixed_buffers = fixed_buffers
        self._bufs: dict[tuple[str, int], torch.Tensor] = {}     # ("act in"|"act out"|"grad in"|..., i) -> buffer

    def _buffer(self, what: str, i: int):
        """The kept buffer ``what`` of micro-batch ``i`` (made at first use)."""
        b = self._bufs.get((what, i))
        if b is None:
            b = self._bufs[(what, i)] = torch.empty(self.act_shape, dtype=self.act_dtype)
        return b

    def _split(self, t, what: str):
        if t is None or t.shape[0] % self.m:
            raise InvalidArgumentError(f"rank {self.rank} (stage {self.stage}): Pipeline.step: {what} must be "
                                       f"given on this stage with dim 0 a multiple of microbatches={self.m}, got "
                                       f"{None if t is None else tuple(t.shape)}", rank=self.rank,
                                       op="Pipeline.step")
        return t.chunk(self.m)

    def _recv(self, src: int, what: str, i: int):
        if not self.fixed_buffers:
            buf = torch.empty(self.act_shape, dtype=self.act_dtype)
            ops.irecv(buf, src, self.group).wait()
            return buf
        buf = self._buffer(what + " in", i)
        ops.irecv(buf, src, self.group).wait()
        # a new tensor on the buffer's memory: autograd's grad goes to it, not to the kept buffer, and
        # the buffer is written again only by the next step's receive, after this step's backward
        return buf.detach()

    def _send(self, t, dst: int, what: str, i: int) -> None:
        t = t.detach()
        if self.fixed_buffers and t.shape == self.act_shape and t.dtype == self.act_dtype:
            buf = self._buffer(what + " out", i)   # free: last step's sends were waited for
            buf.copy_(t)
            t = buf
        else:                                      # another shape or dtype: sent as it is, as before
            t = t.contiguous()
        self._sends.append((t, ops.isend(t, dst, self.group)))    # t stays alive until the wait

    def step(self, inputs=None, targets=None):
        """One step over the batch: the mean loss on the last stage, None elsewhere."""
        xs = self._split(inputs, "inputs") if self.first else None
        ys = self._split(targets, "targets") if self.last else None
        self._sends, self.timeline = [], []
        saved: dict[int, tuple] = {}      # micro-batch -> (its input, its output or loss)
        losses = []
        t0 = time.perf_counter()
        # Pairs of stages exchange messages in order (no tags): activations go s -> s+1 in i order,
        # gradients s+1 -> s in i order, and both schedules run F and B in increasing i.
        for kind, i in self.actions:
            if kind == "F":
                if self.first:
                    x = xs[i]
                else:
                    x = self._recv(self.stage - 1, "act", i).requires_grad_()
                start = time.perf_counter()
                out = self.module(x)
                if self.last:
                    out = self.loss_fn(out, ys[i]) / self.m
                    losses.append(out.detach())
                else:
                    self._send(out, self.stage + 1, "act", i)
                saved[i] = (x, out)
            else:
                x, out = saved.pop(i)
                grad = None if self.last else self._recv(self.stage + 1, "grad", i)
                start = time.perf_counter()
                torch.autograd.backward(out, grad)
                if not self.first:
                    self._send(x.grad, self.stage - 1, "grad", i)
            self.timeline.append((kind, i, start, time.perf_counter()))
        for _, w in self._sends:           # the receivers took them: the buffers may go
            w.wait()
        self._sends = []
        self.wall = (t0, time.perf_counter())
        return torch.stack(losses).sum() if self.last else None

    def measured_bubble(self, wall: float | None = None) -> float:
        """1 - busy / step time of the last step (``wall``: a step time measured elsewhere, e.g. the
        slowest stage's, in seconds)."""
        busy = sum(e - s for _, _, s, e in self.timeline)
        return 1 - busy / (wall if wall is not None else self.wall[1] - self.wall[0])
