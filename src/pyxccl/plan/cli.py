"""``pyxccl plan``: the planner on the command line (``estimate`` with flags; a table or ``--json``).

    pyxccl plan --model gpt3-175b --hardware dgx-a100 --dp 8 --tp 8 --pp 8
    pyxccl plan --model llama-70b --hardware dgx-h100 --dp 16 --tp 8 --zero 3 --json
    pyxccl plan --model my-model.toml --measured --gpu a100-sxm --dp 4
    pyxccl plan --list
"""
from __future__ import annotations

import argparse
import json
import sys

from ..sim.calibrated import LAUNCH_MODES, Pricing, newest_version
from .model import ITEMSIZE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Estimate one rank's communication in one training step: each primitive, its calls, "
                     "bytes, link class and time with the algorithm pyxccl's tuner would choose (simulated), "
                     "the share of the step, and the brief's verdict above 30%.")
    p.epilog = "presets: pyxccl plan --list; formulas and sources: docs/plan.md"
    w = p.add_argument_group("what to train")
    w.add_argument("--model", default="gpt3-175b", help="a preset name or a file.toml (default gpt3-175b)")
    w.add_argument("--micro-batch-size", type=int, default=None, help="sequences per micro-batch and rank")
    w.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    w.add_argument("--global-batch", type=int, default=None, help="sequences per optimizer step")
    w.add_argument("--dtype", choices=sorted(ITEMSIZE), default=None, help="activations and parameters")
    w.add_argument("--grad-dtype", choices=sorted(ITEMSIZE), default=None, help="gradients (default: dtype)")
    w.add_argument("--forward-only", action="store_true", help="one forward pass (inference): no backward, no gradients")
    lay = p.add_argument_group("layout")
    for k, h in (("dp", "data parallel"), ("tp", "tensor parallel (inside a host while it fits)"),
                 ("pp", "pipeline stages"), ("ep", "expert parallel (divides dp)")):
        lay.add_argument(f"--{k}", type=int, default=1, help=f"{h} degree (default 1)")
    lay.add_argument("--micro-batches", type=int, default=None,
                     help="micro-batches per step (default: global batch / (dp x micro-batch size))")
    lay.add_argument("--sp", action="store_true", help="Megatron sequence parallelism in the TP group")
    lay.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage (3 = FSDP)")
    lay.add_argument("--fsdp", action="store_true", help="the same as --zero 3")
    lay.add_argument("--bucket-mb", type=float, default=25.0, help="MiB per gradient bucket (default 25, DDP's)")
    hw = p.add_argument_group("hardware")
    hw.add_argument("--hardware", default="dgx-a100", help="a preset name or a file.toml (default dgx-a100)")
    hw.add_argument("--measured", action="store_true",
                    help="the links pyxccl measured on this machine (shared memory, TCP); compute from --gpu")
    hw.add_argument("--gpu", default=None, help="GPU for the compute figures (default: the hardware's; "
                                                "with --measured a100-sxm)")
    hw.add_argument("--per-host", type=int, default=None, help="ranks per host (default: the hardware's)")
    hw.add_argument("--launch", choices=LAUNCH_MODES, default="per-gpu",
                    help="how the job is started, for NCCL's rows (whole DGX nodes): per-gpu (default: one process "
                         "per GPU, as torchrun and mpirun launch) or single-process (one process drives a node's GPUs)")
    hw.add_argument("--nccl-version", default=None,
                    help="the NCCL release NCCL's rows are priced with (default: the newest ported, "
                         f"{newest_version()})")
    hw.add_argument("--raw", action="store_true",
                    help="NCCL's model without the figures fitted to published nccl-tests measurements (sim/fitted.py)")
    hw.add_argument("--mfu", type=float, default=0.5, help="fraction of the GPU's peak the compute reaches (0.5)")
    hw.add_argument("--compute-ms", type=float, default=None,
                    help="compute time per step in ms (instead of FLOPs / (peak x MFU))")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--list", action="store_true", help="list the model and hardware presets and exit")
    p.add_argument("--list-hardware", action="store_true",
                   help="list the hardware presets, link classes and GPUs with their figures and sources, and exit")


def main(a: argparse.Namespace) -> int:
    from . import Layout, estimate, hardware, load_model, model_presets
    if a.list_hardware:
        print(_hardware_list())
        return 0
    if a.list:
        print("models:   " + ", ".join(model_presets()))
        print("hardware: " + ", ".join(hardware.names()))
        print("links:    " + ", ".join(hardware.link_names()))
        print("gpus:     " + ", ".join(hardware.gpu_names()))
        return 0
    try:
        model = load_model(a.model).with_(micro_batch_size=a.micro_batch_size, seq_len=a.seq_len,
                                          global_batch=a.global_batch, dtype=a.dtype, grad_dtype=a.grad_dtype)
        layout = Layout(dp=a.dp, tp=a.tp, pp=a.pp, micro_batches=a.micro_batches, ep=a.ep, sp=a.sp,
                        zero=3 if a.fsdp else a.zero, bucket_mb=a.bucket_mb)
        if a.measured:
            hw = hardware.measured(a.per_host, a.gpu or "a100-sxm")
        else:
            hw = hardware.load(a.hardware)
            if a.gpu:
                hw = hw.with_gpu(a.gpu)
            if a.per_host:
                hw = hw.with_per_host(a.per_host)
        plan = estimate(model, layout, hw, mfu=a.mfu, train=not a.forward_only,
                        compute_time=None if a.compute_ms is None else a.compute_ms / 1e3,
                        pricing=Pricing(a.nccl_version or "", a.launch, a.raw))
    except (ValueError, OSError) as e:
        print(f"pyxccl plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_json(), indent=1, ensure_ascii=False) if a.json else plan.table())
    return 0


def _hardware_list() -> str:
    """Every machine, link class and GPU preset with its figures and source."""
    from . import hardware
    out = ["machines:"]
    for n in hardware.names():
        hw = hardware.load(n)
        out.append(f"  {n:16} {hw.per_host} x {hw.gpu.name}, inside {hw.intra.name}, between hosts {hw.nics} x "
                   f"{hw.inter.name}\n  {'':16} source: {hw.source}")
    out.append("links (per direction):")
    for n in hardware.link_names():
        s = hardware.load_link(n)
        out.append(f"  {n:16} {s.bandwidth / 1e9:7.4g} GB/s  {s.latency * 1e6:5.3g} us{'  shared bus' if s.shared else ''}"
                   f"\n  {'':16} source: {s.source}")
    out.append("gpus (dense peak):")
    for n in hardware.gpu_names():
        g = hardware.load_gpu(n)
        fl = ", ".join(f"{k} {v / 1e12:g}" for k, v in g.flops.items())
        out.append(f"  {n:16} TFLOP/s {fl}; HBM {g.hbm / 1e9:g} GB/s\n  {'':16} source: {g.source}")
    return "\n".join(out)
