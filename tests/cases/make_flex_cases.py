#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the FlexAttention examples tests/cases/examples/flex_* (SPEC §9.7),
whose expected outputs PyTorch computes:

  flex_causal_alibi_block_mask  ALiBi as a score_mod with its slopes captured,
                                causal as a mask_mod, and the block mask
                                torch's create_block_mask makes of it (blocks
                                of 4: full blocks below the diagonal)
  flex_document_gqa             a document mask (ids captured as integers,
                                causal within each document) under GQA
  flex_softcap                  a softcap score_mod, Sq != Sk, Dv != D and a
                                scale of its own
  flex_relative_bias            a learned relative-position bias [H, Sq+Sk-1]
  flex_relative_bias_backward   its gradients under GQA and a causal mask_mod:
                                dq, dk, dv and dbias
  flex_alibi_document_bf16      bf16 q, k, v and slopes: ALiBi over documents,
                                causal in each (the native form of §13.5)

The forward outputs (out, lse) are torch's own flex_attention on the CPU in
float32. Its CPU path has no backward, so the gradients are torch autograd's
through the materialized math (scores, mods, softmax) in float64, which the
script also checks the forward outputs against. The bf16 case's expected
out is that math in float64 on the bf16 inputs, rounded to bf16 once (the
contract of SPEC §13.4); torch's own bf16 flex also rounds the softmax
weights to bf16 before P·V, so it is only checked to lie within bf16's
tolerance of it. Each mod is traced by
tandem.flex's tracer, so the case file holds the node list Python sends
(JSON has no infinity: a ±inf constant is written "inf" or "-inf").

Needs torch and the tandem package: run it from the virtual environment of
the Python tests (`ctest -R python_install` creates it):

  .venv/bin/python tests/cases/make_flex_cases.py [NAME ...]

With names, only those cases are written: torch's float32 flex is not
bitwise reproducible between runs and versions, so rewriting every case
changes the last bits of cases that did not change.
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from tandem.flex import _trace

HERE = os.path.dirname(os.path.abspath(__file__))
gen = torch.Generator().manual_seed(20261203)  # its own stream: the other examples stay


def t32(*shape):
    return torch.randn(*shape, dtype=torch.float32, generator=gen)


