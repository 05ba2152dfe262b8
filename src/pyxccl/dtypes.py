"""Buffers and dtypes: turn what users pass (numpy arrays, torch CPU tensors,
writable buffer-protocol objects) into flat numpy views, zero-copy, and check them."""
from __future__ import annotations

import sys

import ml_dtypes
import numpy as np


bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: Every dtype a collective accepts, with a one-byte code that travels in frame
#: headers so that a receiver can tell when ranks disagree on the dtype.
DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(d) for d in (
    np.float16, bfloat16, np.float32, np.float64,
    np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))
DTYPE_CODE = {d: i + 1 for i, d in enumerate(DTYPES)}
CODE_DTYPE = {c: d for d, c in DTYPE_CODE.items()}
FLOATS = frozenset(DTYPES[:4])

def _torch_module():
    """torch if the user already imported it (never import it ourselves: it is slow)."""
    return sys.modules.get("torch")


def dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if dt == bfloat16 else dt.name


def as_array(obj, *, what: str, writable: bool, ctx) -> np.ndarray:
    """A flat numpy view of ``obj`` sharing its memory.

    ``what`` names the argument in errors ("sendbuf"); ``ctx`` is a callable
    ``ctx(msg) -> Exception`` that adds the rank and operation to the message.
    """
    torch = _torch_module()
    if torch is not None and isinstance(obj, torch.Tensor):
        arr = _tensor_view(torch, obj, what, ctx)
    elif isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise ctx(f"{what} is a {type(obj).__name__}, not a numpy array, a torch CPU tensor "
                      f"or a buffer-protocol object; pass one of those") from None
        if not mv.contiguous:
            raise ctx(f"{what} is a non-contiguous buffer; pass a contiguous one")
        arr = np.asarray(mv) if mv.format not in ("c", "") else np.frombuffer(mv, np.uint8)
        if mv.readonly:
            arr.flags.writeable = False
    if not arr.flags.c_contiguous:
        raise ctx(f"{what} is not C-contiguous (shape {arr.shape}, strides {arr.strides}); "
                  f"pass np.ascontiguousarray(x) / x.contiguous() and copy the result back")
    if writable and not arr.flags.writeable:
        raise ctx(f"{what} is read-only but this operation writes into it; pass a writable buffer")
    dt = arr.dtype
    if dt not in DTYPE_CODE:
        raise ctx(f"{what} has dtype {dt}, which pyxccl does not support; supported: "
                  + ", ".join(dtype_name(d) for d in DTYPES))
    return arr.reshape(-1)


def _tensor_view(torch, t, what, ctx) -> np.ndarray:
    if t.device.type != "cpu":
        raise ctx(f"{what} is on device {t.device}; pyxccl moves CPU tensors only: pass t.cpu()")
    if not t.is_contiguous():
        raise ctx(f"{what} is a non-contiguous tensor; pass t.contiguous() and copy the result back")
    t = t.detach()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: view the bits, then retype
        return t.view(torch.int16).numpy().view(bfloat16)
    try:
        return t.numpy()
    except TypeError:
        raise ctx(f"{what} has torch dtype {t.dtype}, which pyxccl does not support") from None
