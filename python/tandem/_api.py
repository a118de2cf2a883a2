# SPDX-License-Identifier: Apache-2.0
"""tandem's kernels on NumPy arrays and PyTorch tensors.

Each function reads its keyword arguments (the one place per op that maps
Python arguments to the C++ API); the C++ shape rules (_ext.attention_call,
SPEC §1; _ext.rope_call, SPEC §4.1; _ext.swiglu_params) then give the Params
and the shapes to view the arrays in, their errors naming this module's
arguments. It allocates
outputs of the caller's kind and calls tandem._ext, which makes the plan
(validating the call), checks every array against it without copying, and
runs the kernel with the GIL released. float32, bfloat16 and float16 run
`backend` (SPEC §10: one storage type per call, which the extension checks
every floating input against, naming the one that differs; lse, masks, ALiBi
slopes and the scales of a quantized cache are float32); float64 runs the
reference in double whatever `backend` says.
"""

import collections

import atexit

import numpy as np

from . import _arrays as A
from . import _ext
from ._errors import Error

__all__ = [
    "attention", "attention_backward", "attention_forward_lse", "attention_backward_saved",
    "attention_with_kvcache", "quantize_kv", "QuantizedKv", "alibi_slopes", "rope",
    "rope_backward", "rope_qk",
    "rope_qk_backward", "axial_rope", "axial_rope_backward", "swiglu", "swiglu_backward",
    "attention_block",
]

_QKV_LAYOUTS = {"bshd": _ext.QkvLayout.bshd, "bhsd": _ext.QkvLayout.bhsd,
                "thd": _ext.QkvLayout.thd}
_MASKS = {"none": _ext.MaskKind.none, "causal": _ext.MaskKind.causal,
          "sliding_window": _ext.MaskKind.sliding_window}
_STYLES = {"neox": _ext.RopeStyle.neox, "gptj": _ext.RopeStyle.gptj}
_TABLE_ROWS = {"position": _ext.TableRows.position, "token": _ext.TableRows.token,
               "position_ids": _ext.TableRows.position_ids}
_ROPE_LAYOUTS = {"bshd": _ext.RopeLayout.bshd, "bhsd": _ext.RopeLayout.bhsd,
                 "thd": _ext.RopeLayout.thd}


_KV_CACHES = {"int8": _ext.KvCache.int8, "e4m3": _ext.KvCache.e4m3}


def _run(kernel, *args):
    """Calls an extension kernel with its arrays as the extension takes them
    (A.crossing; the arrays of an input dict were crossed when it was made)."""
    return kernel(*map(A.crossing, args))


def _choice(name, value, table):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise Error(f"{name} = {value!r} must be one of {', '.join(table)}", name) from None


# ---------------------------------------------------------------------------
# Attention


_INDEX_INPUTS = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table", "cache_seqlens",
                 "key_origin")


def _attention_names(**names):
    """The names an attention call's errors give its inputs (the defaults:
    this module's argument names)."""
    n = _ext.AttentionNames()
    for key, value in names.items():
        setattr(n, key, value)
    return n


_NAMES = _attention_names()
_KVCACHE_NAMES = _attention_names(k="k_cache", v="v_cache")


_CALLS = {}  # (shapes, attrs, names) -> (Params, views) of _ext.attention_call
atexit.register(_CALLS.clear)  # before the extension is torn down


def _attention_call(key, shapes, attrs, names):
    """_ext.attention_call, kept per shapes and attrs (the Params a copy: each
    call sets its own row strides); make() still validates every call."""
    try:
        p, views = _CALLS[key]
    except KeyError:
        if len(_CALLS) >= 256:
            _CALLS.clear()
        p, views = _CALLS[key] = _ext.attention_call(shapes, attrs, names)
    return _ext.AttentionParams(p), views


