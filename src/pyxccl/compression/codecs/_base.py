"""Shared pieces of the compressors: the base class and argument checks."""
from __future__ import annotations

import numpy as np

from ..._errors import InvalidArgumentError

__all__ = ["Compressor", "InvalidArgumentError"]

#: elements processed per pass by the quantizers: a few MiB of float32, so the
#: temporaries of one pass stay in cache and never grow with the buffer.
CHUNK = 1 << 16


class Compressor:
    """Base of :class:`Quantizer` and :class:`Sparsifier`.

    ``name`` is the short name (``"fp16"``, ``"topk"``, ...); ``spec`` the
    string :func:`parse` turns back into an equal compressor; ``ratio`` the
    wire bytes per input byte for large buffers (None when it depends on the
    data).
    """

    name: str = ""
    ratio: float | None = None

    @property
    def spec(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.spec))


def err(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(msg, op="compress")


def check_f32(x, what: str = "x") -> np.ndarray:
    """``x`` must be a 1-D float32 numpy array (any strides)."""
    if not isinstance(x, np.ndarray):
        raise err(f"{what} must be a numpy float32 array, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise err(f"{what} must be float32, got {x.dtype}: the compressors only encode float32 data")
    if x.ndim != 1:
        raise err(f"{what} must be 1-D, got shape {x.shape}")
    return x


def check_u8(data, nbytes: int | None, what: str = "data") -> np.ndarray:
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        got = data.dtype if isinstance(data, np.ndarray) else type(data).__name__
        raise err(f"{what} must be a 1-D uint8 numpy array, got {got}")
    if not data.flags.c_contiguous:
        raise err(f"{what} must be contiguous")
    if nbytes is not None and data.size != nbytes:
        raise err(f"{what} has {data.size} bytes, the code needs exactly {nbytes}")
    return data
