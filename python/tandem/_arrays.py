# SPDX-License-Identifier: Apache-2.0
"""NumPy arrays and PyTorch tensors alike: element strides, views, new
outputs of the caller's kind. torch is imported only when a tensor is passed.

Storage types (SPEC §10.1): float32, float64, bfloat16 and float16. NumPy
has no bfloat16: a NumPy bf16 array is an `ml_dtypes.bfloat16` array, which
neither DLPack nor the buffer protocol carries, so `crossing` hands the
extension its uint16 view (the same memory; the extension reads uint16 as
bf16 bits, and only this module ever passes it one for a float input).
"""

import sys

import numpy as np

from ._errors import Error

FLOATS = ("float32", "float64", "bfloat16", "float16")
LOW_PRECISION = ("bfloat16", "float16")
_E4M3 = "float8_e4m3fn"


def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    """Whether x is a torch tensor. Cheap: after as_array, everything that is
    not a NumPy array is one (isinstance on torch.Tensor, whose metaclass
    customizes instance checks, costs microseconds; its C base does not)."""
    if isinstance(x, np.ndarray):
        return False
    t = _torch()
    return t is not None and isinstance(x, t._C.TensorBase)


def dtype_name(x):
    return str(x.dtype).replace("torch.", "")


def as_array(x, name):
    """x as a NumPy array or a CPU torch tensor (detached), checked to be
    float32, float64, bfloat16 or float16; anything else that NumPy takes
    becomes a NumPy array."""
    if isinstance(x, np.ndarray):
        if x.dtype.char in "fde" or x.dtype.name == "bfloat16":
            return x
    elif is_torch(x):
        if x.device.type != "cpu":
            raise Error(f"{name}.device = {x.device} must be cpu", f"{name}.device")
        if x.requires_grad:
            x = x.detach()
    else:
        x = np.asarray(x)
    if dtype_name(x) not in FLOATS:
        raise Error(f"{name}.dtype = {dtype_name(x)} must be float32, float64, bfloat16 or "
                    "float16", f"{name}.dtype")
    return x


def is_low_precision(x):
    """Whether x is stored in bfloat16 or float16."""
    return dtype_name(x) in LOW_PRECISION


def stat_dtype(x):
    """The dtype of the statistics (lse) of a call whose storage is x's:
    float32 for bfloat16 and float16 (SPEC §10.1), x's own otherwise."""
    if not is_low_precision(x):
        return x.dtype
    return _torch().float32 if is_torch(x) else np.float32


def crossing(x):
    """x as the extension takes it: a NumPy bfloat16 array as its uint16
    view, float8 e4m3fn codes (NumPy or torch) as their uint8 view, both the
    same memory; anything else as it is."""
    if isinstance(x, np.ndarray):
        n = x.dtype.name
        if n == "bfloat16":
            return x.view(np.uint16)
        if n == _E4M3:
            return x.view(np.uint8)
    elif is_torch(x) and dtype_name(x) == _E4M3:
        return x.view(_torch().uint8)
    return x


def as_codes(x, name, kind):
    """The codes of a quantized cache (SPEC §10.4): int8 for kind "int8";
    float8_e4m3fn (torch, ml_dtypes) or its bits as uint8 for "e4m3"."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise Error(f"{name}.device = {x.device} must be cpu", f"{name}.device")
        x = x.detach()
    elif not isinstance(x, np.ndarray):
        x = np.asarray(x)
    ok = ("int8",) if kind == "int8" else (_E4M3, "uint8")
    if dtype_name(x) not in ok:
        raise Error(f"{name}.dtype = {dtype_name(x)} must be {' or '.join(ok)} (the codes of "
                    f"an {kind} cache)", f"{name}.dtype")
    return x


def e4m3_codes(like, shape):
    """New e4m3 codes for a cache of `like`'s kind: torch.float8_e4m3fn, or
    ml_dtypes.float8_e4m3fn for NumPy (uint8 without ml_dtypes)."""
    if is_torch(like):
        return _torch().empty(shape, dtype=_torch().float8_e4m3fn)
    try:
        import ml_dtypes
    except ImportError:
        return np.empty(shape, dtype=np.uint8)
    return np.empty(shape, dtype=ml_dtypes.float8_e4m3fn)


def strides(x):
    """Strides in elements."""
    if is_torch(x):
        return x.stride()
    return tuple(s // x.itemsize for s in x.strides)


def contiguous(x):
    if is_torch(x):
        return x.contiguous()
    return np.ascontiguousarray(x)


def is_contiguous(x):
    expect = 1
    for n, s in zip(reversed(x.shape), reversed(strides(x))):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def reshape(x, shape):
    return x.reshape(shape)


def empty(like, shape, dtype=None):
    """A new contiguous array of the caller's kind (NumPy or torch)."""
    if is_torch(like):
        return _torch().empty(shape, dtype=like.dtype if dtype is None else dtype)
    return np.empty(shape, dtype=like.dtype if dtype is None else dtype)


def to_float32(x, name):
    """A float32 contiguous copy of a mask or bias (bool, integer or float)."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise Error(f"{name}.device = {x.device} must be cpu", f"{name}.device")
        return x.detach().to(_torch().float32).contiguous()
    return np.ascontiguousarray(np.asarray(x), dtype=np.float32)


INDICES = ("int32", "int64")


def as_indices(x, name):
    """An index input (cu_seqlens, block tables, lengths, positions) as a
    contiguous int32 or int64 NumPy array or CPU torch tensor, the caller's
    memory when it already is one; a list becomes an int64 NumPy array."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise Error(f"{name}.device = {x.device} must be cpu", f"{name}.device")
        x = x.detach()
    elif not isinstance(x, np.ndarray):
        x = np.asarray(x)
        if x.dtype.kind in "iu" and x.dtype.name not in INDICES:
            x = x.astype(np.int64)
    if dtype_name(x) not in INDICES:
        raise Error(f"{name}.dtype = {dtype_name(x)} must be int32 or int64", f"{name}.dtype")
    return x if is_contiguous(x) else contiguous(x)


def row_stride(x, heads, width):
    """The row stride of a [B, S, heads, width] view whose rows (b, s) are
    evenly spaced and whose heads and elements are contiguous within a row,
    or None when the view is laid out otherwise."""
    B, S = x.shape[0], x.shape[1]
    st = strides(x)
    if (heads > 1 and st[2] != width) or (width > 1 and st[3] != 1):
        return None
    row = heads * width
    if S > 1:
        rs = st[1]
    elif B > 1:
        rs = st[0]
    else:
        rs = row
    if rs < row or (B > 1 and S > 1 and st[0] != S * rs):
        return None
    return rs


def rows_view(x, name):
    """x of rank >= 2 as [B', S, W] (every axis before the last two folded
    into B') and its row stride: the caller's memory when its rows are evenly
    spaced, a contiguous copy otherwise."""
    if x.ndim < 2:
        raise Error(f"{name}.shape = {list(x.shape)} must have rank >= 2", f"{name}.shape")
    S, W = x.shape[-2], x.shape[-1]
    B = 1
    for n in x.shape[:-2]:
        B *= n
    x3 = x.reshape(B, S, W)
    rs = row_stride(x3.reshape(B, S, 1, W), 1, W) if B * S * W > 0 else None
    if rs is None:
        x3 = contiguous(x3)
        rs = W
    return x3, rs
