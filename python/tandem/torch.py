# SPDX-License-Identifier: Apache-2.0
"""tandem's kernels as PyTorch operators, with autograd.

The ops are registered with torch.library.custom_op (namespace `tandem`),
each with a fake (meta) implementation for torch.compile and export, and,
where the kernel has a backward, an autograd formula: attention saves its out
and log-sum-exp and its backward starts from them (attention_backward_saved);
a float bias (attn_mask) that requires grad gets dbias (SPEC §3).
float32, bfloat16 and float16 tensors run `backend` (SPEC §10: one storage
type per call; lse float32 for bfloat16 and float16; `rounding` says where a
low-precision call rounds); float64 tensors run the reference in double, so
torch.autograd.gradcheck applies. A quantized KV cache (SPEC §10.4:
quantize_kv, attention_forward_quantized) is forward only: int8 and e4m3
codes have no gradient, and asking for one is an Error.

    import tandem.torch as tt
    out = tt.scaled_dot_product_attention(q, k, v, is_causal=True)   # as torch's F.sdpa
    out = tt.attention(q, k, v, layout="bhsd", mask="causal")         # tandem's own arguments
"""

import atexit
import math
from typing import Optional

from ._errors import Error, MissingExtra

try:
    import torch
    from torch import Tensor
except ImportError as e:
    raise MissingExtra("tandem.torch", "PyTorch >= 2.4", "torch", "torch", e) from e
if not hasattr(torch.library, "custom_op"):  # added in torch 2.4
    raise MissingExtra("tandem.torch", "PyTorch >= 2.4", "torch", "torch",
                      f"found {torch.__version__}")

from . import _api, _ext

_LOW_PRECISION = (torch.bfloat16, torch.float16)

__all__ = ["attention", "attention_with_kvcache", "quantize_kv", "attention_forward_quantized",
           "rope", "axial_rope", "swiglu", "attention_block", "scaled_dot_product_attention"]

# ---------------------------------------------------------------------------
# Attention: forward with log-sum-exp, backward from the saved state.


def _mask_kwargs(mask: Optional[Tensor], mask_kind: str, window: int):
    """tandem.attention's mask arguments for an op's (mask, mask_kind, window)."""
    if mask_kind == "bias":
        return {"bias": mask}
    if mask_kind == "key_padding":
        return {"key_padding": mask}
    return {"mask": mask_kind, "window": window if mask_kind == "sliding_window" else None}


def _feature_kwargs(sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k):
    """tandem.attention's feature arguments (SPEC §2.7–2.9) of an op."""
    return dict(sinks=sinks, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k)


# The features are the ops' last arguments, with defaults, so that a call
# without them reads as before: sinks [H] (differentiable), alibi_slopes
# [H] or [n, H], cu_seqlens_q, cu_seqlens_k [n+1] and seqused_k [n] (packed
# q [total_q, H, D], k, v [total_k, Hkv, D]); then the rounding profile of a
# bfloat16 or float16 call (SPEC §10.2; None: "pytorch" — torch 2.4's schema
# inference takes no str default); then key_origin [n] (SPEC §12.1), which
# changes no value (the backward does without it).
@torch.library.custom_op("tandem::attention", mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], layout: str,
                  mask_kind: str, window: int, scale: Optional[float], softcap: float,
                  backend: str, sinks: Optional[Tensor] = None,
                  alibi_slopes: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                  cu_seqlens_k: Optional[Tensor] = None,
                  seqused_k: Optional[Tensor] = None, rounding: Optional[str] = None,
                  key_origin: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    return _api.attention_forward_lse(
        q, k, v, layout=layout, scale=scale, softcap=softcap, backend=backend,
        rounding=rounding or "pytorch", key_origin=key_origin,
        **_mask_kwargs(mask, mask_kind, window),
        **_feature_kwargs(sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k))


@_attention_op.register_fake
def _(q, k, v, mask, layout, mask_kind, window, scale, softcap, backend, sinks=None,
      alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
      rounding=None, key_origin=None):
    # out [B,Sq,H,Dv] (bshd) or [B,H,Sq,Dv] (bhsd), packed [T,H,Dv]: q's axes and v's width;
    # lse float32 for bfloat16 and float16 (SPEC §10.1)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    stat = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
    if q.dim() == 3:  # packed: lse [1, H, total_q]
        return out, q.new_empty((1, q.shape[1], q.shape[0]), dtype=stat)
    B, S, H = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bshd" else \
        (q.shape[0], q.shape[2], q.shape[1])
    return out, q.new_empty((B, H, S), dtype=stat)


