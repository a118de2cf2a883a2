#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes tandem's case corpus for `tandem check`:

  tests/cases/bad/<name>/      malformed cases: each must exit 2 with a message
                               naming the case, the file and the field
  tests/cases/formats/<name>/  valid cases in every .npy variant the reader
                               accepts (v1/v2/v3 headers, <f8, keep masks of
                               |b1, <i4, <i8, position ids of <i4, <i8) and
                               one deliberate mismatch

Each directory holds an `expect` file: the exit code on the first line and a
fragment the command's output must contain on the second. Run it with the
system Python (NumPy only) from anywhere; it rewrites both trees. The files
are committed, so building and testing never needs Python.

  --examples   instead (re)writes the RoPE examples in tests/cases/examples/
               whose expected outputs PyTorch computes (needs torch: run it
               from a virtual environment with numpy and torch installed)
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20240611)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def npy_bytes(header_dict_text, data=b"", version=(1, 0)):
    """A .npy file with a hand-written header (to make malformed ones)."""
    header = header_dict_text.encode("latin1")
    prefix_len = 10 if version[0] == 1 else 12
    pad = (64 - (prefix_len + len(header) + 1) % 64) % 64
    header = header + b" " * pad + b"\n"
    out = b"\x93NUMPY" + bytes(version)
    out += struct.pack("<H", len(header)) if version[0] == 1 else struct.pack("<I", len(header))
    return out + header + data


class Writer:
    def __init__(self, root):
        self.root = root
        if os.path.isdir(root):
            shutil.rmtree(root)
        os.makedirs(root)

    def case(self, name, case_json, arrays=None, raw=None, expect=(2, ""), json_text=None):
        d = os.path.join(self.root, name)
        os.makedirs(d)
        if json_text is not None:
            with open(os.path.join(d, "case.json"), "w") as f:
                f.write(json_text)
        elif case_json is not None:
            with open(os.path.join(d, "case.json"), "w") as f:
                json.dump(case_json, f, indent=1)
                f.write("\n")
        for fname, arr in (arrays or {}).items():
            version = None
            if isinstance(arr, tuple):
                arr, version = arr
            with open(os.path.join(d, fname), "wb") as f:
                np.lib.format.write_array(f, arr, version=version, allow_pickle=False)
        for fname, data in (raw or {}).items():
            with open(os.path.join(d, fname), "wb") as f:
                f.write(data)
        with open(os.path.join(d, "expect"), "w") as f:
            f.write(f"{expect[0]}\n{expect[1]}\n")


def swiglu_case(**overrides):
    c = {"op": "swiglu", "attrs": {"gate_first": True}, "inputs": {"x": "x.npy"}}
    c.update(overrides)
    return c


def attention_case(attrs, inputs=None, **overrides):
    c = {"op": "attention", "attrs": attrs,
         "inputs": inputs or {"q": "q.npy", "k": "k.npy", "v": "v.npy"}}
    c.update(overrides)
    return c


def qkv(q=(1, 4, 2, 8), k=(1, 4, 2, 8), v=(1, 4, 2, 8)):
    return {"q.npy": f32(*q), "k.npy": f32(*k), "v.npy": f32(*v)}


def rope_case(attrs):
    return {"op": "rope", "attrs": attrs, "inputs": {"x": "x.npy", "cos": "cos.npy", "sin": "sin.npy"}}


def rope_arrays(x=(1, 5, 16), table=(5, 4)):
    return {"x.npy": f32(*x), "cos.npy": f32(*table), "sin.npy": f32(*table)}


# RoPE's cases draw from their own generator, so the files above stay as they are.
rope_rng = np.random.default_rng(20240612)


def rope_f32(*shape):
    return rope_rng.standard_normal(shape).astype(np.float32)


def rope_positions_case(attrs, op="rope", names=("x",), **overrides):
    inputs = {n: f"{n}.npy" for n in names}
    inputs.update({"cos": "cos.npy", "sin": "sin.npy", "positions": "positions.npy"})
    c = {"op": op, "attrs": attrs, "inputs": inputs}
    c.update(overrides)
    return c