def plain(x):
    """A node list as JSON: tuples as lists, ±inf as strings."""
    if isinstance(x, (list, tuple)):
        return [plain(y) for y in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def save(directory, name, array, index=False):
    if hasattr(array, "dtype") and array.dtype == torch.bfloat16:  # its bits, <u2
        array = array.detach().contiguous().view(torch.int16).numpy().view(np.uint16)
        np.save(os.path.join(directory, name + ".npy"), array, allow_pickle=False)
        return name + ".npy"
    array = array.detach().cpu().numpy() if hasattr(array, "detach") else np.asarray(array)
    if index:
        wide = array.astype(np.int64)
        fits = wide.size == 0 or (wide.min() >= -2**31 and wide.max() < 2**31)
        array = wide.astype("<i4" if fits else "<i8")
    else:
        array = array.astype("<f4")
    np.save(os.path.join(directory, name + ".npy"), np.ascontiguousarray(array),
            allow_pickle=False)
    return name + ".npy"


def write_flex_case(name, op, tensors, expected, score_mod=None, mask_mod=None, scale=None,
                    block_mask=None, dtype=None):
    """case.json and its .npy files: q, k, v (and dout) in `tensors`, each
    mod's captured tensors under the names its trace gives them, the block
    mask's four index arrays, and the expected outputs."""
    d = os.path.join(HERE, "examples", name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    case = {"op": op, "attrs": {}, "inputs": {}}
    if dtype:
        case["dtype"] = dtype
    for role, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is None:
            continue
        spec, tr = _trace(fn, role)
        case["attrs"][role] = plain(spec)
        for (tname, _, kind, _, _), data in zip(tr.tensors, tr.arrays):
            case["inputs"][tname] = save(d, tname, data, index=kind == "integer")
    if scale is not None:
        case["attrs"]["scale"] = scale
    for tname, t in tensors.items():
        case["inputs"][tname] = save(d, tname, t)
    if block_mask is not None:
        case["attrs"]["block_size"] = list(block_mask.BLOCK_SIZE)
        for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
            case["inputs"][field] = save(d, field, getattr(block_mask, field), index=True)
    case["expected"] = {k: save(d, "expected_" + k, v) for k, v in expected.items()}
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")


def materialized(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """out and lse of SPEC §13.4 as plain tensor math (float64 when the
    inputs are): the mods applied to index grids that broadcast."""
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    scale = 1 / math.sqrt(D) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    qi = torch.arange(Sq).view(1, 1, Sq, 1)
    kv = torch.arange(Sk).view(1, 1, 1, Sk)
    t = score_mod(s, b, h, qi, kv) if score_mod else s
    if mask_mod:
        t = t.masked_fill(~mask_mod(b, h, qi, kv).expand_as(t), -math.inf)
    lse = torch.logsumexp(t, dim=-1)
    return torch.softmax(t, dim=-1) @ v, lse


def torch_flex(q, k, v, score_mod=None, block_mask=None, scale=None):
    """torch's flex_attention on the CPU (float32): out and lse, checked
    against the materialized math in float64."""
    from torch.nn.attention.flex_attention import AuxRequest
    gqa = k.shape[1] != q.shape[1]
    out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=gqa, return_aux=AuxRequest(lse=True))
    return out, aux.lse


def check_against_math(out, lse, ref_out, ref_lse):
    assert torch.allclose(out.double(), ref_out, rtol=1e-5, atol=1e-5), \
        (out.double() - ref_out).abs().max()
    assert torch.allclose(lse.double(), ref_lse, rtol=1e-5, atol=1e-5), \
        (lse.double() - ref_lse).abs().max()


def causal_alibi_block_mask():
    B, H, S, D = 1, 4, 16, 8
    q, k, v = t32(B, H, S, D), t32(B, H, S, D), t32(B, H, S, D)
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / H) for i in range(H)])

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    bm = create_block_mask(causal, None, None, S, S, device="cpu", BLOCK_SIZE=4)
    out, lse = torch_flex(q, k, v, alibi, bm)
    check_against_math(out, lse, *materialized(q.double(), k.double(), v.double(), alibi, causal))
    write_flex_case("flex_causal_alibi_block_mask", "flex_attention", {"q": q, "k": k, "v": v},
                    {"out": out, "lse": lse}, score_mod=alibi, mask_mod=causal, block_mask=bm)


def document_gqa():
    B, H, Hkv, S, D = 1, 4, 2, 16, 8
    q, k, v = t32(B, H, S, D), t32(B, Hkv, S, D), t32(B, Hkv, S, D)
    doc = torch.tensor([0] * 5 + [1] * 7 + [2] * 4, dtype=torch.int32)

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    bm = create_block_mask(document, None, None, S, S, device="cpu")
    out, lse = torch_flex(q, k, v, block_mask=bm)
    check_against_math(out, lse, *materialized(q.double(), k.double(), v.double(), None, document))
    # No block mask in the case: mask_mod alone decides (SPEC §13.4).
    write_flex_case("flex_document_gqa", "flex_attention", {"q": q, "k": k, "v": v},
                    {"out": out, "lse": lse}, mask_mod=document)


def softcap():
    B, H, Sq, Sk, D, Dv = 2, 2, 8, 20, 8, 4
    q, k, v = 4 * t32(B, H, Sq, D), t32(B, H, Sk, D), t32(B, H, Sk, Dv)
    scale = 0.5

    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return 5.0 * torch.tanh(score / 5.0)

    out, lse = torch_flex(q, k, v, tanh_softcap, scale=scale)
    check_against_math(out, lse,
                       *materialized(q.double(), k.double(), v.double(), tanh_softcap, None, scale))
    write_flex_case("flex_softcap", "flex_attention", {"q": q, "k": k, "v": v},
                    {"out": out, "lse": lse}, score_mod=tanh_softcap, scale=scale)