@torch.library.custom_op("tandem::attention_backward", mutates_args=())
def _attention_backward_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], out: Tensor,
                           lse: Tensor, dout: Tensor, layout: str, mask_kind: str, window: int,
                           scale: Optional[float], softcap: float, backend: str,
                           sinks: Optional[Tensor] = None,
                           alibi_slopes: Optional[Tensor] = None,
                           cu_seqlens_q: Optional[Tensor] = None,
                           cu_seqlens_k: Optional[Tensor] = None,
                           seqused_k: Optional[Tensor] = None, dbias: bool = False,
                           rounding: Optional[str] = None
                           ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dsinks, dbias); dsinks is empty ([0]) without sinks, dbias
    (the bias's shape) unless `dbias` asks for it."""
    grads = _api.attention_backward_saved(
        q, k, v, out, lse, dout, layout=layout, scale=scale, softcap=softcap, backend=backend,
        grads=("dbias",) if dbias else None, rounding=rounding or "pytorch",
        **_mask_kwargs(mask, mask_kind, window),
        **_feature_kwargs(sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k))
    dq, dk, dv = grads[:3]
    dsinks = grads[3] if sinks is not None else q.new_empty((0,))
    return dq, dk, dv, dsinks, grads[-1] if dbias else q.new_empty((0,))


@_attention_backward_op.register_fake
def _(q, k, v, mask, out, lse, dout, layout, mask_kind, window, scale, softcap, backend,
      sinks=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
      dbias=False, rounding=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((0,) if sinks is None else sinks.shape),
            q.new_empty(mask.shape if dbias else (0,)))


_ATTENTION_ATTRS = 6  # layout, mask_kind, window, scale, softcap, backend
_FEATURES = 5  # sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k


def _attention_setup(ctx, inputs, output):
    q, k, v, mask = inputs[:4]
    first = 4 + _ATTENTION_ATTRS
    features = tuple(inputs[first:first + _FEATURES])
    features += (None,) * (_FEATURES - len(features))
    out, lse = output
    ctx.save_for_backward(q, k, v, mask, out, lse, *features)
    ctx.attrs = tuple(inputs[4:first])
    ctx.rounding = inputs[first + _FEATURES] if len(inputs) > first + _FEATURES else "pytorch"
    ctx.mark_non_differentiable(lse)


def _attention_grad(ctx, dout, _dlse):
    q, k, v, mask, out, lse, sinks, *features = ctx.saved_tensors
    # a bias (mask kind "bias", attrs[1]) that requires grad gets dbias, in its own shape
    want_dbias = ctx.attrs[1] == "bias" and ctx.needs_input_grad[3]
    dq, dk, dv, dsinks, dbias = _attention_backward_op(q, k, v, mask, out, lse, dout, *ctx.attrs,
                                                       sinks, *features, dbias=want_dbias,
                                                       rounding=ctx.rounding)
    # a keep mask, the ALiBi slopes and index inputs get no gradient; neither do the
    # attributes and the rounding profile
    return (dq, dk, dv, dbias.to(mask.dtype) if want_dbias else None) + \
        (None,) * _ATTENTION_ATTRS + (None if sinks is None else dsinks, None, None, None, None,
                                      None, None)


_attention_op.register_autograd(_attention_grad, setup_context=_attention_setup)


def _mask_args(mask, window, bias, key_padding):
    """(mask tensor, mask kind, window) of the ops from tandem.attention's arguments."""
    if bias is not None and key_padding is not None:
        raise Error("key_padding: give one of bias, key_padding", "key_padding")
    kind = mask if mask is not None else ("sliding_window" if window is not None else "none")
    if (bias is not None or key_padding is not None) and kind != "none":
        name = "bias" if bias is not None else "key_padding"
        raise Error(f"{name}: give one of mask={kind!r}, bias, key_padding", name)
    if bias is not None:
        return bias.to(torch.float32), "bias", 0
    if key_padding is not None:
        return key_padding.to(torch.float32), "key_padding", 0
    return None, kind, int(window or 0)


def attention(q, k, v, *, layout="bshd", mask=None, window=None, scale=None, softcap=0.0,
              bias=None, key_padding=None, sinks=None, alibi_slopes=None, cu_seqlens_q=None,
              cu_seqlens_k=None, seqused_k=None, rounding="pytorch", key_origin=None,
              backend="optimized"):
    """tandem.attention on torch tensors (rank 4, or packed [total, H, D]
    with cu_seqlens), differentiable in q, k, v, sinks and the bias (dbias,
    SPEC §3; key_padding, ALiBi slopes and index tensors get no gradient);
    float32, float64, bfloat16 or float16, with `rounding` for the latter
    two (SPEC §10.2); key_origin [n] as tandem.attention's (SPEC §12.1)."""
    m, kind, w = _mask_args(mask, window, bias, key_padding)
    if alibi_slopes is not None:
        alibi_slopes = torch.as_tensor(alibi_slopes).to(torch.float32)
    out, _ = _attention_op(q, k, v, m, layout, kind, w, None if scale is None else float(scale),
                           float(softcap or 0.0), backend, sinks, alibi_slopes,
                           _index(cu_seqlens_q), _index(cu_seqlens_k), _index(seqused_k),
                           str(rounding), _index(key_origin))
    return out


def _index(x):
    """An index input as a tensor (int32 and int64 stay as they are)."""
    return x if x is None or isinstance(x, Tensor) else torch.as_tensor(x)


@torch.library.custom_op("tandem::attention_with_kvcache", mutates_args=())
def _attention_with_kvcache_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
                               cache_seqlens: Tensor, sinks: Optional[Tensor],
                               alibi_slopes: Optional[Tensor], mask_kind: str, window: int,
                               scale: Optional[float], softcap: float, backend: str) -> Tensor:
    return _api.attention_with_kvcache(q, k_cache, v_cache, block_table, cache_seqlens,
                                       mask=mask_kind,
                                       window=window if mask_kind == "sliding_window" else None,
                                       scale=scale, softcap=softcap, sinks=sinks,
                                       alibi_slopes=alibi_slopes, backend=backend)