class _AttentionCall:
    """An attention call read from Python arguments. The C++ shape rules
    (_ext.attention_call, SPEC §1) give its Params and the shapes the kernels
    read the arrays in; here the arrays are converted (floats, indices),
    viewed in those shapes (the caller's memory when the kernels can read it
    in place, else a contiguous copy) and outputs are given back in q's rank."""

    def __init__(self, q, k, v, layout="bshd", num_heads=None, mask=None, window=None,
                 scale=None, softcap=0.0, bias=None, key_padding=None, sinks=None,
                 alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                 block_table=None, cache_seqlens=None, names=_NAMES, rounding=None,
                 kv_cache=None, k_scale=None, v_scale=None, key_origin=None):
        q = A.as_array(q, names.q)
        if kv_cache is None:
            k, v = A.as_array(k, names.k), A.as_array(v, names.v)
        else:
            _choice("kv_cache", kv_cache, _KV_CACHES)
            k, v = A.as_codes(k, names.k, kv_cache), A.as_codes(v, names.v, kv_cache)
        self.like = q
        a = _ext.AttentionAttrs()
        a.layout = _choice("layout", layout, _QKV_LAYOUTS)
        if num_heads is not None:
            a.num_heads = int(num_heads)
        if scale is not None:
            a.scale = float(scale)
        a.softcap = float(softcap or 0.0)
        inputs = {"q": q, "k": k, "v": v,
                  "mask": self._mask(a, mask, window, bias, key_padding, names)}
        if sinks is not None:
            inputs["sinks"] = A.contiguous(A.as_array(sinks, names.sinks))
        if alibi_slopes is not None:
            inputs["alibi_slopes"] = A.to_float32(alibi_slopes, names.alibi_slopes)
        for name, x in zip(_INDEX_INPUTS, (cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                           cache_seqlens, key_origin)):
            if x is not None:
                inputs[name] = A.as_indices(x, getattr(names, name))
        self.shapes = {name: tuple(x.shape) for name, x in inputs.items() if x is not None}
        key = (tuple(self.shapes.items()), layout, num_heads, a.mask, window, scale, softcap,
               id(names))
        p, self.views = _attention_call(key, self.shapes, a, names)
        self.params, self.names = p, names
        if rounding is not None:
            p.rounding = rounding  # the extension names the profiles (SPEC §10.2)
        if kv_cache is not None:
            p.kv_cache = _KV_CACHES[kv_cache]
            for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
                if x is None:
                    raise Error(f"{name} = (absent) is required by kv_cache={kv_cache!r}", name)
                inputs[name] = A.to_float32(x, name)
        q, p.q_row_stride = self._view(q, "q", p.H, p.D)
        k, p.k_row_stride = self._view(k, "k", p.Hkv, p.D)
        v, p.v_row_stride = self._view(v, "v", p.Hkv, p.Dv)
        inputs.update(q=q, k=k, v=v)
        if inputs["mask"] is not None:
            inputs["mask"] = inputs["mask"].reshape(self.views["mask"])
        self.inputs = {name: A.crossing(x) for name, x in inputs.items()}

    def _view(self, x, name, heads, width):
        """x in the shape the kernels read it in, and its row stride: the
        caller's memory when its rows are evenly spaced (bshd) or it is
        contiguous (bhsd), else a contiguous copy (row stride 0)."""
        x = x.reshape(self.views[name])
        if 0 not in x.shape:
            if self.params.layout == _ext.Layout.bshd:
                rs = A.row_stride(x, heads, width)
                if rs is not None:
                    return x, rs
            elif A.is_contiguous(x):
                return x, 0
        return A.contiguous(x), 0

    @staticmethod
    def _mask(a, mask, window, bias, key_padding, names):
        """Sets a.mask (and the window) from the mask arguments and returns
        the float32 keep mask or bias (None for the other kinds)."""
        given = [n for n, x in (("bias", bias), ("key_padding", key_padding)) if x is not None]
        if mask is None:
            mask = "sliding_window" if window is not None else "none"
        if len(given) > 1 or (given and mask != "none"):
            raise Error(f"{given[-1]}: give one of mask={mask!r}, bias, key_padding "
                        "(tandem applies one mask kind per call)", given[-1])
        if key_padding is not None:
            a.mask = _ext.MaskKind.key_padding
            return A.to_float32(key_padding, names.mask_of(a.mask))
        if bias is not None:
            a.mask = _ext.MaskKind.bias
            return A.to_float32(bias, names.mask_of(a.mask))
        a.mask = _choice("mask", mask, _MASKS)
        if window is not None:
            a.window = int(window)
        return None

    def empty(self, name):
        """A new output of the shape the kernels write `name` in (lse: float32
        for a bfloat16 or float16 call, SPEC §10.1)."""
        dtype = A.stat_dtype(self.like) if name == "lse" else None
        return A.empty(self.like, self.views[name], dtype)

    def back(self, x, name):
        """A gradient in the shape of the caller's input `name`."""
        return x if x is None else x.reshape(self.shapes[name])

    def out_back(self, out):
        """out in q's rank ([total_q, H, Dv] packed, [B, Sq, H*Dv] folded)."""
        return out.reshape(self.views["given_out"])

    def dout(self, dout, name="dout"):
        """dout (or the saved out) in the shape the kernels read it in."""
        d = A.as_array(dout, name)
        if tuple(d.shape) == tuple(self.views["given_out"]):
            d = d.reshape(self.views["out"])
        return d if A.is_contiguous(d) else A.contiguous(d)


