#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes tandem's case corpus for `tandem check`:

  tests/cases/bad/<name>/      malformed cases: each must exit 2 with a message
                               naming the case, the file and the field
  tests/cases/formats/<name>/  valid cases in every .npy variant the reader
                               accepts (v1/v2/v3 headers, <f8, keep masks of
                               |b1, <i4, <i8, index inputs — position ids,
                               sequence offsets, block tables — of <i4 and
                               <i8) and one deliberate mismatch

Cases of the attention features (SPEC §2.7–2.10) are named features_*: CTest
runs them on the backends that implement them. Each directory holds an
`expect` file: the exit code on the first line and a
fragment the command's output must contain on the second. Run it with the
system Python (NumPy only) from anywhere; it rewrites both trees. The files
are committed, so building and testing never needs Python.

  --examples   instead (re)writes the examples in tests/cases/examples/
               whose expected outputs PyTorch computes: RoPE as models apply
               it, the attention features (features_*) the way a
               framework user writes them, and a learned bias's gradient
               (needs torch: run it from a virtual environment with numpy
               and torch installed)

The FlexAttention examples (examples/flex_*) come from make_flex_cases.py,
which needs the tandem package as well; the malformed flex cases
(bad/flex_*) are written here, their node lists by hand (class Mod).
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


# The cases of the attention features draw from their own stream, so that
# adding them left every earlier case's bytes as they were.
features_rng = np.random.default_rng(20261130)


