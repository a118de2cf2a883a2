# SPDX-License-Identifier: Apache-2.0
"""User kernels for the tests of tandem.testing: correct ones (PyTorch's SDPA
through a thin adapter, a NumPy float32 attention, NumPy RoPE and SwiGLU) and
the same NumPy kernels with one deliberate bug each."""

import numpy as np
import torch
import torch.nn.functional as F


def _visible(Sq, Sk, mask, window, offset):
    """[Sq, Sk] keys query i sees under causal / sliding_window (offset: the
    key position of query 0)."""
    i = np.arange(Sq)[:, None] + offset
    j = np.arange(Sk)[None, :]
    if mask == "causal":
        return j <= i
    if mask == "sliding_window":
        return (j <= i) & (j >= i - window)
    return np.ones((Sq, Sk), bool)


# torch 2.5 gave SDPA enable_gqa and a 0 (not NaN) for a query that sees no key.
TORCH_2_5 = tuple(int(n) for n in torch.__version__.split(".")[:2]) >= (2, 5)


def torch_sdpa(q, k, v, *, enable_gqa=False, **kwargs):
    """F.scaled_dot_product_attention with enable_gqa on any torch: each kv
    head repeated over its group of query heads (what enable_gqa computes)."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k, v = (x.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def sdpa_attention(q, k, v, *, layout, mask, window, scale, softcap, bias=None,
                   key_padding=None):
    """tandem.attention's contract on torch tensors through F.sdpa (no softcap)."""
    assert softcap == 0.0, "F.scaled_dot_product_attention has no softcap"
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    Sq, Sk = q.shape[2], k.shape[2]
    attn_mask = None
    if mask in ("causal", "sliding_window"):  # tandem's bottom-right alignment
        attn_mask = torch.from_numpy(_visible(Sq, Sk, mask, window, max(Sk - Sq, 0)))
    elif key_padding is not None:
        attn_mask = (key_padding != 0)[:, None, None, :]
    elif bias is not None:
        attn_mask = bias
    out = torch_sdpa(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2) if layout == "bshd" else out


def sdpa_attention_backward(q, k, v, dout, *, bug=None, **kwargs):
    """(dq, dk, dv) of sdpa_attention by torch's autograd. bug "gqa_sum": k and
    v repeated per query head, and each kv head's gradient taken from the
    first head of its group instead of summed over the group."""
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    if bug != "gqa_sum":
        return torch.autograd.grad(sdpa_attention(q, k, v, **kwargs), (q, k, v), dout)
    axis = 2 if kwargs["layout"] == "bshd" else 1
    group = q.shape[axis] // k.shape[axis]
    k2, v2 = (x.detach().repeat_interleave(group, axis).requires_grad_() for x in (k, v))
    dq, dk2, dv2 = torch.autograd.grad(sdpa_attention(q, k2, v2, **kwargs), (q, k2, v2), dout)
    first = torch.arange(0, q.shape[axis], group)
    return dq, dk2.index_select(axis, first), dv2.index_select(axis, first)


