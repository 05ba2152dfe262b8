"""The traffic rules: which primitive each parallel strategy calls, how often, with how many bytes.

Notation: ``b`` micro-batch size (sequences), ``s`` sequence length, ``h`` hidden size, ``m``
micro-batches per step (gradient accumulation), ``L`` transformer layers on the rank's pipeline
stage, ``e`` the model's itemsize (its dtype), ``g`` the gradients' itemsize, ``P`` parameters on
the rank (dense ones over ``tp``; routed experts over ``tp * ep``), ``B`` the bucket size (25 MiB by
default, like DDP). Bytes per call follow nccl-tests: an allreduce's vector; an allgather's,
reduce-scatter's and all-to-all's whole buffer (every rank's block together).

=============  =====================================================  ==============================
strategy       calls per step and rank                                bytes per call
=============  =====================================================  ==============================
TP (Megatron)  allreduce: 2 per layer forward, 2 backward, per        ``b*s*h*e`` (the layer's output)
               micro-batch: ``4*L*m``; the vocab-parallel embedding
               adds 1 forward (first stage), the output head 1
               backward (last stage), per micro-batch
TP + SP        each allreduce becomes a reduce-scatter and an         ``b*s*h*e`` each
               allgather of the same full tensor: ``4*L*m`` of each
DP             allreduce of the gradients once per step, in buckets:  ``B`` (the last: the rest)
               ``ceil(P*g / B)`` calls (expert gradients in the
               group of ranks holding the same experts, ``dp/ep``)
ZeRO-1, -2     reduce-scatter of the gradients + allgather of the     ``B``
               updated parameters, once per step, in buckets (the
               same volume as DP's allreduce: ``2x`` parameters)
ZeRO-3, FSDP   per layer (one FSDP unit each, embeddings one more),   the unit's ``P*e`` (``P*g``)
               per micro-batch: allgather of its parameters forward,
               again backward, reduce-scatter of its gradients
               (``3x`` parameters per micro-batch)
PP             send/recv to the next stage of the activations,        ``b*s*h*e`` (``/tp`` with SP:
               forward, and to the previous of their gradients,       the tensor is split along the
               backward: ``m`` of each per stage boundary             sequence)
EP (MoE)       all-to-all per MoE layer and micro-batch: dispatch     ``b*s*k*h*e*c`` (``k`` top-k,
               and combine forward, the same two backward:            ``c`` capacity factor; ``/tp``
               ``4*L_moe*m``; ``(ep-1)/ep`` of it leaves the rank     with SP); ``(ep-1)/ep`` sent
=============  =====================================================  ==============================

Left out: the loss's allreduces of ``b*s`` floats, the tied embedding's gradient allreduce between
the first and last stage, optimizer-state traffic, activation recomputation.

Overlap, simply: TP, SP, EP and PP traffic sits on the critical path (``exposed``); gradient
reductions can run during the backward pass and parameter gathers ahead of their layer
(``overlappable``).

Forward-only mode (inference, seeds/003's per-block count): no backward, no gradients; ZeRO-3 still
gathers the parameters forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .layout import Layout
from .model import Model


@dataclass(frozen=True)
class Traffic:
    """One kind of call of one rank's step: ``sizes`` = ((calls, bytes per call), ...)."""
    strategy: str
    what: str
    phase: str          # forward, backward, step
    primitive: str      # a pyxccl.sim primitive, or "send/recv"
    group: str          # the Layout group kind: tp, dp, edp, ep, pp
    sizes: tuple
    overlap: str        # exposed | overlappable

    @property
    def calls(self) -> int:
        return sum(c for c, _ in self.sizes)

    @property
    def total_bytes(self) -> int:
        return sum(c * n for c, n in self.sizes)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage's share of the model, as seen by one of its ranks."""
    index: int
    layers: tuple        # 1-based layer indices
    first: bool
    last: bool

    def dense_layers(self, model: Model) -> list[int]:
        return [i for i in self.layers if not model.is_moe(i)]

    def moe_layers(self, model: Model) -> list[int]:
        return [i for i in self.layers if model.is_moe(i)]


