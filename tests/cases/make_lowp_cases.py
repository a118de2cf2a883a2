#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes tests/cases/lowp/: bf16 and f16 cases whose expected outputs
PyTorch computes in the storage type on the CPU (SPEC §9.4, §10):

  attention_*   torch.nn.functional.scaled_dot_product_attention on bf16 or
                f16 q, k, v (plain, causal, GQA with enable_gqa)
  rope_*        Hugging Face's rotate_half RoPE, every op in the storage type
  swiglu_*      F.silu(gate) * up in the storage type
  attention_block_*   the attention block (SPEC §7) as a bf16 PyTorch model
                runs it: F.linear for the projections, rotate_half RoPE and
                scaled_dot_product_attention with a key-padding mask, every
                activation in the storage type
  attention_{int8,e4m3}_cache_*   a quantized K/V cache (SPEC §10.4): codes
                (|i1, |u1) and float32 scales as SPEC §10.4 fills them, the
                expected output the exact attention of the dequantized cache

bf16 tensors are stored as their bits, `<u2`, beside `"dtype": "bf16"` in
case.json (NumPy has no bfloat16, and a .npy header cannot name ml_dtypes'
type); f16 tensors are NumPy's own `<f2`. No case sets a
tolerance: `tandem check` derives each dtype's default from SPEC §10.5.

Run it from a virtual environment with torch and numpy; the files are
committed, so building and testing never needs torch.
"""
import json
import os
import shutil

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "lowp")
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def to_npy(t):
    """A bf16 tensor as its bit patterns (<u2), an f16 one as <f2."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def write_case(name, op, dtype, attrs, inputs, expected, rounding=None):
    d = os.path.join(OUT, name)
    os.makedirs(d)
    spec = {"op": op, "dtype": dtype, "attrs": attrs, "inputs": {}, "expected": {}}
    if rounding:
        spec["rounding"] = rounding
    for key, t in inputs.items():
        np.save(os.path.join(d, key + ".npy"), t if isinstance(t, np.ndarray) else to_npy(t))
        spec["inputs"][key] = key + ".npy"
    for key, t in expected.items():
        np.save(os.path.join(d, "expected_" + key + ".npy"),
                t if isinstance(t, np.ndarray) else to_npy(t))
        spec["expected"][key] = "expected_" + key + ".npy"
    if not attrs:
        del spec["attrs"]
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(spec, f, indent=1)
        f.write("\n")


def attention_cases(gen):
    # (name, B, Sq, Sk, H, Hkv, D, causal)
    shapes = [("attention", 2, 5, 7, 2, 2, 16, False),
              ("attention_causal_gqa", 1, 9, 9, 4, 2, 8, True),
              ("attention_long_keys", 1, 3, 96, 2, 1, 32, False)]
    for tag, dt in DTYPES.items():
        for name, B, Sq, Sk, H, Hkv, D, causal in shapes:
            q = torch.randn(B, H, Sq, D, generator=gen).to(dt)
            k = torch.randn(B, Hkv, Sk, D, generator=gen).to(dt)
            v = torch.randn(B, Hkv, Sk, D, generator=gen).to(dt)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                 enable_gqa=Hkv != H)
            attrs = {"num_heads": H, "layout": "bhsd"}
            if causal:
                attrs["mask"] = "causal"
            write_case(f"{name}_{tag}", "attention", tag, attrs,
                       {"q": q, "k": k, "v": v}, {"out": out}, rounding="pytorch")


def rope_cases(gen):
    B, S, H, D = 2, 6, 3, 16
    for tag, dt in DTYPES.items():
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        ang = torch.outer(torch.arange(S, dtype=torch.float32), inv)
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)          # [S, D/2] tables
        x = torch.randn(B, S, H, D, generator=gen).to(dt)
        c = torch.cat([cos, cos], -1)[None, :, None, :]
        s = torch.cat([sin, sin], -1)[None, :, None, :]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        out = x * c + torch.cat([-x2, x1], -1) * s               # every op in dt
        write_case(f"rope_neox_{tag}", "rope", tag, {"layout": "bshd"},
                   {"x": x, "cos": cos, "sin": sin}, {"out": out})


def swiglu_cases(gen):
    for tag, dt in DTYPES.items():
        x = (2 * torch.randn(4, 3, 24, generator=gen)).to(dt)
        g, u = x[..., :12], x[..., 12:]
        write_case(f"swiglu_{tag}", "swiglu", tag, {}, {"x": x}, {"out": F.silu(g) * u})


