"""A transformer as the planner sees it: sizes, parameter counts, FLOPs per token.

Parameter counts (weights of the matrix multiplies and embeddings; biases and norms are left out,
they are < 0.1% of a large model):

- attention: ``2*h*h + 2*h*(kv_heads*h/heads)`` (Q and O are h x h, K and V shrink with grouped-query
  attention); with ``kv_heads == heads`` this is the classic ``4*h^2``;
- MLP: ``2*h*ffn`` (GELU: up and down) or ``3*h*ffn`` (SwiGLU: gate, up and down);
- a MoE layer: ``experts + shared_experts`` MLPs of ``expert_ffn`` each (a token uses ``top_k + shared_experts``
  of them) plus a router of ``h*experts``;
- embeddings: ``vocab*h`` for the input, the same again for the output head unless ``tied``.

FLOPs per token (forward; training is 3x: the backward pass costs twice the forward):
``2 * (parameters the token uses)`` for the matrix multiplies plus ``4*seq_len*h`` per layer for the
attention scores and their weighted sum (no causal discount), plus ``2*h*vocab`` for the output head.

>>> m = load_model("gpt3-175b")
>>> round(m.params / 1e9, 1)
174.6
"""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

#: bytes per element of the dtypes a model may train in
ITEMSIZE = {"fp32": 4, "float32": 4, "tf32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp8": 1}


@dataclass(frozen=True)
class Model:
    """A transformer and its training batch (``micro_batch_size`` sequences of ``seq_len`` per rank and
    micro-batch; ``global_batch`` sequences per optimizer step).

    >>> Model("tiny", layers=2, hidden=64, heads=4, ffn=256, vocab=1000).params
    226304
    """
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    kv_heads: int = 0                # 0: as many as heads (no grouped-query attention)
    mlp: str = "gelu"                # "gelu" (2 matrices) or "swiglu" (3)
    tied: bool = False               # output head shares the input embedding
    experts: int = 0                 # routed experts per MoE layer (0: a dense model)
    shared_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0              # 0: ffn
    moe_layers: tuple = ()           # 1-based indices of the MoE layers (default: all, when experts > 0)
    capacity_factor: float = 1.0
    seq_len: int = 2048
    micro_batch_size: int = 1
    global_batch: int = 1
    dtype: str = "bf16"              # activations and parameters as communicated
    grad_dtype: str = ""             # gradients as reduced ("" = dtype)
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "micro_batch_size", "global_batch"):
            if getattr(self, k) < 1:
                raise ValueError(f"model {self.name!r}: {k} must be at least 1, not {getattr(self, k)}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"model {self.name!r}: mlp {self.mlp!r}: give gelu or swiglu")
        for d in (self.dtype, self.grad_dtype or self.dtype):
            if d not in ITEMSIZE:
                raise ValueError(f"model {self.name!r}: dtype {d!r}: give one of {', '.join(ITEMSIZE)}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"model {self.name!r}: top_k={self.top_k} must be in 1..experts={self.experts}")
        if self.experts and not self.moe_layers:
            object.__setattr__(self, "moe_layers", tuple(range(1, self.layers + 1)))
        object.__setattr__(self, "moe_layers", tuple(sorted(set(self.moe_layers))))
        if any(not 1 <= i <= self.layers for i in self.moe_layers):
            raise ValueError(f"model {self.name!r}: moe_layers must be within 1..{self.layers}")

    # --- sizes -------------------------------------------------------------------------------------
    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def grad_itemsize(self) -> int:
        return ITEMSIZE[self.grad_dtype or self.dtype]

    def is_moe(self, layer: int) -> bool:
        """Whether 1-based ``layer`` is a MoE layer."""
        return layer in self.moe_layers

    @property
    def attention_params(self) -> int:
        h = self.hidden
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        return 2 * h * h + 2 * h * kv

    def mlp_params(self, ffn: int | None = None) -> int:
        return (3 if self.mlp == "swiglu" else 2) * self.hidden * (ffn or self.ffn)

    @property
    def expert_params(self) -> int:
        """One expert's MLP."""
        return self.mlp_params(self.expert_ffn or self.ffn)

    def layer_params(self, layer: int) -> tuple[int, int]:
        """(dense parameters, routed-expert parameters) of 1-based ``layer``: the routed experts are the
        part expert parallelism shards; attention, router and shared experts are dense."""
        if not self.is_moe(layer):
            return self.attention_params + self.mlp_params(), 0
        dense = self.attention_params + self.hidden * self.experts + self.shared_experts * self.expert_params
        return dense, self.experts * self.expert_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters."""
        body = sum(sum(self.layer_params(i)) for i in range(1, self.layers + 1))
        return body + self.embedding_params * (1 if self.tied else 2)

    def active_layer_params(self, layer: int) -> int:
        """Parameters one token's matrix multiplies use in 1-based ``layer``."""
        dense, _ = self.layer_params(layer)
        if not self.is_moe(layer):
            return dense
        return dense - self.hidden * self.experts + self.top_k * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters a token uses (all of them for a dense model)."""
        body = sum(self.active_layer_params(i) for i in range(1, self.layers + 1))
        return body + self.embedding_params * (1 if self.tied else 2)

    def layer_flops(self, layer: int) -> float:
        """Forward FLOPs per token of 1-based ``layer`` (see the module's docstring)."""
        return 2.0 * self.active_layer_params(layer) + 4.0 * self.seq_len * self.hidden

    @property
    def head_flops(self) -> float:
        """Forward FLOPs per token of the output head."""
        return 2.0 * self.hidden * self.vocab

    def with_(self, **changes) -> "Model":
        """A copy with ``changes`` (None values are ignored), e.g. overrides from the command line."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_json(self) -> dict:
        d = asdict(self)
        d["moe_layers"] = _ranges(self.moe_layers)
        d["params"], d["active_params"] = self.params, self.active_params
        return d


def _ranges(ix) -> str:
    """(1, 2, 3, 7) -> "1-3,7"."""
    out, ix = [], list(ix)
    while ix:
        a = b = ix.pop(0)
        while ix and ix[0] == b + 1:
            b = ix.pop(0)
        out.append(f"{a}-{b}" if b > a else str(a))
    return ",".join(out)


def _parse_layers(v) -> tuple:
    """moe_layers as written in a file: a list of ints, or a string like "4-61" or "1,3,5-8"."""
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v)
    out = []
    for part in str(v).replace(" ", "").split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return tuple(out)


def presets() -> list[str]:
    """Names of the models shipped with pyxccl (``data/models/*.toml``)."""
    d = resources.files(__package__) / "data" / "models"
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".toml"))


def from_dict(d: dict, name: str = "") -> Model:
    """A Model from a config table (the keys of ``Model``; ``moe_layers`` may be "4-61")."""
    d = dict(d)
    if "moe_layers" in d:
        d["moe_layers"] = _parse_layers(d["moe_layers"])
    d.setdefault("name", name)
    known = set(Model.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"model {d['name']!r}: unknown keys {unknown} (known: {sorted(known)})")
    return Model(**d)


def load_model(name_or_path: str | Path) -> Model:
    """A preset by name (``presets()``) or a TOML file with the same keys.

    >>> load_model("llama-7b").mlp
    'swiglu'
    """
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        with open(p, "rb") as f:
            return from_dict(tomllib.load(f), p.stem)
    f = resources.files(__package__) / "data" / "models" / f"{name_or_path}.toml"
    if not f.is_file():
        raise ValueError(f"no model {str(name_or_path)!r}: give a file.toml or one of {', '.join(presets())}")
    return from_dict(tomllib.loads(f.read_text()), str(name_or_path))