def rope_tables(rows, half):
    angles = np.arange(rows)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def write_bad_rope(w):
    """Malformed RoPE cases: layouts, position ids, and the q-and-k ops."""
    cos, sin = rope_tables(5, 4)
    tables = {"cos.npy": cos, "sin.npy": sin}
    x = {"x.npy": rope_f32(2, 3, 16), **tables}
    pos = np.array([[0, 1, 2], [4, 3, 1]], dtype="<i8")
    w.case("rope_positions_out_of_range", rope_positions_case({"head_dim": 8}),
           {**x, "positions.npy": np.array([[0, 1, 2], [5, 3, 1]], dtype="<i8")},
           expect=(2, "positions.npy: inputs.positions: positions[3] = 5 must be in "
                      "[0, max_position = 5)"))
    w.case("rope_positions_negative", rope_positions_case({"head_dim": 8}),
           {**x, "positions.npy": np.array([[0, 1, 2], [4, -1, 1]], dtype="<i4")},
           expect=(2, "positions.npy: inputs.positions: positions[4] = -1 must be in "
                      "[0, max_position = 5)"))
    w.case("rope_positions_float_dtype", rope_positions_case({"head_dim": 8}),
           {**x, "positions.npy": pos.astype("<f4")},
           expect=(2, "positions.npy: inputs.positions: dtype <f4 is not allowed here: "
                      "positions holds indices, <i4 or <i8"))
    w.case("rope_positions_wrong_shape", rope_positions_case({"head_dim": 8}),
           {**x, "positions.npy": pos.reshape(6)},
           expect=(2, "positions.npy: positions.shape: positions.shape = [6] must be x's token "
                      "axes [B, S] = [2, 3]"))
    w.case("rope_table_rows_with_positions",
           rope_positions_case({"head_dim": 8, "table_rows": "token"}),
           {**x, "positions.npy": pos},
           expect=(2, "case.json: attrs.table_rows: table_rows = token must be absent (or "
                      "position_ids) when positions are given"))
    w.case("rope_position_ids_without_positions",
           rope_case({"head_dim": 8, "table_rows": "position_ids"}), x,
           expect=(2, "case.json: positions: positions = (absent) is required for table_rows = "
                      "position_ids"))
    x4 = {"x.npy": rope_f32(2, 3, 3, 8), **tables}
    w.case("rope_rank4_layout_ambiguous", rope_case({}), x4,
           expect=(2, "case.json: attrs.layout: layout = (absent) is ambiguous for x.shape = "
                      "[2, 3, 3, 8]; give layout bshd or bhsd (or num_heads)"))
    w.case("rope_rank4_num_heads_both_dims", rope_case({"num_heads": 3}), x4,
           expect=(2, "case.json: attrs.layout: layout = (absent) is ambiguous for x.shape = "
                      "[2, 3, 3, 8] and num_heads = 3; give layout bshd or bhsd"))
    w.case("rope_num_heads_not_on_head_axis", rope_case({"layout": "bshd", "num_heads": 4}), x4,
           expect=(2, "x.npy: x.shape: x.shape = [2, 3, 3, 8] must have num_heads = 4 on its head "
                      "axis (bshd)"))
    w.case("rope_bad_layout_name", rope_case({"layout": "sbhd"}), x4,
           expect=(2, 'case.json: attrs.layout: must be one of "bshd", "bhsd", "thd", got "sbhd"'))
    w.case("rope_thd_rank4", rope_case({"layout": "thd"}), x4,
           expect=(2, "case.json: attrs.layout: layout = thd needs rank 2 or 3"))
    qk = {"q.npy": rope_f32(2, 3, 32), **tables, "positions.npy": pos}
    w.case("rope_qk_token_axes_differ", rope_positions_case({"num_heads": 4}, "rope_qk", ("q", "k")),
           {**qk, "k.npy": rope_f32(2, 4, 8)},
           expect=(2, "k.npy: k.shape: k.shape = [2, 4, 8] must have the token axes of q.shape = "
                      "[2, 3, 32]"))
    w.case("rope_qk_k_width", rope_positions_case({"num_heads": 4}, "rope_qk", ("q", "k")),
           {**qk, "k.npy": rope_f32(2, 3, 12)},
           expect=(2, "k.npy: k (k_width): k_width = 12 must be a positive multiple of head_dim = 8"))
    w.case("rope_qk_missing_k", rope_positions_case({"num_heads": 4}, "rope_qk", ("q",)), qk,
           expect=(2, "case.json: inputs.k: missing input"))


