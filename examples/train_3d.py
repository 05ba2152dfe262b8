"""A small GPT trained with DP x TP x PP on pyxccl, on the standard library's own source text.

    pyxccl run -n 8 examples/train_3d.py                 # tp 2 x pp 2 x dp 2
    pyxccl run -n 4 examples/train_3d.py                 # tp 2 x pp 2 x dp 1

Bytes of every ``*.py`` file of this Python's standard library (no download) are the corpus, a byte
is a token (vocabulary 256). The model: token and position embeddings, ``layers`` pre-LayerNorm
transformer blocks split over ``pp`` pipeline stages (1F1B, ``microbatches`` per step), each block
split over ``tp`` ranks (Megatron: 2 allreduces forward, 2 backward), the gradients of each stage
averaged over ``dp`` replicas in buckets during backward. Every rank builds the same seeded dense
model and keeps its stage and its TP shard of it.

Prints the loss as it goes down, then each group's traffic of the last step (rank 0 and the last
stage's first rank), and whether every rank's calls and bytes equal the brief's formulas.
"""
from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pyxccl.torch  # noqa: F401  (registers the "pyxccl" backend)
from pyxccl.parallel import ParallelGroups, traffic
from pyxccl.parallel.data import GradientReducer
from pyxccl.parallel.pipeline import Pipeline
from pyxccl.parallel.tensor import ParallelTransformerBlock, TransformerBlock


def corpus(limit: int = 8 << 20) -> torch.Tensor:
    """The standard library's Python source, as bytes (at most ``limit``), in a fixed file order."""
    out, n = [], 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in f.parts or n >= limit:
            continue
        b = f.read_bytes()
        out.append(b)
        n += len(b)
    return torch.frombuffer(bytearray(b"".join(out)[:limit]), dtype=torch.uint8).long()


class Embed(nn.Module):
    def __init__(self, vocab, seq, hidden):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)

    def forward(self, ids):
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1]))


class Head(nn.Module):
    def __init__(self, hidden, vocab):
        super().__init__()
        self.ln, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.ln(x))


def build_stage(a, groups) -> nn.Sequential:
    """The same seeded dense GPT on every rank; keep this rank's stage, its blocks split over TP."""
    torch.manual_seed(0)
    embed, head = Embed(256, a.seq, a.hidden), Head(a.hidden, 256)
    blocks = [TransformerBlock(a.hidden, a.heads) for _ in range(a.layers)]
    pp, s = groups.sizes["pp"], groups.pp_index
    per = a.layers // pp
    mine = [ParallelTransformerBlock.from_dense(b, groups.tp) for b in blocks[s * per:(s + 1) * per]]
    return nn.Sequential(*([embed] if groups.first_stage else []), *mine, *([head] if groups.last_stage else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="sequences per DP replica and step")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("pyxccl")
    groups = ParallelGroups(tp=a.tp, pp=a.pp)
    me = dist.get_rank()
    if me == 0:
        print(groups.layout(), flush=True)
    data = corpus()
    stage = build_stage(a, groups)
    b = a.batch // a.microbatches
    pipe = Pipeline(stage, groups.pp, microbatches=a.microbatches, schedule="1f1b", act_shape=(b, a.seq, a.hidden),
                    loss_fn=lambda logits, y: F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)))
    # pipeline backward runs once per micro-batch: reduce on the last one
    ddp = GradientReducer(stage, groups.dp, accumulate=a.microbatches)
    opt = torch.optim.AdamW(stage.parameters(), lr=a.lr)
    reporter = groups.last_stage and groups.tp_index == 0 and groups.dp_index == 0
    t0 = time.perf_counter()
    for step in range(a.steps):
        # each DP replica its own windows; TP ranks and stages of a replica the same ones
        g = torch.Generator().manual_seed(step * 1000 + groups.dp_index)
        starts = torch.randint(0, len(data) - a.seq - 1, (a.batch,), generator=g)
        window = torch.stack([data[i:i + a.seq + 1] for i in starts.tolist()])
        traffic.reset()
        loss = pipe.step(window[:, :-1] if groups.first_stage else None, window[:, 1:] if groups.last_stage else None)
        ddp.finish()
        opt.step()
        opt.zero_grad()
        rows = traffic.step()
        if groups.last_stage:
            # the mean over DP replicas, for the printout only (not the model's traffic: not counted)
            dist.all_reduce(loss, group=groups.dp.pg)
            if reporter and (step % 5 == 0 or step == a.steps - 1):
                print(f"step {step:>3}  loss {loss.item() / groups.dp.size:.3f}  "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
    # what the brief's formulas say this rank moves per step: (calls, bytes) per group and primitive
    G, per, m = b * a.seq * a.hidden * 4, a.layers // a.pp, a.microbatches
    p2p = m * (not groups.last_stage) + m * (not groups.first_stage)
    want = {("dp", "all_reduce"): (len(ddp.buckets), sum(p.numel() * 4 for p in stage.parameters()))}
    if a.tp > 1:
        want[("tp", "all_reduce")] = (4 * per * m, 4 * per * m * G)      # 2 per block forward, 2 backward
    if a.pp > 1:
        want[("pp", "send")] = want[("pp", "recv")] = (p2p, p2p * G)    # m activations on, m gradients back
    got = {(r.group, r.op): (r.calls, r.bytes) for r in rows}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (rows, got == want, got, want))
    if me == 0:
        last = (a.pp - 1) * groups.sizes["dp"] * a.tp
        print(f"\n# per step and rank (seeds/001): tp all_reduce 2 per block forward + 2 backward x {per} blocks x "
              f"{m} micro-batches = {4 * per * m} calls of b*s*h*4 = {G} B; pp send and recv of {m} activations and "
              f"{m} gradients of {G} B per stage boundary; dp all_reduce of the stage's gradients, one per bucket")
        for r in sorted({0, last}):
            print("\n" + traffic.table(every[r][0], f"# rank {r} (stage {r // (groups.sizes['dp'] * a.tp)}), last step"))
        bad = [(r, g, w) for r, (_, ok, g, w) in enumerate(every) if not ok]
        print("\n# every rank's calls and bytes equal the formulas" if not bad else
              "\n# MISMATCH with the formulas (rank, counted, formula): " + repr(bad))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