def attention(q, k, v, *, layout="bshd", num_heads=None, mask=None, window=None, scale=None,
              softcap=0.0, bias=None, key_padding=None, sinks=None, alibi_slopes=None,
              cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, rounding=None,
              kv_cache=None, k_scale=None, v_scale=None, key_origin=None, backend="optimized"):
    """Scaled dot-product attention (SPEC §2): out [B, Sq, H, Dv] (bshd) or
    [B, H, Sq, Dv] (bhsd).

    q [B,Sq,H,D], k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv] in `layout` (rank 3
    [B,S,H*D] and rank 2 [S,H*D] are bshd and need `num_heads`; "thd" is
    packed tokens [total, H, D], with cu_seqlens); Hkv divides
    H (query head h reads kv head h // (H/Hkv)). `mask`: "none", "causal" or
    "sliding_window" (keys a-window..a, a = i + max(Sk-Sq, 0)); or an additive
    `bias` [Bb, Hb, Sq, Sk] or [Sq, Sk] (Bb in {1, B}, Hb in {1, H}; -inf
    hides a key);
    or `key_padding` [B, Sk] (nonzero = attend). `scale` defaults to
    1/sqrt(D); `softcap` c > 0 caps scores to c*tanh(s/c). A query that sees
    no key gets 0. NumPy in, NumPy out; torch in, torch out.

    Features (SPEC §2.7–2.9): `sinks` [H] (q's dtype) adds a learned logit
    per query head to every softmax's denominator (p_ij = e^s_ij /
    (e^sink_h + sum_j e^s_ij)); `alibi_slopes` [H] or [B, H] (float32; see
    alibi_slopes()) subtracts m_h * |i + Sk - Sq - j| from the scores;
    `cu_seqlens_q`, `cu_seqlens_k` [n+1] (int32 or int64, from 0 to the
    totals) pack n sequences along the token axis: q [total_q, H, D],
    k, v [total_k, Hkv, D] (or [total, H*D] with num_heads), out
    [total_q, H, Dv]; sequence s owns rows cu_seqlens[s]:cu_seqlens[s+1]
    and masks apply within it; `seqused_k` [n] keeps only the first
    seqused_k[s] keys of each slot (FlashAttention's flash_attn_varlen_func;
    max_seqlen is not needed). `key_origin` [n] (one per batch entry or
    packed sequence) is the position of each sequence's key 0 in its whole
    sequence (a cache that dropped its oldest keys); it changes no value,
    only where the invariant order's blocks fall (SPEC §12.1).

    Storage (SPEC §10): q, k, v (and sinks, dout, the gradients, out) share
    one dtype: float32, float64, bfloat16 (torch.bfloat16, ml_dtypes.bfloat16)
    or float16; a call that mixes them is refused naming the input that
    differs. `rounding` ("pytorch", the default; "exact"; "ggml") says where a
    bfloat16 or float16 call rounds besides its outputs (SPEC §10.2; nothing
    for float32 and float64). `kv_cache` "int8" or "e4m3": k and v are the
    codes of a quantized cache with their float32 scales `k_scale`, `v_scale`
    (quantize_kv; SPEC §10.4): `attention(q, **quantize_kv(k, v)._asdict())`."""
    call = _AttentionCall(q, k, v, layout, num_heads, mask, window, scale, softcap, bias,
                          key_padding, sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                          seqused_k, rounding=rounding, kv_cache=kv_cache, k_scale=k_scale,
                          v_scale=v_scale, key_origin=key_origin)
    out = call.empty("out")
    if kv_cache is None:
        _run(_ext.attention_forward, backend, call.params, call.inputs, out, None)
    else:
        _run(_ext.attention_forward_quantized, backend, call.params, call.inputs, out)
    return call.out_back(out)