@_attention_with_kvcache_op.register_fake
def _(q, k_cache, v_cache, block_table, cache_seqlens, sinks, alibi_slopes, mask_kind, window,
      scale, softcap, backend):
    return q.new_empty((*q.shape[:-1], v_cache.shape[-1]))


def _attention_with_kvcache_grad(ctx, dout):
    """The paged cache has no backward (SPEC §2.10): said in tandem's words
    rather than torch's note to op authors."""
    raise Error("attention_with_kvcache: the paged KV cache is forward only (inference); to "
                "train, use tandem.torch.attention on dense q, k, v or on packed sequences "
                "(cu_seqlens_q, cu_seqlens_k), which differentiate q, k, v and sinks")


_attention_with_kvcache_op.register_autograd(_attention_with_kvcache_grad)


def attention_with_kvcache(q, k_cache, v_cache, block_table, cache_seqlens, *, mask=None,
                           window=None, scale=None, softcap=0.0, sinks=None, alibi_slopes=None,
                           backend="optimized"):
    """tandem.attention_with_kvcache as a torch operator (inference: a paged
    cache has no backward)."""
    kind = mask if mask is not None else ("sliding_window" if window is not None else "none")
    if alibi_slopes is not None:
        alibi_slopes = torch.as_tensor(alibi_slopes).to(torch.float32)
    return _attention_with_kvcache_op(q, k_cache, v_cache, _index(block_table),
                                      _index(cache_seqlens), sinks, alibi_slopes, kind,
                                      int(window or 0), None if scale is None else float(scale),
                                      float(softcap or 0.0), backend)


# ---------------------------------------------------------------------------
# Quantized KV caches (SPEC §10.4): forward only. The codes (int8, or
# torch.float8_e4m3fn as their uint8 bits) and the float32 scales reach the
# kernels through DLPack, without a copy; nothing is ever dequantized.