def g32(*shape):
    return features_rng.standard_normal(shape).astype(np.float32)


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
                      "index inputs are <i4 or <i8"))
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
           expect=(2, 'case.json: attrs.layout: must be one of "bshd", "bhsd", "thd", got "bsdh"'))
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
           expect=(2, "k.npy: k.shape: k.shape = [1, 4, 2, 4] must have D = 8"))
    w.case("shape_kv_heads_not_dividing", attention_case({"num_heads": 4, "layout": "bshd"}),
           qkv(q=(1, 4, 4, 8), k=(1, 4, 3, 8), v=(1, 4, 3, 8)),
           expect=(2, "k.npy: k.shape: k.shape = [1, 4, 3, 8] must have a head count (3)"))
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
    # --- attention features: sinks, ALiBi, packed sequences, paged caches (bad inputs)
    def features_case(inputs, op="attention", attrs=None, **overrides):
        names = {"q": "q.npy", "k": "k.npy", "v": "v.npy"}
        names.update({n: n + ".npy" for n in inputs})
        c = {"op": op, "attrs": attrs or {"num_heads": 2}, "inputs": names}
        c.update(overrides)
        return c

    packed = {"q.npy": g32(5, 2, 8), "k.npy": g32(6, 1, 8), "v.npy": g32(6, 1, 8)}

    def varlen(cu_q=(0, 2, 5), cu_k=(0, 3, 6), dtype="<i4", **more):
        arrays = dict(packed)
        arrays["cu_seqlens_q.npy"] = np.array(cu_q, dtype=dtype)
        arrays["cu_seqlens_k.npy"] = np.array(cu_k, dtype=dtype)
        arrays.update({k + ".npy": v for k, v in more.items()})
        return features_case(["cu_seqlens_q", "cu_seqlens_k"] + list(more)), arrays

    c, a = varlen(cu_q=(1, 2, 5))
    w.case("cu_seqlens_q_not_from_zero", c, a,
           expect=(2, "cu_seqlens_q.npy: inputs.cu_seqlens_q: cu_seqlens_q[0] = 1 must be 0"))
    c, a = varlen(cu_k=(0, 7, 6), dtype="<i8")
    w.case("cu_seqlens_k_decreasing", c, a,
           expect=(2, "cu_seqlens_k.npy: inputs.cu_seqlens_k: cu_seqlens_k[2] = 6 must be >= cu_seqlens_k[1] = 7"))
    c, a = varlen(cu_q=(0, 2, 4))
    w.case("cu_seqlens_q_short_of_the_total", c, a,
           expect=(2, "cu_seqlens_q[2] = 4 must be the total number of rows, 5"))
    c, a = varlen(dtype="<f4")
    w.case("cu_seqlens_float", c, a,
           expect=(2, "cu_seqlens_k.npy: inputs.cu_seqlens_k: dtype <f4 is not allowed here: index inputs are <i4 or <i8"))
    c, a = varlen(cu_k=(0, 2, 4, 6))
    w.case("cu_seqlens_k_wrong_length", c, a,
           expect=(2, "cu_seqlens_k.npy: cu_seqlens_k.shape: cu_seqlens_k.shape = [4] must be [3]"))
    c, a = varlen()
    del c["inputs"]["cu_seqlens_k"]
    w.case("cu_seqlens_k_missing", c, a,
           expect=(2, "case.json: cu_seqlens_k: cu_seqlens_k = (absent) is required with cu_seqlens_q"))
    c, a = varlen(seqused_k=np.array([3, 4], dtype="<i4"))
    w.case("seqused_k_beyond_its_slot", c, a,
           expect=(2, "seqused_k.npy: inputs.seqused_k: seqused_k[1] = 4 must lie in [0, 3]"))
    c, a = varlen(key_origin=np.array([3, -1], dtype="<i4"))
    w.case("key_origin_negative", c, a,
           expect=(2, "key_origin.npy: inputs.key_origin: key_origin[1] = -1 must lie in [0, 2^48]"))
    c, a = varlen(key_origin=np.array([3, 0, 5], dtype="<i8"))
    w.case("key_origin_wrong_length", c, a,
           expect=(2, "key_origin.npy: key_origin.shape: key_origin.shape = [3] must be [2]"))
    c, a = varlen(mask=np.ones((1, 6), dtype=bool))
    c["attrs"]["mask"] = "key_padding"
    w.case("varlen_key_padding_mask", c, a,
           expect=(2, "mask.npy: mask: mask = key_padding must be none, causal or sliding_window with packed sequences"))

    cache = {"q.npy": g32(1, 1, 2, 8), "k.npy": g32(4, 4, 1, 8), "v.npy": g32(4, 4, 1, 8)}

    def paged(table=((1, 3),), lens=(6,), op="attention", dtype="<i4", **more):
        arrays = dict(cache)
        arrays["block_table.npy"] = np.array(table, dtype=dtype)
        arrays["cache_seqlens.npy"] = np.array(lens, dtype=dtype)
        arrays.update({k + ".npy": v for k, v in more.items()})
        return features_case(["block_table", "cache_seqlens"] + list(more), op=op), arrays

    c, a = paged(table=((1, 7),))
    w.case("block_table_entry_out_of_range", c, a,
           expect=(2, "block_table.npy: inputs.block_table: block_table[1] = 7 must lie in [0, num_blocks = 4)"))
    c, a = paged(lens=(9,), dtype="<i8")
    w.case("cache_seqlens_beyond_the_table", c, a,
           expect=(2, "cache_seqlens.npy: inputs.cache_seqlens: cache_seqlens[0] = 9 must lie in [0, 8]"))
    c, a = paged(lens=(-1,))
    w.case("cache_seqlens_negative", c, a,
           expect=(2, "cache_seqlens.npy: inputs.cache_seqlens: cache_seqlens[0] = -1 must lie in [0, 8]"))
    c, a = paged(dtype="<f8")
    w.case("block_table_float", c, a,
           expect=(2, "block_table.npy: inputs.block_table: dtype <f8 is not allowed here: index inputs are <i4 or <i8"))
    c, a = paged(op="attention_backward", dout=g32(1, 1, 2, 8))
    w.case("paged_backward", c, a,
           expect=(2, "block_table.npy: block_table: block_table = [1, 2] is forward only"))
    c, a = paged()
    c["inputs"].update({"cu_seqlens_q": "cu.npy", "cu_seqlens_k": "cu.npy"})
    a["cu.npy"] = np.array([0, 1], dtype="<i4")
    w.case("paged_with_cu_seqlens", c, a,
           expect=(2, "block_table.npy: block_table: block_table = [1, 2] and cu_seqlens_q do not combine"))

    dense = {"q.npy": g32(1, 4, 2, 8), "k.npy": g32(1, 4, 2, 8), "v.npy": g32(1, 4, 2, 8)}

    def dense_case(op="attention", **more):
        arrays = dict(dense)
        arrays.update({k + ".npy": v for k, v in more.items()})
        return features_case(list(more), op=op), arrays

    c, a = dense_case(sinks=g32(3))
    w.case("sinks_wrong_shape", c, a, expect=(2, "sinks.npy: sinks.shape: sinks.shape = [3] must be [2]"))
    c, a = dense_case(sinks=np.array([np.nan, 0.5], dtype="<f4"))
    w.case("sinks_not_finite", c, a, expect=(2, "sinks.npy: inputs.sinks: sinks[0] = nan must be finite"))
    c, a = dense_case(alibi_slopes=g32(3))
    w.case("alibi_slopes_wrong_shape", c, a,
           expect=(2, "alibi_slopes.npy: alibi_slopes.shape: alibi_slopes.shape = [3] must be [H] = [2] or [n, H] = [1, 2]"))
    c, a = dense_case(alibi_slopes=np.array([0.5, np.inf], dtype="<f4"))
    w.case("alibi_slopes_not_finite", c, a,
           expect=(2, "alibi_slopes.npy: inputs.alibi_slopes: alibi_slopes[1] = inf must be finite"))
    c, a = dense_case(op="attention_backward", dout=g32(1, 4, 2, 8))
    c["expected"] = {"dsinks": "dsinks.npy"}
    a["dsinks.npy"] = g32(2)
    w.case("dsinks_without_sinks", c, a,
           expect=(2, "case.json: expected.dsinks: is not an output of this case"))
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
        "npy_complex": (npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 8), }", good * 2),
                        "(npy descr): unsupported dtype descr '<c8'"),
        "npy_uint32": (npy_bytes("{'descr': '<u4', 'fortran_order': False, 'shape': (2, 8), }", good),
                       "(npy descr): unsupported dtype descr '<u4'"),
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
    write_bad_storage(w)
    write_bad_flex(w)