def attention_forward_lse(q, k, v, **kwargs):
    """attention() and the log-sum-exp lse [B, H, Sq] ([1, H, total_q]
    packed) that attention_backward_saved starts from (lse_i = log sum_j
    exp(s_ij) over the visible keys, the sink's e^sink_h included; -inf for a
    query that sees neither key nor sink). Returns (out, lse)."""
    backend = kwargs.pop("backend", "optimized")
    call = _AttentionCall(q, k, v, **kwargs)
    out, lse = call.empty("out"), call.empty("lse")
    _run(_ext.attention_forward, backend, call.params, call.inputs, out, lse)
    return call.out_back(out), lse


_GRADS = ("dq", "dk", "dv", "dsinks", "dbias")


def _grads(call, want):
    """The gradient outputs named in `want` (None: dq, dk, dv and, with sinks,
    dsinks), new; the others None. dsinks [H] exists only for calls with
    sinks, dbias [Bb, Hb, Sq, Sk] only for calls with a bias, and only when
    named (SPEC §3)."""
    p = call.params
    bias = p.mask == _ext.MaskKind.bias
    names = [n for n in _GRADS if (n != "dsinks" or p.sinks) and (n != "dbias" or bias)]
    if want is None:
        want = [n for n in names if n != "dbias"]
    for name in want:
        if name not in names:
            raise Error(f"grads = {tuple(want)!r} may name only {', '.join(names)}", "grads")
    g = {name: None for name in _GRADS}
    for name in want:
        if name == "dsinks":
            g[name] = A.empty(call.like, call.shapes["sinks"])
        elif name == "dbias":
            g[name] = call.empty("mask")  # the bias's [Bb, Hb, Sq, Sk] view
        else:
            g[name] = call.empty(name[1])  # dq: q's view, ...
    return g


def _grads_back(call, g, want):
    """(dq, dk, dv) in the shapes of q, k, v, dsinks when the call has sinks,
    and dbias in the bias's own shape when `want` names it."""
    grads = tuple(call.back(g[n], n[1]) for n in ("dq", "dk", "dv"))
    if call.params.sinks:
        grads += (g["dsinks"],)
    if want is not None and "dbias" in want:
        grads += (call.back(g["dbias"], "mask"),)
    return grads


def attention_backward(q, k, v, dout, *, grads=None, backend="optimized", **kwargs):
    """The gradients of attention() for the loss <dout, out>: (dq, dk, dv),
    each of its input's shape, dsinks [H] next when `sinks` is given
    (dsink_h = -sum_i p_sink,i <dout_i, out_i>), and dbias last, in the
    bias's shape, when `grads` names it (dbias = P * (dP - rowsum(dO * O)),
    summed over the bias's broadcast axes; SPEC §3). Only those named in
    `grads` are computed (default: dq, dk, dv and dsinks; the others are
    None). Keyword arguments as for attention()."""
    call = _AttentionCall(q, k, v, **kwargs)
    g = _grads(call, grads)
    _run(_ext.attention_backward, backend, call.params, call.inputs, call.dout(dout), g["dq"],
         g["dk"], g["dv"], g["dsinks"], g["dbias"])
    return _grads_back(call, g, grads)


def attention_backward_saved(q, k, v, out, lse, dout, *, grads=None, backend="optimized",
                             **kwargs):
    """(dq, dk, dv[, dsinks][, dbias]) from the forward's saved out and lse
    (attention_forward_lse), without running the forward again; dbias only
    when `grads` names it (with dq, dk and dv, which this form always
    computes)."""
    call = _AttentionCall(q, k, v, **kwargs)
    if grads is not None:  # dq, dk, dv (and dsinks) always; dbias when named
        extra = ("dbias",) if "dbias" in grads else ()
        grads = tuple(n for n in _GRADS[:4] if n != "dsinks" or call.params.sinks) + extra
    g = _grads(call, grads)
    saved_out = call.dout(out, "out")
    lse = A.as_array(lse, "lse")
    _run(_ext.attention_backward_saved, backend, call.params, call.inputs, saved_out,
         lse if A.is_contiguous(lse) else A.contiguous(lse), call.dout(dout), g["dq"], g["dk"],
         g["dv"], g["dsinks"], g["dbias"])
    return _grads_back(call, g, grads)