def _quantized_grad(ctx, *grads):
    """No gradient flows through int8 or e4m3 codes (SPEC §10.4)."""
    raise Error("a quantized KV cache is forward only (inference): its int8 or e4m3 codes have "
                "no gradient; to train, use tandem.torch.attention on k and v in float32, "
                "bfloat16 or float16", "kv_cache")


def _forward_only(**tensors):
    """Refuses, before anything runs, a call that would record a gradient."""
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if isinstance(t, Tensor) and t.requires_grad:
                raise Error(f"{name}.requires_grad: a quantized KV cache is forward only "
                            "(inference): its int8 or e4m3 codes have no gradient; call it "
                            "under torch.no_grad() or torch.inference_mode(), or train with "
                            "tandem.torch.attention on unquantized k and v", name)


@torch.library.custom_op("tandem::quantize_kv", mutates_args=())
def _quantize_kv_op(k: Tensor, v: Tensor, kind: str, layout: str, num_heads: Optional[int],
                    backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    c = _api.quantize_kv(k, v, kind=kind, layout=layout, num_heads=num_heads, backend=backend)
    return c.k, c.v, c.k_scale, c.v_scale


@_quantize_kv_op.register_fake
def _(k, v, kind, layout, num_heads, backend):
    # codes in the shapes of k and v; scales float32 [B', S', Hkv] (int8), [Hkv] (e4m3)
    code = torch.int8 if kind == "int8" else torch.float8_e4m3fn
    if k.dim() == 4:
        rows, heads = (k.shape[:2], k.shape[2]) if layout == "bshd" else \
            ((k.shape[0], k.shape[2]), k.shape[1])
    else:  # [B, S, Hkv*D] or [S, Hkv*D] with num_heads = Hkv
        rows, heads = (k.shape[:2] if k.dim() == 3 else (1, k.shape[0])), num_heads
    shape = (*rows, heads) if kind == "int8" else (heads,)
    f32 = torch.float32
    return (k.new_empty(k.shape, dtype=code), v.new_empty(v.shape, dtype=code),
            k.new_empty(shape, dtype=f32), v.new_empty(shape, dtype=f32))


_quantize_kv_op.register_autograd(_quantized_grad)


def quantize_kv(k, v, *, kind="int8", layout="bshd", num_heads=None, backend="optimized"):
    """tandem.quantize_kv as a torch operator: a QuantizedKv of tensors (codes
    torch.int8 or torch.float8_e4m3fn in the shapes of k and v, float32
    scales), forward only: k or v requiring grad in grad mode is an Error."""
    _forward_only(k=k, v=v)
    codes = _quantize_kv_op(k, v, str(kind), str(layout),
                            None if num_heads is None else int(num_heads), backend)
    return _api.QuantizedKv(*codes, kind)


# The same arguments as tandem::attention's, minus the packed sequences, plus
# the cache's scales and kind.
@torch.library.custom_op("tandem::attention_forward_quantized", mutates_args=())
def _attention_quantized_op(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor,
                            kv_cache: str, mask: Optional[Tensor], layout: str, mask_kind: str,
                            window: int, scale: Optional[float], softcap: float, backend: str,
                            sinks: Optional[Tensor] = None,
                            alibi_slopes: Optional[Tensor] = None,
                            rounding: Optional[str] = None) -> Tensor:
    return _api.attention(q, k, v, layout=layout, scale=scale, softcap=softcap, sinks=sinks,
                          alibi_slopes=alibi_slopes, rounding=rounding or "pytorch",
                          kv_cache=kv_cache, k_scale=k_scale, v_scale=v_scale, backend=backend,
                          **_mask_kwargs(mask, mask_kind, window))


@_attention_quantized_op.register_fake
def _(q, k, v, k_scale, v_scale, kv_cache, mask, layout, mask_kind, window, scale, softcap,
      backend, sinks=None, alibi_slopes=None, rounding=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))  # q's dtype, v's width


_attention_quantized_op.register_autograd(_quantized_grad)


