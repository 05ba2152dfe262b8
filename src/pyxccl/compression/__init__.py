"""Compression of collectives, in one package:

- ``codecs``: the compressors (quantizers FP16, BF16, INT8; sparsifiers TopK, Threshold) and
  ``parse`` of spec strings; their names are exported here, the public API
  (``from pyxccl.compression import INT8, TopK``);
- ``collectives``: allreduce, reduce_scatter and allgather with ``compression=`` (what the
  Communicator's calls hand over);
- ``policy``: ``compression="auto"`` (the cost model's choice) and the rules the planner applies to
  a compressed call (which algorithm it runs unless asked, which algorithms settle the bits).

Only the codecs are imported here: the planner imports ``policy`` and the API ``collectives``,
each from its own layer.
"""
from __future__ import annotations

from .codecs import (BF16, FP16, FP16_MAX, INT8, Compressor, InvalidArgumentError, Quantizer, Sparsifier,
                     Threshold, TopK, accumulate, decompress, nbytes, pack, parse, sum_packed, unpack)

__all__ = [
    "Compressor", "Quantizer", "FP16", "BF16", "INT8", "FP16_MAX",
    "Sparsifier", "TopK", "Threshold", "pack", "unpack", "nbytes", "accumulate", "sum_packed", "decompress",
    "parse", "InvalidArgumentError",
]