def attention_with_kvcache(q, k_cache, v_cache, block_table, cache_seqlens, *, mask=None,
                           window=None, scale=None, softcap=0.0, sinks=None, alibi_slopes=None,
                           return_lse=False, rounding=None, kv_cache=None, k_scale=None,
                           v_scale=None, key_origin=None, backend="optimized"):
    """Attention of new queries over a paged KV cache (SPEC §2.10; forward
    only): q [B, Sq, H, D]; k_cache [num_blocks, block_size, Hkv, D] and
    v_cache [num_blocks, block_size, Hkv, Dv]; block_table [B, max_blocks]
    and cache_seqlens [B] (int32 or int64): batch entry b sees keys
    j < cache_seqlens[b], key j in slot j % block_size of block
    block_table[b, j // block_size]. The queries are the last Sq positions
    (mask="causal" aligns them bottom-right). Returns out [B, Sq, H, Dv],
    and lse [B, H, Sq] too with return_lse. As FlashAttention's
    flash_attn_with_kvcache with block_table (causal=True is mask="causal";
    new keys are appended to the cache by the caller). `rounding`, and a
    quantized cache (`kv_cache`, `k_scale`, `v_scale`: quantize_kv of the
    whole cache; no lse), and `key_origin`, as for attention()."""
    call = _AttentionCall(q, k_cache, v_cache, "bshd", None, mask, window, scale, softcap,
                          None, None, sinks, alibi_slopes, block_table=block_table,
                          cache_seqlens=cache_seqlens, names=_KVCACHE_NAMES, rounding=rounding,
                          kv_cache=kv_cache, k_scale=k_scale, v_scale=v_scale,
                          key_origin=key_origin)
    out = call.empty("out")
    if kv_cache is not None:
        if return_lse:
            raise Error("return_lse: a quantized cache's attention returns no lse",
                        "return_lse")
        _run(_ext.attention_forward_quantized, backend, call.params, call.inputs, out)
        return out
    lse = call.empty("lse") if return_lse else None
    _run(_ext.attention_forward, backend, call.params, call.inputs, out, lse)
    return (out, lse) if return_lse else out


QuantizedKv = collections.namedtuple("QuantizedKv", "k v k_scale v_scale kv_cache")
QuantizedKv.__doc__ = """A quantized K/V cache (SPEC §10.4), from quantize_kv: the codes k, v
(the shapes of the k, v quantized; int8, or float8_e4m3fn: torch's, ml_dtypes', else uint8
bits), their float32 scales k_scale, v_scale ([B', S', Hkv] for int8, [Hkv] for e4m3) and
the kind kv_cache ("int8", "e4m3"); attention(q, **cache._asdict()) reads it."""


def _quantize_query_shape(k, layout):
    """The shape of a one-query q that fits k (its heads: the kv heads), by
    which the shape rules read k and v: [B, 1, Hkv, D] (bshd), [B, 1, Hkv*D]
    (bshd folded), [1, Hkv*D] ([S, Hkv*D]), [B, Hkv, 1, D] (bhsd)."""
    s = list(k.shape)
    if layout == "bhsd":
        return tuple(s[:2] + [1] + s[3:]) if len(s) == 4 else tuple(s)
    if len(s) >= 3:
        return tuple(s[:1] + [1] + s[2:])
    return tuple([1] + s[1:])