def attention_forward_quantized(q, k, v, k_scale, v_scale, kv_cache, *, layout="bshd",
                                mask=None, window=None, scale=None, softcap=0.0, bias=None,
                                key_padding=None, sinks=None, alibi_slopes=None,
                                rounding="pytorch", backend="optimized"):
    """Attention of q (float32, bfloat16 or float16) over a quantized cache
    (SPEC §10.4) as a torch operator: k, v the codes (torch.int8 or
    torch.float8_e4m3fn) and k_scale, v_scale their float32 scales, as
    quantize_kv gives them: `attention_forward_quantized(q,
    **quantize_kv(k, v)._asdict())`. Forward only (inference): an input
    requiring grad in grad mode is an Error; under torch.no_grad() it runs."""
    _forward_only(q=q, k_scale=k_scale, v_scale=v_scale, sinks=sinks)
    m, kind, w = _mask_args(mask, window, bias, key_padding)
    if alibi_slopes is not None:
        alibi_slopes = torch.as_tensor(alibi_slopes).to(torch.float32)
    return _attention_quantized_op(q, k, v, k_scale, v_scale, str(kv_cache), m, layout, kind,
                                   w, None if scale is None else float(scale),
                                   float(softcap or 0.0), backend, sinks, alibi_slopes,
                                   str(rounding))


# ---------------------------------------------------------------------------
# RoPE, axial RoPE, SwiGLU: the backward is the op's own transpose kernel.


# layout and positions (int32 or int64 position ids) are the last arguments,
# with defaults, so that a call without them reads as before.
@torch.library.custom_op("tandem::rope", mutates_args=())
def _rope_op(x: Tensor, cos: Tensor, sin: Tensor, head_dim: Optional[int], n_rot: Optional[int],
             style: str, table_rows: Optional[str], backward: bool, backend: str,
             layout: Optional[str] = None, positions: Optional[Tensor] = None) -> Tensor:
    f = _api.rope_backward if backward else _api.rope
    return f(x, cos, sin, head_dim=head_dim, n_rot=n_rot, style=style, table_rows=table_rows,
             layout=layout, positions=positions, backend=backend)


@_rope_op.register_fake
def _(x, cos, sin, head_dim, n_rot, style, table_rows, backward, backend, layout=None,
      positions=None):
    return x.new_empty(x.shape)


def _rope_setup(ctx, inputs, output):
    positions = inputs[10] if len(inputs) > 10 else None
    ctx.save_for_backward(inputs[1], inputs[2], positions)
    ctx.attrs = tuple(inputs[3:9])
    ctx.layout = inputs[9] if len(inputs) > 9 else None


def _rope_grad(ctx, dy):
    cos, sin, positions = ctx.saved_tensors
    head_dim, n_rot, style, table_rows, backward, backend = ctx.attrs
    dx = _rope_op(dy, cos, sin, head_dim, n_rot, style, table_rows, not backward, backend,
                  ctx.layout, positions)
    return dx, None, None, None, None, None, None, None, None, None, None


_rope_op.register_autograd(_rope_grad, setup_context=_rope_setup)


def rope(x, cos, sin, *, head_dim=None, n_rot=None, style="neox", table_rows=None, layout=None,
         positions=None, backend="optimized"):
    """tandem.rope on torch tensors, differentiable in x (not in the tables)."""
    return _rope_op(x, cos, sin, head_dim, n_rot, style, table_rows, False, backend, layout,
                    _index(positions))


@torch.library.custom_op("tandem::axial_rope", mutates_args=())
def _axial_rope_op(x: Tensor, end_x: int, end_y: int, num_heads: int, theta: float,
                   repeat_factor: int, backward: bool, backend: str) -> Tensor:
    f = _api.axial_rope_backward if backward else _api.axial_rope
    return f(x, end_x=end_x, end_y=end_y, num_heads=num_heads, theta=theta,
             repeat_factor=repeat_factor, backend=backend)


@_axial_rope_op.register_fake
def _(x, end_x, end_y, num_heads, theta, repeat_factor, backward, backend):
    return x.new_empty(x.shape)


def _axial_rope_setup(ctx, inputs, output):
    ctx.attrs = inputs[1:]


def _axial_rope_grad(ctx, dy):
    end_x, end_y, num_heads, theta, repeat_factor, backward, backend = ctx.attrs
    dx = _axial_rope_op(dy, end_x, end_y, num_heads, theta, repeat_factor, not backward, backend)
    return dx, None, None, None, None, None, None, None


_axial_rope_op.register_autograd(_axial_rope_grad, setup_context=_axial_rope_setup)