def write_formats_rope(w):
    """Position ids as <i4 and as <i8 (exact NumPy expectations)."""
    x = rope_f32(2, 3, 2, 8)  # [B, S, H, D], layout from num_heads
    cos, sin = rope_tables(7, 4)
    pos = np.array([[6, 0, 3], [1, 1, 5]])
    xs = x.astype(np.float64)
    c = cos.astype(np.float64)[pos][:, :, None, :]  # [B, S, 1, D/2]: shared by the heads
    s = sin.astype(np.float64)[pos][:, :, None, :]
    a, b = xs[..., :4], xs[..., 4:]
    out = np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(np.float32)
    for dtype in ["<i4", "<i8"]:
        w.case("rope_positions_" + {"<i4": "int32", "<i8": "int64"}[dtype],
               rope_positions_case({"num_heads": 2}, expected={"out": "out.npy"}),
               {"x.npy": x, "cos.npy": cos, "sin.npy": sin, "positions.npy": pos.astype(dtype),
                "out.npy": out},
               expect=(0, "pass"))


def write_bad(w):
    x = {"x.npy": f32(2, 8)}
    # --- case.json itself
    w.case("missing_case_json", None, x, expect=(2, "case.json: missing file"))
    w.case("bad_json", None, x, json_text='{ "op": "swiglu", "inputs": { "x": "x.npy" }\n',
           expect=(2, "case.json: is not valid JSON"))
    w.case("json_not_object", None, x, json_text="[1, 2, 3]\n",
           expect=(2, "must be a JSON object"))
    w.case("missing_op", {"inputs": {"x": "x.npy"}}, x, expect=(2, "case.json: op: is missing"))
    w.case("unknown_op", swiglu_case(op="softmax"), x, expect=(2, "case.json: op: unknown op"))
    w.case("op_not_string", swiglu_case(op=3), x, expect=(2, "case.json: op: must be a string"))
    w.case("unknown_top_level_key", swiglu_case(expect={"out": "out.npy"}), x,
           expect=(2, "case.json: expect: unknown key"))
    w.case("duplicate_key", None, x,
           json_text='{"op": "swiglu", "attrs": {"gate_first": true, "gate_first": false},'
                     ' "inputs": {"x": "x.npy"}}\n',
           expect=(2, "case.json: gate_first: key appears more than once"))
    w.case("attrs_not_object", swiglu_case(attrs=[1]), x,
           expect=(2, "case.json: attrs: must be a JSON object"))
    # --- attrs
    w.case("unknown_attr_window_on_rope", rope_case({"head_dim": 8, "window": 4}), rope_arrays(),
           expect=(2, "case.json: attrs.window: unknown attr for op rope"))
    w.case("unknown_attr_typo", attention_case({"num_heads": 2, "causal": True}), qkv(),
           expect=(2, "case.json: attrs.causal: unknown attr for op attention"))
    w.case("mistyped_num_heads_string", attention_case({"num_heads": "2"}), qkv(),
           expect=(2, 'case.json: attrs.num_heads: must be an integer, got "2" (a string)'))
    w.case("mistyped_num_heads_float", attention_case({"num_heads": 2.5}), qkv(),
           expect=(2, "case.json: attrs.num_heads: must be an integer, got 2.5"))
    w.case("num_heads_too_large", None, qkv(),
           json_text='{"op": "attention", "attrs": {"num_heads": 18446744073709551615},'
                     ' "inputs": {"q": "q.npy", "k": "k.npy", "v": "v.npy"}}\n',
           expect=(2, "attrs.num_heads: = 18446744073709551615 (an integer) does not fit"))
    w.case("mistyped_gate_first", swiglu_case(attrs={"gate_first": 1}), x,
           expect=(2, "case.json: attrs.gate_first: must be true or false"))
    w.case("mistyped_scale", attention_case({"num_heads": 2, "scale": "0.1"}), qkv(),
           expect=(2, "case.json: attrs.scale: must be a number"))
    w.case("bad_layout_name", attention_case({"num_heads": 2, "layout": "bsdh"}), qkv(),
           expect=(2, 'case.json: attrs.layout: must be one of "bshd", "bhsd", got "bsdh"'))
    w.case("bad_mask_name", attention_case({"num_heads": 2, "mask": "causal_lower_right"}), qkv(),
           expect=(2, "case.json: attrs.mask: must be one of"))
    w.case("bad_rope_style", rope_case({"head_dim": 8, "style": "llama"}), rope_arrays(),
           expect=(2, 'case.json: attrs.style: must be one of "neox", "gptj"'))
    w.case("bad_table_rows", rope_case({"head_dim": 8, "table_rows": "row"}), rope_arrays(),
           expect=(2, 'case.json: attrs.table_rows: must be one of "position", "token"'))
    w.case("missing_num_heads", attention_case({"mask": "causal"}), qkv(),
           expect=(2, "case.json: attrs.num_heads: is required for op attention"))
    w.case("missing_end_x", {"op": "axial_rope", "attrs": {"end_y": 2}, "inputs": {"x": "x.npy"}},
           {"x.npy": f32(1, 4, 8)}, expect=(2, "case.json: attrs.end_x: is required"))
    w.case("window_without_sliding_window",
           attention_case({"num_heads": 2, "mask": "causal", "window": 4}), qkv(),
           expect=(2, "case.json: attrs.window: window = 4 must be 0"))
    w.case("rope_n_rot_odd", rope_case({"head_dim": 8, "n_rot": 5}), rope_arrays(),
           expect=(2, "case.json: attrs.n_rot: n_rot = 5 must be even and <= head_dim = 8"))
    w.case("rope_head_dim_missing_rank3", rope_case({}), rope_arrays(),
           expect=(2, "case.json: attrs.head_dim: head_dim = (absent) is required"))
    w.case("softcap_negative", attention_case({"num_heads": 2, "softcap": -1.0}), qkv(),
           expect=(2, "case.json: attrs.softcap: softcap = -1.000000 must be finite and >= 0"))
    # --- inputs
    w.case("missing_input", attention_case({"num_heads": 2}, {"q": "q.npy", "k": "k.npy"}), qkv(),
           expect=(2, "case.json: inputs.v: missing input"))
    w.case("unknown_input", swiglu_case(inputs={"x": "x.npy", "y": "x.npy"}), x,
           expect=(2, "case.json: inputs.y: unknown input for op swiglu"))
    w.case("input_not_a_string", swiglu_case(inputs={"x": 5}), x,
           expect=(2, "case.json: inputs.x: must be a non-empty file name"))
    w.case("missing_npy_file", swiglu_case(inputs={"x": "nothere.npy"}), x,
           expect=(2, "nothere.npy: inputs.x: missing file"))
    w.case("int_dtype_for_float_input", swiglu_case(), {"x.npy": np.arange(16, dtype="<i4").reshape(2, 8)},
           expect=(2, "x.npy: inputs.x: dtype <i4 is not allowed here"))
    w.case("bool_bias_mask",
           attention_case({"num_heads": 2, "mask": "bias"},
                          {"q": "q.npy", "k": "k.npy", "v": "v.npy", "mask": "mask.npy"}),
           {**qkv(), "mask.npy": np.ones((1, 1, 4, 4), dtype=bool)},
           expect=(2, "mask.npy: inputs.mask: dtype |b1 is not allowed here"))
    # --- shapes that do not fit the op (messages from the library's plans)
    w.case("shape_head_dim_mismatch", attention_case({"num_heads": 2}), qkv(k=(1, 4, 2, 4), v=(1, 4, 2, 4)),
           expect=(2, "k.npy: k.shape: k.shape = [1, 4, 2, 4] must have head_dim = 8"))
    w.case("shape_kv_heads_not_dividing", attention_case({"num_heads": 4, "layout": "bshd"}),
           qkv(q=(1, 4, 4, 8), k=(1, 4, 3, 8), v=(1, 4, 3, 8)),
           expect=(2, "k.npy: k (kv_heads): kv_heads = 3"))
    w.case("shape_rank_mismatch", attention_case({"num_heads": 2}), qkv(k=(1, 4, 16)),
           expect=(2, "k.npy: k.shape: k.shape = [1, 4, 16] must have the rank of q.shape"))
    w.case("ambiguous_layout", attention_case({"num_heads": 4}),
           qkv(q=(1, 4, 4, 8), k=(1, 4, 4, 8), v=(1, 4, 4, 8)),
           expect=(2, "case.json: attrs.layout: layout = (absent) is ambiguous"))
    w.case("mask_for_maskless_kind",
           attention_case({"num_heads": 2, "mask": "causal"},
                          {"q": "q.npy", "k": "k.npy", "v": "v.npy", "mask": "mask.npy"}),
           {**qkv(), "mask.npy": np.ones((1, 4), dtype=bool)},
           expect=(2, "mask.npy: mask: mask = [1, 4] must be absent for mask causal"))
    w.case("mask_missing_for_key_padding", attention_case({"num_heads": 2, "mask": "key_padding"}), qkv(),
           expect=(2, "case.json: attrs.mask: mask = (absent) is required for mask key_padding"))
    w.case("keep_mask_wrong_shape",
           attention_case({"num_heads": 2, "mask": "key_padding"},
                          {"q": "q.npy", "k": "k.npy", "v": "v.npy", "mask": "mask.npy"}),
           {**qkv(), "mask.npy": np.ones((1, 5), dtype=bool)},
           expect=(2, "mask.npy: mask.shape: mask.shape = [1, 5] must be [B, Sk] = [1, 4]"))
    w.case("swiglu_odd_width", swiglu_case(), {"x.npy": f32(2, 7)},
           expect=(2, "x.npy: x.shape: x.shape = [2, 7] must have an even"))
    w.case("swiglu_empty_rows", swiglu_case(), {"x.npy": f32(0, 8)},
           expect=(2, "x.npy: x (rows): rows = 0 must be >= 1"))
    w.case("axial_seq_mismatch",
           {"op": "axial_rope", "attrs": {"end_x": 2, "end_y": 2}, "inputs": {"x": "x.npy"}},
           {"x.npy": f32(1, 10, 8)},
           expect=(2, "x.npy: x (seq): seq = 10 must equal repeat_factor*end_x*end_y = 4"))
    w.case("rope_sin_shape_differs", rope_case({"head_dim": 8}),
           {"x.npy": f32(1, 5, 16), "cos.npy": f32(5, 4), "sin.npy": f32(5, 3)},
           expect=(2, "sin.npy: sin.shape: sin.shape = [5, 3] must equal cos.shape = [5, 4]"))
    w.case("block_w_qkv_shape",
           {"op": "attention_block", "attrs": {"num_heads": 2},
            "inputs": {"x": "x.npy", "w_qkv": "w_qkv.npy", "w_out": "w_out.npy"}},
           {"x.npy": f32(1, 3, 8), "w_qkv.npy": f32(8, 24), "w_out.npy": f32(8, 8)},
           expect=(2, "w_qkv.npy: w_qkv.shape: w_qkv.shape = [8, 24] must be [3E, E] = [24, 8]"))
    w.case("dout_shape_mismatch",
           {"op": "swiglu_backward", "inputs": {"x": "x.npy", "dout": "dout.npy"}},
           {"x.npy": f32(2, 8), "dout.npy": f32(2, 8)},
           expect=(2, "dout.npy: dout.shape: dout.shape = [2, 8] must be the shape of the forward output, [2, 4]"))
    # --- expected and tolerance
    w.case("unknown_expected_output", swiglu_case(expected={"dx": "x.npy"}), x,
           expect=(2, "case.json: expected.dx: unknown output for op swiglu"))
    w.case("expected_shape_mismatch", swiglu_case(expected={"out": "out.npy"}),
           {**x, "out.npy": f32(2, 8)},
           expect=(2, "out.npy: expected.out: shape [2, 8] is not the output's shape [2, 4]"))
    w.case("missing_expected_file", swiglu_case(expected={"out": "out.npy"}), x,
           expect=(2, "out.npy: expected.out: missing file"))
    w.case("negative_tolerance", swiglu_case(tolerance={"rtol": -1e-4}), x,
           expect=(2, "case.json: tolerance.rtol: = -0.0001 (a number) must be >= 0"))
    w.case("tolerance_not_a_number", swiglu_case(tolerance={"atol": "1e-5"}), x,
           expect=(2, "case.json: tolerance.atol: must be a number"))
    w.case("tolerance_unknown_key", swiglu_case(tolerance={"reltol": 1e-5}), x,
           expect=(2, "case.json: tolerance.reltol: unknown key"))
    # --- malformed .npy files (the reader's own checks)
    good = np.arange(16, dtype="<f4").tobytes()
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8), }"
    npy_cases = {
        "npy_fortran_order": (npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 8), }", good),
                              "(npy fortran_order): array is stored in Fortran order"),
        "npy_big_endian": (npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 8), }", good),
                           "(npy descr): descr '>f4' is big-endian"),
        "npy_float16": (npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 8), }", good[:32]),
                        "(npy descr): unsupported dtype descr '<f2'"),
        "npy_complex": (npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 8), }", good * 2),
                        "(npy descr): unsupported dtype descr '<c8'"),
        "npy_structured": (npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 8), }", good),
                           "(npy descr): value of 'descr' is a list"),
        "npy_truncated_data": (npy_bytes(hdr, good[:40]),
                               "(npy data): truncated data: shape [2, 8] of <f4 needs 64 bytes, the file holds 40"),
        "npy_trailing_data": (npy_bytes(hdr, good + b"\0\0\0\0"),
                              "(npy data): header shape [2, 8] does not match the data size"),
        "npy_missing_shape_key": (npy_bytes("{'descr': '<f4', 'fortran_order': False, }", good),
                                  "(npy shape): header dict has no 'shape' key"),
        "npy_extra_key": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8), 'x': 'y', }", good),
                          "(npy header): unexpected key 'x'"),
        "npy_malformed_dict": (npy_bytes("{'descr': '<f4' 'fortran_order': False, 'shape': (2, 8), }", good),
                               "(npy header): malformed header dict"),
        "npy_not_a_dict": (npy_bytes("descr=<f4", good), "(npy header): malformed header dict"),
        "npy_one_tuple_without_comma": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (16), }", good),
                                        "(npy header): malformed header dict at byte 54: a one-element shape tuple needs a trailing comma"),
        "npy_negative_dim": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 8), }", good),
                             "(npy header): malformed header dict at byte 51: expected a non-negative integer dimension"),
        "npy_absurd_size": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", good),
                            "(npy shape): shape [4611686018427387904, 4] has more elements than fit in 64 bits"),
        "npy_absurd_bytes": (npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693952, 2), }", good),
                             "(npy shape): shape [2305843009213693952, 2] needs more bytes than fit in 64 bits"),
        "npy_huge_shape_small_file": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 1000000000), }", good),
                                      "(npy data): truncated data: shape [1000000000, 1000000000] of <f4 needs 4000000000000000000 bytes"),
        "npy_dim_overflows_int64": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 8), }", good),
                                    "(npy shape): shape dimension does not fit a 64-bit integer"),
        "npy_bad_magic": (b"PK\x03\x04" + good, "(npy magic): not a .npy file"),
        "npy_version_4": (npy_bytes(hdr, good, version=(4, 0)), "(npy version): unsupported .npy format version 4.0"),
        "npy_header_past_end": (b"\x93NUMPY\x01\x00\xff\xff{'descr'", "(npy header): header length 65535 runs past the end"),
        "npy_empty_file": (b"", "(npy magic): not a .npy file"),
        "npy_no_newline": (b"\x93NUMPY\x01\x00\x3c\x00" + hdr.encode() + b" ", "(npy header): header does not end with a newline"),
    }
    for name, (data, fragment) in npy_cases.items():
        w.case(name, swiglu_case(), raw={"x.npy": data}, expect=(2, "x.npy: inputs.x " + fragment))
    write_bad_rope(w)