def stages(model: Model, pp: int) -> list[Stage]:
    """Layers split as evenly as they go over ``pp`` stages (the first stages take one more)."""
    if pp > model.layers:
        raise ValueError(f"pp={pp} stages for {model.layers} layers: at least one layer per stage")
    q, r = divmod(model.layers, pp)
    out, start = [], 1
    for s in range(pp):
        n = q + (1 if s < r else 0)
        out.append(Stage(s, tuple(range(start, start + n)), s == 0, s == pp - 1))
        start += n
    return out


def embedding_units(model: Model, stage: Stage, pp: int) -> int:
    """Vocab x h matrices the stage holds: the input embedding on the first, the output head on the last
    (a copy of the tied embedding when the pipeline has more than one stage)."""
    n = 1 if stage.first else 0
    if stage.last and (not model.tied or pp > 1):
        n += 1
    return n


def stage_params(model: Model, layout: Layout, stage: Stage) -> tuple[int, int]:
    """(dense, routed-expert) parameters one rank of ``stage`` holds."""
    dense = sum(model.layer_params(i)[0] for i in stage.layers)
    dense += embedding_units(model, stage, layout.pp) * model.embedding_params
    expert = sum(model.layer_params(i)[1] for i in stage.layers)
    return dense // layout.tp, expert // (layout.tp * layout.ep)


def buckets(nbytes: int, bucket: int) -> tuple:
    """``ceil(nbytes / bucket)`` calls: full buckets and the rest."""
    if nbytes <= 0:
        return ()
    full, rest = divmod(nbytes, bucket)
    return tuple(x for x in ((full, bucket), (1, rest)) if x[0] and x[1])