def axial_rope(x, *, end_x, end_y, num_heads=1, theta=10000.0, repeat_factor=1,
               backend="optimized"):
    """tandem.axial_rope on torch tensors, differentiable in x."""
    return _axial_rope_op(x, int(end_x), int(end_y), int(num_heads), float(theta),
                          int(repeat_factor), False, backend)


@torch.library.custom_op("tandem::swiglu", mutates_args=())
def _swiglu_op(x: Tensor, gate_first: bool, backend: str) -> Tensor:
    return _api.swiglu(x, gate_first=gate_first, backend=backend)


@_swiglu_op.register_fake
def _(x, gate_first, backend):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("tandem::swiglu_backward", mutates_args=())
def _swiglu_backward_op(x: Tensor, dy: Tensor, gate_first: bool, backend: str) -> Tensor:
    return _api.swiglu_backward(x, dy, gate_first=gate_first, backend=backend)


@_swiglu_backward_op.register_fake
def _(x, dy, gate_first, backend):
    return x.new_empty(x.shape)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.attrs = inputs[1:]


def _swiglu_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return _swiglu_backward_op(x, dy, *ctx.attrs), None, None


_swiglu_op.register_autograd(_swiglu_grad, setup_context=_swiglu_setup)


def swiglu(x, *, gate_first=True, backend="optimized"):
    """tandem.swiglu on torch tensors, differentiable in x."""
    return _swiglu_op(x, bool(gate_first), backend)


@torch.library.custom_op("tandem::attention_block", mutates_args=())
def _attention_block_op(x: Tensor, w_qkv: Tensor, w_out: Tensor, num_heads: int,
                        b_qkv: Optional[Tensor], b_out: Optional[Tensor],
                        key_padding: Optional[Tensor], cos: Optional[Tensor],
                        sin: Optional[Tensor], backend: str) -> Tensor:
    return _api.attention_block(x, w_qkv, w_out, num_heads=num_heads, b_qkv=b_qkv, b_out=b_out,
                                key_padding=key_padding, cos=cos, sin=sin, backend=backend)


@_attention_block_op.register_fake
def _(x, w_qkv, w_out, num_heads, b_qkv, b_out, key_padding, cos, sin, backend):
    return x.new_empty(x.shape)


def attention_block(x, w_qkv, w_out, *, num_heads, b_qkv=None, b_out=None, key_padding=None,
                    cos=None, sin=None, backend="optimized"):
    """tandem.attention_block on torch tensors (float32, bfloat16 or float16, the dtype of x;
    inference: no autograd)."""
    return _attention_block_op(x, w_qkv, w_out, int(num_heads), b_qkv, b_out, key_padding, cos,
                               sin, backend)


# ---------------------------------------------------------------------------
# torch.nn.functional.scaled_dot_product_attention, with its signature.