def quantize(x, kind):
    """SPEC §10.4's codes and float32 scales of x [B, S, Hkv, D] (float32)."""
    if kind == "int8":
        scale = (np.abs(x).max(axis=-1) / np.float32(127)).astype(np.float32)    # [B, S, Hkv]
        safe = np.where(scale == 0, np.float32(1), scale)[..., None]
        codes = np.clip(np.rint((x / safe).astype(np.float32)), -127, 127).astype(np.int8)
        return codes, scale, codes.astype(np.float64) * scale[..., None]
    scale = (np.abs(x).max(axis=(0, 1, 3)) / np.float32(448)).astype(np.float32)  # [Hkv]
    scaled = torch.from_numpy((x / scale[None, None, :, None]).astype(np.float32))
    e4m3 = scaled.to(torch.float8_e4m3fn)
    codes = e4m3.view(torch.uint8).numpy()
    return codes, scale, e4m3.to(torch.float64).numpy() * scale[None, None, :, None]


def quantized_cases(gen):
    """A quantized cache (SPEC §10.4): k and v as codes with scales; the expected
    output is the exact attention (float64) of q and the dequantized k and v."""
    B, Sq, Sk, H, Hkv, D = 1, 2, 33, 4, 2, 16
    for kind, tag in [("int8", "f32"), ("e4m3", "bf16"), ("int8", "f16")]:
        dt = {"f32": torch.float32, **DTYPES}[tag]
        q = torch.randn(B, Sq, H, D, generator=gen).to(dt)
        k = torch.randn(B, Sk, Hkv, D, generator=gen).numpy()
        v = torch.randn(B, Sk, Hkv, D, generator=gen).numpy()
        kc, ks, kd = quantize(k, kind)
        vc, vs, vd = quantize(v, kind)
        qd = q.to(torch.float64).numpy()
        rep = H // Hkv
        kd, vd = np.repeat(kd, rep, axis=2), np.repeat(vd, rep, axis=2)
        s = np.einsum("bqhd,bkhd->bhqk", qd, kd) / np.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out = np.einsum("bhqk,bkhd->bqhd", p, vd)
        inputs = {"q": q if tag != "f32" else q.numpy(), "k": kc, "v": vc,
                  "k_scale": ks, "v_scale": vs}
        write_case(f"attention_{kind}_cache_{tag}", "attention", tag,
                   {"num_heads": H, "layout": "bshd", "kv_cache": kind}, inputs, {"out": out})


def block_cases(gen):
    B, S, H, D = 2, 6, 2, 8
    E = H * D
    for tag, dt in DTYPES.items():
        x = torch.randn(B, S, E, generator=gen).to(dt)
        w_qkv = (torch.randn(3 * E, E, generator=gen) / E ** 0.5).to(dt)
        b_qkv = (0.1 * torch.randn(3 * E, generator=gen)).to(dt)
        w_out = (torch.randn(E, E, generator=gen) / E ** 0.5).to(dt)
        b_out = (0.1 * torch.randn(E, generator=gen)).to(dt)
        keep = torch.ones(B, S, dtype=torch.bool)
        keep[1, -2:] = False
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        ang = torch.outer(torch.arange(S, dtype=torch.float32), inv)
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)          # [S, D/2] tables
        q, k, v = (t.reshape(B, S, H, D) for t in F.linear(x, w_qkv, b_qkv).split(E, -1))
        c = torch.cat([cos, cos], -1)[None, :, None, :]
        s = torch.cat([sin, sin], -1)[None, :, None, :]

        def rotate(t):
            t1, t2 = t[..., : D // 2], t[..., D // 2:]
            return t * c + torch.cat([-t2, t1], -1) * s

        q, k, v = (t.transpose(1, 2) for t in (rotate(q), rotate(k), v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        out = F.linear(a.transpose(1, 2).reshape(B, S, E), w_out, b_out)
        write_case(f"attention_block_{tag}", "attention_block", tag, {"num_heads": H},
                   {"x": x, "w_qkv": w_qkv, "b_qkv": b_qkv, "w_out": w_out, "b_out": b_out,
                    "mask": keep.numpy(), "cos": cos, "sin": sin}, {"out": out})


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    gen = torch.Generator().manual_seed(20261202)
    torch.set_num_threads(1)
    attention_cases(gen)
    rope_cases(gen)
    swiglu_cases(gen)
    quantized_cases(gen)
    block_cases(gen)
    print("wrote", len(os.listdir(OUT)), "cases to", OUT)


if __name__ == "__main__":
    main()
