"""Compressors for collectives: quantizers and sparsifiers.

Quantizers (stateless, fixed size, applied to every message):

* ``FP16()``: float16, 2 bytes/element, values clamped to +-65504;
  ``|x - d| <= 2**-11 |x|`` for 6.1e-5 <= |x| <= 65504.
* ``BF16()``: bfloat16 (round to nearest even), 2 bytes/element;
  ``|x - d| <= 2**-8 |x|`` for normal floats.
* ``INT8(block=256, stochastic=False, seed=None)``: ``count + 4*ceil(count/block)``
  bytes = the float32 scales of the blocks, then the int8 codes;
  ``scale = max|x_block| / 127``, ``q = clip(round(x/scale), -127, 127)``
  (stochastic: ``floor(x/scale + u)``, u ~ U[0, 1), unbiased), ``d = q*scale``;
  ``|x - d| <= scale/2`` (stochastic: ``< scale``).

``q.encode(x, out)`` writes ``q.nbytes(len(x))`` bytes; ``q.decode(data, out,
accumulate)`` sets ``out`` or adds to it in float32.

Sparsifiers (stateful per key, error feedback):

* ``TopK(ratio)``: the ``k = max(1, ceil(ratio*count))`` largest ``|acc|``;
* ``Threshold(tau)``: every ``|acc| >= tau``;

with ``acc = x + residual[key]`` and ``residual[key] = acc`` minus what was
sent; with ``momentum=m`` (DGC): ``u = m*u + x; v += u``, select from ``v``,
zero the sent entries of ``u`` and ``v`` (use plain SGD then). Pairs travel as
``pack(idx, val, count)``: ``nbytes(len(idx), count)`` bytes = the float32
values, a uint32 pair count per block of 65,536 elements, the uint16 low bits
of each index (6 bytes a pair); ``sum_packed(out, wires)`` sums several.

``parse(spec)`` turns ``"fp16"``, ``"bf16"``, ``"int8"``,
``"int8:block=128,stochastic=1,seed=0"``, ``"topk:0.01"``,
``"topk:0.01,momentum=0.9"``, ``"threshold:1e-3,error_feedback=0"`` into a
compressor; ``None``/``"none"`` gives None and ``"auto"`` the string "auto".

Example::

    import numpy as np
    from pyxccl.compression import parse
    q = parse("int8:block=128")
    x = np.random.randn(1000).astype(np.float32)
    buf = np.empty(q.nbytes(x.size), np.uint8)
    q.encode(x, buf)
    y = np.zeros_like(x)
    q.decode(buf, y, accumulate=True)        # y += decoded

    s = parse("topk:0.01")
    idx, val = s.compress(x, key="layer1")   # 10 pairs; the rest stays in s.residual("layer1")
    wire = s.pack(idx, val, x.size)          # 64 bytes: 10 x 6 + one block's count
    dense = s.decompress(*s.unpack(wire, x.size), x.size)
"""
from __future__ import annotations

from ._base import Compressor
from ._quant import BF16, FP16, FP16_MAX, INT8, Quantizer
from ._sparse import Sparsifier, Threshold, TopK, accumulate, decompress, nbytes, pack, sum_packed, unpack
from ..._errors import InvalidArgumentError

__all__ = [
    "Compressor", "Quantizer", "FP16", "BF16", "INT8", "FP16_MAX",
    "Sparsifier", "TopK", "Threshold", "pack", "unpack", "nbytes", "accumulate", "sum_packed", "decompress",
    "parse", "InvalidArgumentError",
]

_NAMES = {"fp16": FP16, "float16": FP16, "half": FP16, "bf16": BF16, "bfloat16": BF16,
          "int8": INT8, "topk": TopK, "threshold": Threshold}
# parameters per compressor: name -> (converter, constructor argument)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(s: str) -> bool:
    s = s.lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(s)


def _opt_float(s: str):
    return None if s.lower() in ("none", "") else float(s)


def _opt_int(s: str):
    return None if s.lower() in ("none", "") else int(s)


_PARAMS = {
    FP16: {}, BF16: {},
    INT8: {"block": (int, "block"), "stochastic": (_bool, "stochastic"), "seed": (_opt_int, "seed")},
    TopK: {"ratio": (float, "ratio"), "error_feedback": (_bool, "error_feedback"),
           "ef": (_bool, "error_feedback"), "momentum": (_opt_float, "momentum")},
    Threshold: {"tau": (float, "tau"), "error_feedback": (_bool, "error_feedback"),
                "ef": (_bool, "error_feedback"), "momentum": (_opt_float, "momentum")},
}
_POSITIONAL = {INT8: "block", TopK: "ratio", Threshold: "tau"}


def parse(spec):
    """A compressor from ``spec``: ``"name[:value][,key=value...]"``.

    ``name`` is fp16, bf16, int8, topk or threshold; a bare first value is
    int8's block, topk's ratio or threshold's tau. Keys: int8 ``block``,
    ``stochastic``, ``seed``; topk/threshold ``ratio``/``tau``,
    ``error_feedback`` (or ``ef``), ``momentum``. A :class:`Compressor` is
    returned as is; None, ``""`` and ``"none"`` give None; ``"auto"`` gives
    ``"auto"`` (the engine chooses). Anything else raises
    :class:`InvalidArgumentError`.
    """
    if spec is None or isinstance(spec, Compressor):
        return spec
    if not isinstance(spec, str):
        raise InvalidArgumentError(f"compression spec must be a string, a compressor or None, "
                                   f"got {type(spec).__name__}", op="compress")
    s = spec.strip().lower()
    if s in ("", "none", "off"):
        return None
    if s == "auto":
        return "auto"
    name, _, rest = s.partition(":")
    cls = _NAMES.get(name.strip())
    if cls is None:
        raise InvalidArgumentError(f"unknown compressor {spec!r}: use fp16, bf16, int8[:block=N], "
                                   "topk:RATIO, threshold:TAU, none or auto", op="compress")
    params = _PARAMS[cls]
    kwargs = {}
    items = [p.strip() for p in rest.split(",")] if rest.strip() else []
    for i, item in enumerate(items):
        key, eq, value = item.partition("=")
        if not eq:
            if i or cls not in _POSITIONAL:
                raise InvalidArgumentError(f"compression spec {spec!r}: expected key=value, got {item!r}",
                                           op="compress")
            key, value = _POSITIONAL[cls], item
        key, value = key.strip(), value.strip()
        if key not in params:
            raise InvalidArgumentError(f"compression spec {spec!r}: {name} takes "
                                       f"{', '.join(params) or 'no parameters'}, not {key!r}", op="compress")
        conv, arg = params[key]
        if arg in kwargs:
            raise InvalidArgumentError(f"compression spec {spec!r}: {key} given twice", op="compress")
        try:
            kwargs[arg] = conv(value)
        except ValueError:
            raise InvalidArgumentError(f"compression spec {spec!r}: bad value {value!r} for {key}",
                                       op="compress") from None
    if cls in (TopK, Threshold) and _POSITIONAL[cls] not in kwargs:
        raise InvalidArgumentError(f"compression spec {spec!r}: {name} needs a "
                                   f"{_POSITIONAL[cls]}, e.g. {name}:0.01", op="compress")
    return cls(**kwargs)