def quantize_kv(k, v, *, kind="int8", layout="bshd", num_heads=None, backend="optimized"):
    """The codes and scales of a quantized K/V cache (SPEC §10.4): k
    [B, Sk, Hkv, D] and v [B, Sk, Hkv, Dv] in `layout` ("bshd", "bhsd";
    [B, Sk, Hkv*D] with num_heads = Hkv; a paged cache [num_blocks,
    block_size, Hkv, D] is quantized as bshd), float32, bfloat16 or float16.
    kind "int8": one scale per key row and kv head, sigma = max|k_d|/127,
    codes round_even(k/sigma) in [-127, 127]; "e4m3": one scale per kv head,
    sigma = max|k|/448, codes RN_e4m3(k/sigma). Returns a QuantizedKv."""
    _choice("kind", kind, _KV_CACHES)
    name = kind
    k, v = A.as_array(k, "k"), A.as_array(v, "v")
    a = _ext.AttentionAttrs()
    a.layout = _choice("layout", layout, {n: _QKV_LAYOUTS[n] for n in ("bshd", "bhsd")})
    if num_heads is not None:
        a.num_heads = int(num_heads)
    shapes = {"q": _quantize_query_shape(k, layout), "k": tuple(k.shape), "v": tuple(v.shape)}
    p, views = _ext.attention_call(shapes, a, _NAMES)
    p.kv_cache = _KV_CACHES[name]
    kc = A.contiguous(k.reshape(views["k"]))
    vc = A.contiguous(v.reshape(views["v"]))
    if name == "int8":
        int8 = A._torch().int8 if A.is_torch(k) else np.int8
        codes = [A.empty(k, views[n], int8) for n in ("k", "v")]
        B, S = views["k"][0], views["k"][1 if layout == "bshd" else 2]
        scale_shape = (B, S, p.Hkv)
    else:
        codes = [A.e4m3_codes(k, views[n]) for n in ("k", "v")]
        scale_shape = (p.Hkv,)
    f32 = A._torch().float32 if A.is_torch(k) else np.float32
    scales = [A.empty(k, scale_shape, f32) for _ in range(2)]
    _run(_ext.quantize_kv, backend, p, kc, vc, *codes, *scales)
    return QuantizedKv(codes[0].reshape(k.shape), codes[1].reshape(v.shape), scales[0],
                       scales[1], name)



def alibi_slopes(num_heads):
    """The standard ALiBi slopes [H] (float32) of BLOOM and MPT (SPEC §2.8):
    2^(-8(h+1)/n) for the n = 2^floor(log2 H) first heads, then the odd
    terms of the 2n-head sequence."""
    return np.asarray(_ext.alibi_standard_slopes(int(num_heads)), dtype=np.float32)


# ---------------------------------------------------------------------------
# RoPE, axial RoPE, SwiGLU


def _rope_names(**names):
    """The names a RoPE call's errors give its inputs (the defaults: rope()'s)."""
    n = _ext.RopeNames()
    for key, value in names.items():
        setattr(n, key, value)
    return n


_ROPE_NAMES = {False: _rope_names(), True: _rope_names(x="dy")}
_ROPE_QK_NAMES = {False: _rope_names(x="q"), True: _rope_names(x="dq_out", k="dk_out")}


def _rope_source(x, view, p, name):
    """x in its view ([B, S, W] rows or [B, H, S, D]) and its row stride:
    the caller's memory when the kernel can read it there, else a copy."""
    x = x.reshape(view)
    if p.layout == _ext.RopeLayout.bhsd:
        return A.contiguous(x), 0
    return A.rows_view(x, name)


def _rope_call(sources, cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout,
               positions, names):
    """One RoPE call: the C++ shape rules (_ext.rope_call, SPEC §4) give its
    RopeQkParams and views; returns them with the sources (as given), their
    views, the tables cos and sin [R, T] (contiguous) and the position ids
    [B*S] (or None)."""
    keys = ("x", "k")[:len(sources)]
    src = [A.as_array(x, getattr(names, key)) for x, key in zip(sources, keys)]
    arrays = dict(zip(keys, src))
    for key, t in (("cos", cos), ("sin", sin), ("cos_sin_cache", cos_sin_cache)):
        if t is not None:
            arrays[key] = A.as_array(t, getattr(names, key))
    if positions is not None:
        arrays["positions"] = A.as_indices(positions, names.positions)
    a = _ext.RopeAttrs()
    if head_dim is not None:
        a.head_dim = int(head_dim)
    if n_rot is not None:
        a.n_rot = int(n_rot)
    a.style = _choice("style", style, _STYLES)
    if table_rows is not None:
        a.table_rows = _choice("table_rows", table_rows, _TABLE_ROWS)
    if layout is not None:
        a.layout = _choice("layout", layout, _ROPE_LAYOUTS)
    p, views = _ext.rope_call({k: tuple(v.shape) for k, v in arrays.items()}, a, names)
    read = [None] * len(src)
    read[0], p.q.src_row_stride = _rope_source(src[0], views["x"], p.q, names.x)
    if len(src) > 1:
        read[1], p.k_src_row_stride = _rope_source(src[1], views["k"], p.q, names.k)
    T = views["cache_split"]
    if T:
        cos, sin = arrays["cos_sin_cache"][:, :T], arrays["cos_sin_cache"][:, T:]
    else:
        cos, sin = arrays["cos"], arrays["sin"]
    pos = arrays.get("positions")
    return (p, src, read, A.contiguous(cos), A.contiguous(sin),
            None if pos is None else pos.reshape(-1))


