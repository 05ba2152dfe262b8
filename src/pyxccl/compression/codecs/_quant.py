"""Quantizers: stateless codecs from float32 to a fixed-size byte string.

Every quantizer maps ``count`` float32 values to exactly ``nbytes(count)``
bytes; the size never depends on the data, so both ends of a link know it.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ._base import CHUNK, Compressor, check_f32, check_u8, err

__all__ = ["Quantizer", "FP16", "BF16", "INT8", "FP16_MAX"]

#: the largest finite float16; FP16 clamps to +-FP16_MAX
FP16_MAX = 65504.0
_BF16 = np.dtype(ml_dtypes.bfloat16)


class Quantizer(Compressor):
    """A stateless float32 codec applied to every message of a collective.

    ``elementwise``: each value's code depends on that value alone (FP16, BF16), so decoding a
    slice of any message gives the same values as decoding the whole; INT8's blocks depend on where
    a message starts and ends.

    Subclasses define ``nbytes``, ``_encode`` and ``_decode``; the public
    methods check the arguments. ``rel_error_bound`` is the bound on
    ``|x - decode(encode(x))| / |x|`` where one exists (None for INT8, whose
    bound is absolute per block: see :class:`INT8`).
    """

    elementwise = True

    rel_error_bound: float | None = None

    def nbytes(self, count: int) -> int:
        """Encoded size in bytes of ``count`` float32 elements."""
        raise NotImplementedError

    def _count(self, count) -> int:
        count = int(count)
        if count < 0:
            raise err(f"{self.name}: count must be >= 0, got {count}")
        return count

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        """Write the code of float32 ``x`` into ``out`` (uint8, ``nbytes(len(x))`` bytes)."""
        check_f32(x)
        check_u8(out, self.nbytes(x.size), "out")
        if x.size:
            self._encode(x, out)

    def decode(self, data: np.ndarray, out: np.ndarray, accumulate: bool = False) -> None:
        """Decode ``data`` into float32 ``out``: ``out[:] = d`` or, with
        ``accumulate``, ``out += d`` (the sum is done in float32)."""
        check_f32(out, "out")
        check_u8(data, self.nbytes(out.size))
        if out.size:
            self._decode(data, out, bool(accumulate))

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """``decode(encode(x))`` into a new float32 array."""
        check_f32(x)
        buf = np.empty(self.nbytes(x.size), np.uint8)
        self.encode(x, buf)
        out = np.empty(x.size, np.float32)
        self.decode(buf, out)
        return out

    def _encode(self, x, out):
        raise NotImplementedError

    def _decode(self, data, out, accumulate):
        raise NotImplementedError


class FP16(Quantizer):
    """IEEE half precision, 2 bytes per element (little-endian float16).

    Values are clamped to ``+-65504`` (the largest finite float16) before the
    round-to-nearest-even cast, so large values saturate instead of becoming
    inf (inf itself becomes +-65504; NaN stays NaN). FP16 is meant for values
    of moderate range such as gradients. Error: ``|x - d| <= 2**-11 * |x|``
    for ``6.1e-5 <= |x| <= 65504``; below that (float16 subnormals) the error
    is at most ``2**-25`` absolute; above, ``|x| - 65504``.
    """

    name = "fp16"
    ratio = 0.5
    rel_error_bound = 2.0 ** -11

    def nbytes(self, count: int) -> int:
        return 2 * self._count(count)

    def _encode(self, x, out):
        np.clip(x, -FP16_MAX, FP16_MAX, out=out.view(np.float16), casting="same_kind")

    def _decode(self, data, out, accumulate):
        # numpy's float16 -> float32 cast is scalar (~3 GB/s); the bit-level
        # widening below is exact and about twice as fast, in cache-sized passes
        hu = data.view(np.uint16)
        n = out.size
        c = min(n, CHUNK)
        a = np.empty(c, np.uint32)
        sgn = np.empty(c, np.uint32)
        o = np.empty(c, np.float32) if accumulate or not out.flags.c_contiguous else None
        for lo in range(0, n, c):
            hi = min(n, lo + c)
            m = hi - lo
            aa, ss = a[:m], sgn[:m]
            oo = out[lo:hi] if o is None else o[:m]
            np.copyto(aa, hu[lo:hi], casting="safe")
            np.bitwise_and(aa, 0x8000, out=ss)
            np.left_shift(ss, 16, out=ss)
            np.bitwise_and(aa, 0x7FFF, out=aa)
            np.left_shift(aa, 13, out=aa)  # exponent and mantissa in float32 position, bias 15
            np.multiply(aa.view(np.float32), np.float32(2.0 ** 112), out=oo)  # rebias (exact)
            big = oo >= np.float32(65536.0)  # exponent 31: inf or NaN
            if big.any():
                oo[big] = np.where(oo[big] == np.float32(65536.0), np.float32(np.inf), np.float32(np.nan))
            ov = oo.view(np.uint32)
            np.bitwise_or(ov, ss, out=ov)
            if accumulate:
                np.add(out[lo:hi], oo, out=out[lo:hi])
            elif o is not None:
                out[lo:hi] = oo


class BF16(Quantizer):
    """bfloat16 (ml_dtypes), 2 bytes per element: the top half of the float32
    bits after round-to-nearest-even. Same range as float32 (values above
    about 3.39e38 round to inf). Error: ``|x - d| <= 2**-8 * |x|`` for normal
    values (``|x| >= 2**-126``); ``2**-134`` absolute for float32 subnormals.
    """

    name = "bf16"
    ratio = 0.5
    rel_error_bound = 2.0 ** -8

    def nbytes(self, count: int) -> int:
        return 2 * self._count(count)

    def _encode(self, x, out):
        np.copyto(out.view(_BF16), x, casting="unsafe")

    def _decode(self, data, out, accumulate):
        b = data.view(_BF16)
        if accumulate:
            np.add(out, b, out=out)
        elif out.flags.c_contiguous:
            # exact widening: the bfloat16 bits are the high half of the float32
            o = out.view(np.uint32)
            np.copyto(o, data.view(np.uint16), casting="safe")
            np.left_shift(o, 16, out=o)
        else:
            np.copyto(out, b, casting="unsafe")


class INT8(Quantizer):
    """Block-scaled int8: ``count + 4 * ceil(count / block)`` bytes.

    Layout: ``nblocks = ceil(count / block)`` little-endian float32 scales
    (one per block of ``block`` consecutive elements; the last block may be
    shorter), followed by the ``count`` int8 codes. ``scale = max|x| / 127``
    over the block; ``q = round(x / scale)`` (to nearest even), or with
    ``stochastic=True`` ``q = floor(x / scale + u)``, ``u`` uniform in [0, 1)
    from ``np.random.default_rng(seed)`` (unbiased: ``E[d] = x``); q is
    clipped to [-127, 127]; decode is ``q * scale``. A block of zeros has
    scale 0 and decodes to zeros. Error per element: ``<= scale / 2``
    (stochastic: ``< scale``), plus float32 rounding of ``x/scale`` and
    ``q*scale``: at most ``2**-22 * (|x| + scale)``, and ``2**-142`` absolute
    when the scale is subnormal (block max below 1.5e-36). Inputs must be finite: a block holding inf or NaN
    decodes to garbage.
    """

    elementwise = False      # a message's blocks: re-slicing a value may change its scale

    name = "int8"
    rel_error_bound = None

    def __init__(self, block: int = 256, stochastic: bool = False, seed: int | None = None):
        if isinstance(block, bool) or int(block) != block or block < 1:
            raise err(f"int8: block must be a positive integer, got {block!r}")
        self.block = int(block)
        self.stochastic = bool(stochastic)
        self.seed = seed
        self._rng = np.random.default_rng(seed) if self.stochastic else None
        self.ratio = (1.0 + 4.0 / self.block) / 4.0

    @property
    def spec(self) -> str:
        s = f"int8:block={self.block}"
        if self.stochastic:
            s += ",stochastic=1" + ("" if self.seed is None else f",seed={self.seed}")
        return s

    def nbytes(self, count: int) -> int:
        count = self._count(count)
        return count + 4 * (-(-count // self.block))

    def error_bound(self, x: np.ndarray) -> np.ndarray:
        """Per-element bound on ``|x - round_trip(x)|`` (scale/2, or scale when stochastic)."""
        check_f32(x)
        b = self.block
        nb = -(-x.size // b)
        pad = np.zeros(nb * b, np.float32)
        pad[: x.size] = np.abs(x)
        s = pad.reshape(nb, b).max(axis=1) / np.float32(127)
        return np.repeat(s if self.stochastic else s / 2, b)[: x.size]

    def _split(self, n):
        """(row ranges of whole blocks per pass, tail start): passes of ~CHUNK elements."""
        b = self.block
        full = n // b
        step = max(1, CHUNK // b)
        return [(r, min(r + step, full)) for r in range(0, full, step)], full * b

    def _encode(self, x, out):
        n, b = x.size, self.block
        nb = -(-n // b)
        scales = out[: 4 * nb].view(np.float32)
        q = out[4 * nb:].view(np.int8)
        rows, tail = self._split(n)
        tmp = np.empty(min(n, max(b, CHUNK // b * b)), np.float32)
        u = np.empty_like(tmp) if self.stochastic else None
        for r0, r1 in rows:
            lo, hi = r0 * b, r1 * b
            self._enc(x[lo:hi].reshape(r1 - r0, b), scales[r0:r1], q[lo:hi].reshape(r1 - r0, b),
                      tmp[: hi - lo].reshape(r1 - r0, b), u)
        if tail < n:
            m = n - tail
            self._enc(x[tail:].reshape(1, m), scales[nb - 1:], q[tail:].reshape(1, m),
                      tmp[:m].reshape(1, m), u)

    def _enc(self, xb, s, qb, t, u):
        # xb (rows, L) float32; s (rows,) scales out; qb (rows, L) int8 out; t, u scratch
        np.abs(xb, out=t)
        np.maximum.reduce(t, axis=1, out=s)
        np.divide(s, np.float32(127), out=s)
        safe = np.where(s > 0, s, np.float32(1))[:, None]
        np.divide(xb, safe, out=t)
        if u is None:
            np.rint(t, out=t)
        else:
            ub = u[: t.size].reshape(t.shape)
            self._rng.random(out=u[: t.size], dtype=np.float32)
            np.add(t, ub, out=t)
            np.floor(t, out=t)
        np.clip(t, -127, 127, out=t)  # |t| <= 127.5 unless the scale is subnormal or stochastic
        np.copyto(qb, t, casting="unsafe")

    def _decode(self, data, out, accumulate):
        if not out.flags.c_contiguous:
            tmp = np.empty(out.size, np.float32)
            self._decode(data, tmp, False)
            if accumulate:
                out += tmp
            else:
                out[:] = tmp
            return
        n, b = out.size, self.block
        nb = -(-n // b)
        scales = data[: 4 * nb].view(np.float32)
        q = data[4 * nb:].view(np.int8)
        rows, tail = self._split(n)
        tmp = np.empty(min(n, max(b, CHUNK // b * b)), np.float32) if accumulate else None
        parts = [(r0 * b, r1 * b, r1 - r0, b, scales[r0:r1]) for r0, r1 in rows]
        if tail < n:
            parts.append((tail, n, 1, n - tail, scales[nb - 1:]))
        for lo, hi, r, L, s in parts:
            qb = q[lo:hi].reshape(r, L)
            ob = out[lo:hi].reshape(r, L)
            if accumulate:
                t = tmp[: hi - lo].reshape(r, L)
                np.multiply(qb, s[:, None], out=t)
                np.add(ob, t, out=ob)
            else:
                np.multiply(qb, s[:, None], out=ob)

