"""What the planner answers: one row per kind of call of one rank's training step, the totals, and
the brief's verdict when communication takes more than 30% of the step.

>>> from pyxccl.plan import Layout, estimate, load_model, hardware      # doctest: +SKIP
>>> p = estimate(load_model("llama-7b"), Layout(dp=8, tp=8), hardware.load("dgx-a100"))  # doctest: +SKIP
>>> print(p.table())                                                    # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: the brief's rule (seeds/000): communication above 30% of the step is the bottleneck
THRESHOLD = 0.30
SOURCE = "seeds/000 (集合通信), section 通信性能分析"
QUOTE = ("如果通信时间占比超过 30%，说明通信成为瓶颈，需要考虑增加梯度累积步数（减少通信频率）、"
         "使用模型并行（减少跨节点通信）或升级网络硬件（从 Ethernet 升级到 InfiniBand）")
ADVICE = ("communication is the bottleneck: consider more gradient-accumulation steps (less frequent "
          "communication), model parallelism (less communication across hosts), or faster network hardware "
          "(from Ethernet to InfiniBand)")


@dataclass
class Row:
    """One kind of call of one rank's step."""
    strategy: str
    what: str
    phase: str
    primitive: str
    group: str            # tp, dp, edp, ep, pp
    group_size: int
    link: str             # where the group lies, in words
    link_class: str       # intra | inter | none
    calls: int
    bytes_per_call: int   # the largest call (nccl-tests' size)
    total_bytes: int      # all calls
    sent_per_call: int    # bytes the busiest rank sends in the largest call (simulator)
    sent: int             # ... in all calls
    algorithm: str
    time_per_call: float  # seconds, the largest call
    time: float           # seconds, all calls
    overlap: str          # exposed | overlappable


@dataclass
class Plan:
    """The estimate of one rank's training step: ``rows``, ``totals``, ``verdict`` (None at or below 30%).

    ``table()`` prints it, ``to_json()`` gives plain data (``Plan.from_json`` reads it back)."""
    model: dict
    layout: dict
    hardware: dict
    settings: dict
    stage: int
    rows: list[Row]
    totals: dict
    verdict: str | None = None
    notes: list = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.totals["comm_share"]

    def to_json(self) -> dict:
        return {"model": self.model, "layout": self.layout, "hardware": self.hardware, "settings": self.settings,
                "stage": self.stage, "rows": [asdict(r) for r in self.rows], "totals": self.totals,
                "verdict": self.verdict, "notes": list(self.notes)}

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        return cls(d["model"], d["layout"], d["hardware"], d["settings"], d["stage"],
                   [Row(**r) for r in d["rows"]], d["totals"], d["verdict"], list(d["notes"]))

    def table(self) -> str:
        t, s, lay = self.totals, self.settings, self.layout
        head = (f"{self.model['name']} ({self.model['params'] / 1e9:.1f}B parameters"
                f"{', %.1fB active' % (self.model['active_params'] / 1e9) if self.model['experts'] else ''}), "
                f"{self.model['dtype']}, micro-batch {self.model['micro_batch_size']} x {self.model['seq_len']} "
                f"tokens, {t['micro_batches']} micro-batches, global batch {t['global_batch']}")
        par = (f"dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} ep={lay['ep']} sp={'on' if lay['sp'] else 'off'} "
               f"zero={lay['zero']}  ({t['world']} ranks, {t['hosts']} hosts of {self.hardware['gpus_per_host']})")
        hw = (f"{self.hardware['name']}: {self.hardware['gpu']['name']}, inside a host {self.hardware['intra']['name']} "
              f"({self.hardware['intra']['gbytes_per_s']:.4g} GB/s), between hosts {self.hardware['nics']} x "
              f"{self.hardware['inter']['name']} ({self.hardware['inter']['gbytes_per_s']:.4g} GB/s)")
        lines = [head, par, hw, f"{'training step' if s['train'] else 'forward pass'} of one rank"
                 f"{' of pipeline stage %d (the slowest)' % self.stage if lay['pp'] > 1 else ''}:", ""]
        cols = ["strategy", "what", "phase", "primitive", "group", "calls", "bytes/call", "total", "sent/rank",
                "algorithm", "time/call", "time", "overlap"]
        body = [[r.strategy, r.what, r.phase, r.primitive, f"{r.group} {r.group_size}: {r.link}", str(r.calls),
                 _bytes(r.bytes_per_call), _bytes(r.total_bytes), _bytes(r.sent), r.algorithm,
                 _secs(r.time_per_call), _secs(r.time), r.overlap] for r in self.rows]
        if not body:
            body = [["(none)", "no communication", "", "", "", "0", "", "", "", "", "", "", ""]]
        w = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
        right = {5, 6, 7, 8, 10, 11}
        fmt = lambda cells: "  ".join(c.rjust(w[i]) if i in right else c.ljust(w[i]) for i, c in enumerate(cells))
        lines += [fmt(cols), fmt(["-" * x for x in w])] + [fmt(b) for b in body]
        src = s["compute_source"]
        lines += ["",
                  f"communication   {_secs(t['comm_time']):>10}  ({_bytes(t['total_bytes'])} in "
                  f"{t['calls']} calls, {_bytes(t['sent'])} sent by the rank; exposed {_secs(t['exposed_time'])}, "
                  f"overlappable {_secs(t['overlappable_time'])})",
                  f"compute         {_secs(t['compute_time']):>10}  ({src})",
                  f"pipeline bubble {_secs(t['bubble_time']):>10}  ((p-1)/(m+p-1) = {t['bubble_fraction']:.1%} of "
                  f"the pipeline's time, 1F1B)",
                  f"step            {_secs(t['step_time']):>10}  (compute + bubble + communication, nothing overlapped)",
                  f"communication share {t['comm_share']:.1%} of the step (serial); {t['comm_share_overlapped']:.1%} "
                  f"if overlappable traffic hides behind compute (step {_secs(t['step_time_overlapped'])})"]
        if self.verdict:
            lines += ["", "VERDICT: " + self.verdict, f'  source: {SOURCE}: "{QUOTE}"']
        else:
            lines += [f"below the brief's 30% threshold ({SOURCE}): communication is not the bottleneck"]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def verdict(share: float, rows: list[Row]) -> str | None:
    """The brief's verdict when ``share`` > 30% (None otherwise), naming the biggest item."""
    if share <= THRESHOLD:
        return None
    text = f"communication is {share:.1%} of the step, above 30%: {ADVICE}"
    if rows:
        top = max(rows, key=lambda r: r.time)
        total = sum(r.time for r in rows) or 1.0
        text += (f". The largest item: {top.strategy} {top.primitive} of {top.what} "
                 f"({top.link}), {top.time / total:.0%} of the communication time")
    return text


def _bytes(n: float) -> str:
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{int(n)} B"


def _secs(t: float) -> str:
    if t >= 100:
        return f"{t:.0f} s"
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} us"
