# SPDX-License-Identifier: Apache-2.0
"""Writes case directories for `tandem check` and `tandem run` (NumPy only).

A case is a directory holding case.json and one .npy file per tensor:

    import numpy as np
    from tandem_case import write_case

    x = np.random.standard_normal((4, 16)).astype(np.float32)
    g, u = x[:, :8], x[:, 8:]
    write_case("cases/swiglu_small", "swiglu", {"gate_first": True},
               inputs={"x": x}, expected={"out": g / (1 + np.exp(-g)) * u})

Tensors are saved as C-order little-endian float32 (`<f4`); a key-padding
keep mask (input "mask" of attention with mask "key_padding", or of
attention_block) keeps a boolean or integer dtype, and index inputs (RoPE's
"positions"; attention's cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
cache_seqlens) are saved as integers: `<i4` when their dtype fits in int32,
else `<i8`. Anything with `.detach().cpu().numpy()` (a PyTorch tensor) or
`__array__` is accepted.

With dtype="bf16" or "f16" (SPEC §9.4) the storage tensors — every input but
the mask, the ALiBi slopes, index inputs and a quantized cache's codes and
scales — and the expected outputs are saved in that type: f16 as `<f2`, bf16
as its bits in `<u2` (NumPy has no bfloat16), and case.json says
`"dtype"`. Their values must already be of that type (a bf16 torch tensor,
or an array rounded to it): a value the type cannot hold exactly is an
error, never rounded here. With kv_cache int8 or e4m3, k and v are the
codes: integer arrays saved as `|i1` (int8) or `|u1` (e4m3 bits; a torch
float8_e4m3fn tensor is taken by its bits).
"""

import json
import os
import sys

import numpy as np

__all__ = ["write_case"]


def _to_numpy(name, value):
    if hasattr(value, "detach"):  # a torch.Tensor, without importing torch
        value = value.detach().cpu()
        kind = str(value.dtype)
        if kind == "torch.bfloat16":
            value = value.float()  # exact
        elif kind.startswith("torch.float8"):
            value = value.view(sys.modules["torch"].uint8)  # the code bytes
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype == object:
        raise TypeError(f"tensor {name!r}: cannot convert {type(value).__name__} to an array")
    return array


INDEX_INPUTS = {"positions", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table",
                "cache_seqlens"}


def _keeps_dtype(op, attrs, name):
    if name != "mask":
        return False
    if op == "attention_block":
        return True
    return op.startswith("attention") and attrs.get("mask") == "key_padding"


def _save_indices(directory, filename, array):
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{filename}: index input of dtype {array.dtype}; give an integer array")
    width = "<i4" if np.can_cast(array.dtype, np.int32) else "<i8"
    np.save(os.path.join(directory, filename), np.ascontiguousarray(array, dtype=width),
            allow_pickle=False)