def _rope(src, cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout, positions,
          backend, backward):
    p, (src,), (x,), cos, sin, pos = _rope_call(
        (src,), cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout, positions,
        _ROPE_NAMES[backward])
    out = A.empty(src, tuple(x.shape))
    _run(_ext.rope, backend, p.q, x, cos, sin, pos, out, backward)
    return out.reshape(src.shape)


def rope(x, cos=None, sin=None, *, head_dim=None, n_rot=None, style="neox", table_rows=None,
         layout=None, positions=None, cos_sin_cache=None, backend="optimized"):
    """Rotary position embedding (SPEC §4) of x with tables cos, sin [R, T]
    (or one cos_sin_cache [R, 2T], cos then sin, as vLLM keeps it): pair
    i < n_rot/2 of every head, (i, i + n_rot/2) for style "neox" or
    (2i, 2i+1) for "gptj", rotates by the angle whose cos and sin are row r,
    column i of the tables; r is the position s (table_rows "position"), the
    token index b*S + s ("token") or positions[b, s] (`positions`, int32 or
    int64, x's token axes: [B, S], or [T] / [S]; each in [0, R)).

    layout: "bshd" x [B, S, H, D], [B, S, H*D] or [S, H*D]; "bhsd"
    [B, H, S, D]; "thd" packed tokens [T, H, D] or [T, H*D]. None: bshd for
    rank <= 3, and a rank >= 4 x is read as [..., S, D] rows (every leading
    axis a batch axis; positions then need a layout). head_dim defaults to
    the last dim when x has a head axis. The output has x's shape."""
    return _rope(x, cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout,
                 positions, backend, False)


def rope_backward(dy, cos=None, sin=None, *, head_dim=None, n_rot=None, style="neox",
                  table_rows=None, layout=None, positions=None, cos_sin_cache=None,
                  backend="optimized"):
    """The gradient of rope(): dy rotated by minus the angle (the transpose)."""
    return _rope(dy, cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout,
                 positions, backend, True)


def _rope_qk(q, k, cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout,
             positions, backend, backward):
    p, (q, k), (xq, xk), cos, sin, pos = _rope_call(
        (q, k), cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout, positions,
        _ROPE_QK_NAMES[backward])
    q_out, k_out = A.empty(q, tuple(xq.shape)), A.empty(k, tuple(xk.shape))
    _run(_ext.rope_qk, backend, p, xq, xk, cos, sin, pos, q_out, k_out, backward)
    return q_out.reshape(q.shape), k_out.reshape(k.shape)


def rope_qk(q, k, cos=None, sin=None, *, head_dim=None, n_rot=None, style="neox",
            table_rows=None, layout=None, positions=None, cos_sin_cache=None,
            backend="optimized"):
    """rope() of q and k in one call, with the same tables and positions
    (vLLM's rotary_embedding(positions, query, key, ...)): k has q's layout,
    token axes and head width, its own head count (GQA). Returns
    (q_out, k_out)."""
    return _rope_qk(q, k, cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows, layout,
                    positions, backend, False)


def rope_qk_backward(dq_out, dk_out, cos=None, sin=None, *, head_dim=None, n_rot=None,
                     style="neox", table_rows=None, layout=None, positions=None,
                     cos_sin_cache=None, backend="optimized"):
    """The gradient of rope_qk(): (dq, dk)."""
    return _rope_qk(dq_out, dk_out, cos, sin, cos_sin_cache, head_dim, n_rot, style, table_rows,
                    layout, positions, backend, True)


