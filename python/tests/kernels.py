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


def _ordered_rows(q, k, v, mask, window, scale, sinks, split):
    """One sequence, float32, written for a fixed order of operations: q
    [Sq, H, D], k, v [Sk, Hkv, *]; the keys visited one by one in key order
    (reversed when split < 0), or in |split| chunks of equal size merged in
    order (split > 1): out [Sq, H, Dv]."""
    Sq, H, D = q.shape
    Sk, Hkv = k.shape[:2]
    heads = np.arange(H) // (H // Hkv)
    kh, vh = k[:, heads], v[:, heads]  # [Sk, H, *]
    f = np.float32
    sc = f(scale if scale is not None else 1 / np.sqrt(D))
    s = np.zeros((H, Sq, Sk), f)  # each score summed along d in order
    for d in range(D):
        s = s + q[:, :, d].T[:, :, None] * kh[:, :, d].T[:, None, :]
    s = sc * s
    visible = _visible(Sq, Sk, mask, window, max(Sk - Sq, 0))[None]
    s = np.where(visible, s, -np.inf).astype(f)
    sink = None if sinks is None else np.asarray(sinks, f)[:, None]

    def part(keys):
        """(m [H, Sq], l [H, Sq], acc [H, Sq, Dv]) of the keys `keys`, in order."""
        m = np.max(s[:, :, keys], axis=-1, initial=-np.inf) if len(keys) else \
            np.full(s.shape[:2], -np.inf, f)
        m0 = np.where(np.isfinite(m), m, 0).astype(f)
        l = np.zeros(s.shape[:2], f)
        acc = np.zeros(s.shape[:2] + (vh.shape[-1],), f)
        for j in keys:
            p = np.exp(s[:, :, j] - m0).astype(f)
            l = l + p
            acc = acc + p[..., None] * vh[j][:, None, :]
        return m, l, acc

    order = list(range(Sk))[::-1] if split < 0 else list(range(Sk))
    n = max(1, split)
    bounds = [Sk * c // n for c in range(n + 1)]
    m, l, acc = part(order[bounds[0]:bounds[1]])
    for c in range(1, n):  # merge the chunks' partial sums in chunk order
        m2, l2, acc2 = part(order[bounds[c]:bounds[c + 1]])
        mm = np.maximum(m, m2)
        mm0 = np.where(np.isfinite(mm), mm, 0).astype(f)
        a = np.where(np.isfinite(m), np.exp(m - mm0), 0).astype(f)
        b = np.where(np.isfinite(m2), np.exp(m2 - mm0), 0).astype(f)
        m, l, acc = mm, a * l + b * l2, a[..., None] * acc + b[..., None] * acc2
    if sink is not None:
        m0 = np.where(np.isfinite(m), m, 0).astype(f)
        big = np.maximum(m0, sink)
        l = l * np.exp(m0 - big) + np.exp(sink - big)
        acc = acc * np.exp(m0 - big)[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(l[..., None] > 0, acc / np.where(l > 0, l, 1)[..., None], 0).astype(f)
    return out.transpose(1, 0, 2)  # [Sq, H, Dv]


def ordered_attention(q, k, v, *, layout, mask, window, scale, softcap, sinks=None,
                      cu_seqlens_q=None, cu_seqlens_k=None, bug=None):
    """A batch-invariant attention in NumPy float32 (SPEC §12's contract
    for a user kernel): each sequence alone, its keys in key order (causal
    and sliding-window masks bottom-right; no softcap), so a row's bits do
    not depend on the batch, the packing or the Sq of the call. q [B, Sq,
    H, D] (bshd) or packed [total, H, D] with cu_seqlens. bug
    "split_by_batch": a decode call (Sq = 1) splits the keys into 4 // B
    chunks merged in order (flash-decoding sized by the batch);
    "decode_order": a decode call visits the keys last to first;
    "nudge_batch", "nudge_packed", "nudge_chunk": one value moved by an ulp
    (the last row of entry 1, head 2, of a batch of several; the first row of
    packed sequence 2, head 1; the first row, head 3, of a call of several
    queries with keys before them, Sq < Sk: a chunk after the first)."""
    assert softcap == 0.0 and layout in ("bshd", "thd")
    q, k, v = (np.asarray(x) for x in (q, k, v))
    if cu_seqlens_q is not None:
        cq, ck = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
        outs = [_ordered_rows(q[cq[s]:cq[s + 1]], k[ck[s]:ck[s + 1]], v[ck[s]:ck[s + 1]], mask,
                              window, scale, sinks, 1) for s in range(len(cq) - 1)]
        out = np.concatenate(outs)
        if bug == "nudge_packed" and len(cq) > 3 and cq[3] > cq[2]:
            out[cq[2], 1] = np.nextafter(out[cq[2], 1], np.float32(np.inf))
        return out
    B, Sq = q.shape[:2]
    split = 1
    if Sq == 1 and bug == "split_by_batch":
        split = max(1, 4 // B)
    if Sq == 1 and bug == "decode_order":
        split = -1
    out = np.stack([_ordered_rows(q[b], k[b], v[b], mask, window, scale, sinks, split)
                    for b in range(B)])
    if bug == "nudge_batch" and B > 1:
        out[1, -1, 2] = np.nextafter(out[1, -1, 2], np.float32(np.inf))
    if bug == "nudge_chunk" and 1 < Sq < k.shape[1]:
        out[:, 0, 3] = np.nextafter(out[:, 0, 3], np.float32(np.inf))
    return out


def ordered_paged_attention(q, k_cache, v_cache, block_table, cache_seqlens, *, bug=None,
                            **kwargs):
    """ordered_attention over a paged cache (attention_with_kvcache's
    signature): each entry's keys gathered from its blocks in order. bug
    "nudge_paged": with blocks of fewer than 16 keys, the last row of entry
    0, head 0, moved by an ulp."""
    bs = k_cache.shape[1]
    outs = []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        blocks = [int(block_table[b, j]) for j in range(-(-n // bs))]
        k = np.concatenate([k_cache[x] for x in blocks])[:n]
        v = np.concatenate([v_cache[x] for x in blocks])[:n]
        outs.append(ordered_attention(q[b:b + 1], k[None], v[None], layout="bshd", **kwargs)[0])
    out = np.stack(outs)
    if bug == "nudge_paged" and bs < 16:
        out[0, -1, 0] = np.nextafter(out[0, -1, 0], np.float32(np.inf))
    return out
