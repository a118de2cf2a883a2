#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tandem_case.write_case writes cases that `tandem check` reads and passes,
with expected values computed here in NumPy (float64) from SPEC's formulas;
`tandem run` writes outputs NumPy reads back; a perturbed expected value is
reported as a mismatch (exit 1).

Usage: test_tandem_case.py <tandem executable> <scratch directory>
"""
import math
import os
import shutil
import subprocess
import sys

import numpy as np

from tandem_case import write_case

rng = np.random.default_rng(7)
failures = []


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def tandem(*args):
    p = subprocess.run([TANDEM, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def expect(what, code, want, text):
    status = "ok" if code == want else "FAILED"
    print(f"[{status}] {what}: exit {code} (want {want})")
    if code != want:
        print(text)
        failures.append(what)


def silu(g):
    return g / (1.0 + np.exp(-g))


def attention_np(q, k, v, causal=False, keep=None):
    """q [B, Sq, H, D], k, v [B, Sk, Hkv, *] (bshd); returns out and P."""
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    off = max(Sk - Sq, 0)
    out = np.zeros((B, Sq, H, v.shape[3]))
    probs = np.zeros((B, H, Sq, Sk))
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            s = q[b, :, h] @ k[b, :, g].T / math.sqrt(D)
            visible = np.ones((Sq, Sk), dtype=bool)
            if causal:
                visible &= np.arange(Sk)[None, :] <= (off + np.arange(Sq))[:, None]
            if keep is not None:
                visible &= keep[b][None, :] != 0
            s = np.where(visible, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
            z = e.sum(axis=1, keepdims=True)
            p = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
            probs[b, h] = p
            out[b, :, h] = p @ v[b, :, g]
    return out, probs


def attention_backward_np(q, k, v, dout, causal=False):
    out, probs = attention_np(q, k, v, causal)
    q, k, v, dout = (t.astype(np.float64) for t in (q, k, v, dout))
    B, Sq, H, D = q.shape
    Hkv = k.shape[2]
    scale = 1 / math.sqrt(D)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            p = probs[b, h]
            dp = dout[b, :, h] @ v[b, :, g].T
            ds = p * (dp - (dout[b, :, h] * out[b, :, h]).sum(axis=1, keepdims=True))
            dq[b, :, h] = scale * ds @ k[b, :, g]
            dk[b, :, g] += scale * ds.T @ q[b, :, h]
            dv[b, :, g] += p.T @ dout[b, :, h]
    return dq, dk, dv


def rope_np(x, cos, sin, head_dim, n_rot, style):
    y = x.astype(np.float64).copy()
    heads = x.shape[-1] // head_dim
    m = n_rot // 2
    xs = x.astype(np.float64).reshape(*x.shape[:-1], heads, head_dim)
    ys = y.reshape(*x.shape[:-1], heads, head_dim)
    S = x.shape[-2]
    for i in range(m):
        c = cos[:S, i].astype(np.float64)[:, None]
        s = sin[:S, i].astype(np.float64)[:, None]
        p, q = (i, i + m) if style == "neox" else (2 * i, 2 * i + 1)
        ys[..., p] = xs[..., p] * c - xs[..., q] * s
        ys[..., q] = xs[..., q] * c + xs[..., p] * s
    return ys.reshape(x.shape)


def axial_rope_np(x, num_heads, end_x, end_y, theta=10000.0):
    """x [B, S, W]; SPEC section 5."""
    B, S, W = x.shape
    D = W // num_heads
    xs = x.astype(np.float64).reshape(B, S, num_heads, D)
    y = xs.copy()
    f = theta ** (-4.0 * np.arange(D // 4) / D)
    for s in range(S):
        p = s % (end_x * end_y)
        px, py = p % end_x, p // end_x
        for j in range(D // 2):
            a = px * f[j] if j < D // 4 else py * f[j - D // 4]
            c, sn = math.cos(a), math.sin(a)
            y[:, s, :, 2 * j] = xs[:, s, :, 2 * j] * c - xs[:, s, :, 2 * j + 1] * sn
            y[:, s, :, 2 * j + 1] = xs[:, s, :, 2 * j + 1] * c + xs[:, s, :, 2 * j] * sn
    return y.reshape(B, S, W)


def attention_block_np(x, w_qkv, b_qkv, w_out, b_out, keep, num_heads):
    B, S, E = x.shape
    D = E // num_heads
    qkv = x.astype(np.float64) @ w_qkv.T.astype(np.float64) + b_qkv
    q, k, v = (qkv[..., i * E:(i + 1) * E].reshape(B, S, num_heads, D) for i in range(3))
    o, _ = attention_np(q, k, v, keep=keep)
    return o.reshape(B, S, E) @ w_out.T.astype(np.float64) + b_out


def main():
    root = SCRATCH
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    cases = []

    x = f32(3, 5, 16)
    g, u = x[..., :8].astype(np.float64), x[..., 8:].astype(np.float64)
    d = os.path.join(root, "swiglu")
    write_case(d, "swiglu", {"gate_first": True}, {"x": x}, {"out": silu(g) * u})
    cases.append(d)

    dy = f32(3, 5, 8)
    sig = 1 / (1 + np.exp(-u))  # gate_first false: the gate is the second half
    dgate = dy * g * sig * (1 + u * (1 - sig))
    dup = dy * silu(u)
    d = os.path.join(root, "swiglu_backward_up_first")
    write_case(d, "swiglu_backward", {"gate_first": False}, {"x": x, "dout": dy},
               {"dx": np.concatenate([dup, dgate], axis=-1)})
    cases.append(d)

    for style in ["neox", "gptj"]:
        xr = f32(2, 6, 24)
        angles = np.arange(8)[:, None] * (10000.0 ** (-np.arange(4) / 4))[None, :]
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        d = os.path.join(root, f"rope_{style}_partial")
        write_case(d, "rope", {"head_dim": 12, "n_rot": 6, "style": style},
                   {"x": xr, "cos": cos, "sin": sin},
                   {"out": rope_np(xr, cos, sin, 12, 6, style)})
        cases.append(d)

    # q and k (GQA) in [B, H, S, D] with per-token position ids (int32) into a longer cache.
    qr, kr = f32(2, 4, 5, 8), f32(2, 2, 5, 8)
    angles = np.arange(12)[:, None] * (10000.0 ** (-np.arange(4) / 4))[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]], dtype=np.int32)

    def rope_bhsd(t):  # the rows each token selects, broadcast over heads
        per_token = [rope_np(t[b].transpose(1, 0, 2).reshape(5, -1), cos[positions[b]],
                             sin[positions[b]], 8, 8, "neox") for b in range(2)]
        return np.stack(per_token).reshape(2, 5, -1, 8).transpose(0, 2, 1, 3)

    d = os.path.join(root, "rope_qk_bhsd_positions")
    write_case(d, "rope_qk", {"layout": "bhsd"},
               {"q": qr, "k": kr, "cos": cos, "sin": sin, "positions": positions},
               {"q_out": rope_bhsd(qr), "k_out": rope_bhsd(kr)})
    if np.load(os.path.join(d, "positions.npy")).dtype != np.dtype("<i4"):
        failures.append("positions saved as <i4")
    cases.append(d)

    q, k, v = f32(2, 4, 4, 8), f32(2, 6, 2, 8), f32(2, 6, 2, 5)
    out, _ = attention_np(q, k, v, causal=True)
    d = os.path.join(root, "attention_gqa_causal_mla")
    write_case(d, "attention", {"num_heads": 4, "mask": "causal", "layout": "bshd"},
               {"q": q, "k": k, "v": v}, {"out": out})
    cases.append(d)

    # The same call in bhsd, given as [B, H, S, D] tensors.
    d = os.path.join(root, "attention_bhsd")
    write_case(d, "attention", {"num_heads": 4, "mask": "causal", "layout": "bhsd"},
               {"q": q.transpose(0, 2, 1, 3), "k": k.transpose(0, 2, 1, 3),
                "v": v.transpose(0, 2, 1, 3)}, {"out": out.transpose(0, 2, 1, 3)})
    cases.append(d)

    keep = np.array([[True, False, True, True, False, True], [False, True, True, True, True, True]])
    out, _ = attention_np(q, k, v, keep=keep)
    d = os.path.join(root, "attention_key_padding_bool")
    write_case(d, "attention", {"num_heads": 4, "mask": "key_padding", "layout": "bshd"},
               {"q": q, "k": k, "v": v, "mask": keep}, {"out": out})
    cases.append(d)

    dout = f32(2, 4, 4, 5)
    dq, dk, dv = attention_backward_np(q, k, v, dout, causal=True)
    d = os.path.join(root, "attention_backward_causal")
    write_case(d, "attention_backward", {"num_heads": 4, "mask": "causal", "layout": "bshd"},
               {"q": q, "k": k, "v": v, "dout": dout}, {"dq": dq, "dk": dk, "dv": dv})
    cases.append(d)

    xa = f32(2, 12, 16)
    d = os.path.join(root, "axial_rope_two_heads")
    write_case(d, "axial_rope", {"num_heads": 2, "end_x": 3, "end_y": 2, "repeat_factor": 2},
               {"x": xa}, {"out": axial_rope_np(xa, 2, 3, 2)})
    cases.append(d)

    xb, w_qkv, b_qkv = f32(2, 5, 8), f32(24, 8) * 0.3, f32(24)
    w_out, b_out = f32(8, 8) * 0.3, f32(8)
    keep_b = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=np.int32)
    d = os.path.join(root, "attention_block_padded")
    write_case(d, "attention_block", {"num_heads": 2},
               {"x": xb, "w_qkv": w_qkv, "b_qkv": b_qkv, "w_out": w_out, "b_out": b_out,
                "mask": keep_b},
               {"out": attention_block_np(xb, w_qkv, b_qkv, w_out, b_out, keep_b, 2)})
    cases.append(d)

    for c in cases:
        code, text = tandem("check", "--backend", "all", c)
        expect(f"check {os.path.basename(c)}", code, 0, text)

    # Index inputs keep an integer dtype (int32 stays <i4): two packed
    # sequences, each attending to its own keys.
    qp, kp, vp = f32(5, 4, 8), f32(7, 2, 8), f32(7, 2, 8)
    cu_q, cu_k = np.array([0, 2, 5], dtype=np.int32), np.array([0, 3, 7], dtype=np.int32)
    out = np.concatenate([attention_np(qp[None, cu_q[n]:cu_q[n + 1]], kp[None, cu_k[n]:cu_k[n + 1]],
                                       vp[None, cu_k[n]:cu_k[n + 1]])[0][0] for n in range(2)])
    d = os.path.join(root, "attention_varlen")
    write_case(d, "attention", {"num_heads": 4},
               {"q": qp, "k": kp, "v": vp, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}, {"out": out})
    dtype = np.load(os.path.join(d, "cu_seqlens_q.npy")).dtype
    print(f"[{'ok' if dtype == np.dtype('<i4') else 'FAILED'}] cu_seqlens_q saved as {dtype}")
    if dtype != np.dtype("<i4"):
        failures.append("cu_seqlens_q dtype")
    code, text = tandem("check", "--backend", "reference", d)
    expect("check attention_varlen", code, 0, text)
    try:
        write_case(d, "attention", {"num_heads": 4}, {"q": qp, "k": kp, "v": vp,
                                                      "cu_seqlens_q": cu_q.astype(np.float32),
                                                      "cu_seqlens_k": cu_k})
        failures.append("float cu_seqlens_q accepted")
        print("[FAILED] write_case accepted a float cu_seqlens_q")
    except TypeError as e:
        print(f"[ok] float cu_seqlens_q refused: {e}")

    # run writes every output; NumPy reads it back and it matches the expected file.
    outdir = os.path.join(root, "run_out")
    backward_case = os.path.join(root, "attention_backward_causal")
    code, text = tandem("run", backward_case, "--backend", "reference", "--out", outdir)
    expect("run attention_backward", code, 0, text)
    for name in ["dq", "dk", "dv"]:
        got = np.load(os.path.join(outdir, f"{name}.npy"))
        want = np.load(os.path.join(backward_case, f"expected_{name}.npy"))
        ok = got.dtype == np.float32 and got.shape == want.shape and np.allclose(
            got, want, rtol=1e-3, atol=1e-4)
        print(f"[{'ok' if ok else 'FAILED'}] run output {name}: {got.dtype} {got.shape}")
        if not ok:
            failures.append(f"run output {name}")

    # A perturbed expected value is a mismatch; a loose tolerance accepts it.
    x = f32(2, 8)
    want = silu(x[:, :4].astype(np.float64)) * x[:, 4:]
    want[1, 3] += 1e-3
    d = os.path.join(root, "swiglu_perturbed")
    write_case(d, "swiglu", {}, {"x": x}, {"out": want})
    code, text = tandem("check", d)
    expect("perturbed expected value", code, 1, text)
    write_case(d, "swiglu", {}, {"x": x}, {"out": want}, tolerance={"rtol": 0.0, "atol": 2e-3})
    code, text = tandem("check", d)
    expect("perturbed value within a case tolerance", code, 0, text)

    # NaN and inf in the data propagate and are compared exactly.
    x = f32(2, 8)
    x[0, 0] = np.nan
    x[1, 1] = np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        want = silu(x[:, :4].astype(np.float64)) * x[:, 4:]
    d = os.path.join(root, "swiglu_nonfinite")
    write_case(d, "swiglu", {}, {"x": x}, {"out": want})
    code, text = tandem("check", d)
    expect("non-finite data", code, 0, text)

    storage_cases(root)

    if failures:
        print("FAILED:", ", ".join(failures))
        return 1
    return 0


def to_bf16(x):
    """x rounded to bfloat16 (nearest, ties to even), as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def storage_cases(root):
    """bf16 and f16 cases (SPEC §9.4): the files' dtypes, the values they hold,
    and that the command loads them (it then runs them, or says the backend
    does not offer the entry point: never a load error)."""
    x = to_bf16(f32(3, 8))
    d = os.path.join(root, "swiglu_bf16")
    want = to_bf16(silu(x[:, :4].astype(np.float64)) * x[:, 4:])
    write_case(d, "swiglu", {}, {"x": x}, {"out": want}, dtype="bf16")
    stored = np.load(os.path.join(d, "x.npy"))
    ok = stored.dtype == np.dtype("<u2") and np.array_equal(
        (stored.astype(np.uint32) << 16).view(np.float32), x)
    expect("bf16 stored as its bits", 0 if ok else 1, 0, str(stored.dtype))
    code, text = tandem("check", "--backend", "reference", d)
    loaded = code == 0 or (code == 2 and "does not offer swiglu_forward for dtype bf16" in text)
    expect("bf16 case loads", 0 if loaded else code, 0, text)

    h = f32(3, 8).astype(np.float16)
    d = os.path.join(root, "swiglu_f16")
    write_case(d, "swiglu", {}, {"x": h}, dtype="f16")
    ok = np.load(os.path.join(d, "x.npy")).dtype == np.dtype("<f2")
    expect("f16 stored as <f2", 0 if ok else 1, 0, "")

    for dtype, value in [("bf16", np.float32(1.0 + 2.0 ** -10)), ("f16", np.float32(0.1))]:
        try:
            write_case(os.path.join(root, "inexact"), "swiglu", {},
                       {"x": np.full((1, 2), value)}, dtype=dtype)
            expect(f"{dtype} value it cannot hold is refused", 1, 0, "no error")
        except ValueError as e:
            expect(f"{dtype} value it cannot hold is refused", 0, 0, str(e))

    # A float32 file in a bf16 case is an error naming the input.
    q = to_bf16(f32(1, 4, 2, 8))
    d = os.path.join(root, "attention_mixed")
    write_case(d, "attention", {"num_heads": 2}, {"q": q, "k": q, "v": q}, dtype="bf16")
    np.save(os.path.join(d, "k.npy"), q)
    code, text = tandem("check", "--backend", "reference", d)
    expect("f32 k in a bf16 case", code, 2, text)
    expect("the error names inputs.k", 0 if "k.npy: inputs.k: dtype <f4" in text else 1, 0, text)

    # Quantized codes keep their 8 bits.
    codes = rng.integers(-127, 128, size=(1, 4, 2, 8))
    d = os.path.join(root, "attention_int8")
    ones = np.ones((1, 4, 2), np.float32)
    write_case(d, "attention", {"num_heads": 2, "kv_cache": "int8"},
               {"q": f32(1, 4, 2, 8), "k": codes, "v": codes, "k_scale": ones, "v_scale": ones})
    ok = np.load(os.path.join(d, "k.npy")).dtype == np.dtype("|i1")
    expect("int8 codes stored as |i1", 0 if ok else 1, 0, "")


if __name__ == "__main__":
    TANDEM, SCRATCH = sys.argv[1], sys.argv[2]
    sys.exit(main())