def _axial_rope(src, num_heads, end_x, end_y, theta, repeat_factor, backend, backward):
    name = "dy" if backward else "x"
    src = A.as_array(src, name)
    x3, rs = A.rows_view(src, name)
    p = _ext.AxialRopeParams()
    p.batch, p.seq, p.width = x3.shape
    p.num_heads, p.end_x, p.end_y = int(num_heads), int(end_x), int(end_y)
    p.theta, p.repeat_factor, p.src_row_stride = float(theta), int(repeat_factor), rs
    out = A.empty(src, x3.shape)
    _run(_ext.axial_rope, backend, p, x3, out, backward)
    return out.reshape(src.shape)


def axial_rope(x, *, end_x, end_y, num_heads=1, theta=10000.0, repeat_factor=1,
               backend="optimized"):
    """Axial 2-D RoPE (SPEC §5) of x [..., S, W], S = repeat_factor*end_x*end_y,
    heads of width W/num_heads (divisible by 4)."""
    return _axial_rope(x, num_heads, end_x, end_y, theta, repeat_factor, backend, False)


def axial_rope_backward(dy, *, end_x, end_y, num_heads=1, theta=10000.0, repeat_factor=1,
                        backend="optimized"):
    """The gradient of axial_rope() (the transpose)."""
    return _axial_rope(dy, num_heads, end_x, end_y, theta, repeat_factor, backend, True)


def _swiglu_params(x, gate_first, name="x"):
    """The SwigluParams of x [..., 2n] by the C++ shape rules (SPEC §6)."""
    return _ext.swiglu_params(tuple(x.shape), bool(gate_first), name)


def swiglu(x, *, gate_first=True, backend="optimized"):
    """SwiGLU (SPEC §6): x [..., 2n] -> silu(g)*u [..., n], the gate g the
    first half of the last axis (gate_first) or the second."""
    x = A.as_array(x, "x")
    p = _swiglu_params(x, gate_first)
    out = A.empty(x, (p.rows, p.n))
    _run(_ext.swiglu_forward, backend, p, A.contiguous(x).reshape(p.rows, 2 * p.n), out)
    return out.reshape(*x.shape[:-1], p.n)


def swiglu_backward(x, dy, *, gate_first=True, backend="optimized"):
    """dx [..., 2n], the gradient of swiglu() at x for dy [..., n]."""
    x, dy = A.as_array(x, "x"), A.as_array(dy, "dy")
    p = _swiglu_params(x, gate_first)
    dx = A.empty(x, (p.rows, 2 * p.n))
    if tuple(dy.shape) == (*x.shape[:-1], p.n):  # out's shape: the kernel's rows
        dy = A.contiguous(dy).reshape(p.rows, p.n)
    _run(_ext.swiglu_backward, backend, p, A.contiguous(x).reshape(p.rows, 2 * p.n), dy, dx)
    return dx.reshape(x.shape)


def attention_block(x, w_qkv, w_out, *, num_heads, b_qkv=None, b_out=None, key_padding=None,
                    cos=None, sin=None, backend="optimized"):
    """The fused attention block (SPEC §7): x [B, S, E], w_qkv [3E, E]
    (rows q, k, v), w_out [E, E], optional b_qkv [3E], b_out [E],
    key_padding [B, S] (nonzero = attend; read as float32), NeoX RoPE
    tables cos, sin [R, T] applied to q and k. Every tensor but key_padding
    has x's dtype: float32, float64, bfloat16 or float16, the block then
    rounding where SPEC §10.2 says. Returns [B, S, E] of x's dtype."""
    x = A.as_array(x, "x")
    inputs = {"x": A.contiguous(x)}
    for name, a in (("w_qkv", w_qkv), ("w_out", w_out), ("b_qkv", b_qkv), ("b_out", b_out),
                    ("cos", cos), ("sin", sin)):
        if a is not None:
            inputs[name] = A.contiguous(A.as_array(a, name))
    if key_padding is not None:
        inputs["mask"] = A.to_float32(key_padding, "key_padding")
    out = A.empty(x, tuple(x.shape))
    inputs = {name: A.crossing(a) for name, a in inputs.items()}
    _run(_ext.attention_block, backend, int(num_heads), inputs, out)
    return out