def _needs_op(*tensors):
    """Whether a call must go through the registered op (autograd or a
    compiler is watching: one of `tensors`, q, k, v or the bias, requires
    grad); otherwise the kernel is called directly."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return True
    return torch.compiler.is_compiling()


def _check_mask_dtype(attn_mask, query):
    """F.sdpa's dtype rule for attn_mask: bool (True takes part), or float
    (float32, or the query's dtype) added to the scores; anything else (an
    integer 0/1 mask, another float) is refused, as PyTorch refuses it."""
    if attn_mask is None or attn_mask.dtype in (torch.bool, torch.float32, query.dtype):
        return
    raise Error("attn_mask: Expected attn_mask dtype to be bool or float or to match query "
                f"dtype, but got attn_mask.dtype: {attn_mask.dtype} and query.dtype: "
                f"{query.dtype} instead (as in PyTorch)", "attn_mask")


def _sdpa_mask(attn_mask, is_causal, batch, N, H, L, S):
    """(mask tensor, kind) for tandem from F.sdpa's attn_mask / is_causal on
    [N, H, L, S] scores (the leading batch axes `batch` folded into N)."""
    if is_causal:
        if attn_mask is not None:
            raise Error("attn_mask: must be None when is_causal=True (as in PyTorch)",
                        "attn_mask")
        if L >= S:
            # PyTorch's top-left causal (j <= i) equals tandem's bottom-right
            # one when Sq >= Sk: the query offset max(Sk - Sq, 0) is 0.
            return None, "causal"
        # L < S: top-left differs from bottom-right; hide j > i with a bias.
        i = torch.arange(L).unsqueeze(1)
        j = torch.arange(S).unsqueeze(0)
        bias = torch.zeros((L, S), dtype=torch.float32).masked_fill_(j > i, -math.inf)
        return bias.reshape(1, 1, L, S), "bias"
    if attn_mask is None:
        return None, "none"
    m = attn_mask
    if m.dim() > len(batch) + 3:
        raise Error(f"attn_mask.shape = {list(m.shape)} must broadcast to "
                    f"{[*batch, H, L, S]}", "attn_mask")
    m = m.reshape((1,) * (len(batch) + 3 - m.dim()) + tuple(m.shape))
    lead, mh = m.shape[:-3], m.shape[-3]
    try:
        m = m.expand(*lead, mh, L, S)  # materialize only the query and key axes
        bb = 1 if all(n == 1 for n in lead) else N
        m = m.expand(*batch, mh, L, S) if bb != 1 else m
    except RuntimeError:
        raise Error(f"attn_mask.shape = {list(attn_mask.shape)} must broadcast to "
                    f"{[*batch, H, L, S]}", "attn_mask") from None
    if mh not in (1, H):
        raise Error(f"attn_mask.shape = {list(attn_mask.shape)} must broadcast to "
                    f"{[*batch, H, L, S]}", "attn_mask")
    m = m.reshape(bb, mh, L, S)
    if m.dtype == torch.bool:
        bias = torch.zeros(m.shape, dtype=torch.float32).masked_fill_(~m, -math.inf)
    else:
        bias = m.to(torch.float32).contiguous()
    return bias, "bias"


_SDPA_NAMES = _api._attention_names(q="query", k="key", v="value", mask="attn_mask")


def _sdpa_shapes(query, key, value):
    """Checks query, key and value (N, ..., H, S, E) by the C++ shape rules
    (SPEC §1, every leading axis folded into N), whose errors name F.sdpa's
    arguments."""
    def fold(x):
        return (math.prod(x.shape[:-3]), *x.shape[-3:]) if x.dim() >= 4 else tuple(x.shape)

    a = _ext.AttentionAttrs()
    a.layout = _ext.QkvLayout.bhsd
    a.num_heads = query.shape[-3]
    _ext.attention_call({"q": fold(query), "k": fold(key), "v": fold(value)}, a, _SDPA_NAMES)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by tandem.

    query (N, ..., Hq, L, E), key (N, ..., H, S, E), value (N, ..., H, S, Ev)
    -> (N, ..., Hq, L, Ev). attn_mask: bool (True takes part) or float (added
    to the scores), broadcastable to (N, ..., Hq, L, S); is_causal: PyTorch's
    top-left alignment (query i sees keys j <= i); scale defaults to
    1/sqrt(E); enable_gqa: Hq a multiple of H. Only dropout_p = 0 is
    supported. A query that sees no key gets 0, as in PyTorch. float32,
    bfloat16 and float16 run the optimized backend, float64 the reference in
    double."""
    if attn_mask is None and dropout_p == 0.0:
        out = _fast_sdpa(query, key, value, is_causal, scale, enable_gqa, "optimized")
        if out is not None:
            return out
    return sdpa_softcap(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


_DTYPES = {torch.float32: _ext.Dtype.float32, torch.float64: _ext.Dtype.float64,
           torch.bfloat16: _ext.Dtype.bfloat16, torch.float16: _ext.Dtype.float16}
_PLANS = {}  # (q, k, v shapes, is_causal, scale, enable_gqa) -> AttentionPlan, or None: no fast path
atexit.register(_PLANS.clear)  # before the extension is torn down


def _fast_plan(q, k, v, is_causal, scale, enable_gqa):
    """The plan of a [B, H, S, D] call without a mask, made (and validated)
    once per shape; None when the call needs the general path (another rank,
    top-left causal with fewer queries than keys, k or v not fitting q: the
    general path then names the problem)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return None
    B, H, L, D = q.shape
    Bk, Hkv, S, Dk = k.shape
    if Bk != B or Dk != D or tuple(v.shape[:3]) != (B, Hkv, S) or min(B, H, L, D, S) < 1 or \
            (is_causal and L < S) or (Hkv != H and not (enable_gqa and H % Hkv == 0)):
        return None
    p = _ext.AttentionParams()
    p.layout = _ext.Layout.bhsd
    p.B, p.H, p.Sq, p.D = B, H, L, D
    p.Hkv, p.Sk, p.Dv = Hkv, S, v.shape[3]
    if is_causal:
        p.mask = _ext.MaskKind.causal
    if scale is not None:
        p.scale = float(scale)
    return _ext.AttentionPlan.make(p)


def _fast_sdpa(q, k, v, is_causal, scale, enable_gqa, backend):
    """Inference on contiguous [B, H, S, D] CPU tensors without a mask: the
    output straight from the kernel, the tensors passed by address (their
    sizes, contiguity, dtype and device checked here, the plan made once per
    shape); None when the call needs the general path (autograd, a
    compiler, another layout, ...)."""
    dtype = q.dtype
    if k.dtype != dtype or v.dtype != dtype or dtype not in _DTYPES or _needs_op(q, k, v) or \
            not (q.is_cpu and k.is_cpu and v.is_cpu) or \
            not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return None
    key = (q.shape, k.shape, v.shape, is_causal, scale, enable_gqa)
    try:
        plan = _PLANS[key]
    except KeyError:
        if len(_PLANS) >= 256:
            _PLANS.clear()
        plan = _PLANS[key] = _fast_plan(q, k, v, is_causal, scale, enable_gqa)
    if plan is None:
        return None
    out = torch.empty((*key[0][:3], key[2][3]), dtype=dtype)
    _ext.attention_forward_contiguous(backend, plan, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                      out.data_ptr(), _DTYPES[dtype])
    return out


def sdpa_softcap(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False, softcap=0.0, backend="optimized", sinks=None):
    """scaled_dot_product_attention with tandem's logit softcap c > 0
    (scores s -> c*tanh(s/c) before the mask is added), attention sinks
    [Hq] (a logit per query head joining every softmax's denominator,
    differentiable) and a backend choice."""
    if dropout_p != 0.0:
        raise Error(f"dropout_p = {dropout_p} must be 0 (tandem has no dropout)", "dropout_p")
    if query.dim() < 3:
        raise Error(f"query.shape = {list(query.shape)} must be (N, ..., L, E)", "query.shape")
    _check_mask_dtype(attn_mask, query)
    if query.dim() == 3:
        mask = attn_mask
        if mask is not None and mask.dim() >= 3:
            mask = mask.unsqueeze(-3)
        return sdpa_softcap(query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1), mask, 0.0,
                            is_causal, scale, enable_gqa, softcap, backend, sinks).squeeze(1)
    batch = tuple(query.shape[:-3])
    Hq, L, E = query.shape[-3:]
    H, S = key.shape[-3], key.shape[-2]
    if H != Hq and not (enable_gqa and H >= 1 and Hq % H == 0):
        raise Error(f"key.shape = {list(key.shape)} must have {Hq} heads (query's), or a divisor "
                    "of it with enable_gqa=True", "key.shape")
    if attn_mask is None and not softcap and sinks is None:
        out = _fast_sdpa(query, key, value, is_causal, scale, enable_gqa, backend)
        if out is not None:
            return out
    if not torch.compiler.is_compiling():  # a compiler traces the op, which checks at run time
        _sdpa_shapes(query, key, value)
    N = math.prod(batch)
    q = query.reshape(N, Hq, L, E)
    k = key.reshape(N, H, S, key.shape[-1])
    v = value.reshape(N, H, S, value.shape[-1])
    mask, kind = _sdpa_mask(attn_mask, is_causal, batch, N, Hq, L, S)
    sc = None if scale is None else float(scale)
    cap = float(softcap or 0.0)
    if _needs_op(q, k, v, mask) or sinks is not None:
        out, _ = _attention_op(q, k, v, mask, "bhsd", kind, 0, sc, cap, backend, sinks)
    else:
        out = _api.attention(q, k, v, layout="bhsd", scale=sc, softcap=cap, backend=backend,
                             **_mask_kwargs(mask, kind, 0))
    return out.reshape(*batch, Hq, L, value.shape[-1])