def silu(g):
    return g / (1.0 + np.exp(-g))


def attention_np(q, k, v, keep=None):
    # q [B, S, H, D] (bshd), no mask kind but key padding; float64.
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    B, Sq, H, D = q.shape
    Hkv = k.shape[2]
    out = np.zeros((B, Sq, H, v.shape[3]))
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            s = q[b, :, h, :] @ k[b, :, g, :].T / math.sqrt(D)
            if keep is not None:
                s = np.where(keep[b][None, :] != 0, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out[b, :, h, :] = p @ v[b, :, g, :]
    return out


def write_formats(w):
    x = f32(3, 8)
    out = (silu(x[:, :4].astype(np.float64)) * x[:, 4:]).astype(np.float32)
    case = swiglu_case(expected={"out": "out.npy"})
    ok = (0, "pass")
    w.case("npy_v1", case, {"x.npy": (x, (1, 0)), "out.npy": (out, (1, 0))}, expect=ok)
    w.case("npy_v2", case, {"x.npy": (x, (2, 0)), "out.npy": (out, (2, 0))}, expect=ok)
    w.case("npy_v3", case, {"x.npy": (x, (3, 0)), "out.npy": (out, (3, 0))}, expect=ok)
    x64 = rng.standard_normal((3, 8))
    out64 = silu(x64[:, :4]) * x64[:, 4:]
    w.case("npy_float64", case, {"x.npy": x64, "out.npy": out64}, expect=ok)
    wrong = out.copy()
    wrong[1, 2] += 0.5
    w.case("mismatch_reported", case, {"x.npy": x, "out.npy": wrong},
           expect=(1, "FAIL (1 of 12 elements; worst at [1, 2]"))
    q, k, v = f32(2, 5, 2, 8), f32(2, 6, 1, 8), f32(2, 6, 1, 8)
    keep = np.array([[1, 1, 0, 1, 0, 1], [0, 1, 1, 1, 1, 1]])
    expected = attention_np(q, k, v, keep).astype(np.float32)
    for dtype in ["|b1", "<i4", "<i8", "<f4"]:
        w.case("keep_mask_" + {"|b1": "bool", "<i4": "int32", "<i8": "int64", "<f4": "float32"}[dtype],
               attention_case({"num_heads": 2, "mask": "key_padding"},
                              {"q": "q.npy", "k": "k.npy", "v": "v.npy", "mask": "mask.npy"},
                              expected={"out": "out.npy"}),
               {"q.npy": q, "k.npy": k, "v.npy": v, "mask.npy": keep.astype(dtype), "out.npy": expected},
               expect=ok)
    write_formats_rope(w)


def write_examples():
    """RoPE examples whose expected outputs PyTorch computes, the way models do."""
    import torch  # only here: the corpus above needs NumPy alone
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
    from tandem_case import write_case

    root = os.path.join(HERE, "examples")
    gen = torch.Generator().manual_seed(20240613)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    def rotary_cache(max_position, dim, base=10000.0):
        # Hugging Face's LlamaRotaryEmbedding: cat(freqs, freqs), [max_position, dim]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def rotate_half(t):
        t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-t2, t1), dim=-1)

    def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
        # transformers' apply_rotary_pos_emb after the cache lookup cos[position_ids]
        c, s = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    # 1. GQA q [B, H, S, D] and k [B, Hkv, S, D] of a left-padded batch: row 0 starts at
    #    position 0, row 1 continues at 3 (a cache of 16 positions). Forward and backward.
    B, H, Hkv, S, D = 2, 4, 2, 5, 16
    q, k = randn(B, H, S, D), randn(B, Hkv, S, D)
    cos, sin = rotary_cache(16, D)
    position_ids = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin, position_ids)
    write_case(os.path.join(root, "rope_qk_hf_position_ids"), "rope_qk", {"layout": "bhsd"},
               {"q": q, "k": k, "cos": cos, "sin": sin, "positions": position_ids},
               {"q_out": q_out, "k_out": k_out})
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    dq_out, dk_out = randn(B, H, S, D), randn(B, Hkv, S, D)
    qo, ko = apply_rotary_pos_emb(qg, kg, cos, sin, position_ids)
    torch.autograd.backward([qo, ko], [dq_out, dk_out])
    write_case(os.path.join(root, "rope_qk_backward_hf_position_ids"), "rope_qk_backward",
               {"layout": "bhsd"},
               {"dq_out": dq_out, "dk_out": dk_out, "cos": cos, "sin": sin,
                "positions": position_ids},
               {"dq": qg.grad, "dk": kg.grad})

    # 2. [B, S, H, D] (FlashAttention's and vLLM's layout, found from num_heads), rotating
    #    the first 8 of 12 dims (vLLM's rotary_dim < head_size), int32 position ids.
    B, S, H, D, n_rot = 2, 3, 2, 12, 8
    x = randn(B, S, H, D)
    cos, sin = rotary_cache(9, n_rot)
    position_ids = torch.tensor([[8, 0, 4], [2, 2, 7]], dtype=torch.int32)
    c, s = cos[position_ids.long()].unsqueeze(2), sin[position_ids.long()].unsqueeze(2)
    rot, rest = x[..., :n_rot], x[..., n_rot:]
    out = torch.cat((rot * c + rotate_half(rot) * s, rest), dim=-1)
    write_case(os.path.join(root, "rope_bshd_partial_positions"), "rope",
               {"num_heads": H, "n_rot": n_rot},
               {"x": x, "cos": cos, "sin": sin, "positions": position_ids}, {"out": out})

    # 3. Packed tokens [T, H, D] of two sequences (lengths 4 and 3, positions restarting),
    #    GPT-J pairs as Meta's LLaMA code rotates them: complex multiplication.
    T, H, D = 7, 3, 8
    x = randn(T, H, D)
    angles = torch.outer(torch.arange(10, dtype=torch.float32),
                         1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D)))
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # [max_position, D/2]
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    xc = torch.view_as_complex(x.reshape(T, H, D // 2, 2))
    out = torch.view_as_real(xc * freqs_cis[positions].unsqueeze(1)).reshape(T, H, D)
    write_case(os.path.join(root, "rope_thd_packed_gptj"), "rope",
               {"layout": "thd", "style": "gptj"},
               {"x": x, "cos": freqs_cis.real.contiguous(), "sin": freqs_cis.imag.contiguous(),
                "positions": positions},
               {"out": out})


def main():
    if "--examples" in sys.argv[1:]:
        write_examples()
        return 0
    write_bad(Writer(os.path.join(HERE, "bad")))
    write_formats(Writer(os.path.join(HERE, "formats")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