class Mod:
    """A node list as tandem.flex's tracer records it (SPEC §9.7): nodes
    [op, args, type, value, ivalue, tensor, index], tensors [name, shape,
    type, lo, hi]; written by hand here, for cases NumPy alone can write."""

    def __init__(self, name, score=False):
        self.name, self.nodes, self.tensors = name, [], []
        if score:
            self.node("score")
        self.b, self.h, self.q, self.kv = (self.node(op, type="integer")
                                           for op in ("b", "h", "q_idx", "kv_idx"))

    def node(self, op, args=(), type="real", value=0.0, ivalue=0, tensor=-1, index=()):
        self.nodes.append([op, list(args), type, value, ivalue, tensor, list(index)])
        return len(self.nodes) - 1

    def int(self, x):
        return self.node("constant", type="integer", ivalue=x)

    def capture(self, name, shape, type="real", lo=0, hi=0):
        self.tensors.append([name, list(shape), type, lo, hi])
        return len(self.tensors) - 1

    def spec(self, result):
        return {"name": self.name, "tensors": self.tensors, "nodes": self.nodes, "result": result}


def write_bad_flex(w):
    """Malformed flex_attention cases (SPEC §9.7): a node list the builder
    refuses, a captured tensor without its input, an index the plan proves
    can leave its tensor, a value outside its declared range, a block mask
    of the wrong shape, an integer tensor stored as floats."""
    frng = np.random.default_rng(20261203)  # its own stream: the other cases stay
    B, H, S, D = 1, 2, 6, 4
    qkv = {n + ".npy": frng.standard_normal((B, H, S, D)).astype(np.float32) for n in "qkv"}
    inputs = {"q": "q.npy", "k": "k.npy", "v": "v.npy"}

    def case(attrs, extra=None):
        return {"op": "flex_attention", "attrs": attrs, "inputs": dict(inputs, **(extra or {}))}

    m = Mod("causal")
    m.spec(m.node("xor", [m.q, m.kv], type="boolean"))
    w.case("flex_unknown_mod_op", case({"mask_mod": m.spec(4)}), qkv,
           expect=(2, "case.json: attrs.mask_mod.nodes[4][0]: unknown op \"xor\""))

    def relative_bias(extent):
        s = Mod("rel_bias", score=True)
        t = s.capture("bias", [H, extent])
        i = s.node("add", [s.node("sub", [s.q, s.kv], type="integer"), s.int(S - 1)],
                   type="integer")
        load = s.node("load", tensor=t, index=[s.h, i])
        return s.spec(s.node("add", [0, load]))

    bias = {"bias.npy": frng.standard_normal((H, 2 * S - 1)).astype(np.float32)}
    w.case("flex_captured_tensor_missing", case({"score_mod": relative_bias(2 * S - 1)}), qkv,
           expect=(2, "case.json: inputs.bias: missing input (the score_mod captures tensor bias)"))
    w.case("flex_load_out_of_range", case({"score_mod": relative_bias(2 * S - 2)},
                                          {"bias": "bias.npy"}),
           dict(qkv, **{"bias.npy": bias["bias.npy"][:, :-1].copy()}),
           expect=(2, "case.json: attrs.score_mod: score_mod = bias[h, ((q_idx - kv_idx) + 5)] "
                      "reads outside bias: index 1 (((q_idx - kv_idx) + 5)) takes [0, 10] over "
                      "the call, and axis 1 has extent 10"))

    d = Mod("document")
    doc = d.capture("doc", [S], "integer", 0, 1)
    same = d.node("eq", [d.node("load", type="integer", tensor=doc, index=[d.q]),
                         d.node("load", type="integer", tensor=doc, index=[d.kv])],
                  type="boolean")
    docs = np.array([0, 0, 1, 1, 2, 2], dtype="<i4")
    w.case("flex_value_outside_declared_range",
           case({"mask_mod": d.spec(same)}, {"doc": "doc.npy"}), dict(qkv, **{"doc.npy": docs}),
           expect=(2, "doc.npy: inputs.doc: mask_mod tensor doc[4] = 2 is outside its declared "
                      "range [0, 1]"))
    w.case("flex_integer_tensor_as_float",
           case({"mask_mod": d.spec(same)}, {"doc": "doc.npy"}),
           dict(qkv, **{"doc.npy": np.minimum(docs, 1).astype(np.float32)}),
           expect=(2, "doc.npy: inputs.doc: dtype <f4 is not allowed here: an integer tensor of "
                      "a mod is <i4 or <i8"))

    c = Mod("causal")
    causal = c.node("le", [c.kv, c.q], type="boolean")
    # S = 6 in blocks of 4 is 2 query blocks; the counts give 3.
    w.case("flex_block_mask_query_blocks",
           case({"mask_mod": c.spec(causal), "block_size": 4},
                {"kv_num_blocks": "kv_num_blocks.npy", "kv_indices": "kv_indices.npy"}),
           dict(qkv, **{"kv_num_blocks.npy": np.ones((1, 1, 3), dtype="<i4"),
                        "kv_indices.npy": np.zeros((1, 1, 3, 2), dtype="<i4")}),
           expect=(2, "kv_num_blocks.npy: kv_num_blocks.shape: kv_num_blocks.shape = [1, 1, 3] "
                      "must have nQ = ceil(Sq / q_block) = 2 query blocks"))


