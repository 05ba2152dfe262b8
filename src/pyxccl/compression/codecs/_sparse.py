"""Sparsifiers with error feedback: send a few (index, value) pairs per step
and keep the rest in a residual that is added back at the next step."""
from __future__ import annotations

import math

import numpy as np

from ... import _env
from ._base import Compressor, check_f32, check_u8, err

try:        # the optional compiled kernels: the selection's one pass, the sum's scatter (setup.py)
    from ..._kernels import candidates as _candidates_native, scatter_add as _scatter_add_native, \
        sum_pairs as _sum_pairs_native
except ImportError:          # pragma: no cover  (no C compiler where it was installed)
    _candidates_native = _scatter_add_native = _sum_pairs_native = None
if not _env.get("PYXCCL_NATIVE"):      # as for the segment executor: the numpy path only
    _candidates_native = _scatter_add_native = _sum_pairs_native = None

__all__ = ["Sparsifier", "TopK", "Threshold", "pack", "unpack", "nbytes", "accumulate", "sum_packed", "decompress"]

_I32_MAX = 2 ** 31 - 1
BLOCK_BITS = 16         # an index travels as its low 16 bits; its block (index >> 16) as a pair count per block


def _blocks(count: int) -> int:
    return -(-int(count) // (1 << BLOCK_BITS))


def nbytes(pairs: int, count: int) -> int:
    """Wire bytes of ``pairs`` pairs from a ``count``-element tensor: 6 a pair (float32 value, 16-bit
    index), 4 for each block of 65,536 elements (its pair count), 2 of padding if ``pairs`` is odd (a
    whole number of 4-byte words: wires stay aligned side by side)."""
    return 6 * int(pairs) + 2 * (int(pairs) % 2) + 4 * _blocks(count)


def pack(idx: np.ndarray, val: np.ndarray, count: int, out: np.ndarray | None = None) -> np.ndarray:
    """Pairs of a ``count``-element tensor to wire bytes, ``nbytes(len(idx), count)`` of them
    (little-endian): the float32 values, then the uint32 number of pairs in each block of 65,536
    elements, then the uint16 low bits of each index (and 2 zero bytes if their number is odd).
    Indices must be ascending and in ``[0, count)`` (as the sparsifiers give them). Writes into
    ``out`` if given."""
    idx = np.asarray(idx)
    val = np.asarray(val)
    if idx.ndim != 1 or val.ndim != 1 or idx.size != val.size:
        raise err(f"pack: idx and val must be 1-D of the same length, got {idx.shape} and {val.shape}")
    n, nb = idx.size, _blocks(count)
    if n and (idx[0] < 0 or idx[-1] >= count or np.any(idx[1:] < idx[:-1])):
        raise err(f"pack: indices must be ascending and in [0, {count})")
    if out is None:
        out = np.empty(nbytes(n, count), np.uint8)
    else:
        check_u8(out, nbytes(n, count), "out")
    out[: 4 * n].view(np.float32)[:] = val
    out[4 * n: 4 * (n + nb)].view(np.uint32)[:] = np.bincount(idx >> BLOCK_BITS, minlength=nb)
    out[4 * (n + nb): 6 * n + 4 * nb].view(np.uint16)[:] = idx & 0xFFFF
    out[6 * n + 4 * nb:] = 0
    return out


def _pairs(data: np.ndarray, count: int) -> tuple[int, int]:
    """(pairs, blocks) of wire bytes for a ``count``-element tensor, checked."""
    check_u8(data, None)
    nb = _blocks(count)
    rest = data.size - 4 * nb
    n = rest // 6
    if rest < 0 or rest % 6 != 2 * (n % 2):
        raise err(f"unpack: {data.size} bytes are not {4 * nb} bytes of block counts and whole 6-byte pairs, "
                  f"padded to 4 (a tensor of {count} elements)")
    told = int(data[4 * n: 4 * (n + nb)].view(np.uint32).sum(dtype=np.int64))
    if told != n:
        raise err(f"unpack: the block counts say {told} pairs, the data holds {n}")
    return n, nb


def unpack(data: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Wire bytes of a ``count``-element tensor to ``(idx int32, val float32)`` (``val`` a view into
    ``data``)."""
    n, nb = _pairs(data, count)
    base = np.repeat(np.arange(nb, dtype=np.int32) << BLOCK_BITS, data[4 * n: 4 * (n + nb)].view(np.uint32))
    return base + data[4 * (n + nb): 6 * n + 4 * nb].view(np.uint16), data[: 4 * n].view(np.float32)


def sum_packed(out: np.ndarray, wires: list) -> None:
    """``out`` = the sum of every wire's pairs (``pack``'s bytes, for a tensor of ``len(out)``
    elements), added in the list's order: bit for bit as zeroing ``out`` and ``accumulate``-ing each
    wire's pairs in turn. In C where it was built: block by block (zeroed, then each wire's pairs of
    it added while it is in cache), one ordered write of ``out`` instead of a zeroing pass and a
    scattered add per wire (4 ranks' 168k pairs into 16M elements, 4 ranks on 2 cores: about 4 ms
    instead of 14)."""
    check_f32(out, "out")
    for w in wires:
        _pairs(w, out.size)
    if _sum_pairs_native is not None and out.flags.c_contiguous and all(w.ctypes.data % 4 == 0 for w in wires):
        try:
            _sum_pairs_native(out, list(wires))
        except ValueError as e:
            raise err(str(e)) from None
        return
    out[...] = 0
    for w in wires:
        accumulate(out, *unpack(w, out.size))


def accumulate(out: np.ndarray, idx: np.ndarray, val: np.ndarray) -> None:
    """``out[idx] += val`` with repeated indices summed (float32), in order.

    A plain loop in C where it was built (twice as fast as ``np.add.at`` for 4 x 168k pairs into
    16M elements), else ``np.add.at`` (unbuffered; ``out[idx] += val`` would be wrong for repeats).
    Indices must lie in ``[0, len(out))`` (negative ones are refused, not wrapped).
    """
    check_f32(out, "out")
    idx = np.asarray(idx)
    val = np.asarray(val)
    if idx.ndim != 1 or val.shape != idx.shape:
        raise err(f"accumulate: idx and val must be 1-D of the same length, got {idx.shape} and {val.shape}")
    if idx.size == 0:
        return
    if idx.dtype.kind not in "iu":
        raise err(f"accumulate: indices must be integers, got {idx.dtype}")
    lo, hi = idx.min(), idx.max()
    if lo < 0 or hi >= out.size:
        raise err(f"accumulate: index {lo if lo < 0 else hi} out of range [0, {out.size})")
    val = val.astype(np.float32, copy=False)
    if _scatter_add_native is not None and out.flags.c_contiguous and out.size <= _I32_MAX:
        _scatter_add_native(out, np.ascontiguousarray(idx, np.int32), np.ascontiguousarray(val))
    else:
        np.add.at(out, idx, val)


def decompress(idx: np.ndarray, val: np.ndarray, count: int) -> np.ndarray:
    """Dense float32 array of ``count`` zeros with the pairs added."""
    out = np.zeros(int(count), np.float32)
    accumulate(out, idx, val)
    return out


class Sparsifier(Compressor):
    """Selects (index, value) pairs from a float32 vector, keeping per-``key``
    state for error feedback and momentum correction.

    With ``error_feedback`` (default): ``acc = x + residual[key]`` (zeros at a
    key's first use), the pairs are selected from ``acc`` and ``residual[key]
    = acc`` with the selected entries zeroed, so nothing is lost: the sum of
    all sent values plus the residual equals the sum of all inputs. Without:
    the pairs are selected from ``x`` and nothing is kept.

    With ``momentum=m`` (Deep Gradient Compression, Lin et al. 2018; needs
    error feedback): ``u = m*u + x; v = v + u``; the pairs are selected from
    ``v``, and the selected entries of both ``u`` and ``v`` are zeroed
    (momentum factor masking). The sent values already carry the momentum, so
    the optimizer must be plain SGD without momentum. Conserved: the sum of
    sent values plus ``v`` equals the sum of the ``u`` added at each step.

    Indices are int32 (count < 2**31), sorted ascending and unique; values are
    the float32 entries of ``acc`` (or ``v``). Inputs must be finite.
    """

    ratio: float | None = None

    def __init__(self, error_feedback: bool = True, momentum: float | None = None):
        self.error_feedback = bool(error_feedback)
        if momentum is not None:
            momentum = float(momentum)
            if not 0.0 <= momentum < 1.0:
                raise err(f"{self.name}: momentum must be in [0, 1), got {momentum}")
            if not self.error_feedback:
                raise err(f"{self.name}: momentum correction needs error_feedback=True")
        self.momentum = momentum
        self._res: dict = {}   # key -> residual (v with momentum)
        self._mom: dict = {}   # key -> momentum buffer u

    def _opts(self) -> str:
        s = "" if self.error_feedback else ",error_feedback=0"
        return s + ("" if self.momentum is None else f",momentum={self.momentum!r}")

    def k(self, count: int) -> int | None:
        """Pairs sent for ``count`` elements (None: depends on the data)."""
        return None

    def _select(self, acc: np.ndarray, add: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The indices to send of ``acc`` and their values (after ``acc += add``, which this does: fused
        where it can)."""
        raise NotImplementedError

    @staticmethod
    def _pass(acc, add, t: float, cap: int):
        """``acc += add``, then the indices of |acc| >= t and their values, in one pass (None if more
        than ``cap``)."""
        if _candidates_native is not None and acc.flags.c_contiguous and (add is None or add.flags.c_contiguous):
            idx, val = np.empty(cap, np.int32), np.empty(cap, np.float32)
            count = _candidates_native(acc, add, t, idx, val)
            return (idx[:count], val[:count]) if count <= cap else None
        if add is not None:
            acc += add
        idx = np.flatnonzero(np.abs(acc) >= np.float32(t)).astype(np.int32)
        return (idx, acc[idx]) if idx.size <= cap else None

    def _state(self, store: dict, key, n: int) -> np.ndarray:
        a = store.get(key)
        if a is None:
            a = store[key] = np.zeros(n, np.float32)
        elif a.size != n:
            raise err(f"{self.name}: key {key!r} was used with {a.size} elements, now {n}; "
                      "use another key or reset() it")
        return a

    def compress(self, x: np.ndarray, key=None) -> tuple[np.ndarray, np.ndarray]:
        """Select pairs from ``x`` (+ the state of ``key``): ``(idx int32, val float32)``."""
        check_f32(x)
        n = x.size
        if n > _I32_MAX:
            raise err(f"{self.name}: {n} elements do not fit int32 indices")
        if not self.error_feedback:
            return self._select(x)
        if self.momentum is None:
            acc = self._state(self._res, key, n)
            idx, val = self._select(acc, x)         # acc += x, then select
        else:
            u = self._state(self._mom, key, n)
            acc = self._state(self._res, key, n)
            u *= np.float32(self.momentum)
            u += x
            idx, val = self._select(acc, u)
        acc[idx] = 0
        if self.momentum is not None:
            u[idx] = 0
        return idx, val

    def residual(self, key=None) -> np.ndarray | None:
        """A copy of the residual kept for ``key`` (``v`` with momentum), None if none."""
        a = self._res.get(key)
        return None if a is None else a.copy()

    def momentum_buffer(self, key=None) -> np.ndarray | None:
        """A copy of the momentum buffer ``u`` of ``key``, None if none."""
        a = self._mom.get(key)
        return None if a is None else a.copy()

    def reset(self, key=None) -> None:
        """Forget the state of ``key``; ``reset()`` forgets every key."""
        if key is None:
            self._res.clear()
            self._mom.clear()
        else:
            self._res.pop(key, None)
            self._mom.pop(key, None)

    @staticmethod
    def decompress(idx: np.ndarray, val: np.ndarray, count: int) -> np.ndarray:
        return decompress(idx, val, count)

    @staticmethod
    def accumulate(out: np.ndarray, idx: np.ndarray, val: np.ndarray) -> None:
        accumulate(out, idx, val)

    @staticmethod
    def pack(idx: np.ndarray, val: np.ndarray, count: int, out: np.ndarray | None = None) -> np.ndarray:
        return pack(idx, val, count, out)

    @staticmethod
    def unpack(data: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        return unpack(data, count)

    @staticmethod
    def nbytes(pairs: int, count: int) -> int:
        return nbytes(pairs, count)

    @staticmethod
    def sum_packed(out: np.ndarray, wires: list) -> None:
        sum_packed(out, wires)


class TopK(Sparsifier):
    """The ``k = max(1, ceil(ratio * count))`` entries of largest magnitude.

    Exactly k pairs (all of them when ``count <= k``). Ties: of entries whose
    magnitude equals the k-th largest, the lowest indices are taken, so the
    choice is deterministic and the same on every rank. ``ratio`` on the wire
    is ``1.5 * ratio`` (6 bytes per pair against 4 per element).
    """

    name = "topk"

    def __init__(self, ratio: float, error_feedback: bool = True, momentum: float | None = None):
        ratio = float(ratio)
        if not 0.0 < ratio <= 1.0:
            raise err(f"topk: ratio must be in (0, 1], got {ratio}")
        self.fraction = ratio
        self.ratio = 1.5 * ratio
        super().__init__(error_feedback, momentum)

    @property
    def spec(self) -> str:
        return f"topk:{self.fraction!r}" + self._opts()

    def k(self, count: int) -> int:
        count = int(count)
        r = self.fraction * count
        # ceil with a 1e-9 relative slack, so that 0.07 * 100 = 7.000000000000001 gives 7
        return min(count, max(1, math.ceil(r - 1e-9 * r)))

    def _select(self, acc, add=None):
        n = acc.size
        k = self.k(n)
        if k >= n:
            if add is not None:
                acc += add
            return np.arange(n, dtype=np.int32), acc.copy()
        cand = self._candidates(acc, add, k)      # acc += add done
        cand, vals = (None, acc) if cand is None else cand   # the values sent come from here
        sub = np.abs(vals)
        t = np.partition(sub, sub.size - k)[sub.size - k]      # the k-th largest magnitude
        sel = np.flatnonzero(sub >= t)
        if sel.size > k:                # ties at t: the lowest indices of the equal ones
            tie = np.flatnonzero(sub[sel] == t)
            sel = np.delete(sel, tie[k - (sel.size - tie.size):])
        if sel.size != k:
            raise err("topk: the input holds NaN; values must be finite")
        return (sel if cand is None else cand[sel]).astype(np.int32), vals[sel]

    def _candidates(self, acc, add, k: int):
        """``acc += add`` and the indices (ascending) and values of a superset of its k largest magnitudes,
        or None to take all (DGC's sampled threshold: a fixed-stride sample says which magnitude about 1.3k
        entries reach). Selecting among them gives exactly the k largest, at one pass over ``acc``
        instead of a partition of all of it."""
        n = acc.size
        if n < 1 << 16:
            if add is not None:
                acc += add
            return None
        step = max(1, n // (1 << 14))
        sample = np.abs(acc[::step] if add is None else acc[::step] + add[::step])
        m = min(sample.size - 1, int(1.3 * k * sample.size / n) + 8)   # about 1.3k: > 3 sigma above k
        t0 = np.partition(sample, sample.size - 1 - m)[sample.size - 1 - m]
        cand = self._pass(acc, add, float(t0), n // 4)
        return cand if cand is not None and cand[0].size >= k else None     # a bad sample: take all


class Threshold(Sparsifier):
    """Every entry with ``|acc| >= tau``: a data-dependent number of pairs."""

    name = "threshold"

    def __init__(self, tau: float, error_feedback: bool = True, momentum: float | None = None):
        tau = float(tau)
        if not (tau >= 0.0 and math.isfinite(tau)):
            raise err(f"threshold: tau must be finite and >= 0, got {tau}")
        self.tau = tau
        super().__init__(error_feedback, momentum)

    @property
    def spec(self) -> str:
        return f"threshold:{self.tau!r}" + self._opts()

    def _select(self, acc, add=None):
        return self._pass(acc, add, self.tau, acc.size)