def traffic(model: Model, layout: Layout, stage: Stage, train: bool = True) -> list[Traffic]:
    """Every kind of call one rank of ``stage`` makes in one step (see the module's table)."""
    m = micro_batches(model, layout)
    e, g = model.itemsize, model.grad_itemsize
    act = model.micro_batch_size * model.seq_len * model.hidden * e
    L, Lmoe = len(stage.layers), len(stage.moe_layers(model))
    out: list[Traffic] = []
    phases = ("forward", "backward") if train else ("forward",)

    def add(strategy, what, phase, prim, group, sizes, overlap="exposed"):
        sizes = tuple((c, n) for c, n in sizes if c > 0 and n > 0)
        if sizes:
            out.append(Traffic(strategy, what, phase, prim, group, sizes, overlap))

    # --- tensor parallel: two per layer and pass (attention out, MLP out), Megatron's f and g ----------
    if layout.tp > 1:
        for ph in phases:
            if layout.sp:
                add("TP+SP", "layer activations", ph, "reduce_scatter", "tp", [(2 * L * m, act)])
                add("TP+SP", "layer activations", ph, "allgather", "tp", [(2 * L * m, act)])
            else:
                add("TP", "layer activations", ph, "allreduce", "tp", [(2 * L * m, act)])
        # the vocab-parallel embedding's output (forward), the head's input gradient (backward)
        prim = "reduce_scatter" if layout.sp else "allreduce"
        name = "TP+SP" if layout.sp else "TP"
        if stage.first:
            add(name, "embedding output", "forward", prim, "tp", [(m, act)])
        if stage.last and train:
            add(name, "output head input grad", "backward", prim, "tp", [(m, act)])
        if stage.last and layout.sp:
            add(name, "output head input", "forward", "allgather", "tp", [(m, act)])

    # --- expert parallel: dispatch and combine all-to-alls per MoE layer and pass -------------------------
    if layout.ep > 1 and Lmoe:
        tokens = model.micro_batch_size * model.seq_len // (layout.tp if layout.sp else 1)
        a2a = int(tokens * model.top_k * model.hidden * e * model.capacity_factor)
        for ph in phases:
            add("EP", "token dispatch + combine", ph, "alltoall", "ep", [(2 * Lmoe * m, a2a)])

    # --- pipeline: activations forward, their gradients backward, per micro-batch ----------------------
    if layout.pp > 1:
        p2p = act // (layout.tp if layout.sp else 1)
        if not stage.last:
            add("PP", "activations to next stage", "forward", "send/recv", "pp", [(m, p2p)])
        if not stage.first and train:
            add("PP", "activation grads to previous stage", "backward", "send/recv", "pp", [(m, p2p)])

    # --- data parallel: gradients (and with ZeRO, parameters) ------------------------------------------
    dense, expert = stage_params(model, layout, stage)
    bucket = int(layout.bucket_mb * (1 << 20))
    groups = [("dp", dense, layout.dp, ""), ("edp", expert, layout.dp // layout.ep, " (experts)")]
    for kind, params, size, tag in groups:
        if size < 2 or params == 0:
            continue
        if layout.zero == 3:
            _fsdp(add, model, layout, stage, kind, tag, m, train)
        elif not train:
            continue
        elif layout.zero == 0:
            add("DP", "gradients" + tag, "step", "allreduce", kind, buckets(params * g, bucket), "overlappable")
        else:
            z = f"ZeRO-{layout.zero}"
            add(z, "gradients" + tag, "step", "reduce_scatter", kind, buckets(params * g, bucket), "overlappable")
            add(z, "parameters" + tag, "step", "allgather", kind, buckets(params * e, bucket), "overlappable")
    return out


def _fsdp(add, model: Model, layout: Layout, stage: Stage, kind: str, tag: str, m: int, train: bool):
    """ZeRO-3 / FSDP: one unit per layer (and per embedding matrix): gathered before its forward and its
    backward, its gradients reduce-scattered after its backward, every micro-batch."""
    e, g = model.itemsize, model.grad_itemsize
    if kind == "dp":
        units = [model.layer_params(i)[0] // layout.tp for i in stage.layers]
        units += [model.embedding_params // layout.tp] * embedding_units(model, stage, layout.pp)
    else:
        units = [model.layer_params(i)[1] // (layout.tp * layout.ep) for i in stage.moe_layers(model)]
    sizes: dict[int, int] = {}
    for u in units:
        sizes[u] = sizes.get(u, 0) + m
    by_size = sorted(sizes.items(), key=lambda kv: -kv[0])
    add("ZeRO-3", "parameters" + tag, "forward", "allgather", kind, [(c, u * e) for u, c in by_size], "overlappable")
    if train:
        add("ZeRO-3", "parameters" + tag, "backward", "allgather", kind, [(c, u * e) for u, c in by_size],
            "overlappable")
        add("ZeRO-3", "gradients" + tag, "backward", "reduce_scatter", kind, [(c, u * g) for u, c in by_size],
            "overlappable")


def micro_batches(model: Model, layout: Layout) -> int:
    """The layout's micro-batches, else the model's global batch over dp x micro-batch size (at least 1)."""
    if layout.micro_batches:
        return layout.micro_batches
    return max(1, math.ceil(model.global_batch / (layout.dp * model.micro_batch_size)))


def stage_flops(model: Model, layout: Layout, stage: Stage, train: bool = True) -> float:
    """FLOPs one rank of ``stage`` computes in a step: forward FLOPs per token (``Model.layer_flops``) of
    its layers (and the head on the last stage) x ``b*s*m`` tokens / ``tp``, x3 when training."""
    per_token = sum(model.layer_flops(i) for i in stage.layers) + (model.head_flops if stage.last else 0.0)
    tokens = model.micro_batch_size * model.seq_len * micro_batches(model, layout)
    return per_token * tokens / layout.tp * (3.0 if train else 1.0)