def write_bad_storage(w):
    """Storage types, rounding profiles and quantized caches (SPEC §9.4, §10), drawing
    from their own stream so that every earlier case keeps its bytes."""
    storage_rng = np.random.default_rng(20261202)

    def s32(*shape):
        return storage_rng.standard_normal(shape).astype(np.float32)

    def sqkv():
        return {"q.npy": s32(1, 4, 2, 8), "k.npy": s32(1, 4, 2, 8), "v.npy": s32(1, 4, 2, 8)}

    x16 = {"x.npy": s32(2, 8).astype("<f2")}
    bits = {"x.npy": s32(2, 16).view("<u2")[:, 1::2].copy()}  # the top halves: bf16
    w.case("npy_float16", swiglu_case(), x16,
           expect=(2, 'x.npy: inputs.x: dtype <f2 is not allowed here: float tensors are <f4 or '
                      '<f8 (<f2 needs "dtype": "f16"'))
    w.case("bf16_bits_without_dtype", swiglu_case(), bits,
           expect=(2, 'x.npy: inputs.x: dtype <u2 is not allowed here'))
    w.case("dtype_unknown", swiglu_case(dtype="fp8"), x16,
           expect=(2, 'case.json: dtype: must be one of "f32", "bf16", "f16", got "fp8"'))
    mixed = {"q.npy": s32(1, 4, 2, 8).view("<u2")[..., 1::2].copy(), "k.npy": s32(1, 4, 2, 8),
             "v.npy": s32(1, 4, 2, 8).view("<u2")[..., 1::2].copy()}
    w.case("dtype_mix_f32_k_in_bf16", attention_case({"num_heads": 2}, dtype="bf16"), mixed,
           expect=(2, 'k.npy: inputs.k: dtype <f4 is not allowed here: the case\'s "dtype" is '
                      '"bf16": every storage tensor is bfloat16 bits (<u2)'))
    w.case("dtype_f16_block_with_f32_x",
           {"op": "attention_block", "dtype": "f16", "attrs": {"num_heads": 2},
            "inputs": {"x": "x.npy", "w_qkv": "w.npy", "w_out": "o.npy"}},
           {"x.npy": s32(1, 3, 4), "w.npy": s32(12, 4).astype("<f2"),
            "o.npy": s32(4, 4).astype("<f2")},
           expect=(2, 'x.npy: inputs.x: dtype <f4 is not allowed here: the case\'s "dtype" is '
                      '"f16"'))
    w.case("rounding_unknown", attention_case({"num_heads": 2}, rounding="fast"), sqkv(),
           expect=(2, "case.json: rounding: must be one of pytorch, exact, ggml"))
    w.case("rounding_on_swiglu", swiglu_case(rounding="exact"), {"x.npy": s32(2, 8)},
           expect=(2, "case.json: rounding: applies to attention only"))
    codes = {"q.npy": s32(1, 4, 2, 8), "k.npy": np.zeros((1, 4, 2, 8), "|i1"),
             "v.npy": np.zeros((1, 4, 2, 8), "|i1"), "ks.npy": np.ones((1, 4, 2), "<f4"),
             "vs.npy": np.ones((1, 4, 2), "<f4")}
    qin = {"q": "q.npy", "k": "k.npy", "v": "v.npy", "k_scale": "ks.npy", "v_scale": "vs.npy"}
    w.case("kv_cache_unknown", attention_case({"num_heads": 2, "kv_cache": "int4"}, qin), codes,
           expect=(2, 'case.json: attrs.kv_cache: must be one of "plain", "int8", "e4m3"'))
    w.case("kv_cache_codes_as_float", attention_case({"num_heads": 2, "kv_cache": "int8"}, qin),
           dict(codes, **{"v.npy": s32(1, 4, 2, 8)}),
           expect=(2, "v.npy: inputs.v: dtype <f4 is not allowed here: attrs.kv_cache = int8 "
                      "reads v as int8 codes (|i1)"))
    w.case("kv_cache_e4m3_given_int8", attention_case({"num_heads": 2, "kv_cache": "e4m3"}, qin),
           dict(codes, **{"ks.npy": np.ones((2,), "<f4"), "vs.npy": np.ones((2,), "<f4")}),
           expect=(2, "k.npy: inputs.k: dtype |i1 is not allowed here: attrs.kv_cache = e4m3 "
                      "reads k as e4m3 code bytes (|u1)"))
    w.case("kv_scale_without_kv_cache", attention_case({"num_heads": 2}, qin),
           dict(codes, **{"k.npy": s32(1, 4, 2, 8), "v.npy": s32(1, 4, 2, 8)}),
           expect=(2, "case.json: inputs.k_scale: is the scale of a quantized cache"))
    w.case("kv_scale_missing", attention_case({"num_heads": 2, "kv_cache": "int8"},
                                              {"q": "q.npy", "k": "k.npy", "v": "v.npy"}),
           codes, expect=(2, "case.json: inputs.k_scale: missing input (attrs.kv_cache = int8"))
    w.case("kv_scale_wrong_size", attention_case({"num_heads": 2, "kv_cache": "int8"}, qin),
           dict(codes, **{"vs.npy": np.ones((2,), "<f4")}),
           expect=(2, "vs.npy: inputs.v_scale: v_scale.size() = 2 must be 8"))
    w.case("kv_scale_negative", attention_case({"num_heads": 2, "kv_cache": "int8"}, qin),
           dict(codes, **{"ks.npy": -np.ones((1, 4, 2), "<f4")}),
           expect=(2, "ks.npy: inputs.k_scale: k_scale[0] = -1.000000 must be finite and >= 0"))


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