def _plain(value, where):
    """JSON-safe attrs: NumPy scalars become Python ones."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"{where}: {value!r} is not an int, float, bool or string")


def _save(directory, filename, array, keep_dtype):
    if keep_dtype and (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer)):
        array = np.ascontiguousarray(array.astype(np.bool_ if array.dtype == np.bool_ else "<i8"))
    else:
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
                or array.dtype == np.bool_):
            raise TypeError(f"{filename}: dtype {array.dtype} is not a real number type")
        array = np.ascontiguousarray(array, dtype="<f4")
    np.save(os.path.join(directory, filename), array, allow_pickle=False)


FLOAT32_INPUTS = {"mask", "alibi_slopes", "k_scale", "v_scale"}


def _exactly(array, stored, filename, dtype):
    back = stored.astype(np.float64)
    same = (back == array) | (np.isnan(back) & np.isnan(array))
    if not np.all(same):
        raise ValueError(f"{filename}: values that {dtype} cannot hold exactly; round the "
                         f"tensor to {dtype} first (the case stores, never rounds)")


def _save_storage(directory, filename, array, dtype):
    """A storage tensor of a bf16 (<u2 bits) or f16 (<f2) case."""
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"{filename}: dtype {array.dtype} is not a real number type")
    wide = np.asarray(array, dtype=np.float64)
    if dtype == "f16":
        stored = np.ascontiguousarray(wide.astype("<f2"))
        _exactly(wide, stored, filename, dtype)
    else:
        f32 = np.ascontiguousarray(wide.astype("<f4"))
        bits = f32.view("<u4")
        if np.any(bits & 0xFFFF) or not np.array_equal(f32.astype(np.float64), wide,
                                                       equal_nan=True):
            raise ValueError(f"{filename}: values that bf16 cannot hold exactly; round the "
                             f"tensor to bf16 first (the case stores, never rounds)")
        stored = np.ascontiguousarray((bits >> 16).astype("<u2"))
    np.save(os.path.join(directory, filename), stored, allow_pickle=False)


def _save_codes(directory, filename, array, kv_cache):
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{filename}: kv_cache {kv_cache} codes must be integers "
                        f"(int8 codes, or e4m3 bits as uint8), not {array.dtype}")
    lo, hi = (-128, 127) if kv_cache == "int8" else (0, 255)
    if array.size and (array.min() < lo or array.max() > hi):
        raise ValueError(f"{filename}: codes outside [{lo}, {hi}]")
    width = "|i1" if kv_cache == "int8" else "|u1"
    np.save(os.path.join(directory, filename), np.ascontiguousarray(array, dtype=width),
            allow_pickle=False)


def write_case(directory, op, attrs=None, inputs=None, expected=None, tolerance=None,
               dtype=None, rounding=None):
    """Writes `directory`/case.json and one .npy file per tensor.

    directory: created if missing; existing files of the same names are replaced.
    op:        "attention", "attention_backward", "rope", "rope_backward", "rope_qk",
               "rope_qk_backward", "axial_rope", "axial_rope_backward", "swiglu",
               "swiglu_backward" or "attention_block".
    attrs:     the op's attrs (see `tandem --help`), e.g. {"num_heads": 8}.
    inputs:    {name: array}; written as <name>.npy.
    expected:  {output name: array} or None; written as expected_<name>.npy.
    tolerance: None (the op's default), or {"rtol": float, "atol": float}.
    dtype:     None or "f32", "bf16", "f16": the call's storage type (SPEC §9.4).
    rounding:  None, or attention's profile "pytorch", "exact" or "ggml" (SPEC §10.3).

    Returns the path of case.json.
    """
    attrs = {} if attrs is None else dict(attrs)
    inputs = {} if inputs is None else dict(inputs)
    expected = {} if expected is None else dict(expected)
    if not isinstance(op, str):
        raise TypeError("op must be a string")
    os.makedirs(directory, exist_ok=True)
    if dtype not in (None, "f32", "bf16", "f16"):
        raise ValueError(f"dtype: {dtype!r} is not f32, bf16 or f16")
    low = dtype in ("bf16", "f16")
    kv_cache = attrs.get("kv_cache", "plain")
    case = {"op": op, "attrs": {k: _plain(v, f"attrs[{k!r}]") for k, v in attrs.items()},
            "inputs": {}}
    if dtype is not None:
        case["dtype"] = dtype
    if rounding is not None:
        case["rounding"] = _plain(rounding, "rounding")
    for name, value in inputs.items():
        filename = f"{name}.npy"
        if name in INDEX_INPUTS:
            _save_indices(directory, filename, _to_numpy(name, value))
        elif name in ("k", "v") and kv_cache != "plain":
            _save_codes(directory, filename, _to_numpy(name, value), kv_cache)
        elif low and name not in FLOAT32_INPUTS:
            _save_storage(directory, filename, _to_numpy(name, value), dtype)
        else:
            _save(directory, filename, _to_numpy(name, value), _keeps_dtype(op, attrs, name))
        case["inputs"][name] = filename
    if expected:
        case["expected"] = {}
        for name, value in expected.items():
            filename = f"expected_{name}.npy"
            if low:
                _save_storage(directory, filename, _to_numpy(name, value), dtype)
            else:
                _save(directory, filename, _to_numpy(name, value), False)
            case["expected"][name] = filename
    if tolerance is not None:
        unknown = set(tolerance) - {"rtol", "atol"}
        if unknown:
            raise ValueError(f"tolerance: unknown keys {sorted(unknown)} (rtol, atol)")
        case["tolerance"] = {k: float(v) for k, v in tolerance.items()}
    path = os.path.join(directory, "case.json")
    with open(path, "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")
    return path
