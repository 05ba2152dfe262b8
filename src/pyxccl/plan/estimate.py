"""``estimate(model, layout, hardware)``: the traffic of every pipeline stage priced, compute from FLOPs,
the slowest stage reported.

Compute time of a rank = its FLOPs (``traffic.stage_flops``: about 6 x parameters x tokens for a
training step, split over the ranks) / (the GPU's peak for the model's dtype x ``mfu``, default 0.5),
or ``compute_time`` when given (seconds per step, e.g. measured). The pipeline bubble of 1F1B adds
``compute * (p-1)/m``: a share ``(p-1)/(m+p-1)`` of the pipeline's time. The communication share is
``comm / (compute + bubble + comm)`` with nothing overlapped (the brief's way of counting, seeds/003:
10/(50+10)); the overlapped share lets overlappable traffic hide behind compute.
"""
from __future__ import annotations

import math

from .hardware import Hardware
from .layout import Layout
from .model import Model
from ..sim.calibrated import Pricing
from .price import price
from .result import Plan, Row, verdict
from .traffic import micro_batches, stage_flops, stages, traffic

MFU = 0.5


def estimate(model: Model, layout: Layout, hardware: Hardware, *, mfu: float = MFU, compute_time: float | None = None,
             train: bool = True, pricing: Pricing | None = None) -> Plan:
    """Estimate one training step (``train=False``: one forward pass) of ``model`` laid out as ``layout``
    on ``hardware``: the calls of the slowest pipeline stage's rank, priced by the simulator (groups of
    whole DGX nodes by NCCL's model, as ``pricing`` says: ``sim.calibrated.Pricing``, default the newest
    release, one process per GPU, with the fitted figures).

    >>> from pyxccl.plan import Layout, estimate, hardware, load_model
    >>> p = estimate(load_model("llama-7b"), Layout(dp=2, tp=8, micro_batches=4), hardware.load("dgx-a100"))
    >>> [(r.strategy, r.primitive, r.calls) for r in p.rows][:2]
    [('TP', 'allreduce', 256), ('TP', 'allreduce', 256)]
    """
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu={mfu}: give a fraction of the peak in (0, 1]")
    if compute_time is not None and compute_time < 0:
        raise ValueError(f"compute_time={compute_time}: give seconds per step, >= 0")
    m = micro_batches(model, layout)
    peak = hardware.gpu.peak(model.dtype)
    pricing = pricing or Pricing()
    best = None
    seen: dict = {}
    by_nccl = False
    for st in stages(model, layout.pp):
        # stages alike in what they hold cost alike: price one of each
        sig = (len(st.layers), len(st.moe_layers(model)), st.first, st.last)
        if sig in seen:
            continue
        priced = [price(t, layout, hardware, model.itemsize, pricing) for t in traffic(model, layout, st, train)]
        by_nccl = by_nccl or any(p.model == "nccl" for p in priced)
        rows = [_row(p) for p in priced]
        flops = stage_flops(model, layout, st, train)
        comp = compute_time if compute_time is not None else flops / (peak * mfu)
        seen[sig] = (st.index, rows, flops, comp)
        step = comp * (1 + (layout.pp - 1) / m) + sum(r.time for r in rows)
        if best is None or step > best[0]:
            best = (step, st.index, rows, flops, comp)
    _, index, rows, flops, comp = best
    plan = _plan(model, layout, hardware, rows, index, flops, comp, m, mfu, compute_time, peak, train)
    if by_nccl:     # say which figures NCCL's rows are (the ones `pyxccl sim` prints for the same call)
        figures = pricing.describe("nccl", hardware.name, nccl=True)
        plan.settings["nccl_figures"] = figures
        plan.notes.append(f"rows with a protocol (Algorithm/Protocol) are NCCL's model on whole DGX nodes: "
                          f"{pricing.words(figures, 'nccl', hardware.name)}")
    return plan


def _row(p) -> Row:
    t = p.traffic
    return Row(t.strategy, t.what, t.phase, t.primitive, t.group, p.group.size, p.link, p.link_class, t.calls,
               max(n for _, n in t.sizes), t.total_bytes, p.sent_per_call, p.sent, p.algorithm, p.time_per_call,
               p.time, t.overlap)


def _plan(model, layout, hw, rows, index, flops, comp, m, mfu, compute_time, peak, train) -> Plan:
    comm = sum(r.time for r in rows)
    exposed = sum(r.time for r in rows if r.overlap == "exposed")
    overl = comm - exposed
    bubble_fraction = (layout.pp - 1) / (m + layout.pp - 1)
    bubble = comp * (layout.pp - 1) / m
    step = comp + bubble + comm
    hidden = min(overl, comp)                 # overlappable traffic hides behind at most the compute
    step_ov = step - hidden
    share = comm / step if step > 0 else 0.0
    share_ov = (comm - hidden) / step_ov if step_ov > 0 else 0.0
    totals = {
        "world": layout.world, "hosts": math.ceil(layout.world / hw.per_host), "micro_batches": m,
        "global_batch": layout.dp * model.micro_batch_size * m,
        "calls": sum(r.calls for r in rows), "total_bytes": sum(r.total_bytes for r in rows),
        "sent": sum(r.sent for r in rows),
        "comm_time": comm, "exposed_time": exposed, "overlappable_time": overl,
        "compute_flops": flops, "compute_time": comp, "bubble_fraction": bubble_fraction, "bubble_time": bubble,
        "step_time": step, "step_time_overlapped": step_ov, "comm_share": share, "comm_share_overlapped": share_ov,
        "by_link": {k: sum(r.time for r in rows if r.link_class == k) for k in ("intra", "inter")},
    }
    if compute_time is not None:
        src = "given"
    else:
        src = (f"{flops:.3g} FLOPs at {hw.gpu.name}'s {peak / 1e12:.4g} TFLOP/s {model.dtype} peak x MFU {mfu}")
    settings = {"mfu": mfu, "train": train, "compute_time_given": compute_time, "peak_flops": peak,
                "compute_source": src, "bucket_mb": layout.bucket_mb}
    notes = []
    if hw.measured:
        notes.append(f"links measured on this machine ({hw.source}); compute from {hw.gpu.name}")
    if layout.micro_batches is None and model.global_batch % (layout.dp * model.micro_batch_size):
        notes.append(f"global batch {model.global_batch} is not a multiple of dp x micro-batch size: rounded up to "
                     f"{totals['global_batch']}")
    if layout.micro_batches and totals["global_batch"] != model.global_batch:
        notes.append(f"{m} micro-batches of {model.micro_batch_size} on {layout.dp} DP ranks make a global batch of "
                     f"{totals['global_batch']} sequences (the model's is {model.global_batch})")
    return Plan(model.to_json(), layout.to_json(), hw.to_json(), settings, index, rows, totals,
                verdict(share, rows), notes)