def numpy_attention(q, k, v, *, layout, mask, window, scale, softcap, bias=None,
                    key_padding=None, sinks=None, alibi_slopes=None, bug=None, round_to=None):
    """Attention in NumPy (float32, or float64 inputs in float64), written
    plainly: s_ij = scale <q_i, k_j> (softcapped) - m_h |i + Sk - Sq - j|
    (ALiBi slopes m [H] or [B, H]) + bias_ij; p_ij = e^s_ij / (e^sink_h +
    sum_j e^s_ij) (sinks [H]). bug: "gqa" (query head h reads kv head
    h % Hkv), "causal_offset" (causal without the Sk - Sq offset), "no_max"
    (softmax without subtracting the row maximum), "sink_numerator" (the
    sink's e^sink_h added to every p_ij's numerator as well), "scores" (the
    scores rounded to `round_to`). round_to: a storage type the weights are
    rounded to before P·V (SPEC §10.2's pytorch profile)."""
    if layout == "bshd":
        q, k, v = (np.asarray(x).transpose(0, 2, 1, 3) for x in (q, k, v))
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    heads = np.arange(H) % Hkv if bug == "gqa" else np.arange(H) // (H // Hkv)
    k, v = k[:, heads], v[:, heads]
    f = q.dtype.type
    s = f(scale if scale is not None else 1 / np.sqrt(D)) * (q @ k.transpose(0, 1, 3, 2))
    if softcap > 0:
        s = f(softcap) * np.tanh(s / f(softcap))
    if bug == "scores":
        s = s.astype(round_to).astype(q.dtype)
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, np.float32).astype(q.dtype)
        slopes = slopes.reshape((1, H) if slopes.ndim == 1 else slopes.shape)[:, :, None, None]
        s = s - slopes * np.abs(np.arange(Sq)[:, None] + Sk - Sq - np.arange(Sk)[None, :])
    offset = 0 if bug == "causal_offset" else max(Sk - Sq, 0)
    visible = np.broadcast_to(_visible(Sq, Sk, mask, window, offset), s.shape)
    if bias is not None:
        s = s + bias
        visible = visible & np.isfinite(bias)
    if key_padding is not None:
        visible = visible & (key_padding != 0)[:, None, None, :]
    s = np.where(visible, s, -np.inf)
    m = np.zeros(s.shape[:-1] + (1,), q.dtype) if bug == "no_max" else \
        np.max(np.where(visible, s, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    sink = None if sinks is None else np.asarray(sinks, q.dtype)[None, :, None, None]
    if sink is not None and bug != "no_max":
        m = np.maximum(m, sink)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.where(visible, np.exp(s - m), 0).astype(q.dtype)
        l = p.sum(-1, keepdims=True)
        if round_to is not None:
            p = p.astype(round_to).astype(q.dtype)
        if sink is not None:
            l = l + np.exp(sink - m)
            if bug == "sink_numerator":
                p = np.where(visible, p + np.exp(sink - m), 0)
        out = np.where(l > 0, (p @ v) / np.where(l > 0, l, 1), 0).astype(q.dtype)
    return out.transpose(0, 2, 1, 3) if layout == "bshd" else out


def numpy_rope(x, cos, sin, *, head_dim, n_rot, style, table_rows, bug=None):
    """RoPE in NumPy. bug "pairs": NeoX asked, GPT-J pairs (2i, 2i+1) rotated."""
    B, S, W = x.shape
    m = n_rot // 2
    rows = np.arange(S)[None, :] + (np.arange(B)[:, None] * S if table_rows == "token" else 0)
    c = cos[rows][..., :m][:, :, None, :]  # [B, S, 1, m]
    s = sin[rows][..., :m][:, :, None, :]
    y = x.reshape(B, S, W // head_dim, head_dim).copy()
    xh = x.reshape(B, S, W // head_dim, head_dim)
    if style == "neox" and bug != "pairs":
        a, b = np.arange(m), np.arange(m) + m
    else:
        a, b = 2 * np.arange(m), 2 * np.arange(m) + 1
    y[..., a] = xh[..., a] * c - xh[..., b] * s
    y[..., b] = xh[..., b] * c + xh[..., a] * s
    return y.reshape(B, S, W)


def torch_swiglu(x, *, gate_first):
    """silu(g) * u with torch."""
    g, u = x.chunk(2, dim=-1)
    if not gate_first:
        g, u = u, g
    return F.silu(g) * u


def my_attention(q, k, v, **kwargs):
    """The docs' example: a user's attention with a GQA bug (head h % Hkv)."""
    return numpy_attention(q, k, v, bug="gqa", **kwargs)


def lowp_attention(q, k, v, *, profile="pytorch", bug=None, sinks=None, **kwargs):
    """A bfloat16 or float16 attention in NumPy: the stored values read
    exactly into float32, computed there (the weights rounded to the storage
    type before P·V with profile "pytorch", not with "exact") and the output
    rounded once. bug "scores": the scores rounded to the storage type too."""
    dt = q.dtype
    q, k, v = (np.asarray(x).astype(np.float32) for x in (q, k, v))
    if sinks is not None:
        sinks = np.asarray(sinks).astype(np.float32)
    out = numpy_attention(q, k, v, sinks=sinks, bug=bug,
                          round_to=dt if profile == "pytorch" or bug else None, **kwargs)
    return out.astype(dt)


def lowp_attention_backward(q, k, v, dout, *, layout, mask, window, scale, softcap, sinks=None,
                            profile="pytorch", bug=None):
    """A bfloat16 or float16 attention backward in NumPy, float32 throughout,
    rounding where SPEC §10.2 says ("pytorch": the weights of the forward,
    RN_T(p) before dV and RN_T(dx) before dQ, dK; "exact": the gradients
    only). Forward: mu_i = ceil(m_i log2 e), e_ij = 2^(x_ij - mu_i), O_i =
    RN_T(sum_j w_ij v_j / l_i), lse_i = mu_i ln 2 + ln l_i. Backward: p_ij =
    e^(s_ij - lse_i), ds_ij = p_ij (dp_ij - delta_i), delta_i = <dO_i, O_i>,
    dx_ij = ds_ij (1 - tanh^2(raw_ij / c)) with a softcap c, dsink_h =
    -sum_i p_sink,i delta_i. Masks none, causal, sliding_window. bug
    "p_unrounded": RN_T(p) dropped before dV; "ds": ds rounded to T before
    the softcap's factor (a second rounding of dx)."""
    dt = q.dtype

    def rn(x):  # RN_T, read back into float32
        return x.astype(dt).astype(np.float32)

    if layout == "bshd":
        q, k, v, dout = (np.asarray(x).transpose(0, 2, 1, 3) for x in (q, k, v, dout))
    q, k, v, do = (np.asarray(x).astype(np.float32) for x in (q, k, v, dout))
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = H // Hkv
    kh, vh = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    sc = np.float32(scale if scale is not None else 1 / np.sqrt(D))
    raw = sc * (q @ kh.transpose(0, 1, 3, 2))
    c = np.float32(softcap)
    s = c * np.tanh(raw / c) if softcap > 0 else raw
    visible = np.broadcast_to(_visible(Sq, Sk, mask, window, max(Sk - Sq, 0)), s.shape)
    sink = None if sinks is None else np.asarray(sinks).astype(np.float32)[None, :, None, None]
    log2e, ln2 = np.float32(np.log2(np.e)), np.float32(np.log(2.0))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        m = np.max(np.where(visible, s, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
        if sink is not None:
            m = np.maximum(m, sink)
        mu = np.where(np.isfinite(m), np.ceil(m * log2e), 0).astype(np.float32)
        e = np.where(visible, np.exp2(s * log2e - mu), 0).astype(np.float32)
        l = e.sum(-1, keepdims=True)
        if sink is not None:
            l = l + np.exp2(sink * log2e - mu)
        w = rn(e) if profile == "pytorch" else e
        o = rn(np.where(l > 0, (w @ vh) / np.where(l > 0, l, 1), 0).astype(np.float32))
        lse = np.where(l > 0, mu * ln2 + np.log(l), -np.inf).astype(np.float32)
        seen = np.isfinite(lse)
        p = np.where(visible & seen, np.exp(s - np.where(seen, lse, 0)), 0).astype(np.float32)
    dp = do @ vh.transpose(0, 1, 3, 2)
    delta = (do * o).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    if bug == "ds":
        ds = rn(ds)
    dx = ds * (1 - np.tanh(raw / c) ** 2) if softcap > 0 else ds
    x = rn(dx) if profile == "pytorch" else dx
    y = rn(p) if profile == "pytorch" and bug != "p_unrounded" else p
    dq = sc * (x @ kh)
    dk = (sc * (x.transpose(0, 1, 3, 2) @ q)).reshape(B, Hkv, group, Sk, D).sum(2)
    dv = (y.transpose(0, 1, 3, 2) @ do).reshape(B, Hkv, group, Sk, -1).sum(2)
    grads = [rn(g).astype(dt) for g in (dq, dk, dv)]
    if layout == "bshd":
        grads = [np.ascontiguousarray(g.transpose(0, 2, 1, 3)) for g in grads]
    if sink is None:
        return tuple(grads)
    with np.errstate(invalid="ignore"):
        p_sink = np.where(seen, np.exp(sink - np.where(seen, lse, 0)), 0)
    dsinks = -(p_sink * delta).sum(axis=(0, 2, 3))
    return tuple(grads) + (dsinks.astype(np.float32).astype(dt),)
