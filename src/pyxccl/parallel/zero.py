"""ZeRO over a data-parallel Group: stages 1 and 2 (:class:`ZeroOptimizer`), stage 3 (:class:`FullyShardedModule`).

The parameters (of a module, or of each bucket/unit) are flattened into one buffer padded to a
multiple of N = ``group.size``; rank r owns the shard of elements ``[r*S, (r+1)*S)``, S = padded/N.
What each stage keeps on a rank (Ψ the padded parameter count):

- stage 1: full parameters and full gradients (until ``step``), optimizer state for S = Ψ/N only.
- stage 2: full parameters; a bucket's full gradients only until its reduce-scatter (run as soon as
  backward has produced all of them), then only its shard's gradient; optimizer state Ψ/N.
- stage 3: only the shards (Ψ/N) and their gradients and optimizer state; a unit's full parameters
  exist only while its forward runs and again while its backward recomputes that forward.

Traffic per step: stages 1/2 reduce-scatter the gradients (Ψ) and all-gather the parameters (Ψ): 2Ψ;
stage 3 all-gathers each unit in forward and again in backward and reduce-scatters its gradient: 3Ψ.
Gradients are the mean over ranks (summed by the reduce-scatter, divided by N), as DDP's.
Every rank must start from the same parameters (same seed): nothing is broadcast.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from .._errors import InvalidArgumentError
from . import ops


def _me():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def _fail(op: str, msg: str):
    raise InvalidArgumentError(f"rank {_me()}: {op}: {msg}", rank=_me(), op=op)


def _check_group(group, op: str):
    if not all(hasattr(group, a) for a in ("name", "ranks", "rank", "pg")) or group.size < 1:
        _fail(op, f"group must be a pyxccl.parallel Group (e.g. ParallelGroups(...).dp), got {group!r}")


class FlatShard:
    """The layout of named parameters flattened into ``padded`` elements (a multiple of N);
    this rank's shard is ``[lo, lo + shard_numel)``."""

    def __init__(self, named, group):
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.numel = sum(self.numels)
        self.padded = -(-self.numel // group.size) * group.size
        self.shard_numel = self.padded // group.size
        self.lo = group.rank * self.shard_numel
        self.group = group

    def flatten(self, tensors) -> torch.Tensor:
        """One padded flat buffer of ``tensors`` (None: zeros)."""
        parts = [torch.zeros(n) if t is None else t.detach().reshape(-1) for t, n in zip(tensors, self.numels)]
        return torch.cat(parts + [parts[0].new_zeros(self.padded - self.numel)])

    def shard_of(self, tensors) -> torch.Tensor:
        return self.flatten(tensors)[self.lo:self.lo + self.shard_numel].clone()

    def views(self, flat: torch.Tensor):
        """Each parameter's view of a full flat buffer."""
        return [v.view(s) for v, s in zip(flat[:self.numel].split(self.numels), self.shapes)]

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The full flat buffer from every rank's shard (one all-gather of ``padded`` elements)."""
        full = shard.new_empty(self.padded)
        ops.all_gather(full, shard.detach(), self.group)
        return full

    def scatter_mean(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the mean over ranks of ``flat`` (one reduce-scatter of ``padded`` elements)."""
        out = flat.new_empty(self.shard_numel)
        ops.reduce_scatter(out, flat, self.group)
        return out.div_(self.group.size)


class ZeroOptimizer:
    """ZeRO stage 1 or 2 (like torch's ZeroRedundancyOptimizer): ``optimizer(**optim_kw)`` runs over
    this rank's shard only; ``step()`` (after backward) reduce-scatters the gradients, updates the
    shard and all-gathers the parameters back into ``module``.

    Stage 1: one bucket (the whole module), reduce-scattered in ``step()``.
    Stage 2: one bucket per top-level child of ``module`` (parameter names' first component); a
    bucket is reduce-scattered from a post-accumulate-grad hook as soon as backward has produced all
    its gradients, and its full gradients are freed (``p.grad = None``): only the shard's remains.

    >>> g = ParallelGroups(tp=1)                                            # doctest: +SKIP
    >>> opt = ZeroOptimizer(model, g.dp, stage=2, optimizer=torch.optim.Adam, lr=1e-3)
    >>> loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, module: nn.Module, group, stage: int = 1, optimizer=torch.optim.Adam, **optim_kw):
        _check_group(group, "ZeroOptimizer")
        if stage not in (1, 2, 3):
            _fail("ZeroOptimizer", f"stage must be 1, 2 or 3, got {stage!r}")
        if stage == 3:
            _fail("ZeroOptimizer", "stage 3 shards the parameters too: wrap the model's units in "
                                   "FullyShardedModule(units, group) and use a plain optimizer on its parameters")
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            _fail("ZeroOptimizer", "the module has no trainable parameters; pass the module to be trained")
        buckets: dict[str, list] = {}
        for n, p in named:
            buckets.setdefault(n.split(".")[0] if stage == 2 else "", []).append((n, p))
        self.stage, self.group = stage, group
        self.buckets = [FlatShard(b, group) for b in buckets.values()]
        self._params = [[p for _, p in b] for b in buckets.values()]
        self.shards = [nn.Parameter(fs.shard_of(ps)) for fs, ps in zip(self.buckets, self._params)]
        self.optimizer = optimizer(self.shards, **optim_kw)
        self._arrived = [0] * len(self.buckets)
        self._hooks = []
        if stage == 2:
            for i, ps in enumerate(self._params):
                for p in ps:
                    self._hooks.append(p.register_post_accumulate_grad_hook(functools.partial(self._ready, i)))

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def _ready(self, i: int, _param) -> None:
        # stage 2: backward produced one more gradient of bucket i; when all have come, scatter them
        self._arrived[i] += 1
        if self._arrived[i] == len(self._params[i]):
            self._reduce(i)

    @torch.no_grad()
    def _reduce(self, i: int) -> None:
        ps, fs, shard = self._params[i], self.buckets[i], self.shards[i]
        self._arrived[i] = 0
        if all(p.grad is None for p in ps):
            return          # no gradient this step (every rank alike): the optimizer skips the shard
        g = fs.scatter_mean(fs.flatten([p.grad for p in ps]))
        shard.grad = g if shard.grad is None else shard.grad.add_(g)      # accumulation over backwards
        for p in ps:
            p.grad = None   # the full gradient is no longer needed: only the shard's is kept

    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter what is left of the gradients, update the shards, all-gather the parameters."""
        for i in range(len(self.buckets)):
            self._reduce(i)         # stage 1: every bucket; stage 2: buckets with unused parameters
        self.optimizer.step()
        for fs, ps, shard in zip(self.buckets, self._params, self.shards):
            for p, v in zip(ps, fs.views(fs.gather(shard))):
                p.copy_(v)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for ps in self._params:
            for p in ps:
                p.grad = None


class _Gather(torch.autograd.Function):
    """Forward: all-gather a unit's full flat parameters from the shards; backward: reduce-scatter
    the full gradient to this rank's shard (the mean over ranks)."""

    @staticmethod
    def forward(ctx, shard, fs):
        ctx.fs = fs
        return fs.gather(shard)

    @staticmethod
    def backward(ctx, grad):
        return ctx.fs.scatter_mean(grad.contiguous()), None


class FullyShardedModule(nn.Module):
    """ZeRO stage 3 (FSDP-like): ``units`` (a list of modules or an nn.Sequential) run one after
    the other; each unit's parameters live only as a flat shard (``shards[str(i)]``, an
    nn.Parameter of S elements); the unit's own parameters are removed.

    Forward of a unit all-gathers its full flat parameters and runs it on views of them
    (``torch.func.functional_call``) inside ``torch.utils.checkpoint`` (non-reentrant), so the full
    parameters and the unit's activations are not kept: backward recomputes the unit's forward
    (the second all-gather) and :class:`_Gather`'s backward reduce-scatters the gradient to the
    shard (mean over ranks). Use any torch optimizer over ``parameters()`` (the shards).

    >>> m = FullyShardedModule(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), g.dp)   # doctest: +SKIP
    >>> opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    >>> loss_fn(m(x), y).backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, units, group):
        super().__init__()
        _check_group(group, "FullyShardedModule")
        units = list(units)
        if not units or not all(isinstance(u, nn.Module) for u in units):
            _fail("FullyShardedModule", "units must be a non-empty list of nn.Module (or an nn.Sequential)")
        self.group = group
        self.units = nn.ModuleList(units)
        self.flats: list[FlatShard | None] = []
        self.shards = nn.ParameterDict()
        for i, u in enumerate(units):
            named = list(u.named_parameters())
            if not named:
                self.flats.append(None)
                continue
            fs = FlatShard(named, group)
            self.flats.append(fs)
            self.shards[str(i)] = nn.Parameter(fs.shard_of([p for _, p in named]))
            for n, _ in named:          # from now on the parameters exist only as the shard
                owner, _, leaf = n.rpartition(".")
                del u.get_submodule(owner)._parameters[leaf]

    def _run(self, i: int, x, shard):
        fs = self.flats[i]
        full = _Gather.apply(shard, fs)
        return functional_call(self.units[i], dict(zip(fs.names, fs.views(full))), (x,))

    def forward(self, x):
        for i, u in enumerate(self.units):
            if self.flats[i] is None:
                x = u(x)
            elif torch.is_grad_enabled():
                x = checkpoint(self._run, i, x, self.shards[str(i)], use_reentrant=False)
            else:
                x = self._run(i, x, self.shards[str(i)])        # inference: one gather, nothing kept
        return x

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every full parameter, named ``"{unit}.{name}"`` as in an nn.Sequential of the units
        (collective: one all-gather per unit)."""
        out = {}
        for i, fs in enumerate(self.flats):
            if fs is not None:
                for n, v in zip(fs.names, fs.views(fs.gather(self.shards[str(i)]))):
                    out[f"{i}.{n}"] = v.clone()
        return out