def relative_bias_mod(bias, Sk):
    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + Sk - 1]

    return relative_bias


def relative_bias():
    B, H, S, D = 1, 2, 12, 8
    q, k, v = t32(B, H, S, D), t32(B, H, S, D), t32(B, H, S, D)
    bias = t32(H, 2 * S - 1)
    mod = relative_bias_mod(bias, S)
    out, lse = torch_flex(q, k, v, mod)
    check_against_math(out, lse, *materialized(q.double(), k.double(), v.double(),
                                               relative_bias_mod(bias.double(), S)))
    write_flex_case("flex_relative_bias", "flex_attention", {"q": q, "k": k, "v": v},
                    {"out": out, "lse": lse}, score_mod=mod)


def relative_bias_backward():
    B, H, Hkv, S, D = 1, 4, 2, 10, 8
    q, k, v = t32(B, H, S, D), t32(B, Hkv, S, D), t32(B, Hkv, S, D)
    dout, bias = t32(B, H, S, D), t32(H, 2 * S - 1)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    q64, k64, v64, b64 = (x.double().requires_grad_() for x in (q, k, v, bias))
    out, _ = materialized(q64, k64, v64, relative_bias_mod(b64, S), causal)
    out.backward(dout.double())
    # bias[h, q - kv + S - 1] for kv <= q reads only entries S-1…2S-2: the
    # others get a zero gradient, as the backward must give them.
    write_flex_case("flex_relative_bias_backward", "flex_attention_backward",
                    {"q": q, "k": k, "v": v, "dout": dout},
                    {"dq": q64.grad, "dk": k64.grad, "dv": v64.grad, "dbias": b64.grad},
                    score_mod=relative_bias_mod(bias, S), mask_mod=causal)


def alibi_document_bf16():
    B, H, S, D = 1, 4, 16, 8
    bf = torch.bfloat16
    q, k, v = t32(B, H, S, D).to(bf), t32(B, H, S, D).to(bf), t32(B, H, S, D).to(bf)
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / H) for i in range(H)]).to(bf)
    doc = torch.tensor([0] * 6 + [1] * 3 + [2] * 7, dtype=torch.int32)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    def alibi64(score, b, h, q_idx, kv_idx):
        return score - slopes.double()[h] * (q_idx - kv_idx).abs()

    out64, lse64 = materialized(q.double(), k.double(), v.double(), alibi64, document)
    out = out64.to(bf)  # rounded once
    bm = create_block_mask(document, None, None, S, S, device="cpu")
    theirs, _ = torch_flex(q, k, v, alibi, bm)
    # theirs rounds P (each weight by at most 2^-9 relative, so out moves by
    # at most 2^-9 max|v|) and then out: both roundings' half ulps, twice
    err = (theirs.double() - out.double()).abs()
    bound = 2.0 ** -9 * v.double().abs().max() + 2.0 ** -8 * out.double().abs()
    assert (err <= bound + 2.0 ** -8 * out64.abs()).all(), (err - bound).max()
    write_flex_case("flex_alibi_document_bf16", "flex_attention", {"q": q, "k": k, "v": v},
                    {"out": out, "lse": lse64}, score_mod=alibi, mask_mod=document,
                    dtype="bf16")


CASES = {"flex_causal_alibi_block_mask": causal_alibi_block_mask,
         "flex_document_gqa": document_gqa, "flex_softcap": softcap,
         "flex_relative_bias": relative_bias,
         "flex_relative_bias_backward": relative_bias_backward,
         "flex_alibi_document_bf16": alibi_document_bf16}


def main(names):
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit("unknown case(s) " + ", ".join(unknown) + "; known: " + ", ".join(CASES))
    for name, write in CASES.items():
        if not names or name in names:
            write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