def attend_seq(q, k, v, causal=False, sinks=None, slopes=None):
    """One sequence: q [Sq, H, D], k [Sk, Hkv, D], v [Sk, Hkv, Dv] -> out [Sq, H, Dv]
    (float64), with bottom-right causal alignment, sinks [H] and ALiBi slopes [H]."""
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    Sq, H, D = q.shape
    Sk, Hkv = k.shape[:2]
    out = np.zeros((Sq, H, v.shape[2]))
    i, j = np.arange(Sq)[:, None], np.arange(Sk)[None, :]
    for h in range(H):
        g = h // (H // Hkv)
        s = q[:, h, :] @ k[:, g, :].T / math.sqrt(D)
        if slopes is not None:
            s = s - slopes[h] * np.abs(i + Sk - Sq - j)
        if causal:
            s = np.where(j <= i + max(Sk - Sq, 0), s, -np.inf)
        m = s.max(axis=1, initial=-np.inf, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[h])
        e = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
        den = e.sum(axis=1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(sinks[h] - m)
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        out[:, h, :] = p @ v[:, g, :]
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
    # index inputs as int32 and int64: two packed sequences (2 and 3 queries;
    # 3 and 4 keys, the last of which is padding past seqused_k)
    q, k, v = g32(5, 2, 8), g32(7, 1, 8), g32(7, 1, 8)
    cu_q, cu_k, used = [0, 2, 5], [0, 3, 7], [3, 3]
    expected = np.concatenate([
        attend_seq(q[cu_q[n]:cu_q[n + 1]], k[cu_k[n]:cu_k[n] + used[n]], v[cu_k[n]:cu_k[n] + used[n]],
                   causal=True) for n in range(2)]).astype(np.float32)
    for dtype, name in [("<i4", "features_varlen_int32"), ("<i8", "features_varlen_int64")]:
        w.case(name, attention_case({"num_heads": 2, "mask": "causal"},
                                    {"q": "q.npy", "k": "k.npy", "v": "v.npy", "cu_seqlens_q": "cq.npy",
                                     "cu_seqlens_k": "ck.npy", "seqused_k": "used.npy"},
                                    expected={"out": "out.npy"}),
               {"q.npy": q, "k.npy": k, "v.npy": v, "cq.npy": np.array(cu_q, dtype=dtype),
                "ck.npy": np.array(cu_k, dtype=dtype), "used.npy": np.array(used, dtype=dtype),
                "out.npy": expected},
               expect=ok)
    # key_origin (SPEC §12.1) changes no value: the same expected out
    w.case("features_varlen_key_origin",
           attention_case({"num_heads": 2, "mask": "causal"},
                          {"q": "q.npy", "k": "k.npy", "v": "v.npy", "cu_seqlens_q": "cq.npy",
                           "cu_seqlens_k": "ck.npy", "seqused_k": "used.npy",
                           "key_origin": "origin.npy"},
                          expected={"out": "out.npy"}),
           {"q.npy": q, "k.npy": k, "v.npy": v, "cq.npy": np.array(cu_q, dtype="<i8"),
            "ck.npy": np.array(cu_k, dtype="<i8"), "used.npy": np.array(used, dtype="<i8"),
            "origin.npy": np.array([61] * (len(cu_q) - 1), dtype="<i8"), "out.npy": expected},
           expect=ok)
    # a paged cache whose spare table entries hold -1 (never read)
    q, kc, vc = g32(2, 1, 2, 8), g32(5, 4, 1, 8), g32(5, 4, 1, 8)
    table, lens = np.array([[3, 0, -1], [1, -1, -1]], dtype="<i4"), np.array([6, 2], dtype="<i8")
    expected = np.stack([
        attend_seq(q[b], kc[table[b]].reshape(-1, 1, 8)[:lens[b]], vc[table[b]].reshape(-1, 1, 8)[:lens[b]])
        for b in range(2)]).astype(np.float32)
    w.case("features_paged_spare_entries",
           attention_case({"num_heads": 2}, {"q": "q.npy", "k": "k.npy", "v": "v.npy",
                                             "block_table": "table.npy", "cache_seqlens": "lens.npy"},
                          expected={"out": "out.npy"}),
           {"q.npy": q, "k.npy": kc, "v.npy": vc, "table.npy": table, "lens.npy": lens, "out.npy": expected},
           expect=ok)

    write_formats_rope(w)


def write_rope_examples(root):
    """RoPE examples whose expected outputs PyTorch computes, the way models do."""
    import torch  # only here: the corpus above needs NumPy alone
    from tandem_case import write_case

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


# --- PyTorch examples of the attention features (python make_cases.py --examples) ---
#
# Each is computed the way a framework user writes it, in float64 from the
# float32 inputs the case stores: sinks as gpt-oss writes them (one more
# score column, dropped after the softmax), ALiBi as an additive bias, packed
# sequences as one call per sequence, a paged cache by gathering its blocks.
# Gradients come from autograd.


def write_feature_examples(root):
    import torch  # only here: the corpus above needs NumPy alone
    from tandem_case import write_case

    torch.manual_seed(20261130)

    def t32(*shape):
        return torch.randn(*shape, dtype=torch.float32)

    def write(name, op, attrs, inputs, expected):
        write_case(os.path.join(root, name), op, attrs, inputs, expected)

    def gpt_oss_sdpa(Q, K, V, S, sm_scale, sliding_window=0):
        # Q [T, Hkv, q_mult, D], K and V [T, Hkv, D], S [Hkv * q_mult]: gpt-oss's
        # reference attention, the sink appended as one more score column.
        T, n_kv, q_mult, _ = Q.shape
        K = K[:, :, None, :].expand(-1, -1, q_mult, -1)
        V = V[:, :, None, :].expand(-1, -1, q_mult, -1)
        S = S.reshape(n_kv, q_mult, 1, 1).expand(-1, -1, T, -1)
        mask = torch.triu(Q.new_full((T, T), -float("inf")), diagonal=1)
        if sliding_window > 0:
            mask = mask + torch.tril(mask.new_full((T, T), -float("inf")), diagonal=-sliding_window)
        QK = torch.einsum("qhmd,khmd->hmqk", Q, K) * sm_scale + mask[None, None]
        W = torch.softmax(torch.cat([QK, S], dim=-1), dim=-1)[..., :-1]
        return torch.einsum("hmqk,khmd->qhmd", W, V)

    # 1. gpt-oss sinks, GQA (8 query heads on 2 kv heads), a sliding window of
    # 4 keys (gpt-oss's sliding_window = 4 is tandem's window = 3), forward and
    # backward (dsinks too).
    T, n_kv, q_mult, D = 7, 2, 4, 8
    q, k, v, sinks = t32(T, n_kv * q_mult, D), t32(T, n_kv, D), t32(T, n_kv, D), t32(n_kv * q_mult)
    dout = t32(T, n_kv * q_mult, D)
    q64, k64, v64, s64 = (x.double().requires_grad_() for x in (q, k, v, sinks))
    out = gpt_oss_sdpa(q64.reshape(T, n_kv, q_mult, D), k64, v64, s64, D ** -0.5,
                       sliding_window=4).reshape(T, n_kv * q_mult, D)
    out.backward(dout.double())
    attrs = {"num_heads": 8, "layout": "bshd", "mask": "sliding_window", "window": 3}
    qkv = {"q": q[None], "k": k[None], "v": v[None], "sinks": sinks}
    write("features_sinks_gpt_oss", "attention", attrs, qkv, {"out": out[None]})
    write("features_sinks_gpt_oss_backward", "attention_backward", attrs,
          {**qkv, "dout": dout[None]},
          {"dq": q64.grad[None], "dk": k64.grad[None], "dv": v64.grad[None], "dsinks": s64.grad})

    # 2. ALiBi with the standard slopes of 6 heads (not a power of two) as an
    # additive bias -m_h |i + Sk - Sq - j| to SDPA, bottom-right causal.
    def standard_slopes(H):
        n = 2 ** math.floor(math.log2(H))
        first = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
        return first + [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(H - n)]

    B, Sq, Sk, H, D = 2, 5, 9, 6, 8
    q, k, v, dout = t32(B, H, Sq, D), t32(B, H, Sk, D), t32(B, H, Sk, D), t32(B, H, Sq, D)
    slopes = torch.tensor(standard_slopes(H), dtype=torch.float32)
    i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
    bias = -slopes.double()[:, None, None] * (i + Sk - Sq - j).abs()
    bias = bias.masked_fill(j > i + (Sk - Sq), -float("inf"))
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, attn_mask=bias)
    out.backward(dout.double())
    attrs = {"num_heads": H, "layout": "bhsd", "mask": "causal"}
    qkv = {"q": q, "k": k, "v": v, "alibi_slopes": slopes}
    write("features_alibi_causal", "attention", attrs, qkv, {"out": out})
    write("features_alibi_causal_backward", "attention_backward", attrs, {**qkv, "dout": dout},
          {"dq": q64.grad, "dk": k64.grad, "dv": v64.grad})

    # 3. Packed sequences (FlashAttention's varlen): 3 sequences of 3, 1 and 4
    # queries over slots of 5, 2 and 6 keys, of which the last uses 4
    # (seqused_k); each is one SDPA call with its own bottom-right causal mask.
    H, Hkv, D = 4, 2, 16
    q_lens, k_slots, k_used = [3, 1, 4], [5, 2, 6], [5, 2, 4]
    cu_q, cu_k = np.cumsum([0] + q_lens), np.cumsum([0] + k_slots)
    q, k, v = t32(cu_q[-1], H, D), t32(cu_k[-1], Hkv, D), t32(cu_k[-1], Hkv, D)
    dout = t32(cu_q[-1], H, D)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    outs = []
    for n in range(3):
        qs = q64[cu_q[n]:cu_q[n + 1]].transpose(0, 1)
        ks = k64[cu_k[n]:cu_k[n] + k_used[n]].transpose(0, 1).repeat_interleave(H // Hkv, 0)
        vs = v64[cu_k[n]:cu_k[n] + k_used[n]].transpose(0, 1).repeat_interleave(H // Hkv, 0)
        i, j = torch.arange(q_lens[n])[:, None], torch.arange(k_used[n])[None, :]
        keep = j <= i + max(k_used[n] - q_lens[n], 0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=keep)
                    .transpose(0, 1))
    out = torch.cat(outs)
    out.backward(dout.double())
    attrs = {"num_heads": H, "mask": "causal"}
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q.astype("<i4"),
              "cu_seqlens_k": cu_k.astype("<i4"), "seqused_k": np.array(k_used, dtype="<i4")}
    write("features_varlen_causal", "attention", attrs, inputs, {"out": out})
    write("features_varlen_causal_backward", "attention_backward", attrs, {**inputs, "dout": dout},
          {"dq": q64.grad, "dk": k64.grad, "dv": v64.grad})

    # 4. A paged KV cache (vLLM): blocks of 4 keys, three sequences of 7, 1 and
    # 12 cached keys in shuffled blocks (spare table entries -1); decode
    # (Sq = 1) and chunked prefill (Sq = 3, causal at the end of the cache),
    # each against SDPA over the gathered cache.
    block, n_blocks, H, Hkv, D = 4, 9, 4, 1, 8
    lens = [7, 1, 12]
    table = np.full((3, 3), -1, dtype="<i4")
    order = iter(torch.randperm(n_blocks).tolist())
    for b, length in enumerate(lens):
        for e in range((length + block - 1) // block):
            table[b, e] = next(order)
    kc, vc = t32(n_blocks, block, Hkv, D), t32(n_blocks, block, Hkv, D)
    for Sq, name in [(1, "features_paged_decode"), (3, "features_paged_prefill")]:
        q = t32(3, Sq, H, D)
        outs = []
        for b, length in enumerate(lens):
            blocks = torch.from_numpy(table[b, :(length + block - 1) // block].astype(np.int64))
            ks = kc[blocks].reshape(-1, Hkv, D)[:length].double().transpose(0, 1)
            vs = vc[blocks].reshape(-1, Hkv, D)[:length].double().transpose(0, 1)
            i, j = torch.arange(Sq)[:, None], torch.arange(length)[None, :]
            keep = j <= i + max(length - Sq, 0)
            o = torch.nn.functional.scaled_dot_product_attention(
                q[b].double().transpose(0, 1), ks.expand(H, -1, -1), vs.expand(H, -1, -1),
                attn_mask=keep)
            outs.append(o.transpose(0, 1))
        write(name, "attention", {"num_heads": H, "mask": "causal"},
              {"q": q, "k": kc, "v": vc, "block_table": table,
               "cache_seqlens": np.array(lens, dtype="<i4")},
              {"out": torch.stack(outs)})


def write_bias_examples(root):
    """A learned relative-position bias (T5, Swin) [1, H, Sq, Sk] shared by the
    batch, trained through SDPA: dbias is the gradient PyTorch's autograd gives
    the bias (summed over the batch it broadcasts over, SPEC §3)."""
    import torch
    from tandem_case import write_case

    gen = torch.Generator().manual_seed(20261201)  # its own stream: the other examples stay

    def t32(*shape):
        return torch.randn(*shape, dtype=torch.float32, generator=gen)

    B, H, Sq, Sk, D = 2, 3, 5, 7, 8
    q, k, v, dout = t32(B, H, Sq, D), t32(B, H, Sk, D), t32(B, H, Sk, D), t32(B, H, Sq, D)
    bias = t32(1, H, Sq, Sk)
    bias[..., 0, -1] = -float("inf")  # one hidden key: its dbias is 0
    q64, k64, v64, b64 = (x.double().requires_grad_() for x in (q, k, v, bias))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, attn_mask=b64)
    out.backward(dout.double())
    write_case(os.path.join(root, "attention_bias_backward"), "attention_backward",
               {"num_heads": H, "layout": "bhsd", "mask": "bias"},
               {"q": q, "k": k, "v": v, "mask": bias, "dout": dout},
               {"dq": q64.grad, "dk": k64.grad, "dv": v64.grad, "dbias": b64.grad})


def main():
    if "--examples" in sys.argv[1:]:
        sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
        root = os.path.join(HERE, "examples")
        write_rope_examples(root)
        write_feature_examples(root)
        write_bias_examples(root)
        return 0
    write_bad(Writer(os.path.join(HERE, "bad")))
    write_formats(Writer(os.path.join(HERE, "formats")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
