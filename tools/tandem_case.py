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
"""

import json
import os

import numpy as np

__all__ = ["write_case"]


def _to_numpy(name, value):
    if hasattr(value, "detach"):  # a torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
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


def write_case(directory, op, attrs=None, inputs=None, expected=None, tolerance=None):
    """Writes `directory`/case.json and one .npy file per tensor.

    directory: created if missing; existing files of the same names are replaced.
    op:        "attention", "attention_backward", "rope", "rope_backward", "rope_qk",
               "rope_qk_backward", "axial_rope", "axial_rope_backward", "swiglu",
               "swiglu_backward" or "attention_block".
    attrs:     the op's attrs (see `tandem --help`), e.g. {"num_heads": 8}.
    inputs:    {name: array}; written as <name>.npy.
    expected:  {output name: array} or None; written as expected_<name>.npy.
    tolerance: None (the op's default), or {"rtol": float, "atol": float}.

    Returns the path of case.json.
    """
    attrs = {} if attrs is None else dict(attrs)
    inputs = {} if inputs is None else dict(inputs)
    expected = {} if expected is None else dict(expected)
    if not isinstance(op, str):
        raise TypeError("op must be a string")
    os.makedirs(directory, exist_ok=True)
    case = {"op": op, "attrs": {k: _plain(v, f"attrs[{k!r}]") for k, v in attrs.items()},
            "inputs": {}}
    for name, value in inputs.items():
        filename = f"{name}.npy"
        if name in INDEX_INPUTS:
            _save_indices(directory, filename, _to_numpy(name, value))
        else:
            _save(directory, filename, _to_numpy(name, value), _keeps_dtype(op, attrs, name))
        case["inputs"][name] = filename
    if expected:
        case["expected"] = {}
        for name, value in expected.items():
            filename = f"expected_{name}.npy"
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
