"""How a training job is laid out on ranks, and where each communication group lands.

Rank order follows Megatron-LM: tensor parallel (TP) innermost, then data parallel (DP), then
pipeline (PP) outermost, ``rank = tp_rank + tp * (dp_rank + dp * pp_rank)``; expert parallel (EP)
groups are made of ``ep`` neighbouring DP ranks (EP divides DP, as in Megatron and DeepSpeed-MoE).
With hosts of ``per_host`` ranks filled in rank order, a TP group of up to ``per_host`` ranks sits in
one host (NVLink), DP, EP and PP groups cross hosts once ``tp`` (``tp*ep``, ``tp*dp``) fills one.

>>> g = Layout(dp=16, tp=8).group("dp", per_host=8)
>>> (g.size, g.hosts, g.per_host, g.groups_per_host)
(16, 16, 1, 8)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

STRIDE_DIMS = ("tp", "dp", "ep", "edp", "pp")


@dataclass(frozen=True)
class Group:
    """The ranks of one communication group as the hosts see them: ``hosts`` hosts with ``per_host`` of
    its ranks each; ``groups_per_host`` groups of this kind share a host (and its NICs) at once."""
    kind: str
    size: int
    hosts: int
    per_host: int
    groups_per_host: int

    @property
    def crosses_hosts(self) -> bool:
        return self.hosts > 1

    def describe(self, hw) -> str:
        if self.size == 1:
            return "1 rank"
        if self.hosts == 1:
            return f"{self.size} in 1 host, {hw.intra.name}"
        nic = _nic_text(min(hw.nics / self.groups_per_host, self.per_host * hw.nics_per_gpu))    # Hardware.cluster's
        return f"{self.hosts} hosts x {self.per_host}, {hw.inter.name} ({nic})"


def _nic_text(x: float) -> str:
    if x >= 1 and float(x).is_integer():
        return f"{int(x)} NIC{'s' if x > 1 else ''}"
    return f"{x:.3g} NIC"


@dataclass(frozen=True)
class Layout:
    """Degrees of parallelism of a training job.

    ``dp`` x ``tp`` x ``pp`` ranks; ``micro_batches``: micro-batches per step and pipeline (gradient
    accumulation steps; default: the model's global batch over ``dp`` x its micro-batch size);
    ``ep``: expert parallel degree (divides ``dp``); ``sp``: Megatron sequence parallelism in the TP
    group; ``zero``: 0 (plain DP), 1, 2 (sharded optimizer / gradients) or 3 (sharded parameters:
    ZeRO-3, FSDP); ``bucket_mb``: MiB per gradient bucket (DDP's default 25).

    >>> Layout(dp=4, tp=2, pp=2).world
    16
    """
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int | None = None
    ep: int = 1
    sp: bool = False
    zero: int = 0
    bucket_mb: float = 25.0

    def __post_init__(self):
        for k in ("dp", "tp", "pp", "ep"):
            if getattr(self, k) < 1:
                raise ValueError(f"layout: {k} must be at least 1, not {getattr(self, k)}")
        if self.micro_batches is not None and self.micro_batches < 1:
            raise ValueError(f"layout: micro_batches must be at least 1, not {self.micro_batches}")
        if self.dp % self.ep:
            raise ValueError(f"layout: ep={self.ep} must divide dp={self.dp} (expert parallel groups are made of "
                             f"data parallel ranks)")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"layout: zero must be 0, 1, 2 or 3 (3 = FSDP), not {self.zero}")
        if self.sp and self.tp == 1:
            raise ValueError("layout: sp (sequence parallelism) shards the TP group's activations: it needs tp > 1")
        if self.bucket_mb <= 0:
            raise ValueError(f"layout: bucket_mb must be positive, not {self.bucket_mb}")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def stride_size(self, kind: str) -> tuple[int, int]:
        """(rank stride, size) of a group of ``kind``: tp, dp, ep, edp (the DP group of expert
        parameters: ranks holding the same experts) or pp."""
        return {"tp": (1, self.tp), "dp": (self.tp, self.dp), "ep": (self.tp, self.ep),
                "edp": (self.tp * self.ep, self.dp // self.ep), "pp": (self.tp * self.dp, self.pp)}[kind]

    def group(self, kind: str, per_host: int) -> Group:
        """Where the group of ``kind`` holding rank 0 lands on hosts of ``per_host`` ranks (every group
        of a kind lands the same way)."""
        stride, size = self.stride_size(kind)
        ranks = [i * stride for i in range(size)]
        hosts: dict[int, int] = {}
        for r in ranks:
            hosts[r // per_host] = hosts.get(r // per_host, 0) + 1
        k = max(hosts.values())
        on_host = min(per_host, self.world)           # ranks busy on a host
        return Group(kind, size, len(hosts), k, max(1, on_host // k))

    def ranks_on_host(self, per_host: int) -> int:
        return min(per_host, self.world)

    def to_json(self) -> dict:
        return asdict(self)
