"""What the planner decides for compressed calls: which algorithm a compressed call runs unless
asked (``compressed_algorithm``; which algorithms leave every rank with the same bits is a fact on
their record, ``Algorithm.settles``), and ``compression="auto"``: compress only where the cost model says it pays.

For a call of ``nbytes`` the model prices (on the communicator's own topology and link figures):

- uncompressed: the tuner's best algorithm;
- with each quantizer (FP16, INT8): the algorithm a compressed call runs (hierarchical across hosts,
  else ring) with its messages ``ratio`` times as large, plus the CPU time of encoding and decoding
  what the busiest rank sends (``bytes_sent / ratio`` each way, priced in local copies: ``COPIES``).

The cheapest wins; on one host's shared memory (GB/s) the encoding costs more than the bytes it saves
and nothing is compressed; across a slow link (1 Gbit/s) INT8 usually wins. Sparsifiers are never
chosen: they change what is summed (they need a key and error feedback), so they are asked for by
name. ``PYXCCL_DEBUG=INFO`` logs each decision with the estimates.
"""
from __future__ import annotations

import logging

from ..algorithms import registry
from .codecs import FP16, INT8

log = logging.getLogger("pyxccl")

# Encoding and decoding (adding) one float32 byte costs this many local copies of a byte: measured
# here (16 MiB, numpy; 2026-11-25). Priced in copies, with the machine's copy figure, which every rank
# agrees on (pyxccl/probe.py): a rate each process timed for itself could differ by rank, and ranks
# that chose differently would fail the call (the compressor is part of the fingerprint).
COPIES = {"fp16": 20.0, "bf16": 5.0, "int8": 11.0}


def compressed_algorithm(ctx, primitive: str) -> str:
    """What a compressed call runs unless asked otherwise: an algorithm that settles (every rank ends
    with the same quantized bits with no last round trip: each part is quantized by the rank that owns
    it and passed on as sent; ``Algorithm.settles``), host-aware across hosts (it compresses only
    between them), else the primitive's default if it settles."""
    fit = [a for a in registry.records(primitive) if a.settles and not a.segment]
    across = len(set(ctx.hosts)) > 1
    best = [a for a in fit if a.wants_hosts == across] or fit
    default = registry.default(primitive)
    return next((a.name for a in best if a.name == default), best[0].name if best else default)


def codec_cost(codec, machine) -> float:
    """Seconds per float32 byte to encode and decode with ``codec`` on ``machine``."""
    return COPIES.get(codec.name, 20.0) * machine.copy


def choose(ctx, primitive: str, nbytes: int):
    """The quantizer to use for ``primitive`` of ``nbytes`` (a size bucket) on ``ctx``'s communicator, or
    None (the planner keeps the answer per bucket)."""
    tuner, b = ctx.tuner, nbytes
    if tuner is None or ctx.size < 2:
        return None
    costs = {name: est.time for name, est in tuner.table(primitive, b).items()}
    best_plain = min(costs, key=costs.get)
    options = {"none": costs[best_plain]}
    algo = compressed_algorithm(ctx, primitive)
    codecs = {}
    for codec in (FP16(), INT8()):
        est = tuner.model(primitive, algo, max(8, int(b * codec.ratio)))
        if est is None:
            continue
        options[codec.spec] = est.time + 2 * est.bytes_sent / codec.ratio * codec_cost(codec, tuner.machine)
        codecs[codec.spec] = codec
    pick = min(options, key=options.get)
    if log.isEnabledFor(logging.INFO):
        alts = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(options.items(), key=lambda kv: kv[1]))
        log.info("compression=auto: %s %d B on %d ranks (%d hosts): %s (model: uncompressed by %s; %s; the "
                 "compressed ones run %s, encoding included)", primitive, b, ctx.size, len(set(ctx.hosts)),
                 pick, best_plain, alts, algo)
    return codecs.get(pick)
